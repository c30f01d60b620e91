// The routes of sandboxes themselves (api/sandboxes.md): create, look up, stop, delete, network.

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nettle/hmac.h>
#include <nettle/sha2.h>

#include "base/base64.h"
#include "base/files.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/utf8.h"
#include "exec/runner.h"
#include "fs/fs_error.h"
#include "fs/path.h"
#include "images/image.h"
#include "images/store.h"
#include "isolate/cgroup.h"
#include "isolate/cgroup_placement.h"
#include "isolate/disk.h"
#include "net/policy.h"
#include "policy/environment.h"
#include "runtime/api/daemon.h"
#include "runtime/api/exec_queue.h"
#include "runtime/api/exec_request.h"
#include "runtime/api/http.h"
#include "runtime/api/json_shapes.h"
#include "runtime/api/proxy_auth.h"
#include "runtime/api/routes.h"
#include "runtime/api_client.h"
#include "runtime/api_error.h"
#include "runtime/channel_watch.h"
#include "runtime/exec_events.h"
#include "runtime/exec_session.h"
#include "runtime/image_imports.h"
#include "runtime/listing.h"
#include "runtime/metrics.h"
#include "runtime/netns.h"
#include "runtime/paths.h"
#include "runtime/ports.h"
#include "runtime/registry.h"
#include "runtime/units.h"
#include "runtime/version.h"

namespace nsbox::runtime::api {

asio::awaitable<ApiOutcome<std::shared_ptr<SandboxEntry>>> Daemon::FindEntry(
    const std::string& id) {
  auto entry = registry_.Find(id);
  if (entry == nullptr) co_return ApiError::SandboxNotFound(id);
  co_return entry;
}

asio::awaitable<ApiOutcome<std::shared_ptr<Sandbox>>> Daemon::EnsureRunning(
    std::shared_ptr<SandboxEntry> entry) {
  if (std::shared_ptr<Sandbox> box = registry_.RunningNow(*entry)) co_return box;
  // A new sandbox whose creation still adopts a pooled jail: waited for here, on the loop (the
  // cancel is posted to it, so it comes after this wait began).
  auto adopted = std::make_shared<asio::steady_timer>(io_, Clock::time_point::max());
  auto wake = [ex = io_.get_executor(), adopted] {
    asio::post(ex, [adopted] { adopted->cancel(); });
  };
  if (registry_.WhenAdopted(*entry, std::move(wake))) {
    (void)co_await adopted->async_wait(kTuple);
    if (std::shared_ptr<Sandbox> box = registry_.RunningNow(*entry)) co_return box;
  }
  auto work = [this, entry] { return registry_.Running(*entry); };
  co_return co_await Blocking(std::move(work));
}

// ---- sandboxes ----

asio::awaitable<bool> Daemon::ListSandboxes(Ctx& c, const RouteArgs& a) {
  (void)a;
  json::array list;
  for (const auto& e : registry_.List()) list.push_back(SandboxJson(*e));
  json::object o;
  o["sandboxes"] = std::move(list);
  co_return co_await ReplyJson(c, 200, o);
}

asio::awaitable<bool> Daemon::GetSandbox(Ctx& c, const RouteArgs& a) {
  const json::value reply_json = SandboxJson(*a.entry);
  co_return co_await ReplyJson(c, 200, reply_json);
}

asio::awaitable<bool> Daemon::PutSandbox(Ctx& c, const RouteArgs& a) {
  const std::string id = a.Param("id");
  auto body = co_await ReadJson(c, /*optional=*/true);
  if (!body.ok()) {
    const ApiError reply_error = body.error();
    co_return co_await ReplyError(c, reply_error);
  }
  const json::object& o = body.value();
  static constexpr std::string_view kKeys[] = {"image",  "cwd",     "env",
                                               "limits", "network", "idleStopMs"};
  if (auto unknown = UnknownKey(o, kKeys, "a sandbox")) {
    const ApiError reply_error = *unknown;
    co_return co_await ReplyError(c, reply_error);
  }
  Fields f(o);
  SandboxConfig config;
  config.id = id;

  auto image = f.String("image");
  if (!image.ok()) {
    const ApiError reply_error = image.error();
    co_return co_await ReplyError(c, reply_error);
  }
  // An imported image: its content as it is now (a later replace does not change this
  // sandbox's root), and its Env and WorkingDir as the sandbox's defaults.
  std::string default_cwd = "/workspace";
  std::map<std::string, std::string> env_defaults;
  if (image.value() && *image.value() != images::kHostImage) {
    if (auto reason = images::InvalidImageNameReason(*image.value())) {
      const ApiError reply_error = ApiError::Invalid("\"image\": " + *reason);
      co_return co_await ReplyError(c, reply_error);
    }
    auto info = registry_.images().Find(*image.value());
    if (!info) {
      const ApiError reply_error = ApiError::ImageNotFound(*image.value());
      co_return co_await ReplyError(c, reply_error);
    }
    config.image = info->name;
    config.image_id = info->id;
    const std::string& dir = info->config.working_dir;
    if (!dir.empty() && dir[0] == '/') default_cwd = fs::ResolvePath("/", dir);
    for (const std::string& kv : info->config.env) {
      if (auto parsed = policy::ParseEnvAssignment(kv); parsed.ok()) {
        env_defaults[parsed->first] = parsed->second;
      }
    }
  }
  config.cwd = default_cwd;
  auto cwd = f.String("cwd");
  if (!cwd.ok()) {
    const ApiError reply_error = cwd.error();
    co_return co_await ReplyError(c, reply_error);
  }
  if (cwd.value()) {
    if (cwd.value()->empty() || cwd.value()->find('\0') != std::string::npos) {
      const ApiError reply_error = ApiError::Invalid(
          cwd.value()->empty() ? "\"cwd\" must be a non-empty path"
                               : "\"cwd\" contains a NUL byte, which no path can hold");
      co_return co_await ReplyError(c, reply_error);
    }
    config.cwd = fs::ResolvePath(default_cwd, *cwd.value());
  }
  if (const json::value* env = o.if_contains("env"); env != nullptr && !env->is_null()) {
    if (!env->is_object()) {
      {
        const ApiError reply_error = ApiError::Invalid("\"env\" must be an object of strings");
        co_return co_await ReplyError(c, reply_error);
      }
    }
    for (const auto& [k, v] : env->get_object()) {
      if (!v.is_string()) {
        {
          const ApiError reply_error =
              ApiError::Invalid("\"env\": the value of " + std::string(k) + " must be a string");
          co_return co_await ReplyError(c, reply_error);
        }
      }
      std::string assignment = std::string(k) + "=" + std::string(v.get_string());
      auto parsed = policy::ParseEnvAssignment(assignment, "\"env\" entry");
      if (!parsed.ok() || std::string_view(v.get_string()).find('\0') != std::string_view::npos) {
        {
          const ApiError reply_error =
              ApiError::Invalid(parsed.ok() ? std::string("\"env\": a value contains a NUL byte")
                                            : parsed.error().message());
          co_return co_await ReplyError(c, reply_error);
        }
      }
      env_defaults[std::string(k)] = std::string(v.get_string());
    }
  }
  config.env.assign(env_defaults.begin(), env_defaults.end());
  if (const json::value* limits = o.if_contains("limits");
      limits != nullptr && !limits->is_null()) {
    if (!limits->is_object()) {
      {
        const ApiError reply_error = ApiError::Invalid("\"limits\" must be an object");
        co_return co_await ReplyError(c, reply_error);
      }
    }
    const json::object& l = limits->get_object();
    Fields lf(l);
    auto memory = lf.Count("memoryBytes", 16u << 20, uint64_t{1} << 50);
    if (!memory.ok()) {
      const ApiError reply_error = memory.error();
      co_return co_await ReplyError(c, reply_error);
    }
    config.limits.memory_bytes = memory.value();
    auto pids = lf.Count("pids", isolate::kMinPids, isolate::kMaxPids);
    if (!pids.ok()) {
      const ApiError reply_error = pids.error();
      co_return co_await ReplyError(c, reply_error);
    }
    config.limits.pids = pids.value();
    // api.md: the output cap, 64 MiB unless configured; at most 1 GiB, which a buffered answer
    // holds whole.
    auto output = lf.Count("outputBytes", 1, uint64_t{1} << 30);
    if (!output.ok()) {
      const ApiError reply_error = output.error();
      co_return co_await ReplyError(c, reply_error);
    }
    config.limits.output_bytes = output.value();
    if (const json::value* cpus = l.if_contains("cpus"); cpus != nullptr && !cpus->is_null()) {
      boost::system::error_code ec;
      double value = cpus->is_number() ? cpus->to_number<double>(ec) : 0;
      if (!cpus->is_number() || ec || !(value >= isolate::kMinCpus && value <= isolate::kMaxCpus)) {
        {
          const ApiError reply_error =
              ApiError::Invalid("\"cpus\" must be a number of CPUs from 0.01 to 4096");
          co_return co_await ReplyError(c, reply_error);
        }
      }
      config.limits.cpus = CanonicalCpus(value);
    }
    // The size of the sandbox's own disk (isolate/disk.h), rounded up to its 4 KiB blocks.
    auto disk = lf.Count("diskBytes", isolate::kMinDiskBytes, isolate::kMaxDiskBytes);
    if (!disk.ok()) {
      const ApiError reply_error = disk.error();
      co_return co_await ReplyError(c, reply_error);
    }
    if (disk.value()) {
      if (auto st = isolate::DiskSupport(); !st.ok()) {
        const ApiError reply_error = ApiError::Unsupported(
            "\"diskBytes\" cannot be enforced on this host: " + st.error().message() +
            " (nsbox doctor tells more)");
        co_return co_await ReplyError(c, reply_error);
      }
      const uint64_t block = isolate::kDiskBlockBytes;
      config.limits.disk_bytes = (*disk.value() + block - 1) / block * block;
    }
    for (const auto& [k, v] : l) {
      if (k != "memoryBytes" && k != "pids" && k != "cpus" && k != "diskBytes" &&
          k != "outputBytes") {
        {
          const ApiError reply_error =
              ApiError::Invalid("unknown limit \"" + std::string(k) +
                                "\" (memoryBytes, pids, cpus, outputBytes, diskBytes)");
          co_return co_await ReplyError(c, reply_error);
        }
      }
    }
  }
  if (const json::value* network = o.if_contains("network"); network != nullptr) {
    auto policy = net::ParsePolicy(*network);
    if (!policy.ok()) {
      const ApiError reply_error = ApiError::Invalid(policy.error().message());
      co_return co_await ReplyError(c, reply_error);
    }
    config.network = std::move(policy).value();
  }
  // 0: never, whatever the daemon's --idle-stop says; none: as it says.
  auto idle_stop = f.Count("idleStopMs", 0, kMaxIdleStopMs);
  if (!idle_stop.ok() || (idle_stop.value() && !ValidIdleStopMs(*idle_stop.value()))) {
    const ApiError reply_error =
        ApiError::Invalid("\"idleStopMs\" must be 0 (never) or a whole number of ms from " +
                          std::to_string(kMinIdleStopMs) + " to " + std::to_string(kMaxIdleStopMs));
    co_return co_await ReplyError(c, reply_error);
  }
  config.idle_stop_ms = idle_stop.value();
  auto work2 = [this, config]() mutable { return registry_.Create(std::move(config)); };
  auto created = co_await Blocking(std::move(work2));
  if (!created.ok()) {
    const ApiError reply_error = created.error();
    co_return co_await ReplyError(c, reply_error);
  }
  if (created.value().first->idle_stop_ms() != 0) ArmIdleStops();
  {
    const json::value reply_json = SandboxJson(*created.value().first);
    co_return co_await ReplyJson(c, created.value().second ? 201 : 200, reply_json);
  }
}

asio::awaitable<bool> Daemon::StopSandbox(Ctx& c, const RouteArgs& a) {
  std::shared_ptr<SandboxEntry> entry = a.entry;
  auto work3 = [this, entry] { return registry_.Stop(*entry); };
  auto stopped = co_await Blocking(std::move(work3));
  if (!stopped.ok()) {
    const ApiError reply_error = stopped.error();
    co_return co_await ReplyError(c, reply_error);
  }
  {
    const json::value reply_json = SandboxJson(*entry);
    co_return co_await ReplyJson(c, 200, reply_json);
  }
}

asio::awaitable<bool> Daemon::SandboxNetwork(Ctx& c, const RouteArgs& a) {
  std::shared_ptr<SandboxEntry> entry = a.entry;
  if (c.parser.get().method() == http::verb::get) {
    json::object o;
    AddNetworkJson(o, *entry);
    co_return co_await ReplyJson(c, 200, o);
  }
  auto body = co_await ReadJson(c, false);
  if (!body.ok()) {
    const ApiError reply_error = body.error();
    co_return co_await ReplyError(c, reply_error);
  }
  const json::object& o = body.value();
  static constexpr std::string_view kKeys[] = {"network"};
  if (auto unknown = UnknownKey(o, kKeys, "a sandbox's network")) {
    const ApiError reply_error = *unknown;
    co_return co_await ReplyError(c, reply_error);
  }
  const json::value* network = o.if_contains("network");
  if (network == nullptr) {
    const ApiError reply_error = ApiError::Invalid(
        "the body must be {\"network\": \"none\" | \"open\" | {\"allow\": [...]}}");
    co_return co_await ReplyError(c, reply_error);
  }
  auto policy = net::ParsePolicy(*network);
  if (!policy.ok()) {
    const ApiError reply_error = ApiError::Invalid(policy.error().message());
    co_return co_await ReplyError(c, reply_error);
  }
  auto work = [this, entry, p = std::move(policy).value()] {
    return registry_.SetNetwork(*entry, p);
  };
  auto set = co_await Blocking(std::move(work));
  if (!set.ok()) {
    const ApiError reply_error = set.error();
    co_return co_await ReplyError(c, reply_error);
  }
  {
    const json::value reply_json = SandboxJson(*entry);
    co_return co_await ReplyJson(c, 200, reply_json);
  }
}

asio::awaitable<bool> Daemon::DeleteSandbox(Ctx& c, const RouteArgs& a) {
  const std::string id = a.Param("id");
  std::shared_ptr<SandboxEntry> entry = registry_.Find(id);
  ports_.CloseAll(id);  // every listener and connection of it
  auto work4 = [this, id] { return registry_.Delete(id); };
  auto deleted = co_await Blocking(std::move(work4));
  if (!deleted.ok()) {
    const ApiError reply_error = deleted.error();
    co_return co_await ReplyError(c, reply_error);
  }
  // Its exec sessions and their spill files go with it. Their pumps see the execs end,
  // "stopped", once the loop has taken the closed channels: waited for (a second at most), then
  // one turn of the loop, so that the requests waiting on those ends answer from the sessions'
  // logs before they are dropped.
  if (entry != nullptr) {
    std::vector<std::shared_ptr<ExecSession>> sessions = entry->TakeSessions();
    const auto give_up = Clock::now() + std::chrono::seconds(1);
    for (const auto& s : sessions) {
      while (!s->ended() && Clock::now() < give_up) {
        asio::steady_timer t(io_, std::chrono::milliseconds(5));
        (void)co_await t.async_wait(kTuple);
      }
    }
    co_await asio::post(io_, asio::use_awaitable);
    for (const auto& s : sessions) DropSession(*s);
  }
  if (deleted.value().files_left) {
    const ApiError reply_error = *deleted.value().files_left;
    co_return co_await ReplyError(c, reply_error);
  }
  co_return co_await ReplyNoContent(c);
}

}  // namespace nsbox::runtime::api

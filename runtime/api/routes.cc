// The routing of a request's path and method to its handler, and the queries each route takes.

#include "runtime/api/routes.h"

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

std::span<const std::string_view> QueryKeysOf(const std::vector<std::string>& segs,
                                              http::verb method) {
  static constexpr std::string_view kAll[] = {"all"};
  static constexpr std::string_view kOutput[] = {"offset", "follow", "encoding"};
  static constexpr std::string_view kAttach[] = {"offset"};
  static constexpr std::string_view kStdin[] = {"close"};
  static constexpr std::string_view kGetFile[] = {"path", "pathBase64"};
  static constexpr std::string_view kPutFile[] = {"path", "pathBase64", "mode"};
  static constexpr std::string_view kImport[] = {"replace", "maxBytes"};
  const size_t n = segs.size();
  if (n == 3 && segs[1] == "images" && method == http::verb::post) return kImport;
  if (n < 4 || segs[1] != "sandboxes") return {};
  if (n == 4 && segs[3] == "execs") return kAll;
  if (n == 6 && segs[3] == "execs" && segs[5] == "output") return kOutput;
  if (n == 6 && segs[3] == "execs" && segs[5] == "attach") return kAttach;
  if (n == 6 && segs[3] == "execs" && segs[5] == "stdin") return kStdin;
  if (n == 4 && segs[3] == "files" && method == http::verb::put) return kPutFile;
  if (n == 4 && segs[3] == "files") return kGetFile;
  return {};
}

std::string RouteName(std::string_view method, const std::vector<std::string>& segs) {
  std::string out = std::string(method) + " ";
  for (size_t i = 0; i < segs.size(); ++i) {
    std::string_view seg = segs[i];
    if (i == 2 && segs[1] == "sandboxes") seg = "{id}";
    if (i == 2 && segs[1] == "images") seg = "{name}";
    if (i == 4 && segs[3] == "execs") seg = "{execId}";
    if (i == 4 && segs[3] == "ports") seg = "{port}";
    out += "/" + utf8::DecodeLossy(seg.substr(0, 64));
  }
  return out;
}

std::optional<ApiError> QueryCheck(std::string_view query, const std::vector<std::string>& segs,
                                   http::verb method) {
  if (query.empty()) return std::nullopt;
  const std::span<const std::string_view> known = QueryKeysOf(segs, method);
  auto route = [&segs, method] { return RouteName(http::to_string(method), segs); };
  std::vector<std::string> seen;
  return ForEachQueryParam(query, [&](std::string key, std::string) -> std::optional<ApiError> {
    auto shown = [&key] {
      return "\"" + utf8::DecodeLossy(std::string_view(key).substr(0, 100)) + "\"";
    };
    if (std::find(known.begin(), known.end(), std::string_view(key)) == known.end()) {
      std::string names;
      for (std::string_view k : known) names += (names.empty() ? "" : ", ") + std::string(k);
      return ApiError::Invalid("unknown query parameter " + shown() + " for " + route() +
                               (names.empty() ? ", which takes none" : " (" + names + ")"));
    }
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return ApiError::Invalid("query parameter " + shown() + " is given more than once; " +
                               route() + " takes each at most once");
    }
    seen.push_back(std::move(key));
    return std::nullopt;
  });
}

asio::awaitable<bool> Daemon::Route(Ctx& c, const std::vector<std::string>& segs,
                                    std::string_view query) {
  const http::verb method = c.parser.get().method();
  const size_t n = segs.size();
  const bool uses_body =
      method == http::verb::put ||
      (method == http::verb::post && n >= 4 && (segs[3] == "exec" || segs[3] == "fs")) ||
      (method == http::verb::post && n == 6 && segs[3] == "execs") ||
      (method == http::verb::post && n == 4 && segs[3] == "ports") ||
      (n >= 6 && segs[1] == "sandboxes" && segs[3] == "ports" && segs[5] == "http") ||
      (method == http::verb::post && n == 3 && segs[1] == "images");
  if (!uses_body && !c.body_done) {
    auto drained = co_await ReadBody(c);
    if (!drained.ok()) {
      const ApiError error = drained.error();
      co_return co_await ReplyError(c, error);
    }
  }
  auto not_found = ApiError::Of(
      404, "not_found",
      "no such route: " + std::string(c.parser.get().target().substr(
                              0, std::min<size_t>(200, c.parser.get().target().size()))));
  if (n == 1 && segs[0] == "metrics") {
    if (method != http::verb::get) co_return co_await MethodNotAllowed(c, "GET");
    if (auto bad = QueryCheck(query, segs, method)) {
      const ApiError reply_error = *bad;
      co_return co_await ReplyError(c, reply_error);
    }
    {
      auto work = [this] {
        return metrics_.Render(registry_.CountByState()) +
               RenderPool(registry_.PoolReady(), registry_.pool_size(),
                          registry_.AdoptedAheadReady()) +
               RenderTrash(registry_.trash().pending(), registry_.trash().failures()) +
               RenderNetworkConnections(registry_.NetworkCounters());
      };
      std::string reply_body = co_await Blocking(std::move(work));
      co_return co_await Reply(c, 200, std::move(reply_body),
                               "text/plain; version=0.0.4; charset=utf-8");
    }
  }
  if (n < 2 || segs[0] != "v1") co_return co_await ReplyError(c, not_found);
  if (n == 2 && segs[1] == "health") {
    if (method != http::verb::get) co_return co_await MethodNotAllowed(c, "GET");
    if (auto bad = QueryCheck(query, segs, method)) {
      const ApiError reply_error = *bad;
      co_return co_await ReplyError(c, reply_error);
    }
    json::object o;
    o["ok"] = true;
    o["version"] = kVersion;
    co_return co_await ReplyJson(c, 200, o);
  }
  if (segs[1] == "images" && n <= 3) co_return co_await Images(c, segs, query);
  if (segs[1] != "sandboxes") co_return co_await ReplyError(c, not_found);
  if (n == 2) {
    if (method != http::verb::get) co_return co_await MethodNotAllowed(c, "GET");
    if (auto bad = QueryCheck(query, segs, method)) {
      const ApiError reply_error = *bad;
      co_return co_await ReplyError(c, reply_error);
    }
    json::array list;
    for (const auto& e : registry_.List()) list.push_back(SandboxJson(*e));
    json::object o;
    o["sandboxes"] = std::move(list);
    co_return co_await ReplyJson(c, 200, o);
  }

  // /v1/sandboxes/{id}/...: the route and method first, then the id, then the
  // sandbox.
  const std::string& id = segs[2];
  std::string_view allow;
  if (n == 3) {
    allow = "GET, PUT, DELETE";
  } else if (n == 4 && segs[3] == "stop") {
    allow = "POST";
  } else if (n == 4 && segs[3] == "network") {
    allow = "GET, PUT";
  } else if (n == 4 && segs[3] == "exec") {
    allow = "POST, GET";  // GET: the WebSocket (Upgrade: websocket)
  } else if (n == 4 && segs[3] == "execs") {
    allow = "GET";
  } else if (n == 5 && segs[3] == "execs") {
    allow = "DELETE";
  } else if (n == 6 && segs[3] == "execs" && (segs[5] == "output" || segs[5] == "attach")) {
    allow = "GET";
  } else if (n == 6 && segs[3] == "execs" && (segs[5] == "stdin" || segs[5] == "resize")) {
    allow = "POST";
  } else if (n == 4 && segs[3] == "files") {
    allow = "GET, PUT";
  } else if (n == 4 && segs[3] == "ports") {
    allow = "GET, POST";
  } else if (n == 5 && segs[3] == "ports") {
    allow = "DELETE";
  } else if (n >= 6 && segs[3] == "ports" && segs[5] == "http") {
    allow = "*";  // any method: the HTTP path through the API
  } else if (n == 5 && segs[3] == "fs" &&
             (segs[4] == "stat" || segs[4] == "readdir" || segs[4] == "exists" ||
              segs[4] == "mkdir" || segs[4] == "rm")) {
    allow = "POST";
  } else {
    co_return co_await ReplyError(c, not_found);
  }
  if (allow != "*" && !MethodIn(allow, std::string_view(c.parser.get().method_string()))) {
    co_return co_await MethodNotAllowed(c, allow);
  }
  if (allow != "*") {
    if (auto bad = QueryCheck(query, segs, method)) {
      const ApiError reply_error = *bad;
      co_return co_await ReplyError(c, reply_error);
    }
  }
  if (auto reason = InvalidIdReason(id)) {
    {
      const ApiError reply_error = ApiError::Invalid(*reason);
      co_return co_await ReplyError(c, reply_error);
    }
  }
  c.sandbox_id = id;
  if (n == 3 && method == http::verb::put) co_return co_await PutSandbox(c, id);
  if (n == 3 && method == http::verb::delete_) co_return co_await DeleteSandbox(c, id);

  auto found = co_await FindEntry(id);
  if (!found.ok()) {
    const ApiError reply_error = found.error();
    co_return co_await ReplyError(c, reply_error);
  }
  std::shared_ptr<SandboxEntry> entry = found.value();
  // What runs inside is in use until this request's answer has ended: the idle stop waits.
  std::optional<SandboxUse> use;
  if (n >= 4 && segs[3] != "stop" && segs[3] != "network") use.emplace(entry);
  if (n == 3) {
    const json::value reply_json = SandboxJson(*entry);
    co_return co_await ReplyJson(c, 200, reply_json);
  }
  if (segs[3] == "stop") co_return co_await StopSandbox(c, entry);
  if (segs[3] == "network") co_return co_await SandboxNetwork(c, entry);
  const bool upgrade = websocket::is_upgrade(c.parser.get());
  if (segs[3] == "exec" && method == http::verb::get) {
    if (!upgrade) {
      // Plain HTTP starts an exec with POST; GET is only the WebSocket's upgrade.
      const ApiError reply_error = ApiError::Of(
          405, "method_not_allowed",
          "method GET is not allowed here; use POST (GET only with Upgrade: websocket)");
      co_return co_await ReplyError(c, reply_error, "POST");
    }
    co_return co_await ExecSocket(c, entry, nullptr, 0);
  }
  if (segs[3] == "exec") co_return co_await Exec(c, entry);
  if (segs[3] == "execs" && n == 4) {
    json::array list;
    // api.md: the commands running now; with all=1 also the ended ones kept for re-attach.
    auto all_flag = QueryBool(query, "all");
    if (!all_flag.ok()) {
      const ApiError reply_error = all_flag.error();
      co_return co_await ReplyError(c, reply_error);
    }
    const bool all = all_flag.value();
    for (const auto& s : entry->Sessions()) {
      if (!s->dropped() && (all || !s->ended())) list.push_back(ExecJson(*s));
    }
    json::object o;
    o["execs"] = std::move(list);
    co_return co_await ReplyJson(c, 200, o);
  }
  if (segs[3] == "execs" && n == 5) {
    std::shared_ptr<ExecSession> s = entry->FindSession(segs[4]);
    std::shared_ptr<Sandbox> box = s != nullptr && !s->ended() ? s->box.lock() : nullptr;
    if (box == nullptr) {
      {
        // exec.md: exec_not_found ("not_found" is api.md's unknown route).
        const ApiError reply_error =
            ApiError::Of(404, "exec_not_found",
                         "no running exec '" + utf8::DecodeLossy(segs[4].substr(0, 64)) +
                             "' in sandbox '" + utf8::DecodeLossy(id) + "'");
        co_return co_await ReplyError(c, reply_error);
      }
    }
    box->client().KillExec(s->tag, static_cast<uint8_t>(exec::EndReason::kCancelled));
    metrics_.Kill("cancelled");
    log::info("sandbox={} exec={} cancelled by DELETE", id, segs[4]);
    json::object o;
    o["execId"] = segs[4];
    co_return co_await ReplyJson(c, 202, o);
  }
  if (segs[3] == "execs" && segs[5] == "output") {
    co_return co_await ExecOutput(c, entry, segs[4], query);
  }
  if (segs[3] == "execs" && segs[5] == "stdin") {
    co_return co_await ExecStdin(c, entry, segs[4], query);
  }
  if (segs[3] == "execs" && segs[5] == "resize") co_return co_await ExecResize(c, entry, segs[4]);
  if (segs[3] == "execs") {  // attach
    std::shared_ptr<ExecSession> s = entry->FindSession(segs[4]);
    if (s == nullptr || s->dropped()) {
      const ApiError reply_error = ExecNotFound(segs[4], id);
      co_return co_await ReplyError(c, reply_error);
    }
    auto offset = AttachOffset(query, *s);
    if (!offset.ok()) {
      const ApiError reply_error = offset.error();
      co_return co_await ReplyError(c, reply_error);
    }
    if (!upgrade) {
      const ApiError reply_error =
          ApiError::Of(426, "upgrade_required",
                       ".../attach is a WebSocket and needs Upgrade: websocket; "
                       "GET .../output re-attaches over plain HTTP");
      co_return co_await ReplyError(c, reply_error);
    }
    co_return co_await ExecSocket(c, entry, s, offset.value());
  }
  if (segs[3] == "files" && method == http::verb::get) co_return co_await GetFile(c, entry, query);
  if (segs[3] == "files") co_return co_await PutFile(c, entry, query);
  if (segs[3] == "ports" && n >= 6) {
    const std::string& text = segs[4];
    const bool digits = !text.empty() && text.size() <= 5 &&
                        text.find_first_not_of("0123456789") == std::string::npos;
    const unsigned long number = digits ? std::stoul(text) : 0;
    if (!digits || number < 1 || number > 65535) {
      const ApiError reply_error = ApiError::Invalid(
          "port must be an integer from 1 to 65535, not '" + text.substr(0, 64) + "'");
      co_return co_await ReplyError(c, reply_error);
    }
    co_return co_await HttpProxy(c, entry, static_cast<uint16_t>(number));
  }
  if (segs[3] == "ports") co_return co_await Ports(c, entry, segs);
  co_return co_await FsVerb(c, entry, segs[4]);
}

}  // namespace nsbox::runtime::api

// The JSON shapes of api.md (json_shapes.h).

#include "runtime/api/json_shapes.h"

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
#include "runtime/api/proxy_auth.h"
#include "runtime/api/routes.h"
#include "runtime/api_client.h"
#include "runtime/api_error.h"
#include "runtime/channel_watch.h"
#include "runtime/exec_events.h"
#include "runtime/exec_session.h"
#include "runtime/image_imports.h"
#include "runtime/limits_json.h"
#include "runtime/listing.h"
#include "runtime/metrics.h"
#include "runtime/netns.h"
#include "runtime/paths.h"
#include "runtime/ports.h"
#include "runtime/registry.h"
#include "runtime/units.h"
#include "runtime/version.h"

namespace nsbox::runtime::api {

std::string SignalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);  // glibc 2.32
  return abbrev != nullptr ? std::string("SIG") + abbrev : "SIG" + std::to_string(sig);
}

void AddNetworkJson(json::object& o, const SandboxEntry& e) {
  o["network"] = net::PolicyToJson(e.network());
  if (std::string address = e.address(); !address.empty()) {
    o["address"] = address;
  } else {
    o["address"] = nullptr;
  }
}

json::object SandboxJson(const SandboxEntry& e) {
  const SandboxConfig& c = e.config();
  json::object o;
  o["id"] = c.id;
  o["state"] = e.running() ? "running" : "stopped";
  o["image"] = c.image;
  o["cwd"] = c.cwd;
  o["createdAt"] = c.created_at;
  o["limits"] = LimitsJson(c.limits);
  if (e.idle_stop_ms() != 0) {
    o["idleStopMs"] = e.idle_stop_ms();
  } else {
    o["idleStopMs"] = nullptr;
  }
  AddNetworkJson(o, e);
  json::object env;
  for (const auto& [k, v] : c.env) env[k] = v;
  o["env"] = std::move(env);
  return o;
}

std::string ErrorBody(const ApiError& error) {
  json::object e;
  e["code"] = error.code;
  e["message"] = utf8::DecodeLossy(error.message);
  if (!error.path.empty()) e["path"] = utf8::DecodeLossy(error.path);
  if (!error.syscall.empty()) e["syscall"] = error.syscall;
  json::object o;
  o["error"] = std::move(e);
  return json::serialize(o);
}

ApiOutcome<std::string> RawPath(const std::optional<std::string>& path,
                                const std::optional<std::string>& path_base64) {
  if (path && path_base64) return ApiError::Invalid("give \"path\" or \"pathBase64\", not both");
  if (path_base64) {
    auto decoded = Base64Decode(*path_base64);
    if (!decoded.ok()) return ApiError::Invalid("\"pathBase64\": " + decoded.error().message());
    return std::move(decoded).value();
  }
  if (!path) return ApiError::Invalid("the request needs a \"path\"");
  return *path;
}

ApiOutcome<std::string> SandboxPath(const SandboxEntry& entry, const std::string& raw,
                                    std::string_view syscall) {
  if (raw.find('\0') != std::string::npos) {
    return ApiError::Invalid("the path contains a NUL byte");
  }
  if (raw.empty()) {
    return ApiError::Of(404, "ENOENT",
                        "ENOENT: no such file or directory, " + std::string(syscall) + " ''", "",
                        std::string(syscall));
  }
  return fs::ResolvePath(entry.config().cwd, raw);
}

json::object ImageJson(const images::ImageInfo& info, const std::vector<std::string>& used_by) {
  json::object o;
  o["name"] = info.name;
  o["id"] = info.id;
  o["format"] = info.format;
  o["digest"] = info.digest;
  o["layers"] = info.layers;
  o["files"] = info.files;
  o["sizeBytes"] = info.size_bytes;
  o["importedAt"] = info.imported_at;
  o["shell"] = info.shell;
  json::object config;
  json::array env(info.config.env.begin(), info.config.env.end());
  config["env"] = std::move(env);
  config["workingDir"] = info.config.working_dir;
  config["user"] = info.config.user;
  config["entrypoint"] = json::array(info.config.entrypoint.begin(), info.config.entrypoint.end());
  config["cmd"] = json::array(info.config.cmd.begin(), info.config.cmd.end());
  config["architecture"] = info.config.architecture;
  config["os"] = info.config.os;
  o["config"] = std::move(config);
  json::array warnings;
  for (const std::string& w : info.warnings) warnings.emplace_back(utf8::DecodeLossy(w));
  o["warnings"] = std::move(warnings);
  o["usedBy"] = json::array(used_by.begin(), used_by.end());
  return o;
}

std::optional<ApiError> UnknownKey(const json::object& o, std::span<const std::string_view> known,
                                   std::string_view what) {
  for (const auto& [key, value] : o) {
    if (std::find(known.begin(), known.end(), std::string_view(key)) != known.end()) continue;
    std::string names;
    for (std::string_view k : known) names += (names.empty() ? "" : ", ") + std::string(k);
    return ApiError::Invalid("unknown option \"" +
                             utf8::DecodeLossy(std::string_view(key).substr(0, 100)) + "\" for " +
                             std::string(what) + " (" + names + ")");
  }
  return std::nullopt;
}

void FillExit(json::object& o, const fs::proto::ExecExit& x, const std::string& reason) {
  o["exitCode"] = x.exit_code;
  o["reason"] = reason;
  if (x.signal != 0) {
    o["signal"] = SignalName(x.signal);
  } else {
    o["signal"] = nullptr;
  }
  o["timedOut"] = x.timed_out;
  o["truncated"] = x.truncated;
  o["cancelled"] = x.cancelled;
  o["durationMs"] = x.duration_ms;
  // What the exec's own cgroups say it used (docs/cgroups.md "Per-exec usage"); null where
  // this host has no controller for a figure.
  json::object usage(o.storage());
  auto put = [&usage](const char* key, const std::optional<uint64_t>& v) {
    if (v.has_value()) {
      usage[key] = *v;
    } else {
      usage[key] = nullptr;
    }
  };
  auto ms = [](const std::optional<uint64_t>& us) -> std::optional<uint64_t> {
    if (!us.has_value()) return std::nullopt;
    return *us / 1000;
  };
  put("cpuUserMs", ms(x.usage.cpu_user_us));
  put("cpuSystemMs", ms(x.usage.cpu_system_us));
  put("memoryPeakBytes", x.usage.memory_peak_bytes);
  put("pidsPeak", x.usage.pids_peak);
  put("ioReadBytes", x.usage.io_read_bytes);
  put("ioWriteBytes", x.usage.io_write_bytes);
  o["usage"] = std::move(usage);
}

json::object ExecJson(const ExecSession& s) {
  json::object o;
  o["execId"] = s.id();
  o["command"] = utf8::DecodeLossy(s.command());
  o["pid"] = s.pid();
  o["startedAt"] = s.started_at();
  o["state"] = s.ended() ? "exited" : "running";
  o["detach"] = s.detach;
  o["stdinStream"] = s.stdin_stream || s.tty.has_value();
  if (s.tty) {
    o["tty"] = json::object{{"rows", s.tty->rows}, {"cols", s.tty->cols}};
  } else {
    o["tty"] = nullptr;
  }
  o["outputEnd"] = s.end();
  o["oldestOffset"] = s.oldest();
  if (s.ended()) {
    json::object x;
    FillExit(x, s.exit(), s.reason());
    o["exit"] = std::move(x);
  } else {
    o["exit"] = nullptr;
  }
  return o;
}

}  // namespace nsbox::runtime::api

// What an exec request asks for (exec_request.h).

#include "runtime/api/exec_request.h"

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

namespace {

// One side of a terminal size: a whole number from 1 to 4096; the message names the value.
ApiOutcome<uint16_t> TtyDimension(const json::object& o, const char* key, std::string_view where) {
  const json::value* v = o.if_contains(key);
  if (v == nullptr) {
    return ApiError::Invalid(std::string(where) + "needs \"rows\" and \"cols\"");
  }
  boost::system::error_code ec;
  const uint64_t n = v->is_number() ? v->to_number<uint64_t>(ec) : 0;
  if (!v->is_number() || ec || n < 1 || n > fs::proto::kMaxTtyDimension) {
    std::string shown;
    if (v->is_double()) {
      // Boost.JSON writes a double as 5.5E0; the shortest form that reads back is 5.5.
      char text[32];
      const auto end = std::to_chars(text, text + sizeof text, v->get_double()).ptr;
      shown.assign(text, end);
    } else {
      shown = json::serialize(*v);
    }
    if (shown.size() > 40) shown = shown.substr(0, 40) + "...";
    return ApiError::Invalid(std::string(where) + "\"" + key +
                             "\" must be a whole number from 1 to 4096, not " + shown);
  }
  return static_cast<uint16_t>(n);
}

}  // namespace

ApiOutcome<fs::proto::TtySize> TtySizeOf(const json::object& o, std::string_view where) {
  auto rows = TtyDimension(o, "rows", where);
  if (!rows.ok()) return rows.error();
  auto cols = TtyDimension(o, "cols", where);
  if (!cols.ok()) return cols.error();
  return fs::proto::TtySize{rows.value(), cols.value()};
}

ApiOutcome<ExecSpec> ParseExecRequest(const json::object& o, const SandboxEntry& entry) {
  static constexpr std::string_view kKeys[] = {
      "command", "cwd", "env", "stdin", "timeoutMs", "encoding", "detach", "stdinStream", "tty"};
  if (auto unknown = UnknownKey(o, kKeys, "exec")) return *unknown;
  Fields f(o);
  ExecSpec spec;
  auto command = f.String("command");
  if (!command.ok()) return command.error();
  if (!command.value()) return ApiError::Invalid("\"command\" is required");
  if (command.value()->find('\0') != std::string::npos) {
    return ApiError::Invalid("\"command\" contains a NUL byte");
  }
  spec.command = *command.value();
  auto cwd = f.String("cwd");
  if (!cwd.ok()) return cwd.error();
  if (cwd.value() && cwd.value()->find('\0') != std::string::npos) {
    return ApiError::Invalid("\"cwd\" contains a NUL byte");
  }
  spec.cwd = cwd.value();
  auto stdin_text = f.String("stdin");
  if (!stdin_text.ok()) return stdin_text.error();
  spec.stdin_text = stdin_text.value();
  auto timeout = f.Count("timeoutMs", 0, kMaxExecTimeoutMs);
  if (!timeout.ok()) return timeout.error();
  spec.timeout_ms = timeout.value().value_or(0);
  auto encoding = f.String("encoding");
  if (!encoding.ok()) return encoding.error();
  if (encoding.value()) {
    if (*encoding.value() == "base64") {
      spec.base64 = true;
    } else if (*encoding.value() != "utf8" && *encoding.value() != "utf-8") {
      return ApiError::Invalid("\"encoding\" must be \"utf8\" or \"base64\"");
    }
  }
  auto detach = f.Bool("detach");
  if (!detach.ok()) return detach.error();
  spec.detach = detach.value();
  auto stdin_stream = f.Bool("stdinStream");
  if (!stdin_stream.ok()) return stdin_stream.error();
  spec.stdin_stream = stdin_stream.value();
  if (const json::value* tty = o.if_contains("tty"); tty != nullptr && !tty->is_null()) {
    if (tty->is_bool()) {
      if (tty->get_bool()) spec.tty = fs::proto::TtySize{24, 80};
    } else if (tty->is_object()) {
      static constexpr std::string_view kTtyKeys[] = {"rows", "cols"};
      if (auto unknown = UnknownKey(tty->get_object(), kTtyKeys, "\"tty\"")) return *unknown;
      auto size = TtySizeOf(tty->get_object(), "\"tty\": ");
      if (!size.ok()) return size.error();
      spec.tty = size.value();
    } else {
      return ApiError::Invalid("\"tty\" must be true, false or {\"rows\": R, \"cols\": C}");
    }
  }
  for (const auto& [k, v] : entry.config().env) spec.overrides.emplace_back(k, v);
  if (const json::value* env = o.if_contains("env"); env != nullptr && !env->is_null()) {
    if (!env->is_object()) return ApiError::Invalid("\"env\" must be an object");
    for (const auto& [k, v] : env->get_object()) {
      if (v.is_null()) {
        if (std::string_view(k).find('\0') != std::string_view::npos) continue;
        spec.overrides.emplace_back(std::string(k), std::nullopt);
        continue;
      }
      if (!v.is_string()) {
        return ApiError::Invalid("\"env\": the value of " + std::string(k) +
                                 " must be a string or null");
      }
      // Its length is not checked here: a variable too long for execve makes the command one
      // that cannot be started (api.md: 200, exit code 1, E2BIG on stderr), as a command line
      // too long does, not an HTTP error.
      auto parsed = policy::ParseEnvAssignment(std::string(k) + "=" + std::string(v.get_string()),
                                               "\"env\" entry", policy::EnvLength::kUnchecked);
      if (!parsed.ok() || std::string_view(v.get_string()).find('\0') != std::string_view::npos) {
        return ApiError::Invalid(parsed.ok() ? std::string("\"env\": a value contains a NUL byte")
                                             : parsed.error().message());
      }
      spec.overrides.emplace_back(std::string(k), std::string(v.get_string()));
    }
  }
  return spec;
}

ApiOutcome<uint64_t> AttachOffset(std::string_view query, const ExecSession& s) {
  auto text = QueryValue(query, "offset");
  uint64_t offset = 0;
  if (text) {
    const bool digits =
        !text->empty() && text->size() <= 19 &&
        std::all_of(text->begin(), text->end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (!digits) {
      return ApiError::Invalid("\"offset\" must be a whole number of bytes, not \"" +
                               utf8::DecodeLossy(text->substr(0, 40)) + "\"");
    }
    offset = std::stoull(*text);
  }
  if (offset < s.oldest()) {
    return ApiError::Of(410, "offset_not_retained",
                        "offset " + std::to_string(offset) +
                            " is no longer kept; the oldest kept offset is " +
                            std::to_string(s.oldest()));
  }
  if (offset > s.end()) {
    return ApiError::Invalid("offset " + std::to_string(offset) +
                             " is beyond the end of the output, which is at offset " +
                             std::to_string(s.end()));
  }
  return offset;
}

ApiError ExecNotFound(const std::string& exec_id, const std::string& id) {
  return ApiError::Of(404, "exec_not_found",
                      "no exec '" + utf8::DecodeLossy(exec_id.substr(0, 64)) + "' in sandbox '" +
                          utf8::DecodeLossy(id) +
                          "' (it never ran, or it ended longer ago than the retention time)");
}

std::optional<ApiError> InputRefusal(const ExecSession& s) {
  if (!s.stdin_stream) {
    return ApiError::Of(409, "stdin_not_streamed",
                        "exec '" + s.id() +
                            "' was not started with \"stdinStream\": true or \"tty\"; its stdin "
                            "cannot be written");
  }
  if (s.ended()) {
    return ApiError::Of(409, "exec_ended", "exec '" + s.id() + "' has ended; its stdin is gone");
  }
  if (s.stdin_closed) {
    return ApiError::Of(409, "stdin_closed", "the stdin of exec '" + s.id() + "' was closed");
  }
  return std::nullopt;
}

ApiError InputError(const ExecSession& s, const fs::FsError& error) {
  if (error.err == EPIPE || error.err == ESRCH) {
    if (s.ended() || error.err == ESRCH) {
      return ApiError::Of(409, "exec_ended", "exec '" + s.id() + "' has ended; its stdin is gone");
    }
    // nsbox-init says why, after the channel's own tag for the exec ("exec 7: ..."), which
    // means nothing to a client: only the why is kept.
    std::string_view why = error.message;
    if (why.starts_with("exec ")) {
      size_t colon = why.find(": ");
      if (colon != std::string_view::npos) why.remove_prefix(colon + 2);
    }
    return ApiError::Of(409, "stdin_closed",
                        "the stdin of exec '" + s.id() + "' is closed (" + std::string(why) + ")");
  }
  return ApiError::FromFs(error);
}

}  // namespace nsbox::runtime::api

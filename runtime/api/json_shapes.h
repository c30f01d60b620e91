#pragma once

// The JSON shapes of api.md that more than one group of routes writes or reads: a sandbox, an
// image, an exec and its end, an error, a request body's typed fields and the paths it names.

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
#include "runtime/api/http.h"
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

std::string SignalName(int sig);

// ---- JSON shapes of api.md ----

// A sandbox's "network" (its policy) and "address" (null unless it runs with a network).
void AddNetworkJson(json::object& o, const SandboxEntry& e);

json::object SandboxJson(const SandboxEntry& e);

std::string ErrorBody(const ApiError& error);

// The typed fields of a JSON request body: each getter fails with a message
// naming the field.
class Fields {
 public:
  explicit Fields(const json::object& o) : o_(o) {}

  ApiOutcome<std::optional<std::string>> String(const char* key) const {
    const json::value* v = o_.if_contains(key);
    if (v == nullptr || v->is_null()) return std::optional<std::string>();
    if (!v->is_string()) return ApiError::Invalid(std::string("\"") + key + "\" must be a string");
    return std::optional<std::string>(std::string(v->get_string()));
  }
  ApiOutcome<bool> Bool(const char* key) const {
    const json::value* v = o_.if_contains(key);
    if (v == nullptr || v->is_null()) return false;
    if (!v->is_bool()) return ApiError::Invalid(std::string("\"") + key + "\" must be a boolean");
    return v->get_bool();
  }
  // A whole number in [min, max].
  ApiOutcome<std::optional<uint64_t>> Count(const char* key, uint64_t min, uint64_t max) const {
    const json::value* v = o_.if_contains(key);
    if (v == nullptr || v->is_null()) return std::optional<uint64_t>();
    boost::system::error_code ec;
    uint64_t n = v->is_number() ? v->to_number<uint64_t>(ec) : 0;
    if (!v->is_number() || ec || n < min || n > max) {
      return ApiError::Invalid(std::string("\"") + key + "\" must be a whole number from " +
                               std::to_string(min) + " to " + std::to_string(max));
    }
    return std::optional<uint64_t>(n);
  }

 private:
  const json::object& o_;
};

// The path of a request: `path` (UTF-8) or `pathBase64` (exact bytes), api.md
// "Paths".
ApiOutcome<std::string> RawPath(const std::optional<std::string>& path,
                                const std::optional<std::string>& path_base64);

// A path from a client made absolute against the sandbox's cwd and normalised.
// A NUL byte is invalid_request (api.md "Paths"); an empty path is Node's ENOENT, named by the
// verb's `syscall` as Node names it ("open", "stat", "scandir", "mkdir", "lstat").
ApiOutcome<std::string> SandboxPath(const SandboxEntry& entry, const std::string& raw,
                                    std::string_view syscall);

json::object ImageJson(const images::ImageInfo& info, const std::vector<std::string>& used_by);

// A key of a request body that the route does not know: an error naming it and the keys it
// takes. Never ignored (Flue's contract: "never silently ignore an option").
std::optional<ApiError> UnknownKey(const json::object& o, std::span<const std::string_view> known,
                                   std::string_view what);

// The fields of an exec's end, shared by the buffered answer, the NDJSON and WebSocket `exit`
// events and GET .../execs: the one place that builds them.
void FillExit(json::object& o, const fs::proto::ExecExit& x, const std::string& reason);

json::object ExecJson(const ExecSession& s);

}  // namespace nsbox::runtime::api

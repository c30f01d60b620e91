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

std::span<const Daemon::Handler> Daemon::Handlers() {
  static const Handler kHandlers[] = {
#define NSBOX_ROUTE(method, pattern, handler, needs) \
  {{method, pattern, RouteNeeds::needs}, &Daemon::handler},
#include "runtime/api/routes.inc"
#undef NSBOX_ROUTE
  };
  return kHandlers;
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
  // The routes of this path (routes.inc): none is a 404; none of this method a 405 that names
  // theirs, in the table's order. A method is compared whole: a request's method is any token the
  // client likes, and "UT" or "T" is not "PUT".
  const std::string_view method_name(c.parser.get().method_string());
  const Handler* route = nullptr;
  std::string allow;
  for (const Handler& h : Handlers()) {
    if (!MatchesPattern(h.spec.pattern, segs)) continue;
    if (route == nullptr && (h.spec.method == "*" || h.spec.method == method_name)) route = &h;
    allow += (allow.empty() ? "" : ", ") + std::string(h.spec.method);
  }
  if (allow.empty()) co_return co_await ReplyError(c, not_found);
  if (route == nullptr) co_return co_await MethodNotAllowed(c, allow);
  // Then the query (the HTTP path through the API passes its query on), then the name or the
  // id, then the sandbox.
  if (route->spec.method != "*") {
    if (auto bad = QueryCheck(query, segs, method)) {
      const ApiError reply_error = *bad;
      co_return co_await ReplyError(c, reply_error);
    }
  }
  RouteArgs args{segs, query, route->spec.pattern, nullptr};
  const RouteNeeds needs = route->spec.needs;
  if (needs == RouteNeeds::kImageName) {
    if (auto reason = images::InvalidImageNameReason(args.Param("name"))) {
      const ApiError reply_error = ApiError::Invalid(*reason);
      co_return co_await ReplyError(c, reply_error);
    }
  }
  // What runs inside is in use until this request's answer has ended: the idle stop waits.
  std::optional<SandboxUse> use;
  if (needs == RouteNeeds::kId || needs == RouteNeeds::kEntry || needs == RouteNeeds::kEntryInUse) {
    const std::string id = args.Param("id");
    if (auto reason = InvalidIdReason(id)) {
      {
        const ApiError reply_error = ApiError::Invalid(*reason);
        co_return co_await ReplyError(c, reply_error);
      }
    }
    c.sandbox_id = id;
    if (needs != RouteNeeds::kId) {
      auto found = co_await FindEntry(id);
      if (!found.ok()) {
        const ApiError reply_error = found.error();
        co_return co_await ReplyError(c, reply_error);
      }
      args.entry = found.value();
      if (needs == RouteNeeds::kEntryInUse) use.emplace(args.entry);
    }
  }
  co_return co_await (this->*route->handler)(c, args);
}

}  // namespace nsbox::runtime::api

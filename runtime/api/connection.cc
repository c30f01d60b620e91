// A connection of nsboxd: its requests read one after another, then for each the HTTP rules that
// come before any route (the target's form, the token, request smuggling shapes, the path's
// segments), and the route (routes.cc).

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

asio::awaitable<void> Daemon::Session(Socket socket, bool tcp) {
  beast::flat_buffer buffer;
  bool linger = false;
  std::optional<PendingAuth> auth;
  if (tcp) auth.emplace(io_, socket, unauthenticated_tcp_, auth_timeout_);
  for (;;) {
    if (auth && auth->expired()) break;
    http::request_parser<http::buffer_body> parser;
    parser.header_limit(kHeaderLimit);
    parser.body_limit(boost::none);  // JSON bodies are limited by ReadJson; uploads stream
    auto [ec, n] = co_await http::async_read_header(socket, buffer, parser, kTuple);
    (void)n;
    if (auth && auth->expired()) {
      log::debug("a TCP connection sent no request with the token within {} s: closed",
                 auth_timeout_.count());
      break;
    }
    if (ec) {
      if (ec != http::error::end_of_stream && ec != asio::error::eof &&
          ec != asio::error::connection_reset && ec != asio::error::operation_aborted) {
        // Not HTTP: one answer, then the connection closes.
        Ctx c{socket, buffer, parser, tcp, false, false, false, 0, {}, nullptr};
        bool too_big = ec == http::error::header_limit;
        {
          const ApiError reply_error =
              too_big ? ApiError::Of(431, "invalid_request", "the request's header is too large")
                      : ApiError::Invalid("malformed HTTP request: " + ec.message());
          (void)co_await ReplyError(c, reply_error);
        }
      }
      break;
    }
    Ctx c{socket, buffer, parser, tcp, false, false, false, 0, {}, auth ? &*auth : nullptr};
    c.body_done = parser.is_done();
    if (!c.body_done && parser.content_length().value_or(kSocketReadRoom) > 4096) {
      buffer.reserve(kSocketReadRoom);
    }
    auto start = Clock::now();
    // Image imports pause while it is fresh (runtime/image_imports.h); an import's own request
    // does not hold the others back.
    std::shared_ptr<void> foreground;
    if (parser.get().method() != http::verb::post ||
        !parser.get().target().starts_with("/v1/images/")) {
      foreground = import_lane_.Foreground();
    }
    bool keep = co_await Handle(c);
    foreground.reset();
    // The room its body had (kSocketReadRoom); what a client sent ahead stays.
    if (buffer.capacity() > 4096) buffer.shrink_to_fit();
    metrics_.Request(std::string_view(parser.get().method_string()), c.status);
    if (spdlog::should_log(spdlog::level::debug)) {  // its arguments cost a string
      log::debug("{} {} -> {} in {:.3f} ms{}", std::string_view(parser.get().method_string()),
                 std::string_view(parser.get().target()), c.status, SecondsSince(start) * 1000,
                 c.sandbox_id.empty() ? "" : " sandbox=" + c.sandbox_id);
    }
    if (!keep) {
      linger = !c.body_done && !parser.is_done();
      break;
    }
  }
  boost::system::error_code ignored;
  if (linger) {
    // The answer went out before the request's body was read (413, an unknown sandbox for an
    // upload): close our side, then read and drop what the client is still sending for a
    // moment, so that it can finish writing and read the answer instead of a reset.
    socket.shutdown(asio::socket_base::shutdown_send, ignored);
    asio::steady_timer deadline(io_, std::chrono::seconds(2));
    deadline.async_wait([&socket](boost::system::error_code ec) {
      boost::system::error_code e;
      if (!ec) socket.cancel(e);
    });
    std::vector<char> sink(64u << 10);
    for (size_t total = 0; total < (64u << 20);) {
      auto [ec, n] = co_await socket.async_read_some(asio::buffer(sink), kTuple);
      if (ec) break;
      total += n;
    }
    deadline.cancel();
  }
  socket.shutdown(asio::socket_base::shutdown_both, ignored);
  socket.close(ignored);
}

asio::awaitable<bool> Daemon::Handle(Ctx& c) {
  auto& req = c.parser.get();
  // A target in absolute form is routed on its path and query, and its authority stands for Host
  // (RFC 9112 §3.2.2: the Host field is then ignored). One that is malformed is a 400, after
  // the token is checked.
  std::optional<ApiError> bad_target;
  {
    auto absolute = ParseAbsoluteTarget(req.target());
    if (!absolute.ok()) {
      bad_target = absolute.error();
    } else if (absolute.value().has_value()) {
      req.set(http::field::host, absolute.value()->authority);
      req.target(absolute.value()->origin);
    }
  }
  std::string_view target = bad_target ? std::string_view() : std::string_view(req.target());
  std::string_view path = target;
  std::string_view query;
  if (auto q = target.find('?'); q != std::string_view::npos) {
    path = target.substr(0, q);
    query = target.substr(q + 1);
  }
  if (c.tcp) {
    std::string_view auth = req[http::field::authorization];
    const std::optional<std::string_view> presented_token = BearerCredentials(auth);
    bool ok = presented_token && TokenMatches(*presented_token, token_);
    // Browsers cannot send a bearer header: under .../ports/{port}/http/, ?nsbox_token= once
    // (answered with a cookie for that path only), then the cookie.
    const std::string prefix = ok ? std::string() : ProxyPrefix(path);
    if (!prefix.empty()) {
      const auto presented = QueryValue(query, kTokenCookie);
      if (presented && TokenMatches(*presented, token_)) {
        const std::string rest = QueryWithout(query, kTokenCookie);
        http::response<http::string_body> res{http::status::found, 11};
        res.set(http::field::server, std::string("nsboxd/") + kVersion);
        res.set(http::field::location,
                std::string(path) + (rest.empty() ? std::string() : "?" + rest));
        res.set(http::field::set_cookie, std::string(kTokenCookie) + "=" +
                                             ProxyCookieValue(token_, prefix) + "; Path=" + prefix +
                                             "; HttpOnly; SameSite=Strict");
        res.set(http::field::cache_control, "no-store");
        res.keep_alive(false);
        res.prepare_payload();
        c.status = 302;
        c.must_close = true;
        (void)co_await http::async_write(c.socket, res, kTuple);
        co_return false;
      }
      const CookieSplit cookies = SplitCookies(req);
      ok = cookies.token && TokenMatches(*cookies.token, ProxyCookieValue(token_, prefix));
    }
    if (ok && c.auth != nullptr) c.auth->Passed();
    if (!ok) {
      {
        const ApiError reply_error =
            ApiError::Of(401, "unauthorized",
                         auth.empty() ? "this listener needs an Authorization: Bearer token"
                                      : "the bearer token is not valid");
        co_return co_await ReplyError(c, reply_error);
      }
    }
  }
  // Request smuggling shapes (RFC 9112 6.1, 6.3): a Transfer-Encoding other than exactly
  // "chunked", or one beside a Content-Length, would make a proxy and this daemon disagree on
  // where the body ends. Refused, and the connection closed (case
  // RequestSmugglingShapesAreRefused).
  if (req.count(http::field::transfer_encoding) > 0) {
    const bool chunked_only = req.count(http::field::transfer_encoding) == 1 &&
                              beast::iequals(req[http::field::transfer_encoding], "chunked");
    if (!chunked_only || req.count(http::field::content_length) > 0) {
      const ApiError reply_error = ApiError::Invalid(
          "Transfer-Encoding must be exactly \"chunked\", and never beside Content-Length");
      c.must_close = true;  // where this request ends is not known: nothing after it is read
      co_return co_await ReplyError(c, reply_error);
    }
  }
  if (bad_target) {
    const ApiError reply_error = *bad_target;
    co_return co_await ReplyError(c, reply_error);
  }
  if (path.empty() || path[0] != '/') {
    {
      const ApiError reply_error = ApiError::Of(404, "not_found", "no such route");
      co_return co_await ReplyError(c, reply_error);
    }
  }
  std::vector<std::string> segs;
  size_t pos = 1;
  for (;;) {
    size_t slash = path.find('/', pos);
    auto decoded = PercentDecode(
        path.substr(pos, slash == std::string_view::npos ? std::string_view::npos : slash - pos),
        false);
    if (!decoded) {
      const ApiError reply_error = ApiError::Invalid("malformed percent-encoding");
      co_return co_await ReplyError(c, reply_error);
    }
    segs.push_back(std::move(*decoded));
    if (slash == std::string_view::npos) break;
    pos = slash + 1;
  }
  co_return co_await Route(c, segs, query);
}

}  // namespace nsbox::runtime::api

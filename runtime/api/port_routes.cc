// Exposed ports (runtime/ports.h): GET/POST .../ports, DELETE .../ports/{port}, and the HTTP path
// through the API to a port inside (.../ports/{port}/http/...).

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
#include "runtime/byte_relay.h"
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

// The {port} of .../ports/{port} and .../ports/{port}/http/...: an integer from 1 to 65535, of at
// most 5 digits.
ApiOutcome<uint16_t> PortSegment(const std::string& text) {
  const bool digits = !text.empty() && text.size() <= 5 &&
                      text.find_first_not_of("0123456789") == std::string::npos;
  const unsigned long number = digits ? std::stoul(text) : 0;
  if (!digits || number < 1 || number > 65535) {
    return ApiError::Invalid("port must be an integer from 1 to 65535, not '" + text.substr(0, 64) +
                             "'");
  }
  return static_cast<uint16_t>(number);
}

// The field names that the Connection fields of `fields` list: hop-by-hop too (RFC 9110 7.6.1).
// Gathered once per message; they view into `fields`.
template <typename Fields>
std::vector<std::string_view> ConnectionNamed(const Fields& fields) {
  std::vector<std::string_view> names;
  for (const auto& f : fields) {
    if (f.name() != http::field::connection) continue;
    AnyListItem(f.value(), ',', [&names](std::string_view item) {
      names.push_back(item);
      return false;  // every item
    });
  }
  return names;
}

bool Listed(const std::vector<std::string_view>& names, std::string_view name) {
  return std::any_of(names.begin(), names.end(),
                     [name](std::string_view n) { return beast::iequals(n, name); });
}

// A Set-Cookie of the upstream's that would plant the token cookie: the sandbox's pages share
// the daemon's origin, and may not.
bool PlantsTokenCookie(http::field f, std::string_view value) {
  return f == http::field::set_cookie &&
         beast::iequals(TrimBlanks(value).substr(0, kTokenCookie.size() + 1),
                        std::string(kTokenCookie) + "=");
}

// Hop-by-hop fields (RFC 9110 7.6.1) and the framing the proxy sets itself: never copied across.
bool HopByHop(http::field f, std::string_view name) {
  switch (f) {
    case http::field::connection:
    case http::field::keep_alive:
    case http::field::proxy_authenticate:
    case http::field::proxy_authorization:
    case http::field::proxy_connection:
    case http::field::te:
    case http::field::trailer:
    case http::field::transfer_encoding:
    case http::field::upgrade:
    case http::field::content_length:
      return true;
    default:
      return beast::iequals(name, "keep-alive");
  }
}

}  // namespace

// ---- exposed ports ----

asio::awaitable<bool> Daemon::HttpProxy(Ctx& c, const RouteArgs& a) {
  std::shared_ptr<SandboxEntry> entry = a.entry;
  auto parsed_port = PortSegment(a.segs[4]);
  if (!parsed_port.ok()) {
    const ApiError reply_error = parsed_port.error();
    co_return co_await ReplyError(c, reply_error);
  }
  const uint16_t port = parsed_port.value();
  auto& req = c.parser.get();
  c.must_close = true;
  const std::string_view target = req.target();
  const size_t q = target.find('?');
  const std::string_view path = target.substr(0, q);
  const std::string prefix = ProxyPrefix(path);  // with its trailing '/'
  std::string upstream_target =
      prefix.empty() ? std::string("/") : std::string(path.substr(prefix.size() - 1));
  if (q != std::string_view::npos) {
    // The token, given in the query beside a bearer header, is the daemon's: never the sandbox's.
    const std::string rest = QueryWithout(target.substr(q + 1), kTokenCookie);
    if (!rest.empty()) upstream_target += "?" + rest;
  }

  auto connected = co_await ports_.ConnectInside(entry, port);
  if (!connected.ok()) {
    const ApiError reply_error = connected.error();
    co_return co_await ReplyError(c, reply_error);
  }
  std::shared_ptr<asio::ip::tcp::socket> up = connected.value();
  const bool upgrade = websocket::is_upgrade(req);

  // The request upstream: the client's fields less the hop-by-hop ones and every secret of ours.
  http::request<http::buffer_body> ureq;
  ureq.method_string(req.method_string());
  ureq.target(upstream_target);
  ureq.version(11);
  const std::vector<std::string_view> hop_names = ConnectionNamed(req);
  for (const auto& f : req) {
    // Expect is answered here (SendContinue, below), not by the upstream: its interim 100
    // would otherwise be taken for its answer and the body never sent.
    if (HopByHop(f.name(), f.name_string()) || Listed(hop_names, f.name_string()) ||
        f.name() == http::field::expect || f.name() == http::field::authorization ||
        f.name() == http::field::cookie || f.name() == http::field::host ||
        beast::iequals(f.name_string(), "x-forwarded-for") ||
        beast::iequals(f.name_string(), "x-forwarded-prefix") ||
        beast::iequals(f.name_string(), "x-forwarded-proto") ||
        beast::iequals(f.name_string(), "x-forwarded-host")) {
      continue;
    }
    ureq.insert(f.name_string(), f.value());
  }
  const CookieSplit cookies = SplitCookies(req);
  if (!cookies.others.empty()) ureq.set(http::field::cookie, cookies.others);
  ureq.set(http::field::host, "127.0.0.1:" + std::to_string(port));
  ureq.set("X-Forwarded-Prefix", prefix.empty() ? prefix : prefix.substr(0, prefix.size() - 1));
  std::string peer = "unix";
  if (c.tcp) {
    boost::system::error_code ec;
    auto ep = c.socket.remote_endpoint(ec);
    char text[INET6_ADDRSTRLEN] = {};
    if (!ec && ep.size() >= sizeof(sockaddr_in) && ep.data()->sa_family == AF_INET) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(ep.data());
      ::inet_ntop(AF_INET, &sin->sin_addr, text, sizeof text);
      peer = text;
    } else if (!ec && ep.size() >= sizeof(sockaddr_in6) && ep.data()->sa_family == AF_INET6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(ep.data());
      ::inet_ntop(AF_INET6, &sin6->sin6_addr, text, sizeof text);
      peer = text;
    }
  }
  ureq.set("X-Forwarded-For", peer);
  ureq.set("X-Forwarded-Proto", "http");
  ureq.set("X-Forwarded-Host", req[http::field::host]);
  if (upgrade) {
    ureq.set(http::field::connection, "Upgrade");
    ureq.set(http::field::upgrade, req[http::field::upgrade]);
  } else {
    ureq.set(http::field::connection, "close");
  }
  const bool has_body = !c.body_done || req.has_content_length() || req.chunked();
  if (req.has_content_length()) {
    ureq.content_length(c.parser.content_length().value_or(0));
  } else if (req.chunked()) {
    ureq.chunked(true);
  }
  std::vector<char> buf(64u << 10);
  ureq.body().data = nullptr;
  ureq.body().size = 0;
  ureq.body().more = has_body;
  http::request_serializer<http::buffer_body> usr{ureq};
  bool upstream_failed = false;
  {
    auto [ec, n] = co_await http::async_write_header(*up, usr, kTuple);
    (void)n;
    upstream_failed = static_cast<bool>(ec);
  }
  if (!upstream_failed && has_body && !co_await SendContinue(c)) co_return false;
  while (!upstream_failed && has_body && !c.parser.is_done()) {
    std::string hangup;
    auto got = co_await ReadBodyPiece(c, buf, &hangup);
    if (!got) co_return false;  // the client went away
    if (*got == 0) continue;
    ureq.body().data = buf.data();
    ureq.body().size = *got;
    ureq.body().more = true;
    auto [ec, n] = co_await http::async_write(*up, usr, kTuple);
    (void)n;
    if (ec && ec != http::error::need_buffer) upstream_failed = true;
  }
  c.body_done = c.parser.is_done();
  if (!upstream_failed && has_body) {
    ureq.body().data = nullptr;
    ureq.body().size = 0;
    ureq.body().more = false;
    auto [ec, n] = co_await http::async_write(*up, usr, kTuple);
    (void)n;
    if (ec && ec != http::error::need_buffer) upstream_failed = true;
  }
  if (upstream_failed) {
    const ApiError reply_error = ApiError::Of(
        502, "upstream_unreachable",
        "the server on port " + std::to_string(port) + " inside closed the connection");
    co_return co_await ReplyError(c, reply_error);
  }

  // The answer, streamed back. A client that hangs up while the upstream has not answered ends
  // the wait (an upstream that never answers held two of the daemon's fds per abandoned request
  // until the sandbox was deleted).
  auto watch = std::make_shared<HangupWatch>();
  WatchHangup(c, watch, [watch, up] {
    watch->hung_up = true;
    boost::system::error_code ignored;
    up->close(ignored);
  });
  auto end_watch = [&c, watch] {
    watch->finished = true;
    boost::system::error_code ignored;
    c.socket.cancel(ignored);
  };
  beast::flat_buffer ubuf;
  // Interim answers (100 Continue, 103 Early Hints) are skipped: the next one is the answer.
  std::optional<http::response_parser<http::buffer_body>> parser;
  for (int interim = 0;; ++interim) {
    parser.emplace();
    parser->header_limit(kHeaderLimit);
    parser->body_limit(boost::none);
    if (req.method() == http::verb::head) parser->skip(true);
    auto [ec, n] = co_await http::async_read_header(*up, ubuf, *parser, kTuple);
    (void)n;
    if (watch->hung_up) co_return false;
    if (ec) {
      end_watch();
      const ApiError reply_error =
          ApiError::Of(502, "upstream_unreachable",
                       "the server on port " + std::to_string(port) +
                           " inside sent no valid HTTP answer: " + ec.message());
      co_return co_await ReplyError(c, reply_error);
    }
    const unsigned code = parser->get().result_int();
    if (code >= 200 || code == 101 || code < 100 || interim == 16) break;
  }
  end_watch();
  http::response_parser<http::buffer_body>& p = *parser;
  const auto& ures = p.get();
  c.status = static_cast<int>(ures.result_int());
  if (upgrade && ures.result() == http::status::switching_protocols) {
    http::response<http::empty_body> res{http::status::switching_protocols, 11};
    for (const auto& f : ures) {
      if (!PlantsTokenCookie(f.name(), f.value())) res.insert(f.name_string(), f.value());
    }
    auto [ec, n] = co_await http::async_write(c.socket, res, kTuple);
    (void)n;
    if (ec) co_return false;
    // What either side sent beyond the headers goes first, then raw bytes both ways.
    if (ubuf.size() > 0) {
      auto [wec, w] = co_await asio::async_write(c.socket, ubuf.data(), kTuple);
      (void)w;
      if (wec) co_return false;
    }
    if (c.buffer.size() > 0) {
      auto [wec, w] = co_await asio::async_write(*up, c.buffer.data(), kTuple);
      (void)w;
      if (wec) co_return false;
      c.buffer.consume(c.buffer.size());
    }
    auto done = std::make_shared<asio::steady_timer>(io_, asio::steady_timer::time_point::max());
    auto keep = std::shared_ptr<void>(nullptr, [done](void*) { done->cancel(); });
    // An error either way resets both sides, as an exposed port's relay does.
    std::function<void()> abort = [&socket = c.socket, up] {
      Reset(socket);
      Reset(*up);
    };
    asio::co_spawn(io_, Pipe(keep, c.socket, *up, abort), asio::detached);
    asio::co_spawn(io_, Pipe(keep, *up, c.socket, abort), asio::detached);
    keep.reset();
    (void)co_await done->async_wait(kTuple);
    co_return false;
  }
  http::response<http::buffer_body> res;
  res.result(ures.result_int());
  res.version(11);
  const std::vector<std::string_view> upstream_hop_names = ConnectionNamed(ures);
  for (const auto& f : ures) {
    if (HopByHop(f.name(), f.name_string()) || Listed(upstream_hop_names, f.name_string()) ||
        PlantsTokenCookie(f.name(), f.value())) {
      continue;
    }
    res.insert(f.name_string(), f.value());
  }
  const unsigned code = ures.result_int();
  const bool bodyless =
      req.method() == http::verb::head || code == 204 || code == 304 || (code >= 100 && code < 200);
  if (!bodyless && p.content_length()) {
    res.content_length(*p.content_length());
  } else if (!bodyless) {
    res.chunked(true);
  } else if (ures.has_content_length()) {
    res.set(http::field::content_length, ures[http::field::content_length]);
  }
  res.keep_alive(false);
  res.body().data = nullptr;
  res.body().size = 0;
  res.body().more = !bodyless;
  http::response_serializer<http::buffer_body> sr{res};
  {
    auto [ec, n] = co_await http::async_write_header(c.socket, sr, kTuple);
    (void)n;
    if (ec) co_return false;
  }
  ubuf.reserve(kSocketReadRoom);
  while (!bodyless && !p.is_done()) {
    p.get().body().data = buf.data();
    p.get().body().size = buf.size();
    auto [ec, n] = co_await http::async_read(*up, ubuf, p, kTuple);
    (void)n;
    if (ec == http::error::need_buffer) ec = {};
    // What came before an upstream cut its answer short still goes to the client (it was
    // dropped), which then sees the answer end early.
    const size_t got = buf.size() - p.get().body().size;
    if (got > 0) {
      res.body().data = buf.data();
      res.body().size = got;
      res.body().more = true;
      metrics_.BytesOut(got);
      auto [wec, w] = co_await http::async_write(c.socket, sr, kTuple);
      (void)w;
      if (wec && wec != http::error::need_buffer) co_return false;
    }
    if (ec) co_return false;
  }
  if (!bodyless) {
    res.body().data = nullptr;
    res.body().size = 0;
    res.body().more = false;
    auto [ec, n] = co_await http::async_write(c.socket, sr, kTuple);
    (void)n;
  }
  co_return false;
}

asio::awaitable<ApiOutcome<int>> Daemon::InnerSocket(std::shared_ptr<SandboxEntry> entry) {
  // A connection to an exposed port uses the sandbox as a request does: one that starts it (a
  // port scanner's, say) gives it its idle time before the idle stop stops it again.
  SandboxUse use(entry);
  auto running = co_await EnsureRunning(entry);
  if (!running.ok()) co_return running.error();
  std::shared_ptr<Sandbox> box = running.value();
  auto work = [box]() -> ApiOutcome<int> {
    auto sock = SocketInNetns(box->netns_fd(), AF_INET, SOCK_STREAM | SOCK_NONBLOCK);
    if (!sock.ok()) return ApiError::Internal(sock.error().message());
    return std::move(sock).value().release();
  };
  co_return co_await Blocking(std::move(work));
}

asio::awaitable<void> Daemon::SavePorts(std::shared_ptr<SandboxEntry> entry) {
  auto snapshot = ports_.SnapshotOf(entry->config().id);
  auto work = [this, entry, snapshot] {
    auto st = ports_.WritePorts(entry->config().id, entry->dir(), snapshot);
    if (!st.ok()) {
      log::error("sandbox={} write ports.json: {}", entry->config().id, st.error().message());
    }
    return true;
  };
  co_await Blocking(std::move(work));
}

void Daemon::RestorePorts() {
  for (const auto& entry : registry_.List()) {
    const std::string file = entry->dir() + "/ports.json";
    if (::access(file.c_str(), F_OK) != 0) continue;
    auto text = ReadFile(file);
    auto ports = text.ok() ? DecodePorts(*text) : Result<std::vector<PortExposure>>(text.error());
    if (!ports.ok()) {
      log::error("sandbox={} {}: {}; its ports are dropped", entry->config().id, file,
                 ports.error().message());
      (void)ports_.WritePorts(entry->config().id, entry->dir(),
                              ports_.SnapshotOf(entry->config().id));
      continue;
    }
    bool dropped = false;
    for (const auto& p : *ports) {
      auto exposed = ports_.Expose(entry, p.port, p.host_port, p.address);
      if (!exposed.ok()) {
        log::error("sandbox={} port {} not re-opened on {}:{}: {}; dropped", entry->config().id,
                   p.port, p.address, p.host_port, exposed.error().message);
        dropped = true;
      }
    }
    if (dropped) {
      auto st = ports_.WritePorts(entry->config().id, entry->dir(),
                                  ports_.SnapshotOf(entry->config().id));
      if (!st.ok())
        log::error("sandbox={} write ports.json: {}", entry->config().id, st.error().message());
    }
  }
}

namespace {

json::object PortJson(const PortExposure& p) {
  json::object o;
  o["port"] = p.port;
  o["address"] = p.address;
  o["hostPort"] = p.host_port;
  o["url"] = "http://" + p.address + ":" + std::to_string(p.host_port) + "/";
  return o;
}

}  // namespace

asio::awaitable<bool> Daemon::Ports(Ctx& c, const RouteArgs& a) {
  std::shared_ptr<SandboxEntry> entry = a.entry;
  const std::vector<std::string>& segs = a.segs;
  const http::verb method = c.parser.get().method();
  const std::string& id = entry->config().id;
  if (segs.size() == 4 && method == http::verb::get) {
    json::array list;
    for (const auto& p : ports_.List(id)) list.push_back(PortJson(p));
    json::object o;
    o["ports"] = std::move(list);
    co_return co_await ReplyJson(c, 200, o);
  }
  if (segs.size() == 4) {  // POST
    auto body = co_await ReadJson(c, false);
    if (!body.ok()) {
      const ApiError reply_error = body.error();
      co_return co_await ReplyError(c, reply_error);
    }
    const json::object& o = body.value();
    static constexpr std::string_view kKeys[] = {"port", "hostPort", "address"};
    if (auto unknown = UnknownKey(o, kKeys, "a port")) {
      const ApiError reply_error = *unknown;
      co_return co_await ReplyError(c, reply_error);
    }
    auto port = ParsePortNumber(o.if_contains("port"), "port", false);
    const json::value* hp = o.if_contains("hostPort");
    const json::value zero(0);
    auto host_port = ParsePortNumber(hp == nullptr || hp->is_null() ? &zero : hp, "hostPort", true);
    auto address = ParseHostAddress(o.if_contains("address"));
    if (!port.ok()) {
      const ApiError reply_error = port.error();
      co_return co_await ReplyError(c, reply_error);
    }
    if (!host_port.ok()) {
      const ApiError reply_error = host_port.error();
      co_return co_await ReplyError(c, reply_error);
    }
    if (!address.ok()) {
      const ApiError reply_error = address.error();
      co_return co_await ReplyError(c, reply_error);
    }
    auto exposed = ports_.Expose(entry, port.value(), host_port.value(), address.value());
    if (!exposed.ok()) {
      const ApiError reply_error = exposed.error();
      co_return co_await ReplyError(c, reply_error);
    }
    co_await SavePorts(entry);
    const json::value reply_json = PortJson(exposed.value());
    co_return co_await ReplyJson(c, 201, reply_json);
  }
  // DELETE .../ports/{port}
  const std::string& text = segs[4];
  auto port = PortSegment(text);
  if (!port.ok()) {
    const ApiError reply_error = port.error();
    co_return co_await ReplyError(c, reply_error);
  }
  if (!ports_.Close(id, port.value())) {
    const ApiError reply_error =
        ApiError::Of(404, "not_found", "port " + text + " of sandbox '" + id + "' is not exposed");
    co_return co_await ReplyError(c, reply_error);
  }
  co_await SavePorts(entry);
  co_return co_await ReplyNoContent(c);
}

}  // namespace nsbox::runtime::api

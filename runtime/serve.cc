// `nsbox serve`: nsboxd's listeners and its start and end; the daemon itself is runtime/api/
// (daemon.h, and a file for each group of routes: docs/architecture.md).

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
#include "runtime/serve.h"
#include "runtime/units.h"
#include "runtime/version.h"

namespace nsbox::runtime::api {

namespace {

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

// One direction of an upgraded connection: bytes until the end, then the end passed on as a
// shutdown of the other side's sending half; an error closes both.
template <typename From, typename To>
asio::awaitable<void> PipeBytes(std::shared_ptr<void> /*keep*/, From& from, To& to) {
  std::vector<char> buf(64u << 10);
  for (;;) {
    auto [ec, n] = co_await from.async_read_some(asio::buffer(buf), kTuple);
    if (ec) {
      boost::system::error_code ignored;
      if (ec == asio::error::eof) {
        to.shutdown(asio::socket_base::shutdown_send, ignored);
      } else {
        to.close(ignored);
      }
      co_return;
    }
    auto [wec, written] = co_await asio::async_write(to, asio::buffer(buf.data(), n), kTuple);
    (void)written;
    if (wec) {
      boost::system::error_code ignored;
      from.close(ignored);
      co_return;
    }
  }
}

// ---- exposed ports ----

}  // namespace

asio::awaitable<bool> Daemon::HttpProxy(Ctx& c, std::shared_ptr<SandboxEntry> entry,
                                        uint16_t port) {
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
    asio::co_spawn(io_, PipeBytes(keep, c.socket, *up), asio::detached);
    asio::co_spawn(io_, PipeBytes(keep, *up, c.socket), asio::detached);
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

asio::awaitable<bool> Daemon::Ports(Ctx& c, std::shared_ptr<SandboxEntry> entry,
                                    const std::vector<std::string>& segs) {
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
  const bool digits =
      !text.empty() && text.size() <= 5 &&
      std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  const unsigned long number = digits ? std::stoul(text) : 0;
  if (!digits || number < 1 || number > 65535) {
    const ApiError reply_error = ApiError::Invalid(
        "port must be an integer from 1 to 65535, not '" + text.substr(0, 64) + "'");
    co_return co_await ReplyError(c, reply_error);
  }
  if (!ports_.Close(id, static_cast<uint16_t>(number))) {
    const ApiError reply_error =
        ApiError::Of(404, "not_found", "port " + text + " of sandbox '" + id + "' is not exposed");
    co_return co_await ReplyError(c, reply_error);
  }
  co_await SavePorts(entry);
  co_return co_await ReplyNoContent(c);
}

namespace {

// ---- images ----

}  // namespace

asio::awaitable<bool> Daemon::Images(Ctx& c, const std::vector<std::string>& segs,
                                     std::string_view query) {
  const http::verb method = c.parser.get().method();
  if (segs.size() == 2) {
    if (method != http::verb::get) co_return co_await MethodNotAllowed(c, "GET");
    if (auto bad = QueryCheck(query, segs, method)) {
      const ApiError reply_error = *bad;
      co_return co_await ReplyError(c, reply_error);
    }
    json::array list;
    for (const auto& info : registry_.images().List()) {
      list.push_back(ImageJson(info, registry_.SandboxesOfImage(info.name)));
    }
    json::object o;
    o["images"] = std::move(list);
    co_return co_await ReplyJson(c, 200, o);
  }
  const std::string& name = segs[2];
  if (method != http::verb::get && method != http::verb::post && method != http::verb::delete_) {
    co_return co_await MethodNotAllowed(c, "GET, POST, DELETE");
  }
  if (auto bad = QueryCheck(query, segs, method)) {
    const ApiError reply_error = *bad;
    co_return co_await ReplyError(c, reply_error);
  }
  if (auto reason = images::InvalidImageNameReason(name)) {
    const ApiError reply_error = ApiError::Invalid(*reason);
    co_return co_await ReplyError(c, reply_error);
  }
  if (method == http::verb::post) {
    auto replace = QueryBool(query, "replace");
    if (!replace.ok()) {
      const ApiError reply_error = replace.error();
      co_return co_await ReplyError(c, reply_error);
    }
    auto max_bytes = QueryMaxBytes(QueryValue(query, "maxBytes"));
    if (!max_bytes.ok()) {
      const ApiError reply_error = max_bytes.error();
      co_return co_await ReplyError(c, reply_error);
    }
    co_return co_await ImportImage(c, name, replace.value(), max_bytes.value());
  }
  if (method == http::verb::delete_) {
    auto work = [this, name] { return registry_.RemoveImage(name); };
    auto removed = co_await Blocking(std::move(work));
    if (!removed.ok()) {
      const ApiError reply_error = removed.error();
      co_return co_await ReplyError(c, reply_error);
    }
    co_return co_await ReplyNoContent(c);
  }
  auto info = registry_.images().Find(name);
  if (!info) {
    const ApiError reply_error = ApiError::ImageNotFound(name);
    co_return co_await ReplyError(c, reply_error);
  }
  const json::value reply_json = ImageJson(*info, registry_.SandboxesOfImage(name));
  co_return co_await ReplyJson(c, 200, reply_json);
}

// The tarball is spooled to the state dir as it comes (an OCI or docker archive must be read
// out of order, and a slow client must not hold an import half-done), then imported on a thread
// of the import lane, within the import's budget (runtime/image_imports.h). With Accept:
// application/x-ndjson the answer is a stream of progress events ending with the image or the
// error.
asio::awaitable<bool> Daemon::ImportImage(Ctx& c, const std::string& name, bool replace,
                                          std::optional<uint64_t> max_bytes) {
  if (!replace && registry_.images().Find(name)) {
    const ApiError reply_error =
        ApiError::Of(409, "image_exists",
                     "an image named '" + name + "' exists already (replace it with ?replace=1)");
    co_return co_await ReplyError(c, reply_error);
  }
  // A place in the import lane from the first byte spooled until the import's job has ended
  // (docs/images.md "Limits"); none left: 429, before the body is read.
  std::shared_ptr<void> ticket = import_lane_.TryEnter();
  if (!ticket) {
    const ApiError reply_error = LaneFull(import_lane_);
    co_return co_await ReplyError(c, reply_error);
  }
  std::shared_ptr<images::ImportBudget> budget =
      import_lane_.NewBudget(registry_.images().dir(), max_bytes);
  if (auto length = c.parser.content_length(); length && *length > budget->limits().max_bytes) {
    const ApiError reply_error = UploadTooLarge(*budget, *length);
    co_return co_await ReplyError(c, reply_error);
  }
  const std::string spool = registry_.NewUploadPath();
  // Made on the worker pool: a file's creation waits for the file system's journal. A file system
  // already short of the free space imports keep is refused first.
  auto make_spool = [spool, budget]() -> Result<UniqueFd> {
    NSBOX_TRY(budget->CheckFreeSpace());
    UniqueFd made(::open(spool.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!made.valid()) return Error::Sys("open", spool, errno).Context("spool the upload");
    return made;
  };
  Result<UniqueFd> made = co_await Blocking(std::move(make_spool));
  if (!made.ok()) {
    const auto refused = BudgetError(*budget, made.error());
    const ApiError reply_error = refused ? *refused : ApiError::Internal(made.error().message());
    co_return co_await ReplyError(c, reply_error);
  }
  UniqueFd fd = std::move(made.value());
  // Removed before the answer, on the worker pool (freeing a large file's blocks took 60-140 ms
  // for 512 MiB here); here only if this ends otherwise, before a byte was spooled.
  struct Unlink {
    std::string path;
    ~Unlink() { ::unlink(path.c_str()); }
  } unlink_spool{spool};

  if (!co_await SendContinue(c)) co_return false;
  // Each piece is counted against the budget before it is written (a chunked body has no length).
  const WriteCheck charge = [budget](size_t n) {
    return budget->Charge(images::ImportBudget::Step::kUpload, n, "the upload");
  };
  const BodyCopy copied = co_await CopyBodyTo(c, fd.get(), spool, &charge);
  fd.reset();  // still linked: its blocks stay until the unlink
  if (!copied.hangup.empty() || copied.write_error != 0 || copied.bytes == 0) {
    co_await RemoveFile(spool);
  }
  if (!copied.hangup.empty()) {
    log::info("image={} the upload ended early after {} bytes ({}); nothing imported", name,
              copied.bytes, copied.hangup);
    co_return false;
  }
  if (copied.write_error != 0) {
    const int err = copied.write_error;
    const auto refused = BudgetError(*budget, Error(err, budget->stop_message()));
    const ApiError reply_error =
        refused ? *refused
                : ApiError::Of(
                      StatusForErrno(err), ErrnoName(err),
                      Error::Sys("write", spool, err).Context("spool the image upload").message());
    co_return co_await ReplyError(c, reply_error);
  }
  const uint64_t total = copied.bytes;
  if (total == 0) {
    const ApiError reply_error =
        ApiError::Of(400, "invalid_image", "the request has no body: send the image's tarball");
    co_return co_await ReplyError(c, reply_error);
  }
  log::info("image={} received {} bytes; importing", name, total);
  ++running_imports_;
  struct Answered {
    std::atomic<int>& n;
    ~Answered() { --n; }
  } answered{running_imports_};

  const bool stream = WantsNdjson(c.parser.get()[http::field::accept]);
  struct ImportEvent {
    std::optional<images::ImportProgress> progress;
    std::optional<ApiOutcome<images::ImageInfo>> done;
  };
  auto queue = std::make_shared<LoopQueue<ImportEvent>>(io_.get_executor());
  images::ProgressFn progress;
  if (stream) {
    progress = [queue](const images::ImportProgress& update) {
      queue->Push(ImportEvent{update, std::nullopt});
    };
  }
  const bool existed = registry_.images().Find(name).has_value();
  auto import_work = [this, name, spool, replace, progress, queue, budget, ticket] {
    auto done = registry_.ImportImage(name, spool, replace, progress, budget.get());
    UnlinkLogged(spool);
    if (!done.ok()) {
      // The client sent a body, not a file: its errors name it so, not the daemon's spool.
      ApiError error = done.error();
      for (size_t at = error.message.find(spool); at != std::string::npos;
           at = error.message.find(spool, at)) {
        error.message.replace(at, spool.size(), "the uploaded image");
      }
      done = std::move(error);
    }
    queue->Push(ImportEvent{std::nullopt, std::move(done)});
  };
  // On a thread of the import lane, never one of the worker pool's; its result arrives through
  // the queue. A client that hangs up ends it at its next read or write, and it publishes
  // nothing (what it wrote is removed).
  import_lane_.Run(std::move(import_work));
  auto watch = std::make_shared<HangupWatch>();
  WatchHangup(c, watch, [watch, budget] {
    watch->hung_up = true;
    budget->ClientGone();
  });
  auto end_watch = [&c, watch] {
    watch->finished = true;
    boost::system::error_code ignored;
    c.socket.cancel(ignored);
  };

  if (!stream) {
    for (;;) {
      for (auto& event : co_await queue->Next()) {
        if (!event.done) continue;
        end_watch();
        if (watch->hung_up) co_return false;  // nobody to answer
        if (!event.done->ok()) {
          const ApiError reply_error = event.done->error();
          co_return co_await ReplyError(c, reply_error);
        }
        const json::value reply_json =
            ImageJson(event.done->value(), registry_.SandboxesOfImage(name));
        co_return co_await ReplyJson(c, existed ? 200 : 201, reply_json);
      }
    }
  }

  bool alive = co_await StartNdjson(c);
  if (!alive) budget->ClientGone();
  std::string lines;  // the events of one wake-up, sent in one write
  for (;;) {
    for (auto& event : co_await queue->Next()) {
      json::object o;
      if (event.progress) {
        const images::ImportProgress& update = *event.progress;
        o["type"] = "progress";
        o["phase"] = update.phase;
        o["layer"] = update.layer;
        o["layers"] = update.layers;
        o["bytesRead"] = update.bytes_read;
        o["bytesTotal"] = update.bytes_total;
      } else if (event.done->ok()) {
        o["type"] = "image";
        o["image"] = ImageJson(event.done->value(), registry_.SandboxesOfImage(name));
      } else {
        const ApiError& error = event.done->error();
        o["type"] = "error";
        json::object e;
        e["code"] = error.code;
        e["message"] = utf8::DecodeLossy(error.message);
        o["error"] = std::move(e);
        o["status"] = error.status;
      }
      lines += json::serialize(o);
      lines += '\n';
      if (event.done) {
        end_watch();
        if (!alive || watch->hung_up || !co_await SendChunk(c, lines, /*last=*/true)) {
          co_return false;
        }
        co_return c.parser.get().keep_alive() && !shutting_down_;
      }
    }
    if (alive && !watch->hung_up) {
      alive = co_await SendChunk(c, lines, /*last=*/false);
      if (!alive) budget->ClientGone();  // the import ends; its end is still awaited
    } else {
      lines.clear();
    }
  }
}

}  // namespace nsbox::runtime::api

namespace nsbox::runtime {

namespace {

namespace asio = boost::asio;
using api::Acceptor;
using api::Daemon;
using api::SignalName;

// ---- listeners ----

// A daemon SIGKILLed while it cloned a jail leaves the clone with copies of its listening
// sockets until the clone dies too (of PR_SET_PDEATHSIG, well under a millisecond here): a socket
// that still answers, or a port still in use, is looked at again for this long before a new
// daemon gives up on it, so that a restart at once (systemd, a script) is not refused.
constexpr auto kPredecessorGrace = std::chrono::milliseconds(1000);
constexpr auto kPredecessorRetry = std::chrono::milliseconds(10);

Result<std::unique_ptr<Acceptor>> ListenUnix(asio::io_context& io, const std::string& path) {
  std::error_code fec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), fec);
  if (fec)
    return Error(fec.value(), "create the socket's directory for " + path + ": " + fec.message());
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Error(EEXIST, path + " exists and is not a socket; refusing to replace it");
    }
    // A live daemon answers; a dead one's socket is only a name.
    const auto give_up = std::chrono::steady_clock::now() + kPredecessorGrace;
    for (;;) {
      asio::local::stream_protocol::socket probe(io);
      boost::system::error_code ec;
      probe.connect(asio::local::stream_protocol::endpoint(path), ec);
      if (ec) break;
      if (std::chrono::steady_clock::now() >= give_up) {
        return Error(EADDRINUSE, "another nsboxd is already listening on " + path);
      }
      std::this_thread::sleep_for(kPredecessorRetry);
    }
    if (::unlink(path.c_str()) != 0) return Error::Sys("unlink", path, errno);
  }
  auto acceptor = std::make_unique<Acceptor>(io);
  asio::generic::stream_protocol::endpoint ep{asio::local::stream_protocol::endpoint(path)};
  boost::system::error_code ec;
  acceptor->open(ep.protocol(), ec);
  if (!ec) acceptor->bind(ep, ec);
  if (ec) return Error(ec.value(), "listen on " + path + ": " + ec.message());
  // api.md: mode 0660; access to the socket is the authorisation.
  if (::chmod(path.c_str(), 0660) != 0) return Error::Sys("chmod", path, errno);
  acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Error(ec.value(), "listen on " + path + ": " + ec.message());
  return acceptor;
}

Result<std::unique_ptr<Acceptor>> ListenTcp(asio::io_context& io, const std::string& listen) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return Error(EINVAL, "--listen takes HOST:PORT, like 127.0.0.1:7711, not '" + listen + "'");
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  boost::system::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (ec) return Error(EINVAL, "--listen: '" + host + "' is not an IP address");
  unsigned long port = 0;
  try {
    size_t used = 0;
    port = std::stoul(listen.substr(colon + 1), &used);
    if (used != listen.size() - colon - 1 || port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    return Error(EINVAL, "--listen: '" + listen.substr(colon + 1) + "' is not a port number");
  }
  asio::ip::tcp::endpoint tcp_ep(address, static_cast<unsigned short>(port));
  asio::generic::stream_protocol::endpoint ep{tcp_ep};
  auto acceptor = std::make_unique<Acceptor>(io);
  acceptor->open(ep.protocol(), ec);
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  const auto give_up = std::chrono::steady_clock::now() + kPredecessorGrace;
  while (!ec) {
    acceptor->bind(ep, ec);
    if (ec != asio::error::address_in_use || std::chrono::steady_clock::now() >= give_up) break;
    ec.clear();
    std::this_thread::sleep_for(kPredecessorRetry);
  }
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Error(ec.value(), "listen on " + listen + ": " + ec.message());
  return acceptor;
}

Result<std::string> ReadToken(const std::string& file) {
  NSBOX_ASSIGN_OR_RETURN(auto text, ReadFile(file));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) {
    text.pop_back();
  }
  if (text.empty()) return Error(EINVAL, "the token file " + file + " is empty");
  if (text.size() < 16) {
    return Error(EINVAL, "the token in " + file + " is too short: use at least 16 characters");
  }
  return text;
}

}  // namespace

int Serve(const ServeOptions& options) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "nsbox serve: %s\n", what.c_str());
    return 1;
  };
  if (!options.listen.empty() && options.token_file.empty()) {
    return fail(
        "--listen needs --token-file: a TCP listener never runs "
        "without a token");
  }
  if (options.listen.empty() && !options.token_file.empty()) {
    return fail("--token-file is only used with --listen");
  }
  if (::geteuid() != 0) {
    // Refused at once rather than a daemon that fails every creation (chown of a workspace to
    // the jail's uid is EPERM, and so are the uid maps and the cgroups).
    return fail(
        "needs root: nsboxd writes the uid/gid maps of its jails' user namespaces, chowns their "
        "workspaces to the jails' uids and manages their cgroups, none of which a normal user "
        "may do (running as uid " +
        std::to_string(::geteuid()) +
        "). Run it as root: `sudo nsbox serve`, or the systemd unit deploy/nsboxd.service");
  }
  std::string token;
  if (!options.token_file.empty()) {
    auto t = ReadToken(options.token_file);
    if (!t.ok()) return fail(t.error().message());
    token = std::move(t).value();
  }
  ::signal(SIGPIPE, SIG_IGN);
  // Thousands of keep-alive connections need fds: the soft limit may rise to
  // the hard one without any privilege.
  struct rlimit nofile;
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &nofile);
  }

  RegistryOptions ro;
  ro.state_dir = options.state_dir.empty() ? DefaultStateDir() : options.state_dir;
  if (!ro.state_dir.empty() && ro.state_dir[0] != '/') {
    std::error_code ec;
    ro.state_dir = std::filesystem::absolute(ro.state_dir, ec).string();
  }
  ro.init_binary = options.init_binary;
  ro.network_range = options.network_range;
  ro.dns_upstreams = options.dns_upstreams;
  ro.net_binary = options.net_binary;
  ro.log_level = options.log_level;
  ro.pool_size = options.pool_size;
  ro.idle_stop_ms = options.idle_stop_ms;
  // The loop, and what reads the sandboxes' control channels on it, outlive the registry: the
  // sandboxes that the final StopAll ends are still answered.
  asio::io_context io(1);
  ChannelWatch channels(io);
  ro.watch_channel = [&channels](std::shared_ptr<fs::InitClient> client) {
    channels.Watch(std::move(client));
  };
  // The TCP listener first: a bad --listen (or a port in use) fails before the state directory
  // or the socket file is made.
  std::unique_ptr<Acceptor> tcp_acceptor;
  if (!options.listen.empty()) {
    auto t = ListenTcp(io, options.listen);
    if (!t.ok()) return fail(t.error().message());
    tcp_acceptor = std::move(t).value();
  }
  // Before the registry's pool starts its jails: where the sandboxes' cgroups are made (on a pure
  // v2 host, a leaf of a delegated cgroup for the daemon itself; docs/cgroups.md "Placement").
  // A failure is logged, and tried again by the next creation that needs it.
  (void)isolate::PlaceSelf("nsboxd", "nsboxd-" + std::to_string(::getpid()) + ".scope", false);
  // Each jail is moved into its v1 cgroups (a hybrid host), as is every command's child.
  if (!options.leave_cgroup_mount) {
    if (auto layout = isolate::LoadCgroupLayout(); layout.ok()) isolate::FavorMovesIntoV1(*layout);
  }
  auto registry = Registry::Open(ro);
  if (!registry.ok()) return fail(registry.error().message());

  const std::string socket_path = options.socket.empty() ? DefaultSocketPath() : options.socket;
  auto unix_acceptor = ListenUnix(io, socket_path);
  if (!unix_acceptor.ok()) return fail(unix_acceptor.error().message());

  // Exec sessions live in memory only: what a previous daemon spilled is of no use now.
  for (const auto& entry : (*registry)->List()) {
    std::error_code ec;
    std::filesystem::remove_all(entry->execs_dir(), ec);
    if (ec)
      log::warn("sandbox={} remove {}: {}", entry->config().id, entry->execs_dir(), ec.message());
  }
  ExecLogLimits log_limits;
  log_limits.ring_bytes = options.output_ring;
  log_limits.spill_bytes = options.output_spill;
  int exit_code = 0;
  {
    Daemon daemon(io, **registry, token, log_limits,
                  std::chrono::seconds(options.exec_retention_seconds),
                  std::chrono::seconds(options.auth_timeout_seconds), options.image_imports);
    daemon.RestorePorts();
    daemon.ArmIdleStops();
    std::vector<Acceptor*> acceptors{unix_acceptor->get()};
    asio::co_spawn(io, daemon.AcceptLoop(**unix_acceptor, false), asio::detached);
    if (tcp_acceptor) {
      acceptors.push_back(tcp_acceptor.get());
      asio::co_spawn(io, daemon.AcceptLoop(*tcp_acceptor, true), asio::detached);
    }
    asio::signal_set signals(io, SIGTERM, SIGINT);
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      log::info("{} received", SignalName(sig));
      daemon.Shutdown(acceptors);
    });
    if (options.idle_stop_ms != 0) {
      log::info("sandboxes that do not say are stopped once idle for {} ms (--idle-stop)",
                options.idle_stop_ms);
    }
    log::info("nsboxd {} listening on {}{}; state in {}", kVersion, socket_path,
              options.listen.empty() ? "" : " and tcp " + options.listen, (*registry)->state_dir());
    try {
      io.run();
    } catch (const std::exception& e) {
      log::error("the event loop failed: {}", e.what());
      exit_code = 1;
    }
    channels.LoopEnded();
    // The sessions' timers belong to the loop: gone before it, spill files removed.
    for (const auto& entry : (*registry)->List()) {
      for (const auto& s : entry->TakeSessions()) daemon.DropSession(*s);
    }
    daemon.FinishSpills();
  }
  (*registry)->StopAll();
  ::unlink(socket_path.c_str());
  log::info("nsboxd stopped");
  return exit_code;
}

}  // namespace nsbox::runtime
#include "runtime/ports.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <cstring>
#include <utility>

#include "base/files.h"
#include "base/log.h"
#include "runtime/byte_relay.h"

namespace nsbox::runtime {

namespace asio = boost::asio;
namespace json = boost::json;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
constexpr auto kConnectTimeout = std::chrono::seconds(10);

}  // namespace

std::string EncodePorts(const std::vector<PortExposure>& ports) {
  json::array list;
  for (const auto& p : ports) {
    json::object o;
    o["port"] = p.port;
    o["hostPort"] = p.host_port;
    o["address"] = p.address;
    list.push_back(std::move(o));
  }
  json::object root;
  root["ports"] = std::move(list);
  return json::serialize(root) + "\n";
}

Result<std::vector<PortExposure>> DecodePorts(std::string_view text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) return Error(EINVAL, "ports.json: " + ec.message());
  const auto* root = v.if_object();
  const auto* list =
      root != nullptr && root->contains("ports") ? root->at("ports").if_array() : nullptr;
  if (list == nullptr) return Error(EINVAL, "ports.json: no \"ports\" array");
  std::vector<PortExposure> out;
  for (const auto& item : *list) {
    const auto* o = item.if_object();
    if (o == nullptr) return Error(EINVAL, "ports.json: an entry is not an object");
    auto port = ParsePortNumber(o->if_contains("port"), "port", false);
    auto host_port = ParsePortNumber(o->if_contains("hostPort"), "hostPort", false);
    auto address = ParseHostAddress(o->if_contains("address"));
    if (!port.ok()) return Error(EINVAL, "ports.json: " + port.error().message);
    if (!host_port.ok()) return Error(EINVAL, "ports.json: " + host_port.error().message);
    if (!address.ok()) return Error(EINVAL, "ports.json: " + address.error().message);
    out.push_back({port.value(), host_port.value(), address.value()});
  }
  return out;
}

ApiOutcome<uint16_t> ParsePortNumber(const json::value* v, std::string_view name,
                                     bool zero_allowed) {
  const int64_t low = zero_allowed ? 0 : 1;
  if (v != nullptr && v->is_int64() && v->as_int64() >= low && v->as_int64() <= 65535) {
    return static_cast<uint16_t>(v->as_int64());
  }
  if (v != nullptr && v->is_uint64() && v->as_uint64() <= 65535 &&
      v->as_uint64() >= static_cast<uint64_t>(low)) {
    return static_cast<uint16_t>(v->as_uint64());
  }
  std::string shown = v == nullptr ? "missing" : json::serialize(*v);
  if (shown.size() > 64) shown = shown.substr(0, 64) + "...";
  return ApiError::Invalid(std::string(name) + " must be an integer from " +
                           (zero_allowed ? "0" : "1") + " to 65535, not " + shown);
}

ApiOutcome<std::string> ParseHostAddress(const json::value* v) {
  if (v == nullptr || v->is_null()) return std::string("127.0.0.1");
  const auto* s = v->if_string();
  in_addr a{};
  if (s == nullptr || s->size() > 15 || ::inet_pton(AF_INET, std::string(*s).c_str(), &a) != 1) {
    std::string shown = json::serialize(*v);
    if (shown.size() > 64) shown = shown.substr(0, 64) + "...";
    return ApiError::Invalid("address must be an IPv4 address of the host, not " + shown);
  }
  char text[INET_ADDRSTRLEN];
  ::inet_ntop(AF_INET, &a, text, sizeof text);
  return std::string(text);
}

struct PortForwarder::Listener {
  Listener(asio::io_context& io, std::shared_ptr<SandboxEntry> e) : acceptor(io), entry(e) {}
  tcp::acceptor acceptor;
  std::shared_ptr<SandboxEntry> entry;
  PortExposure info;
  bool closed = false;
  uint64_t next_conn = 0;
  std::map<uint64_t, std::weak_ptr<Conn>> conns;
};

struct PortForwarder::Conn {
  Conn(tcp::socket h, std::shared_ptr<tcp::socket> u) : host(std::move(h)), inner(std::move(u)) {}
  tcp::socket host;
  std::shared_ptr<tcp::socket> inner;
  int open_directions = 2;
  void Abort() {
    Reset(host);
    if (inner) Reset(*inner);
  }
};

PortForwarder::PortForwarder(asio::io_context& io, Metrics& metrics, InnerSocket inner_socket)
    : io_(io), metrics_(metrics), inner_socket_(std::move(inner_socket)) {}

PortForwarder::~PortForwarder() { CloseEverything(); }

ApiOutcome<PortExposure> PortForwarder::Expose(std::shared_ptr<SandboxEntry> entry, uint16_t port,
                                               uint16_t host_port, const std::string& address) {
  const std::string& id = entry->config().id;
  auto& ports = by_id_[id];
  if (auto it = ports.find(port); it != ports.end()) {
    return ApiError::Of(409, "port_already_exposed",
                        "port " + std::to_string(port) + " of sandbox '" + id +
                            "' is exposed already, on " + it->second->info.address + ":" +
                            std::to_string(it->second->info.host_port));
  }
  auto listener = std::make_shared<Listener>(io_, entry);
  boost::system::error_code ec;
  const tcp::endpoint where(asio::ip::make_address_v4(address), host_port);
  listener->acceptor.open(tcp::v4(), ec);
  if (!ec) listener->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) listener->acceptor.bind(where, ec);
  const std::string where_text = address + ":" + std::to_string(host_port);
  if (ec == asio::error::address_in_use) {
    if (ports.empty()) by_id_.erase(id);
    return ApiError::Of(409, "address_in_use",
                        "bind " + where_text + ": " + std::strerror(EADDRINUSE));
  }
  if (ec.value() == EADDRNOTAVAIL) {
    if (ports.empty()) by_id_.erase(id);
    return ApiError::Invalid("bind " + where_text + ": " + std::strerror(EADDRNOTAVAIL) +
                             " (address must be one of the host's)");
  }
  if (!ec) listener->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    if (ports.empty()) by_id_.erase(id);
    return ApiError::Internal("listen on " + where_text + ": " + ec.message());
  }
  listener->info.port = port;
  listener->info.address = address;
  listener->info.host_port = listener->acceptor.local_endpoint(ec).port();
  ports[port] = listener;
  metrics_.PortsExposed(1);
  log::info("sandbox={} port {} exposed on {}:{}", id, port, address, listener->info.host_port);
  asio::co_spawn(io_, AcceptLoop(listener), asio::detached);
  return listener->info;
}

std::vector<PortExposure> PortForwarder::List(const std::string& id) const {
  std::vector<PortExposure> out;
  if (auto it = by_id_.find(id); it != by_id_.end()) {
    for (const auto& [port, l] : it->second) out.push_back(l->info);
  }
  return out;  // the map is ordered by port
}

void PortForwarder::CloseListener(Listener& l) {
  if (l.closed) return;
  l.closed = true;
  boost::system::error_code ec;
  // Stop listening now, before the close: a copy of the fd that a jail being started holds
  // between its clone and its fd cleanup (asio opens sockets without SOCK_CLOEXEC) would
  // otherwise keep the port accepting connections, which its last close then resets.
  if (l.acceptor.is_open()) ::shutdown(l.acceptor.native_handle(), SHUT_RDWR);
  l.acceptor.close(ec);
  for (auto& [n, weak] : l.conns) {
    if (auto conn = weak.lock()) conn->Abort();
  }
  l.conns.clear();
  metrics_.PortsExposed(-1);
  log::info("sandbox={} port {} closed ({}:{})", l.entry->config().id, l.info.port, l.info.address,
            l.info.host_port);
}

bool PortForwarder::Close(const std::string& id, uint16_t port) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  auto p = it->second.find(port);
  if (p == it->second.end()) return false;
  CloseListener(*p->second);
  it->second.erase(p);
  if (it->second.empty()) by_id_.erase(it);
  return true;
}

void PortForwarder::CloseAll(const std::string& id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  for (auto& [port, l] : it->second) CloseListener(*l);
  by_id_.erase(it);
}

void PortForwarder::CloseEverything() {
  for (auto& [id, ports] : by_id_) {
    for (auto& [port, l] : ports) CloseListener(*l);
  }
  by_id_.clear();
}

PortForwarder::Snapshot PortForwarder::SnapshotOf(const std::string& id) {
  return {EncodePorts(List(id)), ++generation_};
}

Status PortForwarder::WritePorts(const std::string& id, const std::string& dir,
                                 const Snapshot& snapshot) {
  std::lock_guard lock(write_mu_);
  uint64_t& last = written_[id];
  if (last > snapshot.generation) return Ok();
  last = snapshot.generation;
  return WriteFileAtomic(dir, "ports.json", snapshot.json);
}

asio::awaitable<ApiOutcome<std::shared_ptr<tcp::socket>>> PortForwarder::ConnectInside(
    std::shared_ptr<SandboxEntry> entry, uint16_t port) {
  auto fd = co_await inner_socket_(entry);
  if (!fd.ok()) co_return fd.error();
  auto inner = std::make_shared<tcp::socket>(io_);
  boost::system::error_code ec;
  inner->assign(tcp::v4(), fd.value(), ec);
  if (ec) {
    ::close(fd.value());
    co_return ApiError::Internal("assign the inner socket: " + ec.message());
  }
  asio::steady_timer timeout(io_, kConnectTimeout);
  std::weak_ptr<tcp::socket> weak = inner;
  timeout.async_wait([weak](boost::system::error_code e) {
    if (e) return;
    if (auto s = weak.lock()) {
      boost::system::error_code ignored;
      s->cancel(ignored);
    }
  });
  const tcp::endpoint target(asio::ip::address_v4::loopback(), port);
  auto [cec] = co_await inner->async_connect(target, kTuple);
  timeout.cancel();
  if (cec) {
    co_return ApiError::Of(502, "upstream_unreachable",
                           "nothing answers on 127.0.0.1:" + std::to_string(port) +
                               " inside sandbox '" + entry->config().id + "': " + cec.message());
  }
  inner->set_option(tcp::no_delay(true), ec);
  co_return inner;
}

asio::awaitable<void> PortForwarder::AcceptLoop(std::shared_ptr<Listener> listener) {
  for (;;) {
    auto [ec, socket] = co_await listener->acceptor.async_accept(kTuple);
    if (listener->closed) co_return;
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) {
      log::error("accept on {}:{}: {}", listener->info.address, listener->info.host_port,
                 ec.message());
      asio::steady_timer pause(io_, std::chrono::milliseconds(100));
      (void)co_await pause.async_wait(kTuple);
      continue;
    }
    metrics_.PortConnection();
    asio::co_spawn(io_, Relay(listener, std::move(socket)), asio::detached);
  }
}

asio::awaitable<void> PortForwarder::Relay(std::shared_ptr<Listener> listener, tcp::socket host) {
  auto inner = co_await ConnectInside(listener->entry, listener->info.port);
  if (listener->closed || !inner.ok()) {
    if (!inner.ok()) {
      log::debug("sandbox={} port {}: {}", listener->entry->config().id, listener->info.port,
                 inner.error().message);
    }
    Reset(host);
    co_return;
  }
  boost::system::error_code ec;
  host.set_option(tcp::no_delay(true), ec);
  auto conn = std::make_shared<Conn>(std::move(host), inner.value());
  const uint64_t n = listener->next_conn++;
  listener->conns[n] = conn;
  std::weak_ptr<Conn> weak = conn;
  std::function<void()> abort = [weak] {
    if (auto c = weak.lock()) c->Abort();
  };
  // Each direction holds the connection; when both have ended it is closed and forgotten.
  auto done = std::shared_ptr<void>(nullptr, [listener, n](void*) { listener->conns.erase(n); });
  std::shared_ptr<void> keep =
      std::make_shared<std::pair<std::shared_ptr<Conn>, std::shared_ptr<void>>>(conn, done);
  asio::co_spawn(io_, Pipe(keep, conn->host, *conn->inner, abort), asio::detached);
  asio::co_spawn(io_, Pipe(keep, *conn->inner, conn->host, abort), asio::detached);
}

}  // namespace nsbox::runtime

#pragma once

// Exposed ports (docs/network.md "Ports"): the daemon listens on a host address and relays each
// connection, byte for byte, to 127.0.0.1:<port> inside the sandbox's network namespace. Works
// for every sandbox, also network "none": the daemon makes the inner socket itself
// (runtime/netns.h). Kept in <sandbox dir>/ports.json, re-opened when the daemon starts.
//
// PortForwarder lives on the daemon's event loop: every method is called there, except
// WritePorts (worker pool).

#include <boost/asio.hpp>
#include <boost/json.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "runtime/api_error.h"
#include "runtime/metrics.h"
#include "runtime/registry.h"

namespace nsbox::runtime {

struct PortExposure {
  uint16_t port = 0;       // inside, on 127.0.0.1
  uint16_t host_port = 0;  // on the host (the one bound, never 0)
  std::string address = "127.0.0.1";
};

// ports.json, both ways. Decode checks every field (the file may have been edited by hand).
std::string EncodePorts(const std::vector<PortExposure>& ports);
Result<std::vector<PortExposure>> DecodePorts(std::string_view json);

// The checks of POST .../ports' fields: the value, or 400 invalid_request naming it.
ApiOutcome<uint16_t> ParsePortNumber(const boost::json::value* v, std::string_view name,
                                     bool zero_allowed);
ApiOutcome<std::string> ParseHostAddress(const boost::json::value* v);

class PortForwarder {
 public:
  // A fresh TCP socket inside the sandbox's network namespace (started if it is stopped), or why
  // there is none. Given by the daemon (it starts sandboxes and owns the worker pool).
  using InnerSocket =
      std::function<boost::asio::awaitable<ApiOutcome<int>>(std::shared_ptr<SandboxEntry> entry)>;

  PortForwarder(boost::asio::io_context& io, Metrics& metrics, InnerSocket inner_socket);
  ~PortForwarder();

  // Listens on address:host_port (0: a free port) for `port` of the sandbox. 409
  // port_already_exposed, 409 address_in_use, 400 for an address the host does not have.
  ApiOutcome<PortExposure> Expose(std::shared_ptr<SandboxEntry> entry, uint16_t port,
                                  uint16_t host_port, const std::string& address);
  // Sorted by port.
  std::vector<PortExposure> List(const std::string& id) const;
  // Closes the listener and its connections; false when the port was not exposed.
  bool Close(const std::string& id, uint16_t port);
  // Every port of the sandbox (it was deleted).
  void CloseAll(const std::string& id);
  void CloseEverything();

  // What ports.json of the sandbox must hold now, and a number that orders these snapshots.
  struct Snapshot {
    std::string json;
    uint64_t generation = 0;
  };
  Snapshot SnapshotOf(const std::string& id);
  // Writes a snapshot into <dir>/ports.json unless a later one was written already (blocks:
  // call it on the worker pool). Thread-safe.
  Status WritePorts(const std::string& id, const std::string& dir, const Snapshot& snapshot);

  // A socket connected to 127.0.0.1:port inside (nullptr and the reason when nothing listens).
  boost::asio::awaitable<ApiOutcome<std::shared_ptr<boost::asio::ip::tcp::socket>>> ConnectInside(
      std::shared_ptr<SandboxEntry> entry, uint16_t port);

 private:
  struct Listener;
  struct Conn;
  boost::asio::awaitable<void> AcceptLoop(std::shared_ptr<Listener> listener);
  boost::asio::awaitable<void> Relay(std::shared_ptr<Listener> listener,
                                     boost::asio::ip::tcp::socket host);
  void CloseListener(Listener& listener);

  boost::asio::io_context& io_;
  Metrics& metrics_;
  InnerSocket inner_socket_;
  uint64_t generation_ = 0;
  // sandbox id -> port -> listener
  std::map<std::string, std::map<uint16_t, std::shared_ptr<Listener>>> by_id_;
  std::mutex write_mu_;
  std::map<std::string, uint64_t> written_;  // the last generation written, per sandbox id
};

}  // namespace nsbox::runtime

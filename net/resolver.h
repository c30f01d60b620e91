#pragma once

// The DNS resolver of nsbox-net (docs/network.md "Names"): one UDP socket and one TCP listener on
// the resolver address, serving every networked sandbox of the daemon. The sandbox is known by
// the query's source address (the filter guarantees it). A name the sandbox's policy does not
// allow gets NXDOMAIN at once; an allowed one is forwarded to the upstreams, and every IPv4
// address of the answer is opened in the filter (the `Open` callback) before the answer goes
// back. Messages are parsed and built with ldns; every byte from a sandbox or an upstream is
// hostile.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "base/error.h"
#include "net/policy.h"

namespace nsbox::net {

class Resolver {
 public:
  struct Learned {
    uint32_t address;  // host byte order
    uint32_t ttl_seconds;
    bool operator==(const Learned&) const = default;
  };
  // The policy of the sandbox whose address is `source`, or null (unknown source: REFUSED).
  using PolicyFor = std::function<const NetworkPolicy*(uint32_t source)>;
  // Opens the filter for `source` to these addresses (all ports when verdict.all_ports, else
  // verdict.ports) before the answer goes back; an error makes the answer SERVFAIL. Called for
  // every forwarded answer that is not an error, also with no addresses (a name without A).
  using Open = std::function<Status(uint32_t source, const NameVerdict& verdict,
                                    const std::vector<Learned>& addresses)>;
  struct Options {
    uint32_t listen_address = 0;  // host byte order
    // 0: an ephemeral port, the same for UDP and TCP (tests); see port().
    uint16_t port = 53;
    std::vector<std::pair<uint32_t, uint16_t>> upstreams;  // address (host order), port
    std::chrono::milliseconds upstream_timeout{2000};
    std::chrono::milliseconds tcp_idle_timeout{10000};
    size_t max_in_flight = 1024;  // forwards waiting for an upstream
    size_t max_tcp_connections = 64;
  };
  // Binds the sockets and starts serving on `io` (single-threaded: all callbacks run there).
  static Result<std::unique_ptr<Resolver>> Start(boost::asio::io_context& io, Options options,
                                                 PolicyFor policy_for, Open open);
  // Closes the sockets; forwards in flight are dropped.
  ~Resolver();
  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;

  struct Stats {
    uint64_t queries = 0;   // messages that carried an id
    uint64_t answered = 0;  // NOERROR or NXDOMAIN from an upstream, and the empty AAAA answers
    uint64_t denied = 0;    // NXDOMAIN by policy, REFUSED (unknown source)
    uint64_t failed = 0;    // FORMERR, NOTIMP, SERVFAIL (upstreams silent, open failed, busy)
  };
  Stats stats() const;
  // The port bound (Options::port, or the ephemeral one when that was 0).
  uint16_t port() const;

  struct Impl;

 private:
  explicit Resolver(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// "nameserver" lines of a resolv.conf text, IPv4 only (for the default upstreams), port 53.
std::vector<std::pair<uint32_t, uint16_t>> NameserversOf(std::string_view resolv_conf);

}  // namespace nsbox::net

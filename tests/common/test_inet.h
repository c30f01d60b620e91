#pragma once

// The tests' "small internet" (issue 9): a network namespace reached from the host over a veth,
// with a DNS server and HTTP servers inside, and an HTTP server on the host that sandboxes must
// not reach. Only addresses of this machine are used (198.18.0.0/15, the benchmarking range, and
// 169.254.169.254 for the fake metadata server).
//
// Names carry the test process's pid ("nsbox-tinet-PID-N" for the namespace, "tinetPID-N" for
// the host side of the veth), so parallel test binaries never collide, and the leftovers of a
// SIGKILLed run (a dead pid) are removed by the next Start. Each instance takes a /29 of
// 198.18.0.0/15 that no host interface uses:
//   .1 the host side of the veth       .2 the namespace side      .3 the DNS server (UDP 53)
//   .4 allowed.test (HTTP 80, 8080)    .5 denied.test (HTTP 80, 8080)   .6 a raw-IP host (HTTP 80)
// and 169.254.169.254 (HTTP 80) inside, with a host route to it through the veth (a metric of
// its own per instance, so that two instances can coexist). Every HTTP host also echoes UDP on
// port 80. The zone: allowed.test, sub.allowed.test -> .4; denied.test -> .5; cname.test ->
// CNAME allowed.test; TTL 30 s; NXDOMAIN for every other name.
// The host's own HTTP server listens on 0.0.0.0:host_port() (so on loopback, the veth's host
// side and every other host address, a daemon's gateway included).
//
// Needs root and `ip` (iproute2). The destructor removes the namespace, the link and the route,
// also after a failed test.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nsbox::testinet {

inline constexpr const char* kMetadataAddress = "169.254.169.254";
inline constexpr uint16_t kHttpPort = 80;
// allowed.test and denied.test also answer HTTP on this port (for entries with a port).
inline constexpr uint16_t kAltHttpPort = 8080;
inline constexpr uint32_t kDnsTtl = 30;

class TestInternet {
 public:
  TestInternet() = default;
  ~TestInternet();
  TestInternet(const TestInternet&) = delete;
  TestInternet& operator=(const TestInternet&) = delete;

  // Removes leftovers, builds the namespace and the link, starts the servers and waits until
  // they listen. False with the reason in error().
  bool Start();
  // Kills the servers and removes the namespace, the link and the route (idempotent).
  void Stop();
  const std::string& error() const { return error_; }

  const std::string& netns() const { return netns_; }
  const std::string& host_link() const { return link_; }
  std::string host_address() const { return Address(1); }
  std::string inner_address() const { return Address(2); }
  std::string dns_address() const { return Address(3); }
  std::string allowed_address() const { return Address(4); }
  std::string denied_address() const { return Address(5); }
  std::string raw_address() const { return Address(6); }
  // "198.18.x.3:53", the value of nsboxd's --dns-upstream.
  std::string dns_upstream() const { return dns_address() + ":53"; }
  // The port of the host's own HTTP server (bound on 0.0.0.0).
  uint16_t host_port() const { return host_port_; }

  // What of this instance is still on the host: "netns NAME", "link NAME", "route ..." (empty
  // once Stop has run).
  std::vector<std::string> Remnants() const;

  // Removes the namespaces and links of dead test processes (named as above); what it removed.
  static std::vector<std::string> RemoveLeftovers();

 private:
  std::string Address(int offset) const;
  bool Fail(const std::string& message);
  bool StartServer(bool inside, const std::vector<std::string>& args, pid_t* pid,
                   std::vector<uint16_t>* ports);

  std::string netns_, link_;
  uint32_t base_ = 0;  // host byte order, the /29's network address
  int metric_ = 0;
  pid_t inner_pid_ = -1, host_pid_ = -1;
  uint16_t host_port_ = 0;
  bool started_ = false;
  std::string error_;
};

// ---- clients, for the tests and the benchmark ----

// Runs argv (PATH searched), stdin /dev/null, stdout and stderr together into *output; the exit
// code (128 + signal when killed, -1 when it could not start). Killed after `timeout`.
int RunCommand(const std::vector<std::string>& argv, std::string* output = nullptr,
               std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));

// Names of the host's network links (`ip -o link show`; a veth's "name@peer" gives "name").
std::vector<std::string> LinkNames();

struct DnsAnswer {
  bool answered = false;           // false: no reply in time (error says why)
  int rcode = -1;                  // 0 NOERROR, 3 NXDOMAIN
  std::vector<std::string> a;      // A records in the answer
  std::vector<std::string> cname;  // CNAME targets (without the trailing dot)
  uint32_t min_ttl = 0;
  std::string error;
};
// One UDP query for `name` (type "A" or "AAAA") to server:port.
DnsAnswer DnsQuery(const std::string& server, uint16_t port, const std::string& name,
                   const std::string& type = "A",
                   std::chrono::milliseconds timeout = std::chrono::milliseconds(3000));

// GET http://address:port/path from the calling process's namespace: the status (0 when nothing
// answered: *error says why) and the body.
int HttpGet(const std::string& address, uint16_t port, const std::string& path, std::string* body,
            std::string* error = nullptr,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

// One UDP datagram to address:port and the reply ("" when none came in time).
std::string UdpEcho(const std::string& address, uint16_t port, const std::string& payload,
                    std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));

}  // namespace nsbox::testinet

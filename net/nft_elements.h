#pragma once

// Set elements of nf_tables written straight over netlink (libmnl), for the one write that is on
// a hot path: the resolver opening the addresses it answered (Firewall::Learn, once per DNS
// answer). libnftables reads the whole ruleset (every chain, set and rule of every table) before
// each command it runs, so its cost grows with the number of sandboxes; this does not
// (docs/perf-notes.md, "Issue 9").

#include <libmnl/libmnl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"

namespace nsbox::net {

class NftElements {
 public:
  // A NETLINK_NETFILTER socket, bound.
  static Result<std::unique_ptr<NftElements>> Open();
  ~NftElements();
  NftElements(const NftElements&) = delete;
  NftElements& operator=(const NftElements&) = delete;

  // In one atomic batch: adds each key to set `set` of inet table `table` (a no-op for one that
  // is there), deletes them and adds them again with `timeout_ms`, so that the timeout of every
  // key restarts (the kernel keeps the first timeout of an element added again). Keys are the
  // set's raw key bytes (network byte order; fields of a concatenation padded to 4 bytes).
  Status Refresh(const std::string& table, const std::string& set,
                 const std::vector<std::string>& keys, uint64_t timeout_ms);

  // Key bytes: an IPv4 address (host order in, network order out), and an address with a port
  // (`ipv4_addr . inet_service`).
  static std::string Ipv4Key(uint32_t address);
  static std::string Ipv4PortKey(uint32_t address, uint16_t port);

 private:
  explicit NftElements(mnl_socket* socket) : socket_(socket) {}
  mnl_socket* socket_;
  uint32_t seq_ = 0;
};

}  // namespace nsbox::net

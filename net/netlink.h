#pragma once

// The rtnetlink calls nsbox-net makes (libmnl): veth pairs whose peer is born inside a sandbox's
// network namespace, addresses, routes and permanent neighbour entries, and listing or deleting
// links. Every failure names the operation, the interface
// and the errno text. Not thread-safe (one socket per Netlink object).

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"

#include <libmnl/libmnl.h>

namespace nsbox::net {

// Calls f on each attribute of `h` after its `offset`-byte header (libmnl's mnl_attr_for_each is
// C: its void* does not convert in C++).
template <typename F>
void ForEachAttr(const nlmsghdr* h, size_t offset, F f) {
  const char* tail = static_cast<const char*>(mnl_nlmsg_get_payload_tail(h));
  for (auto* a = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(h, offset));
       mnl_attr_ok(a, static_cast<int>(tail - reinterpret_cast<const char*>(a)));
       a = mnl_attr_next(a)) {
    f(a);
  }
}

using Mac = std::array<uint8_t, 6>;

class Netlink {
 public:
  // A NETLINK_ROUTE socket in the caller's network namespace, or in the one of `netns_fd` (the
  // calling thread enters it for the socket() call only).
  static Result<Netlink> Open(int netns_fd = -1);
  Netlink(Netlink&& other) noexcept;
  Netlink& operator=(Netlink&& other) noexcept;
  ~Netlink();

  // A veth pair: `host_name` here, its peer `peer_name` created directly in `netns_fd`'s
  // namespace, each with the given MAC address.
  Status AddVeth(const std::string& host_name, const Mac& host_mac, const std::string& peer_name,
                 const Mac& peer_mac, int netns_fd);
  Status DeleteLink(const std::string& name);
  // No IPv6 link-local address (addr_gen_mode none), then up.
  Status SetUpWithoutIpv6(const std::string& name);
  // `address`/`prefix` on the link (host byte order).
  Status AddAddress(const std::string& name, uint32_t address, uint8_t prefix);
  // A route to `dst`/`prefix` on the link, through `gateway` (onlink) when non-zero, else scope
  // link.
  Status AddRoute(const std::string& name, uint32_t dst, uint8_t prefix, uint32_t gateway = 0);
  Status AddPermanentNeighbour(const std::string& name, uint32_t address, const Mac& mac);
  // Names of the links that start with `prefix`.
  Result<std::vector<std::string>> LinksWithPrefix(const std::string& prefix);
  // Whether a route of the main table covers or lies inside `network`/`prefix`, on a link whose
  // name does not start with `own_prefix`: its description ("10.213.0.0/16 dev eth0"), or "".
  Result<std::string> ConflictingRoute(uint32_t network, uint8_t prefix,
                                       const std::string& own_prefix);

 private:
  explicit Netlink(mnl_socket* socket) : socket_(socket) {}
  // Sends a request built in `buf` and waits for its acknowledgement.
  Status Ack(void* buf, const std::string& what);
  // Reads the answers of a dump request until its end, calling `cb` on each message.
  Status ReadDump(uint32_t seq, int (*cb)(const nlmsghdr*, void*), void* data,
                  const std::string& what);
  Result<int> IndexOf(const std::string& name);
  mnl_socket* socket_ = nullptr;
  uint32_t seq_ = 1;
};

}  // namespace nsbox::net

#include "net/netlink.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/if_addr.h>
#include <linux/if_link.h>
#include <linux/neighbour.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "net/policy.h"

namespace nsbox::net {
namespace {

constexpr size_t kBufSize = 16384;

nlmsghdr* Start(char* buf, uint16_t type, uint16_t flags, uint32_t seq) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = type;
  nlh->nlmsg_flags = static_cast<uint16_t>(NLM_F_REQUEST | flags);
  nlh->nlmsg_seq = seq;
  return nlh;
}

uint32_t Net(uint32_t host_order) { return htonl(host_order); }

}  // namespace

Result<Netlink> Netlink::Open(int netns_fd) {
  UniqueFd self;
  if (netns_fd >= 0) {
    self.reset(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!self.valid()) return Error::Sys("open", "/proc/self/ns/net", errno);
    if (::setns(netns_fd, CLONE_NEWNET) != 0)
      return Error::Sys("setns", "network namespace", errno);
  }
  mnl_socket* s = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
  const int open_err = errno;
  if (netns_fd >= 0 && ::setns(self.get(), CLONE_NEWNET) != 0) {
    // Every later socket would be made in the sandbox's namespace: never go on like that.
    std::perror("nsbox-net: setns back to its own network namespace");
    std::abort();
  }
  if (s == nullptr) return Error::Sys("socket", "NETLINK_ROUTE", open_err);
  if (mnl_socket_bind(s, 0, MNL_SOCKET_AUTOPID) != 0) {
    const int err = errno;
    mnl_socket_close(s);
    return Error::Sys("bind", "NETLINK_ROUTE", err);
  }
  return Netlink(s);
}

Netlink::Netlink(Netlink&& other) noexcept : socket_(other.socket_), seq_(other.seq_) {
  other.socket_ = nullptr;
}

Netlink& Netlink::operator=(Netlink&& other) noexcept {
  if (this != &other) {
    if (socket_ != nullptr) mnl_socket_close(socket_);
    socket_ = other.socket_;
    seq_ = other.seq_;
    other.socket_ = nullptr;
  }
  return *this;
}

Netlink::~Netlink() {
  if (socket_ != nullptr) mnl_socket_close(socket_);
}

Status Netlink::Ack(void* buf, const std::string& what) {
  auto* nlh = static_cast<nlmsghdr*>(buf);
  nlh->nlmsg_flags |= NLM_F_ACK;
  if (mnl_socket_sendto(socket_, nlh, nlh->nlmsg_len) < 0) {
    return Error::Sys("netlink send", what, errno);
  }
  std::vector<char> reply(MNL_SOCKET_BUFFER_SIZE);
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(socket_, reply.data(), reply.size());
    if (n < 0) return Error::Sys("netlink receive", what, errno);
    int rc = mnl_cb_run(reply.data(), static_cast<size_t>(n), nlh->nlmsg_seq,
                        mnl_socket_get_portid(socket_), nullptr, nullptr);
    if (rc < 0) return Error::Sys("netlink", what, errno);
    if (rc == MNL_CB_STOP) return Ok();
  }
}

Status Netlink::ReadDump(uint32_t seq, int (*cb)(const nlmsghdr*, void*), void* data,
                         const std::string& what) {
  std::vector<char> reply(MNL_SOCKET_BUFFER_SIZE);
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(socket_, reply.data(), reply.size());
    if (n < 0) return Error::Sys("netlink receive", what, errno);
    int rc = mnl_cb_run(reply.data(), static_cast<size_t>(n), seq, mnl_socket_get_portid(socket_),
                        cb, data);
    if (rc < 0) return Error::Sys("netlink", what, errno);
    if (rc == MNL_CB_STOP) return Ok();
  }
}

Result<int> Netlink::IndexOf(const std::string& name) {
  // if_nametoindex asks the caller's namespace; this socket may be in another one.
  char buf[kBufSize];
  nlmsghdr* nlh = Start(buf, RTM_GETLINK, 0, seq_++);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name.c_str());
  if (mnl_socket_sendto(socket_, nlh, nlh->nlmsg_len) < 0) {
    return Error::Sys("netlink send", "get link " + name, errno);
  }
  std::vector<char> reply(MNL_SOCKET_BUFFER_SIZE);
  ssize_t n = mnl_socket_recvfrom(socket_, reply.data(), reply.size());
  if (n < 0) return Error::Sys("netlink receive", "get link " + name, errno);
  int index = -1;
  auto cb = [](const nlmsghdr* h, void* data) -> int {
    const auto* info = static_cast<const ifinfomsg*>(mnl_nlmsg_get_payload(h));
    *static_cast<int*>(data) = info->ifi_index;
    return MNL_CB_OK;
  };
  int rc = mnl_cb_run(reply.data(), static_cast<size_t>(n), nlh->nlmsg_seq,
                      mnl_socket_get_portid(socket_), cb, &index);
  if (rc < 0) return Error::Sys("netlink", "get link " + name, errno);
  if (index <= 0) return Error::Sys("netlink", "get link " + name, ENODEV);
  return index;
}

Status Netlink::AddVeth(const std::string& host_name, const Mac& host_mac,
                        const std::string& peer_name, const Mac& peer_mac, int netns_fd) {
  char buf[kBufSize];
  nlmsghdr* nlh = Start(buf, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, seq_++);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, host_name.c_str());
  mnl_attr_put(nlh, IFLA_ADDRESS, host_mac.size(), host_mac.data());
  nlattr* linkinfo = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
  mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
  nlattr* data = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
  nlattr* peer = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
  // The peer's attributes follow its own struct ifinfomsg.
  auto* peer_ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  std::memset(peer_ifm, 0, sizeof *peer_ifm);
  peer_ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, peer_name.c_str());
  mnl_attr_put(nlh, IFLA_ADDRESS, peer_mac.size(), peer_mac.data());
  mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, static_cast<uint32_t>(netns_fd));
  mnl_attr_nest_end(nlh, peer);
  mnl_attr_nest_end(nlh, data);
  mnl_attr_nest_end(nlh, linkinfo);
  return Ack(buf, "create veth " + host_name);
}

Status Netlink::DeleteLink(const std::string& name) {
  char buf[kBufSize];
  nlmsghdr* nlh = Start(buf, RTM_DELLINK, 0, seq_++);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name.c_str());
  return Ack(buf, "delete link " + name);
}

Status Netlink::SetUpWithoutIpv6(const std::string& name) {
  NSBOX_ASSIGN_OR_RETURN(int index, IndexOf(name));
  char buf[kBufSize];
  nlmsghdr* nlh = Start(buf, RTM_NEWLINK, 0, seq_++);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  ifm->ifi_index = index;
  nlattr* spec = mnl_attr_nest_start(nlh, IFLA_AF_SPEC);
  nlattr* inet6 = mnl_attr_nest_start(nlh, AF_INET6);
  mnl_attr_put_u8(nlh, IFLA_INET6_ADDR_GEN_MODE, IN6_ADDR_GEN_MODE_NONE);
  mnl_attr_nest_end(nlh, inet6);
  mnl_attr_nest_end(nlh, spec);
  NSBOX_TRY(Ack(buf, "set addr_gen_mode none on " + name));
  nlh = Start(buf, RTM_NEWLINK, 0, seq_++);
  ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  ifm->ifi_index = index;
  ifm->ifi_flags = IFF_UP;
  ifm->ifi_change = IFF_UP;
  return Ack(buf, "set " + name + " up");
}

Status Netlink::AddAddress(const std::string& name, uint32_t address, uint8_t prefix) {
  NSBOX_ASSIGN_OR_RETURN(int index, IndexOf(name));
  char buf[kBufSize];
  nlmsghdr* nlh = Start(buf, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, seq_++);
  auto* ifa = static_cast<ifaddrmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifaddrmsg)));
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = prefix;
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = static_cast<uint32_t>(index);
  mnl_attr_put_u32(nlh, IFA_LOCAL, Net(address));
  mnl_attr_put_u32(nlh, IFA_ADDRESS, Net(address));
  return Ack(buf,
             "add address " + Ipv4Text(address) + "/" + std::to_string(prefix) + " to " + name);
}

Status Netlink::AddRoute(const std::string& name, uint32_t dst, uint8_t prefix, uint32_t gateway) {
  NSBOX_ASSIGN_OR_RETURN(int index, IndexOf(name));
  char buf[kBufSize];
  nlmsghdr* nlh = Start(buf, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, seq_++);
  auto* rtm = static_cast<rtmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
  rtm->rtm_family = AF_INET;
  rtm->rtm_dst_len = prefix;
  rtm->rtm_table = RT_TABLE_MAIN;
  rtm->rtm_protocol = RTPROT_STATIC;
  rtm->rtm_type = RTN_UNICAST;
  rtm->rtm_scope = gateway != 0 ? RT_SCOPE_UNIVERSE : RT_SCOPE_LINK;
  if (gateway != 0) rtm->rtm_flags = RTNH_F_ONLINK;
  if (prefix != 0) mnl_attr_put_u32(nlh, RTA_DST, Net(dst));
  if (gateway != 0) mnl_attr_put_u32(nlh, RTA_GATEWAY, Net(gateway));
  mnl_attr_put_u32(nlh, RTA_OIF, static_cast<uint32_t>(index));
  return Ack(buf, "add route " + Ipv4Text(dst) + "/" + std::to_string(prefix) +
                      (gateway != 0 ? " via " + Ipv4Text(gateway) : "") + " dev " + name);
}

Status Netlink::AddPermanentNeighbour(const std::string& name, uint32_t address, const Mac& mac) {
  NSBOX_ASSIGN_OR_RETURN(int index, IndexOf(name));
  char buf[kBufSize];
  nlmsghdr* nlh = Start(buf, RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, seq_++);
  auto* ndm = static_cast<ndmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ndmsg)));
  ndm->ndm_family = AF_INET;
  ndm->ndm_ifindex = index;
  ndm->ndm_state = NUD_PERMANENT;
  mnl_attr_put_u32(nlh, NDA_DST, Net(address));
  mnl_attr_put(nlh, NDA_LLADDR, mac.size(), mac.data());
  return Ack(buf, "add neighbour " + Ipv4Text(address) + " on " + name);
}

Result<std::vector<std::string>> Netlink::LinksWithPrefix(const std::string& prefix) {
  char buf[kBufSize];
  nlmsghdr* nlh = Start(buf, RTM_GETLINK, NLM_F_DUMP, seq_++);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  if (mnl_socket_sendto(socket_, nlh, nlh->nlmsg_len) < 0) {
    return Error::Sys("netlink send", "list links", errno);
  }
  struct Collect {
    std::string prefix;
    std::vector<std::string> names;
  } collect{prefix, {}};
  auto cb = [](const nlmsghdr* h, void* data) -> int {
    auto* c = static_cast<Collect*>(data);
    ForEachAttr(h, sizeof(ifinfomsg), [&](const nlattr* attr) {
      if (mnl_attr_get_type(attr) == IFLA_IFNAME) {
        std::string name = mnl_attr_get_str(attr);
        if (name.rfind(c->prefix, 0) == 0) c->names.push_back(std::move(name));
      }
    });
    return MNL_CB_OK;
  };
  NSBOX_TRY(ReadDump(nlh->nlmsg_seq, cb, &collect, "list links"));
  return collect.names;
}

Result<std::string> Netlink::ConflictingRoute(uint32_t network, uint8_t prefix,
                                              const std::string& own_prefix) {
  char buf[kBufSize];
  nlmsghdr* nlh = Start(buf, RTM_GETROUTE, NLM_F_DUMP, seq_++);
  auto* rtm = static_cast<rtmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
  rtm->rtm_family = AF_INET;
  if (mnl_socket_sendto(socket_, nlh, nlh->nlmsg_len) < 0) {
    return Error::Sys("netlink send", "list routes", errno);
  }
  struct Routes {
    std::vector<std::pair<uint32_t, uint8_t>> dst;  // with their oif
    std::vector<int> oif;
  } routes;
  auto cb = [](const nlmsghdr* h, void* data) -> int {
    auto* r = static_cast<Routes*>(data);
    const auto* m = static_cast<const rtmsg*>(mnl_nlmsg_get_payload(h));
    if (m->rtm_table != RT_TABLE_MAIN || m->rtm_dst_len == 0) return MNL_CB_OK;
    uint32_t dst = 0;
    int oif = 0;
    ForEachAttr(h, sizeof(rtmsg), [&](const nlattr* attr) {
      if (mnl_attr_get_type(attr) == RTA_DST) dst = ntohl(mnl_attr_get_u32(attr));
      if (mnl_attr_get_type(attr) == RTA_OIF) oif = static_cast<int>(mnl_attr_get_u32(attr));
    });
    r->dst.emplace_back(dst, m->rtm_dst_len);
    r->oif.push_back(oif);
    return MNL_CB_OK;
  };
  NSBOX_TRY(ReadDump(nlh->nlmsg_seq, cb, &routes, "list routes"));
  auto mask = [](uint8_t len) { return len == 0 ? 0u : ~uint32_t{0} << (32 - len); };
  for (size_t i = 0; i < routes.dst.size(); ++i) {
    const auto [dst, len] = routes.dst[i];
    const uint8_t shorter = std::min(len, prefix);
    if ((dst & mask(shorter)) != (network & mask(shorter))) continue;  // disjoint
    char name[IF_NAMESIZE] = "?";
    if (routes.oif[i] > 0) ::if_indextoname(static_cast<unsigned>(routes.oif[i]), name);
    if (std::string(name).rfind(own_prefix, 0) == 0) continue;  // ours (a dead predecessor's)
    return Ipv4Text(dst) + "/" + std::to_string(len) + " dev " + name;
  }
  return std::string();
}

}  // namespace nsbox::net

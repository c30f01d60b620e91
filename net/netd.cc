#include "net/netd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/json.hpp>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "base/files.h"
#include "base/log.h"
#include "base/unique_fd.h"
#include "net/firewall.h"
#include "net/netlink.h"
#include "net/policy.h"
#include "net/resolver.h"

namespace nsbox::net {
namespace asio = boost::asio;
namespace json = boost::json;

namespace {

constexpr size_t kMaxMessage = 1 << 20;
// What a name the resolver returned stays open for, at least.
constexpr uint32_t kMinLearnSeconds = 10;
constexpr uint32_t kMaxLearnSeconds = 86400;

struct Range {
  uint32_t network = 0;
  uint8_t prefix = 16;
  uint32_t gateway() const { return network + 1; }
  // Slots 1..max_slot: addresses network+2 .. the last before the broadcast address.
  int max_slot() const {
    const uint64_t size = uint64_t{1} << (32 - prefix);
    return static_cast<int>(std::min<uint64_t>(size - 3, 0xffff));
  }
};

Result<Range> ParseRange(const std::string& text) {
  auto e = ParseAllowEntry(text);
  if (!e.ok() || e->kind != AllowEntry::Kind::kCidr || e->port || e->prefix < 8 || e->prefix > 24) {
    return Error::Msg("--range '" + text + "' is not an IPv4 network from /8 to /24");
  }
  return Range{e->address, e->prefix};
}

Result<std::pair<uint32_t, uint16_t>> ParseUpstream(const std::string& text) {
  std::string host = text;
  uint16_t port = 53;
  if (size_t colon = text.rfind(':'); colon != std::string::npos) {
    host = text.substr(0, colon);
    try {
      const int p = std::stoi(text.substr(colon + 1));
      if (p < 1 || p > 65535) throw std::out_of_range("port");
      port = static_cast<uint16_t>(p);
    } catch (...) {
      return Error::Msg("--dns-upstream '" + text + "': the port is not a number in 1-65535");
    }
  }
  auto a = ParseIpv4(host);
  if (!a) return Error::Msg("--dns-upstream '" + text + "' is not an IPv4 ADDR[:PORT]");
  return std::pair{*a, port};
}

Mac MacFor(int slot, uint8_t end) {
  // Locally administered, unicast; both ends of every pair are on a link of their own.
  return Mac{0x02, 0x6e, 0x73, static_cast<uint8_t>(slot >> 8), static_cast<uint8_t>(slot), end};
}

std::string Describe(const json::value& v) { return json::serialize(v).substr(0, 200); }

// ---- the channel ----

Status SendJson(int fd, const json::object& o) {
  const std::string text = json::serialize(o);
  if (::send(fd, text.data(), text.size(), MSG_NOSIGNAL) < 0) {
    return Error::Sys("send", "channel", errno);
  }
  return Ok();
}

// One message and the fd it carried (if any); nullopt at the end of the channel.
Result<std::optional<std::pair<std::string, UniqueFd>>> Receive(int fd) {
  // The message's length first (a peek with MSG_TRUNC): a buffer of its size, not of the most.
  const ssize_t size = ::recv(fd, nullptr, 0, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
  if (size < 0) {
    if (errno == EAGAIN || errno == EINTR) return Error(EAGAIN, "no message");
    return Error::Sys("recv", "channel", errno);
  }
  std::string buf(std::min(static_cast<size_t>(size), kMaxMessage), '\0');
  iovec iov{buf.data(), buf.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return Error(EAGAIN, "no message");
    return Error::Sys("recvmsg", "channel", errno);
  }
  if (n == 0) return std::optional<std::pair<std::string, UniqueFd>>();
  UniqueFd passed;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got = -1;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
      if (!passed.valid()) {
        passed.reset(got);
      } else {
        ::close(got);  // one fd per message, never more
      }
    }
  }
  buf.resize(static_cast<size_t>(n));
  return std::optional<std::pair<std::string, UniqueFd>>(
      std::pair{std::move(buf), std::move(passed)});
}

// ---- the daemon's networks ----

struct Attachment {
  std::string key;
  std::string id;
  std::string interface;
  uint32_t address = 0;
  NetworkPolicy policy;
};

class Netd {
 public:
  Netd(NetdOptions options, Range range)
      : options_(std::move(options)),
        range_(range),
        prefix_("nsb" + options_.tag),
        gateway_if_(prefix_ + "gw") {}

  Status Setup(asio::io_context& io);
  void Teardown();
  json::object Handle(const json::object& request, UniqueFd fd);
  uint16_t log_group() const { return log_group_; }
  // A refused packet, as the NFLOG listener saw it.
  void LogRefusal(const std::string& prefix, const uint8_t* packet, size_t size) const;
  int nflog_fd() const { return nflog_ ? mnl_socket_get_fd(nflog_) : -1; }
  mnl_socket* nflog() const { return nflog_; }

 private:
  Result<Attachment*> Find(const json::object& request);
  Result<json::object> Attach(const json::object& request, UniqueFd fd);
  Status OpenNflog();

  NetdOptions options_;
  Range range_;
  std::string prefix_;
  std::string gateway_if_;
  std::optional<Netlink> netlink_;
  std::optional<Firewall> firewall_;
  std::unique_ptr<Resolver> resolver_;
  std::map<int, Attachment> slots_;
  int next_slot_ = 1;
  std::map<std::string, int> by_key_;
  std::map<uint32_t, int> by_address_;
  mnl_socket* nflog_ = nullptr;
  uint16_t log_group_ = 0;
};

Status Netd::OpenNflog() {
  nflog_ = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (nflog_ == nullptr) return Error::Sys("socket", "NETLINK_NETFILTER", errno);
  if (mnl_socket_bind(nflog_, 0, MNL_SOCKET_AUTOPID) != 0) {
    return Error::Sys("bind", "NETLINK_NETFILTER", errno);
  }
  // A group of the daemon's own: derived from its tag, the next free one if taken.
  uint32_t seed = 0;
  for (char ch : options_.tag) seed = seed * 31 + static_cast<unsigned char>(ch);
  for (int attempt = 0; attempt < 64; ++attempt) {
    const auto group =
        static_cast<uint16_t>(1000 + (seed + static_cast<uint32_t>(attempt)) % 60000);
    char buf[MNL_SOCKET_BUFFER_SIZE];
    auto config = [&](uint8_t command, bool with_mode) -> int {
      nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
      nlh->nlmsg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
      nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
      nlh->nlmsg_seq = static_cast<uint32_t>(attempt * 2 + command);
      auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
      nfg->nfgen_family = AF_UNSPEC;
      nfg->version = NFNETLINK_V0;
      nfg->res_id = htons(group);
      nfulnl_msg_config_cmd cmd{command};
      mnl_attr_put(nlh, NFULA_CFG_CMD, sizeof cmd, &cmd);
      if (with_mode) {
        nfulnl_msg_config_mode mode{};
        mode.copy_mode = NFULNL_COPY_PACKET;
        mode.copy_range = htonl(64);  // the IP and transport headers are enough
        mnl_attr_put(nlh, NFULA_CFG_MODE, sizeof mode, &mode);
      }
      if (mnl_socket_sendto(nflog_, nlh, nlh->nlmsg_len) < 0) return -1;
      // The acknowledgement (blocking wait is fine here: the socket is new and quiet).
      pollfd p{mnl_socket_get_fd(nflog_), POLLIN, 0};
      if (::poll(&p, 1, 1000) <= 0) return -1;
      ssize_t n = mnl_socket_recvfrom(nflog_, buf, sizeof buf);
      if (n < 0) return -1;
      return mnl_cb_run(buf, static_cast<size_t>(n), nlh->nlmsg_seq, mnl_socket_get_portid(nflog_),
                        nullptr, nullptr);
    };
    if (config(NFULNL_CFG_CMD_BIND, true) >= 0) {
      log_group_ = group;
      return Ok();
    }
  }
  return Error::Sys("bind", "an NFLOG group", errno);
}

Status Netd::Setup(asio::io_context& io) {
  NSBOX_ASSIGN_OR_RETURN(Netlink nl, Netlink::Open());
  netlink_.emplace(std::move(nl));
  FirewallConfig fc;
  fc.tag = options_.tag;
  fc.range = range_.network;
  fc.range_prefix = range_.prefix;
  fc.gateway = range_.gateway();
  if (auto st = OpenNflog(); !st.ok()) {
    log::warn("refused connections will be counted but not logged: {}", st.error().message());
  }
  fc.log_group = log_group_;
  NSBOX_ASSIGN_OR_RETURN(Firewall fw, Firewall::Create(fc));
  firewall_.emplace(std::move(fw));
  // What a dead predecessor of the same daemon left.
  NSBOX_TRY_CTX(firewall_->RemoveTable(), "remove the old table");
  NSBOX_ASSIGN_OR_RETURN(auto stale, netlink_->LinksWithPrefix(prefix_));
  for (const std::string& name : stale) {
    log::info("removing {}, left by a previous nsbox-net", name);
    (void)netlink_->DeleteLink(name);
  }
  NSBOX_ASSIGN_OR_RETURN(std::string conflict,
                         netlink_->ConflictingRoute(range_.network, range_.prefix, prefix_));
  if (!conflict.empty()) {
    return Error::Msg("the network range " + Ipv4Text(range_.network) + "/" +
                      std::to_string(range_.prefix) + " is in use on this host (route " + conflict +
                      "); give the daemon another with --network-range");
  }
  // Forwarding between the sandboxes' links and the others, as Docker turns it on.
  {
    UniqueFd f(::open("/proc/sys/net/ipv4/ip_forward", O_WRONLY | O_CLOEXEC));
    if (!f.valid() || ::write(f.get(), "1\n", 2) != 2) {
      return Error::Sys("write", "/proc/sys/net/ipv4/ip_forward", errno)
          .Context("enable IPv4 forwarding");
    }
  }
  {
    // The gateway's address lives on a link of its own: a veth pair whose both ends stay on the
    // host (kernels without the dummy driver, like this project's CI machines, have veth).
    UniqueFd self(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!self.valid()) return Error::Sys("open", "/proc/self/ns/net", errno);
    NSBOX_TRY(
        netlink_->AddVeth(gateway_if_, MacFor(0, 1), prefix_ + "gp", MacFor(0, 2), self.get()));
  }
  NSBOX_TRY(netlink_->SetUpWithoutIpv6(gateway_if_));
  NSBOX_TRY(netlink_->SetUpWithoutIpv6(prefix_ + "gp"));
  NSBOX_TRY(netlink_->AddAddress(gateway_if_, range_.gateway(), 32));
  NSBOX_TRY(firewall_->Install());

  std::vector<std::pair<uint32_t, uint16_t>> upstreams;
  for (const std::string& u : options_.dns_upstreams) {
    NSBOX_ASSIGN_OR_RETURN(auto parsed, ParseUpstream(u));
    upstreams.push_back(parsed);
  }
  if (upstreams.empty()) {
    auto text = ReadFile("/etc/resolv.conf");
    if (text.ok()) upstreams = NameserversOf(*text);
  }
  if (upstreams.empty()) {
    log::warn(
        "no DNS upstream (no IPv4 nameserver in /etc/resolv.conf, no --dns-upstream): "
        "names of allowlists will not resolve");
  }
  Resolver::Options ro;
  ro.listen_address = range_.gateway();
  ro.port = 53;
  ro.upstreams = upstreams;
  auto policy_for = [this](uint32_t source) -> const NetworkPolicy* {
    auto it = by_address_.find(source);
    return it == by_address_.end() ? nullptr : &slots_.at(it->second).policy;
  };
  auto open = [this](uint32_t source, const NameVerdict& verdict,
                     const std::vector<Resolver::Learned>& learned) -> Status {
    auto it = by_address_.find(source);
    if (it == by_address_.end()) return Error::Msg("unknown source");
    const Attachment& a = slots_.at(it->second);
    if (a.policy.mode != NetworkPolicy::Mode::kAllow) return Ok();  // open: nothing to open
    // One batch per TTL, each address opened for its own TTL (at least kMinLearnSeconds).
    std::map<uint32_t, std::vector<uint32_t>> by_ttl;
    for (const auto& l : learned) {
      by_ttl[std::clamp(l.ttl_seconds, kMinLearnSeconds, kMaxLearnSeconds)].push_back(l.address);
    }
    for (const auto& [ttl, addresses] : by_ttl) {
      NSBOX_TRY(firewall_->Learn(it->second, addresses, ttl, verdict.ports, verdict.all_ports));
    }
    return Ok();
  };
  NSBOX_ASSIGN_OR_RETURN(resolver_, Resolver::Start(io, ro, policy_for, open));
  return Ok();
}

void Netd::Teardown() {
  resolver_.reset();
  if (firewall_) {
    if (auto st = firewall_->RemoveTable(); !st.ok()) log::warn("{}", st.error().message());
  }
  if (netlink_) {
    auto links = netlink_->LinksWithPrefix(prefix_);
    if (links.ok()) {
      for (const std::string& name : *links) (void)netlink_->DeleteLink(name);
    }
  }
  if (nflog_ != nullptr) {
    mnl_socket_close(nflog_);
    nflog_ = nullptr;
  }
}

Result<Attachment*> Netd::Find(const json::object& request) {
  const json::value* key = request.if_contains("key");
  if (key == nullptr || !key->is_string()) return Error::Msg("no \"key\"");
  auto it = by_key_.find(std::string(key->as_string()));
  if (it == by_key_.end()) return Error::Msg("no sandbox attached under " + Describe(*key));
  return &slots_.at(it->second);
}

Result<json::object> Netd::Attach(const json::object& request, UniqueFd netns) {
  const json::value* key = request.if_contains("key");
  const json::value* id = request.if_contains("id");
  const json::value* policy_json = request.if_contains("policy");
  if (key == nullptr || !key->is_string() || id == nullptr || !id->is_string() ||
      policy_json == nullptr) {
    return Error::Msg("attach needs key, id and policy");
  }
  if (!netns.valid()) return Error::Msg("attach needs the network namespace's fd");
  NSBOX_ASSIGN_OR_RETURN(NetworkPolicy policy, ParseStoredPolicy(*policy_json));
  const std::string k(key->as_string());
  if (by_key_.count(k) != 0) return Error::Msg("sandbox " + k + " is attached already");
  // Round robin, not the lowest free slot: an address just given up is not handed out again at
  // once, so that a late answer of the resolver or a stale conntrack entry of the old sandbox
  // never opens anything for the new one.
  if (static_cast<int>(slots_.size()) >= range_.max_slot()) {
    return Error::Msg("the network range is full (" + std::to_string(range_.max_slot()) +
                      " sandboxes with a network); give the daemon a larger --network-range");
  }
  int slot = next_slot_;
  while (slots_.count(slot) != 0) slot = slot % range_.max_slot() + 1;
  next_slot_ = slot % range_.max_slot() + 1;
  Attachment a;
  a.key = k;
  a.id = std::string(id->as_string());
  a.address = range_.network + 1 + static_cast<uint32_t>(slot);
  char name[16];
  std::snprintf(name, sizeof name, "%s%04x", prefix_.c_str(), slot);
  a.interface = name;
  a.policy = std::move(policy);
  const Mac host_mac = MacFor(slot, 1);
  const Mac peer_mac = MacFor(slot, 2);
  auto made = [&]() -> Status {
    NSBOX_TRY(netlink_->AddVeth(a.interface, host_mac, "eth0", peer_mac, netns.get()));
    NSBOX_TRY(firewall_->AddSandbox(slot, a.interface, a.address, a.policy));
    NSBOX_ASSIGN_OR_RETURN(Netlink inside, Netlink::Open(netns.get()));
    NSBOX_TRY(inside.SetUpWithoutIpv6("eth0"));
    NSBOX_TRY(inside.AddAddress("eth0", a.address, 32));
    NSBOX_TRY(inside.AddPermanentNeighbour("eth0", range_.gateway(), host_mac));
    NSBOX_TRY(inside.AddRoute("eth0", range_.gateway(), 32));
    NSBOX_TRY(inside.AddRoute("eth0", 0, 0, range_.gateway()));
    NSBOX_TRY(netlink_->SetUpWithoutIpv6(a.interface));
    NSBOX_TRY(netlink_->AddPermanentNeighbour(a.interface, a.address, peer_mac));
    NSBOX_TRY(netlink_->AddRoute(a.interface, a.address, 32));
    return Ok();
  }();
  if (!made.ok()) {
    (void)netlink_->DeleteLink(a.interface);
    (void)firewall_->RemoveSandbox(slot, a.interface);
    return std::move(made).error().Context("attach sandbox " + a.id);
  }
  log::info("sandbox={} network {}: {} on {}", a.id, PolicySummary(a.policy), Ipv4Text(a.address),
            a.interface);
  json::object reply;
  reply["address"] = Ipv4Text(a.address);
  reply["interface"] = a.interface;
  by_key_[k] = slot;
  by_address_[a.address] = slot;
  slots_[slot] = std::move(a);
  return reply;
}

json::object Netd::Handle(const json::object& request, UniqueFd fd) {
  json::object reply;
  auto fail = [&](const Error& e) {
    json::object r;
    r["error"] = e.message();
    return r;
  };
  const json::value* op = request.if_contains("op");
  const std::string name = op != nullptr && op->is_string() ? std::string(op->as_string()) : "";
  if (name == "attach") {
    auto r = Attach(request, std::move(fd));
    return r.ok() ? std::move(r).value() : fail(r.error());
  }
  if (name == "policy") {
    auto a = Find(request);
    if (!a.ok()) return fail(a.error());
    const json::value* p = request.if_contains("policy");
    if (p == nullptr) return fail(Error::Msg("policy needs \"policy\""));
    auto policy = ParseStoredPolicy(*p);
    if (!policy.ok()) return fail(policy.error());
    const int slot = by_key_.at((*a)->key);
    if (auto st = firewall_->ReplacePolicy(slot, (*a)->address, *policy); !st.ok()) {
      return fail(st.error());
    }
    (*a)->policy = std::move(policy).value();
    log::info("sandbox={} network policy now {}", (*a)->id, PolicySummary((*a)->policy));
    return reply;
  }
  if (name == "detach") {
    auto a = Find(request);
    if (!a.ok()) return fail(a.error());
    const int slot = by_key_.at((*a)->key);
    Status removed = firewall_->RemoveSandbox(slot, (*a)->interface);
    // Gone already when the sandbox's namespace ended (its init exited): not an error.
    Status deleted = netlink_->DeleteLink((*a)->interface);
    if (!deleted.ok() && deleted.error().code() != ENODEV) {
      log::warn("sandbox={} {}", (*a)->id, deleted.error().message());
    }
    log::info("sandbox={} network removed ({})", (*a)->id, (*a)->interface);
    by_address_.erase((*a)->address);
    by_key_.erase((*a)->key);
    slots_.erase(slot);
    if (!removed.ok()) return fail(removed.error());
    return reply;
  }
  if (name == "counters") {
    auto counts = firewall_->Counters();
    if (!counts.ok()) return fail(counts.error());
    json::object all;
    for (const auto& [slot, c] : *counts) {
      auto it = slots_.find(slot);
      if (it == slots_.end()) continue;
      json::object one;
      one["allowed"] = c.allowed;
      one["refused"] = c.refused;
      all[it->second.key] = std::move(one);
    }
    reply["counters"] = std::move(all);
    return reply;
  }
  return fail(Error::Msg("unknown op " + (op != nullptr ? Describe(*op) : std::string("(none)"))));
}

void Netd::LogRefusal(const std::string& prefix, const uint8_t* p, size_t size) const {
  // prefix "nsbox:<slot>:<rule> "
  int slot = 0;
  char rule[32] = "?";
  if (std::sscanf(prefix.c_str(), "nsbox:%d:%31[a-z]", &slot, rule) < 1) return;
  auto it = slots_.find(slot);
  const std::string id = it != slots_.end() ? it->second.id : "(slot " + std::to_string(slot) + ")";
  std::string what = "a packet";
  if (size >= 20 && (p[0] >> 4) == 4) {
    const size_t header = static_cast<size_t>(p[0] & 0x0f) * 4;
    const uint8_t proto = p[9];
    uint32_t src = 0, dst = 0;
    std::memcpy(&src, p + 12, 4);
    std::memcpy(&dst, p + 16, 4);
    std::string port;
    if ((proto == IPPROTO_TCP || proto == IPPROTO_UDP) && size >= header + 4) {
      port = ":" + std::to_string(p[header + 2] << 8 | p[header + 3]);
    }
    const char* proto_name = proto == IPPROTO_TCP    ? "tcp"
                             : proto == IPPROTO_UDP  ? "udp"
                             : proto == IPPROTO_ICMP ? "icmp"
                                                     : "ip";
    what =
        std::string(proto_name) + " " + Ipv4Text(ntohl(src)) + "->" + Ipv4Text(ntohl(dst)) + port;
  }
  const char* why = std::strcmp(rule, "host") == 0      ? "the host itself"
                    : std::strcmp(rule, "special") == 0 ? "loopback, link-local or multicast"
                    : std::strcmp(rule, "sandbox") == 0 ? "another sandbox"
                                                        : "not allowed by the policy";
  log::warn("sandbox={} refused {} (rule: {}, {})", id, what, rule, why);
}

// Reads what NFLOG has (non-blocking) and logs each refused packet.
void DrainNflog(const Netd& netd) {
  char buf[MNL_SOCKET_BUFFER_SIZE];
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(netd.nflog(), buf, sizeof buf);
    if (n <= 0) return;
    auto cb = [](const nlmsghdr* h, void* data) -> int {
      const auto* self = static_cast<const Netd*>(data);
      std::string prefix;
      const uint8_t* payload = nullptr;
      size_t payload_len = 0;
      ForEachAttr(h, sizeof(nfgenmsg), [&](const nlattr* attr) {
        if (mnl_attr_get_type(attr) == NFULA_PREFIX) prefix = mnl_attr_get_str(attr);
        if (mnl_attr_get_type(attr) == NFULA_PAYLOAD) {
          payload = static_cast<const uint8_t*>(mnl_attr_get_payload(attr));
          payload_len = mnl_attr_get_payload_len(attr);
        }
      });
      self->LogRefusal(prefix, payload, payload != nullptr ? payload_len : 0);
      return MNL_CB_OK;
    };
    mnl_cb_run(buf, static_cast<size_t>(n), 0, 0, cb, const_cast<Netd*>(&netd));
  }
}

}  // namespace

int RunNetd(const NetdOptions& options) {
  ::signal(SIGPIPE, SIG_IGN);
  const int channel = options.channel_fd;
  auto fail_early = [&](const std::string& message) {
    json::object o;
    o["error"] = message;
    (void)SendJson(channel, o);
    log::error("{}", message);
    return 1;
  };
  auto range = ParseRange(options.range);
  if (!range.ok()) return fail_early(range.error().message());
  if (options.tag.empty() || options.tag.size() > 8 ||
      options.tag.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return fail_early("--tag must be 1 to 8 lowercase hex digits");
  }
  asio::io_context io(1);
  Netd netd(options, *range);
  if (auto st = netd.Setup(io); !st.ok()) {
    netd.Teardown();
    return fail_early(st.error().message());
  }
  json::object ready;
  ready["ready"] = true;
  ready["gateway"] = Ipv4Text(range->gateway());
  if (!SendJson(channel, ready).ok()) {
    netd.Teardown();
    return 1;
  }
  log::info("nsbox-net: range {}, gateway {}, table inet nsbox_{}", options.range,
            Ipv4Text(range->gateway()), options.tag);

  asio::posix::stream_descriptor control(io, ::dup(channel));
  std::function<void()> wait_control;
  wait_control = [&] {
    control.async_wait(asio::posix::stream_descriptor::wait_read,
                       [&](boost::system::error_code ec) {
                         if (ec) return;
                         for (;;) {
                           auto message = Receive(channel);
                           if (!message.ok()) {
                             if (message.error().code() == EAGAIN) break;
                             log::error("{}", message.error().message());
                             io.stop();
                             return;
                           }
                           if (!message->has_value()) {  // the daemon is gone
                             io.stop();
                             return;
                           }
                           auto& [text, fd] = **message;
                           boost::system::error_code parse_ec;
                           json::value v = json::parse(text, parse_ec);
                           json::object reply;
                           if (parse_ec || !v.is_object()) {
                             reply["error"] = "a request is not a JSON object";
                           } else {
                             reply = netd.Handle(v.as_object(), std::move(fd));
                           }
                           if (!SendJson(channel, reply).ok()) {
                             io.stop();
                             return;
                           }
                         }
                         wait_control();
                       });
  };
  wait_control();

  std::optional<asio::posix::stream_descriptor> nflog;
  std::function<void()> wait_nflog;
  if (netd.nflog_fd() >= 0 && netd.log_group() != 0) {
    nflog.emplace(io, ::dup(netd.nflog_fd()));
    wait_nflog = [&] {
      nflog->async_wait(asio::posix::stream_descriptor::wait_read,
                        [&](boost::system::error_code ec) {
                          if (ec) return;
                          DrainNflog(netd);
                          wait_nflog();
                        });
    };
    wait_nflog();
  }
  asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&](boost::system::error_code, int) { io.stop(); });
  io.run();
  netd.Teardown();
  log::info("nsbox-net: removed table inet nsbox_{} and its interfaces", options.tag);
  return 0;
}

int RunProbe() {
  int rc = 0;
  auto line = [&](const std::string& name, const Status& st, const std::string& ok_detail) {
    if (st.ok()) {
      std::printf("%s: ok (%s)\n", name.c_str(), ok_detail.c_str());
    } else {
      std::printf("%s: missing (%s)\n", name.c_str(), st.error().message().c_str());
      rc = 1;
    }
  };
  line("nftables", Firewall::Probe(), "a scratch table made and removed");
  Status veth = []() -> Status {
    NSBOX_ASSIGN_OR_RETURN(Netlink nl, Netlink::Open());
    UniqueFd self(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!self.valid()) return Error::Sys("open", "/proc/self/ns/net", errno);
    const std::string name = "nsbprobe" + std::to_string(::getpid() % 100000);
    NSBOX_TRY(nl.AddVeth(name, MacFor(0, 1), name + "p", MacFor(0, 2), self.get()));
    return nl.DeleteLink(name);
  }();
  line("veth", veth, "a pair made and removed");
  auto forward = ReadFile("/proc/sys/net/ipv4/ip_forward");
  const bool on = forward.ok() && !forward->empty() && (*forward)[0] == '1';
  std::printf("ip_forward: ok (%s)\n",
              on ? "on" : "off now; nsbox-net turns it on when a sandbox gets a network");
  auto resolv = ReadFile("/etc/resolv.conf");
  auto servers = resolv.ok() ? NameserversOf(*resolv) : decltype(NameserversOf("")){};
  if (servers.empty()) {
    std::printf(
        "resolver upstreams: missing (no IPv4 nameserver in /etc/resolv.conf; give nsbox serve "
        "--dns-upstream)\n");
  } else {
    std::string list;
    for (const auto& [a, p] : servers)
      list += (list.empty() ? "" : ", ") + Ipv4Text(a) + ":" + std::to_string(p);
    std::printf("resolver upstreams: ok (%s, from /etc/resolv.conf)\n", list.c_str());
  }
  return rc;
}

}  // namespace nsbox::net

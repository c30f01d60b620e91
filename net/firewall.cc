#include "net/firewall.h"

#include <nftables/libnftables.h>

#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>

#include "net/nft_elements.h"

namespace nsbox::net {
namespace json = boost::json;

namespace {

std::string Cidr(uint32_t address, uint8_t prefix) {
  return Ipv4Text(address) + "/" + std::to_string(prefix);
}

// Refusals are logged at most this often per sandbox and reason (the rest only counted).
constexpr const char* kLogLimit = "limit rate 10/second burst 20 packets";

}  // namespace

Result<Firewall> Firewall::Create(const FirewallConfig& config) {
  nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  if (ctx == nullptr) return Error::Msg("nft_ctx_new failed");
  if (nft_ctx_buffer_output(ctx) != 0 || nft_ctx_buffer_error(ctx) != 0) {
    nft_ctx_free(ctx);
    return Error::Msg("nft_ctx_buffer_output failed");
  }
  auto elements = NftElements::Open();
  if (!elements.ok()) {
    nft_ctx_free(ctx);
    return std::move(elements).error();
  }
  return Firewall(ctx, std::move(*elements), config);
}

Firewall::Firewall(nft_ctx* ctx, std::unique_ptr<NftElements> elements, FirewallConfig config)
    : ctx_(ctx),
      elements_(std::move(elements)),
      config_(std::move(config)),
      table_("inet nsbox_" + config_.tag),
      if_prefix_("nsb" + config_.tag) {}

Firewall::Firewall(Firewall&& other) noexcept
    : ctx_(other.ctx_),
      elements_(std::move(other.elements_)),
      config_(std::move(other.config_)),
      table_(std::move(other.table_)),
      if_prefix_(std::move(other.if_prefix_)) {
  other.ctx_ = nullptr;
}

Firewall::~Firewall() {
  if (ctx_ != nullptr) nft_ctx_free(ctx_);
}

Status Firewall::Run(const std::string& commands, std::string* output) {
  nft_ctx_output_set_flags(ctx_, output != nullptr ? NFT_CTX_OUTPUT_JSON : 0);
  const int rc = nft_run_cmd_from_buffer(ctx_, commands.c_str());
  if (output != nullptr) *output = nft_ctx_get_output_buffer(ctx_);
  std::string error = nft_ctx_get_error_buffer(ctx_);
  if (rc != 0) {
    while (!error.empty() && (error.back() == '\n' || error.back() == ' ')) error.pop_back();
    if (error.size() > 2000) error = error.substr(0, 2000) + "...";
    return Error::Msg("nft: " + (error.empty() ? std::string("failed") : error));
  }
  return Ok();
}

Status Firewall::RemoveTable() {
  // "destroy" is nft 1.0.8; an add (a no-op when present) then a delete does the same.
  return Run("add table " + table_ + "\ndelete table " + table_ + "\n");
}

Status Firewall::Install() {
  const std::string t = table_;
  const std::string ifs = "\"" + if_prefix_ + "*\"";
  std::string c;
  c += "add table " + t + "\n";
  // Dispatch by input interface to the sandbox's chain, before the host's own filter.
  c += "add map " + t + " sandboxes { type ifname : verdict; }\n";
  // Addresses no sandbox reaches unless a CIDR entry names them. One named set for all: the
  // sandboxes' rules use no anonymous set (`{ ... }` in a rule), since libnftables reads every
  // set of the ruleset, elements included, before each transaction, and anonymous ones made an
  // attach and a learned address cost 7 ms at 200 sandboxes instead of 1 (docs/perf-notes.md).
  c += "add set " + t +
       " special { type ipv4_addr; flags interval; elements = { 127.0.0.0/8, 169.254.0.0/16, "
       "0.0.0.0/8, 224.0.0.0/3 }; }\n";
  c += "add chain " + t + " input { type filter hook input priority filter - 5; policy accept; }\n";
  c += "add chain " + t +
       " forward { type filter hook forward priority filter - 5; policy accept; }\n";
  c += "add chain " + t +
       " postrouting { type nat hook postrouting priority srcnat; policy accept; }\n";
  c += "add rule " + t + " input iifname vmap @sandboxes\n";
  c += "add rule " + t + " forward iifname vmap @sandboxes\n";
  // Into a sandbox: only the answers of its own connections.
  c += "add rule " + t + " forward oifname " + ifs + " ct state established,related accept\n";
  c += "add rule " + t + " forward oifname " + ifs + " drop\n";
  c += "add rule " + t + " postrouting ip saddr " + Cidr(config_.range, config_.range_prefix) +
       " oifname != " + ifs + " masquerade\n";
  return Run(c);
}

std::string Firewall::Rules(int slot, uint32_t address, const NetworkPolicy& policy) const {
  const std::string n = std::to_string(slot);
  const std::string t = table_;
  const std::string chain = "sb_" + n;
  const std::string allowed = "counter name \"allowed_" + n + "\" accept";
  const std::string group = std::to_string(config_.log_group);
  auto rule = [&](const std::string& body) {
    return "add rule " + t + " " + chain + " " + body + "\n";
  };
  auto refuse = [&](const std::string& match, const std::string& reason) {
    return rule(match + (match.empty() ? "" : " ") + kLogLimit + " log group " + group +
                " prefix \"nsbox:" + n + ":" + reason + " \"") +
           rule(match + (match.empty() ? "" : " ") + "goto refuse_" + n);
  };
  std::string c;
  c += rule("meta nfproto ipv6 drop");
  c += rule("ip saddr != " + Ipv4Text(address) + " drop");  // forged sources
  c += rule("ct state established,related accept");
  // TCP and UDP as two rules rather than `meta l4proto { tcp, udp }`: no anonymous set (above).
  for (const char* proto : {"tcp", "udp"}) {
    c += rule("ip daddr " + Ipv4Text(config_.gateway) + " " + proto + " dport 53 accept");
  }
  // The CIDR entries, in two rounds around the refusals of what a sandbox reaches only by name:
  // another sandbox, the host (its addresses, the gateway's among them, and a directed broadcast
  // of one of its links), loopback, link-local (cloud metadata at 169.254.169.254), multicast.
  // An entry of one address (a /32) names its destination and comes first: listed, it is
  // reachable even where those refusals would refuse it, in an allowlist as in open mode. A
  // wider range comes after them: it opens what it covers elsewhere, never all of that, however
  // wide (0.0.0.0/0, 10.0.0.0/8 over the gateway): before 2026-12-07 it came before the refusals
  // of the host and the special addresses, and `{"allow": ["0.0.0.0/0"]}` reached the metadata
  // service and the host's services. Nothing new may enter a sandbox's link unasked, and an
  // accept in a sandbox's chain ends the `forward` hook before the `oifname` drop: hence the
  // refusal of the range before the wide entries.
  auto entries = [&](bool one_address) {
    std::string out;
    for (const AllowEntry& e : policy.allow) {
      if (e.kind != AllowEntry::Kind::kCidr || (e.prefix == 32) != one_address) continue;
      const std::string match = "ip daddr " + Cidr(e.address, e.prefix);
      if (!e.port) {
        out += rule(match + " " + allowed);
        continue;
      }
      for (const char* proto : {"tcp", "udp"}) {
        out += rule(match + " " + proto + " dport " + std::to_string(*e.port) + " " + allowed);
      }
    }
    return out;
  };
  c += entries(true);
  c += refuse("ip daddr != " + Ipv4Text(config_.gateway) + " ip daddr " +
                  Cidr(config_.range, config_.range_prefix),
              "sandbox");
  // The gateway is the host's address on the link: local, refused here as the host.
  c += refuse("fib daddr type local", "host");
  // A directed broadcast (192.0.2.255 on the host's 192.0.2.0/24) is delivered to the host's own
  // sockets as well, but is not of type local.
  c += refuse("fib daddr type broadcast", "host");
  c += refuse("ip daddr @special", "special");
  c += entries(false);
  if (policy.mode == NetworkPolicy::Mode::kOpen) {
    c += rule(allowed);
  } else {
    c += rule("ip daddr @learned_" + n + " " + allowed);
    for (const char* proto : {"tcp", "udp"}) {
      c += rule(std::string("meta l4proto ") + proto + " ip daddr . th dport @learnedp_" + n + " " +
                allowed);
    }
  }
  c += refuse("", "policy");
  return c;
}

Status Firewall::AddSandbox(int slot, const std::string& interface, uint32_t address,
                            const NetworkPolicy& policy) {
  const std::string n = std::to_string(slot);
  const std::string t = table_;
  std::string c;
  c += "add counter " + t + " allowed_" + n + "\n";
  c += "add counter " + t + " refused_" + n + "\n";
  c += "add set " + t + " learned_" + n + " { type ipv4_addr; flags timeout; }\n";
  c += "add set " + t + " learnedp_" + n + " { type ipv4_addr . inet_service; flags timeout; }\n";
  c += "add chain " + t + " refuse_" + n + "\n";
  c += "add rule " + t + " refuse_" + n + " counter name \"refused_" + n + "\"\n";
  c += "add rule " + t + " refuse_" + n + " meta l4proto tcp reject with tcp reset\n";
  c += "add rule " + t + " refuse_" + n + " reject with icmpx admin-prohibited\n";
  c += "add chain " + t + " sb_" + n + "\n";
  c += Rules(slot, address, policy);
  c += "add element " + t + " sandboxes { \"" + interface + "\" : jump sb_" + n + " }\n";
  return Run(c);
}

Status Firewall::ReplacePolicy(int slot, uint32_t address, const NetworkPolicy& policy) {
  const std::string n = std::to_string(slot);
  std::string c;
  c += "flush chain " + table_ + " sb_" + n + "\n";
  c += "flush set " + table_ + " learned_" + n + "\n";
  c += "flush set " + table_ + " learnedp_" + n + "\n";
  c += Rules(slot, address, policy);
  return Run(c);
}

Status Firewall::RemoveSandbox(int slot, const std::string& interface) {
  const std::string n = std::to_string(slot);
  const std::string t = table_;
  std::string c;
  c += "delete element " + t + " sandboxes { \"" + interface + "\" }\n";
  c += "flush chain " + t + " sb_" + n + "\n";
  c += "delete chain " + t + " sb_" + n + "\n";
  c += "delete chain " + t + " refuse_" + n + "\n";
  c += "delete set " + t + " learned_" + n + "\n";
  c += "delete set " + t + " learnedp_" + n + "\n";
  c += "delete counter " + t + " allowed_" + n + "\n";
  c += "delete counter " + t + " refused_" + n + "\n";
  return Run(c);
}

Status Firewall::Learn(int slot, const std::vector<uint32_t>& addresses, uint32_t seconds,
                       const std::vector<uint16_t>& ports, bool all_ports) {
  // On the resolver's path, once per answer: written over netlink by NftElements, whose cost
  // does not grow with the ruleset as a libnftables command's does. Each key is added, deleted
  // and added again with the timeout, so that a later answer extends what an earlier opened.
  std::vector<std::string> keys;
  for (uint32_t a : addresses) {
    if (all_ports) {
      keys.push_back(NftElements::Ipv4Key(a));
    } else {
      for (uint16_t p : ports) keys.push_back(NftElements::Ipv4PortKey(a, p));
    }
  }
  const std::string set = (all_ports ? "learned_" : "learnedp_") + std::to_string(slot);
  return elements_->Refresh("nsbox_" + config_.tag, set, keys, uint64_t{seconds} * 1000);
}

Result<std::map<int, Firewall::Counts>> Firewall::Counters() {
  std::string out;
  NSBOX_TRY(Run("list counters table " + table_, &out));
  std::map<int, Counts> counts;
  boost::system::error_code ec;
  json::value v = json::parse(out, ec);
  if (ec || !v.is_object()) return Error::Msg("nft list counters: not JSON");
  const json::value* items = v.as_object().if_contains("nftables");
  if (items == nullptr || !items->is_array()) return counts;
  for (const json::value& item : items->as_array()) {
    const json::object* o = item.if_object();
    const json::value* counter = o != nullptr ? o->if_contains("counter") : nullptr;
    if (counter == nullptr || !counter->is_object()) continue;
    const json::object& c = counter->as_object();
    const json::value* name = c.if_contains("name");
    const json::value* packets = c.if_contains("packets");
    if (name == nullptr || !name->is_string() || packets == nullptr) continue;
    const std::string text(name->as_string());
    const size_t underscore = text.find('_');
    if (underscore == std::string::npos) continue;
    int slot = 0;
    try {
      slot = std::stoi(text.substr(underscore + 1));
    } catch (...) {
      continue;
    }
    boost::system::error_code number_ec;
    const auto value = packets->to_number<uint64_t>(number_ec);
    if (number_ec) continue;
    if (text.rfind("allowed_", 0) == 0) counts[slot].allowed = value;
    if (text.rfind("refused_", 0) == 0) counts[slot].refused = value;
  }
  return counts;
}

Status Firewall::Probe() {
  FirewallConfig config;
  config.tag = "probe" + std::to_string(::getpid());
  NSBOX_ASSIGN_OR_RETURN(Firewall fw, Create(config));
  NSBOX_TRY(fw.Run("add table " + fw.table_ + "\nadd chain " + fw.table_ +
                   " c { type filter hook forward priority 0; policy accept; }\n"));
  return fw.RemoveTable();
}

}  // namespace nsbox::net

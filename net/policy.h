#pragma once

// A sandbox's network policy (docs/network.md): what nsboxd stores in config.json and gives to
// nsbox-net, which enforces it with nftables and the resolver. Pure values and parsing: used by
// the daemon (static nsbox), by nsbox-net and by the tests.
//
// The JSON form (api.md "network"):
//   "none"                                  loopback only (the default)
//   "open"                                  all egress except the host, link-local addresses
//                                           and other sandboxes
//   {"allow": ["pkg.example.com", "*.cdn.example.net", "git.example.org:443", "10.20.0.0/16"]}
//   {"open": true, "allow": [...]}          open, and the listed entries reachable even when
//                                           they are the host, link-local or another sandbox

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/value.hpp>

#include "base/error.h"

namespace nsbox::net {

// At most this many entries in one allowlist.
inline constexpr size_t kMaxAllowEntries = 1024;

struct AllowEntry {
  enum class Kind { kDomain, kWildcard, kCidr };
  Kind kind = Kind::kDomain;
  // kDomain: the name, lowercase, without a trailing dot. kWildcard: the suffix after "*."
  // ("*.cdn.example.net" -> "cdn.example.net"); it matches names below the suffix, at any depth,
  // never the suffix itself.
  std::string domain;
  // kCidr: the network address (host byte order, host bits zero) and prefix length (0..32).
  uint32_t address = 0;
  uint8_t prefix = 32;
  // Only this destination port (TCP and UDP); nullopt: every port.
  std::optional<uint16_t> port;

  // The normalised text: "git.example.org:443", "*.cdn.example.net", "10.20.0.0/16",
  // "10.0.0.7" (a /32 is written without its prefix).
  std::string Text() const;
  bool operator==(const AllowEntry&) const = default;
};

struct NetworkPolicy {
  enum class Mode { kNone, kAllow, kOpen };
  Mode mode = Mode::kNone;
  std::vector<AllowEntry> allow;  // in the order given, duplicates removed

  bool networked() const { return mode != Mode::kNone; }
  bool operator==(const NetworkPolicy&) const = default;
};

// One allowlist entry. The error names the entry and says what is wrong with it
// ("allow entry 'foo..com': empty label", "allow entry 'x:0': port 0 is outside 1-65535",
// "allow entry '::1': IPv6 entries are not supported, sandboxes have IPv4 only").
Result<AllowEntry> ParseAllowEntry(std::string_view text);
// The JSON form above, as a client sends it; errors name the offending value. An allow list
// that is empty (and not open) is refused: it would reach nothing, as "none" does.
Result<NetworkPolicy> ParsePolicy(const boost::json::value& value);
// The same for a policy stored before the empty allow list was refused (a sandbox's
// config.json) or passed on from one (nsbox-net): an empty allow list is taken as it is.
Result<NetworkPolicy> ParseStoredPolicy(const boost::json::value& value);
// Back to JSON: "none", "open", {"allow": [...]} or {"open": true, "allow": [...]}.
boost::json::value PolicyToJson(const NetworkPolicy& policy);
// Short text for logs and the CLI: "none", "open", "allow(3)", "open+allow(2)".
std::string PolicySummary(const NetworkPolicy& policy);

// What the resolver may answer for `name` (any case, trailing dot or not), a name as ldns writes
// it: a name with an escape ("\." for a dot inside a label, "\DDD" for other bytes) is
// allowed only by an open policy, since "a\.cdn.example.net" (the labels "a.cdn", "example",
// "net") would read as a name below "cdn.example.net".
struct NameVerdict {
  bool allowed = false;
  bool all_ports = false;       // an entry without a port matched (or the policy is open)
  std::vector<uint16_t> ports;  // else: the ports of the matching entries, sorted, unique
};
NameVerdict MatchName(const NetworkPolicy& policy, std::string_view name);

// "10.20.0.0" for the host-order address; ParseIpv4 is its inverse (strict dotted quad).
std::string Ipv4Text(uint32_t address);
std::optional<uint32_t> ParseIpv4(std::string_view text);

}  // namespace nsbox::net

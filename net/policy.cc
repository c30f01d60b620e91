#include "net/policy.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include <boost/json.hpp>

namespace nsbox::net {
namespace json = boost::json;

namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) {
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  }
  return out;
}

// Digits only, no sign, no leading '+', within [lo, hi].
std::optional<uint32_t> ParseNumber(std::string_view s, uint32_t hi) {
  if (s.empty() || s.size() > 10) return std::nullopt;
  uint32_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v > hi) return std::nullopt;
  return v;
}

// Why `name` is not a DNS name (RFC 1123 labels: letters, digits, inner '-'; at most 63 bytes
// each, 253 in all), or "" when it is one. Underscores are accepted (_service labels exist).
std::string BadDomain(std::string_view name) {
  if (name.empty()) return "empty name";
  if (name.size() > 253) return "name longer than 253 bytes";
  size_t start = 0;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    std::string_view label = name.substr(start, dot - start);
    if (label.empty()) return "empty label";
    if (label.size() > 63) return "label '" + std::string(label) + "' longer than 63 bytes";
    if (label.front() == '-' || label.back() == '-') {
      return "label '" + std::string(label) + "' starts or ends with '-'";
    }
    for (char ch : label) {
      const bool ok =
          (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_';
      if (!ok) {
        const auto byte = static_cast<unsigned char>(ch);
        if (byte < 0x21 || byte >= 0x7f) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", byte);
          return std::string("byte ") + hex + " is not allowed in a name";
        }
        return "character '" + std::string(1, ch) + "' is not allowed in a name";
      }
    }
    start = dot + 1;
  }
  return "";
}

bool LooksNumeric(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
    return (ch >= '0' && ch <= '9') || ch == '.' || ch == '/';
  });
}

Error EntryError(std::string_view text, std::string_view why) {
  std::string shown(text.substr(0, 300));
  for (char& ch : shown) {
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
  }
  return Error::Msg("allow entry '" + shown + "': " + std::string(why));
}

}  // namespace

std::string Ipv4Text(uint32_t a) {
  return std::to_string(a >> 24) + "." + std::to_string((a >> 16) & 0xff) + "." +
         std::to_string((a >> 8) & 0xff) + "." + std::to_string(a & 0xff);
}

std::optional<uint32_t> ParseIpv4(std::string_view text) {
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    size_t dot = i < 3 ? text.find('.') : text.size();
    if (dot == std::string_view::npos) return std::nullopt;
    std::string_view part = text.substr(0, dot);
    // "010" is octal to inet_aton and decimal to others: refused, as ambiguous.
    if (part.size() > 1 && part.front() == '0') return std::nullopt;
    auto v = ParseNumber(part, 255);
    if (!v) return std::nullopt;
    out = (out << 8) | *v;
    text = i < 3 ? text.substr(dot + 1) : std::string_view();
  }
  return out;
}

std::string AllowEntry::Text() const {
  std::string s;
  switch (kind) {
    case Kind::kDomain:
      s = domain;
      break;
    case Kind::kWildcard:
      s = "*." + domain;
      break;
    case Kind::kCidr:
      s = Ipv4Text(address);
      if (prefix != 32) s += "/" + std::to_string(prefix);
      break;
  }
  if (port) s += ":" + std::to_string(*port);
  return s;
}

Result<AllowEntry> ParseAllowEntry(std::string_view text) {
  if (text.empty()) return EntryError(text, "empty entry");
  if (text.size() > 300) return EntryError(text, "longer than 300 bytes");
  if (std::count(text.begin(), text.end(), ':') > 1 || text.front() == '[') {
    return EntryError(text,
                      "more than one ':' (an entry takes one :PORT; IPv6 entries are not "
                      "supported, sandboxes have IPv4 only)");
  }
  AllowEntry e;
  std::string_view host = text;
  if (size_t colon = text.rfind(':'); colon != std::string_view::npos) {
    std::string_view port = text.substr(colon + 1);
    auto v = ParseNumber(port, 65535);
    if (!v || *v == 0) {
      return EntryError(text, "port '" + std::string(port) + "' is not a number in 1-65535");
    }
    e.port = static_cast<uint16_t>(*v);
    host = text.substr(0, colon);
    if (host.empty()) return EntryError(text, "no host before the port");
  }
  if (LooksNumeric(host)) {
    std::string_view addr = host;
    uint32_t prefix = 32;
    if (size_t slash = host.find('/'); slash != std::string_view::npos) {
      auto p = ParseNumber(host.substr(slash + 1), 32);
      if (!p) return EntryError(text, "prefix length must be a number in 0-32");
      prefix = *p;
      addr = host.substr(0, slash);
    }
    auto a = ParseIpv4(addr);
    if (!a) return EntryError(text, "not an IPv4 address (four decimal numbers 0-255)");
    const uint32_t mask = prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix);
    if ((*a & ~mask) != 0) {
      return EntryError(text, "host bits are set; the network is " + Ipv4Text(*a & mask) + "/" +
                                  std::to_string(prefix));
    }
    e.kind = AllowEntry::Kind::kCidr;
    e.address = *a;
    e.prefix = static_cast<uint8_t>(prefix);
    return e;
  }
  std::string name = Lower(host);
  if (name.size() > 1 && name.back() == '.') name.pop_back();
  if (name.rfind("*.", 0) == 0) {
    e.kind = AllowEntry::Kind::kWildcard;
    name.erase(0, 2);
  } else if (name.find('*') != std::string::npos) {
    return EntryError(text,
                      "a wildcard is only allowed as the whole first label ('*.example.com')");
  }
  if (std::string why = BadDomain(name); !why.empty()) {
    return EntryError(
        text, "neither a domain, a '*.' wildcard, an IPv4 address nor a CIDR (" + why + ")");
  }
  e.domain = std::move(name);
  return e;
}

namespace {

// `stored`: a policy read back from a sandbox's config.json (or sent to nsbox-net), which may
// be an allow list left empty by a version that took one.
Result<NetworkPolicy> Parse(const json::value& value, bool stored) {
  NetworkPolicy p;
  if (value.is_null()) return p;
  if (value.is_string()) {
    const json::string& s = value.get_string();
    if (s == "none") return p;
    if (s == "open") {
      p.mode = NetworkPolicy::Mode::kOpen;
      return p;
    }
    return Error::Msg("network '" + std::string(s.subview().substr(0, 100)) +
                      "' is not one of \"none\", \"open\" or {\"allow\": [...]}");
  }
  if (!value.is_object()) {
    return Error::Msg("network must be \"none\", \"open\" or an object {\"allow\": [...]}");
  }
  const json::object& o = value.get_object();
  bool open = false;
  const json::array* allow = nullptr;
  for (const auto& [key, v] : o) {
    if (key == "open") {
      if (!v.is_bool()) return Error::Msg("network.open must be true or false");
      open = v.get_bool();
    } else if (key == "allow") {
      if (!v.is_array()) return Error::Msg("network.allow must be an array of strings");
      allow = &v.get_array();
    } else {
      return Error::Msg("network has an unknown field '" +
                        std::string(std::string_view(key).substr(0, 100)) +
                        "' (known: allow, open)");
    }
  }
  if (allow == nullptr && !open) {
    return Error::Msg("network needs \"allow\": [...] (or \"open\": true)");
  }
  p.mode = open ? NetworkPolicy::Mode::kOpen : NetworkPolicy::Mode::kAllow;
  if (allow != nullptr) {
    // Duplicates are dropped before the entries are counted; the list as sent is bounded too,
    // so that a huge one is not parsed.
    if (allow->size() > 4 * kMaxAllowEntries) {
      return Error::Msg("network.allow has " + std::to_string(allow->size()) +
                        " entries; at most " + std::to_string(kMaxAllowEntries) +
                        " different ones are allowed");
    }
    for (const json::value& item : *allow) {
      if (!item.is_string()) return Error::Msg("network.allow entries must be strings");
      auto e = ParseAllowEntry(item.get_string());
      if (!e.ok()) return std::move(e).error();
      if (std::find(p.allow.begin(), p.allow.end(), e.value()) == p.allow.end()) {
        p.allow.push_back(std::move(e).value());
      }
    }
    if (p.allow.size() > kMaxAllowEntries) {
      return Error::Msg("network.allow has " + std::to_string(p.allow.size()) +
                        " different entries; at most " + std::to_string(kMaxAllowEntries) +
                        " are allowed");
    }
  }
  // An allow list with nothing in it reaches nothing, as "none" does, yet costs a veth pair,
  // nsbox-net's rules and its resolver: most likely a list forgotten, so it is said.
  if (!stored && p.mode == NetworkPolicy::Mode::kAllow && p.allow.empty()) {
    return Error::Msg(
        "network {\"allow\": []} has an empty allow list, so the sandbox could reach nothing: "
        "list what it may reach in \"allow\" (names, *.wildcards, IPv4 addresses or CIDRs, "
        "with an optional :PORT), or ask for \"none\" (loopback only, no network at all)");
  }
  return p;
}

}  // namespace

Result<NetworkPolicy> ParsePolicy(const json::value& value) { return Parse(value, false); }

Result<NetworkPolicy> ParseStoredPolicy(const json::value& value) { return Parse(value, true); }

json::value PolicyToJson(const NetworkPolicy& p) {
  if (p.mode == NetworkPolicy::Mode::kNone) return json::string("none");
  if (p.mode == NetworkPolicy::Mode::kOpen && p.allow.empty()) return json::string("open");
  json::object o;
  if (p.mode == NetworkPolicy::Mode::kOpen) o["open"] = true;
  json::array a;
  for (const auto& e : p.allow) a.emplace_back(e.Text());
  o["allow"] = std::move(a);
  return o;
}

std::string PolicySummary(const NetworkPolicy& p) {
  switch (p.mode) {
    case NetworkPolicy::Mode::kNone:
      return "none";
    case NetworkPolicy::Mode::kAllow:
      return "allow(" + std::to_string(p.allow.size()) + ")";
    case NetworkPolicy::Mode::kOpen:
      return p.allow.empty() ? "open" : "open+allow(" + std::to_string(p.allow.size()) + ")";
  }
  return "?";
}

NameVerdict MatchName(const NetworkPolicy& p, std::string_view raw) {
  NameVerdict v;
  if (p.mode == NetworkPolicy::Mode::kNone) return v;
  if (p.mode == NetworkPolicy::Mode::kOpen) {
    v.allowed = true;
    v.all_ports = true;
    return v;
  }
  if (raw.find('\\') != std::string_view::npos) return v;  // escaped: see policy.h
  std::string name = Lower(raw);
  if (!name.empty() && name.back() == '.') name.pop_back();
  for (const auto& e : p.allow) {
    bool hit = false;
    if (e.kind == AllowEntry::Kind::kDomain) {
      hit = name == e.domain;
    } else if (e.kind == AllowEntry::Kind::kWildcard) {
      hit = name.size() > e.domain.size() + 1 &&
            name.compare(name.size() - e.domain.size(), e.domain.size(), e.domain) == 0 &&
            name[name.size() - e.domain.size() - 1] == '.';
    }
    if (!hit) continue;
    v.allowed = true;
    if (!e.port) {
      v.all_ports = true;
    } else {
      v.ports.push_back(*e.port);
    }
  }
  if (v.all_ports) v.ports.clear();
  std::sort(v.ports.begin(), v.ports.end());
  v.ports.erase(std::unique(v.ports.begin(), v.ports.end()), v.ports.end());
  return v;
}

}  // namespace nsbox::net

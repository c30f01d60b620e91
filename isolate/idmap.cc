#include "isolate/idmap.h"

#include <charconv>
#include <string>

#include "base/files.h"

namespace nsbox::isolate {

std::string IdMapText(const IdRange& range) {
  return std::to_string(range.inside) + " " + std::to_string(range.outside) + " " +
         std::to_string(range.count) + "\n";
}

Status ValidateIdRange(const IdRange& range, std::string_view what) {
  std::string name(what);
  if (range.count == 0) {
    return Error::Msg(name + " range is empty");
  }
  if (range.outside == 0) {
    return Error::Msg(name + " range starts at host id 0: root inside would be root on the host");
  }
  // uid_t (uint32_t)-1 is invalid everywhere; the last mapped id must stay below it.
  if (static_cast<uint64_t>(range.outside) + range.count > 0xffffffffULL ||
      static_cast<uint64_t>(range.inside) + range.count > 0xffffffffULL) {
    return Error::Msg(name + " range " + std::to_string(range.outside) + "+" +
                      std::to_string(range.count) + " runs past the largest id");
  }
  return Ok();
}

static bool ParseU32(std::string_view s, uint32_t* out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

Result<IdRange> ParseSubidRange(std::string_view content, std::string_view user) {
  while (!content.empty()) {
    auto nl = content.find('\n');
    std::string_view line = content.substr(0, nl);
    content = nl == std::string_view::npos ? std::string_view() : content.substr(nl + 1);
    auto c1 = line.find(':');
    if (c1 == std::string_view::npos || line.substr(0, c1) != user) continue;
    auto c2 = line.find(':', c1 + 1);
    IdRange r;
    if (c2 == std::string_view::npos || !ParseU32(line.substr(c1 + 1, c2 - c1 - 1), &r.outside) ||
        !ParseU32(line.substr(c2 + 1), &r.count)) {
      return Error::Msg("malformed subordinate id line '" + std::string(line) + "'");
    }
    return r;
  }
  return Error(ENOENT, "no subordinate id range for user '" + std::string(user) + "'");
}

Result<IdMapping> DefaultIdMapping() {
  IdMapping m;
  m.uid = {0, kDefaultIdBase, kDefaultIdCount};
  m.gid = m.uid;
  auto subuid = ReadFile("/etc/subuid");
  auto subgid = ReadFile("/etc/subgid");
  if (subuid.ok() && subgid.ok()) {
    auto u = ParseSubidRange(*subuid, kSubidUser);
    auto g = ParseSubidRange(*subgid, kSubidUser);
    if (u.ok() && g.ok()) {
      m.uid = *u;
      m.gid = *g;
    } else if (u.ok() != g.ok()) {
      return Error::Msg("/etc/subuid and /etc/subgid disagree: only one has a range for '" +
                        std::string(kSubidUser) + "'");
    } else if (!u.ok() && u.error().code() != ENOENT) {
      return std::move(u).error().Context("/etc/subuid");
    }
  }
  NSBOX_TRY_CTX(ValidateIdRange(m.uid, "uid"), "/etc/subuid");
  NSBOX_TRY_CTX(ValidateIdRange(m.gid, "gid"), "/etc/subgid");
  return m;
}

}  // namespace nsbox::isolate

#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.h"

namespace nsbox::isolate {

// One line of /proc/PID/uid_map: ids [inside, inside+count) are host ids [outside, ...).
struct IdRange {
  uint32_t inside = 0;
  uint32_t outside = 0;
  uint32_t count = 0;
};

// The ids of a jail: root inside is `uid.outside` on the host, never host uid 0.
struct IdMapping {
  IdRange uid;
  IdRange gid;
};

// The documented fixed default, used when /etc/subuid has no "nsbox" entry: 65536 ids from
// 0x60000000 (1610612736), inside systemd's range for container ids (524288-1879048191), far
// from the 100000+ ranges useradd hands out for people.
inline constexpr uint32_t kDefaultIdBase = 0x60000000;
inline constexpr uint32_t kDefaultIdCount = 65536;
inline constexpr std::string_view kSubidUser = "nsbox";

// "0 1610612736 65536\n": the exact text written to uid_map/gid_map.
std::string IdMapText(const IdRange& range);

// Refuses a range that would map host id 0 inside, that is empty, or that runs past 2^32-2.
Status ValidateIdRange(const IdRange& range, std::string_view what);

// The range of `user` in the text of /etc/subuid or /etc/subgid ("nsbox:100000:65536"); an
// error when there is none or the line is malformed.
Result<IdRange> ParseSubidRange(std::string_view content, std::string_view user);

// The mapping nsbox uses by default: the "nsbox" entries of /etc/subuid and /etc/subgid when both
// exist, else the fixed default above.
Result<IdMapping> DefaultIdMapping();

}  // namespace nsbox::isolate

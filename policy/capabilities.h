#pragma once

// The capabilities a command keeps, as data. isolate/capabilities.h applies them.

#include <cstdint>
#include <string>
#include <vector>

namespace nsbox::policy {

// One capability kept, by its kernel number (CAP_CHOWN is 0), with its name as in
// capabilities(7) and why it is kept.
struct CapabilityEntry {
  int cap;
  const char* name;
  const char* reason;
};

struct CapabilitySet {
  std::vector<CapabilityEntry> keep;

  // Bit n set for every capability n in `keep`: the layout of /proc/PID/status's CapEff.
  uint64_t Mask() const;
};

// What every command keeps: Docker's default set without CAP_SYS_CHROOT. The command is uid 0 in
// the sandbox's user namespace, so these reach only objects that namespace owns (its files, its
// network namespace), never the host's.
CapabilitySet DefaultCommandCapabilities();

// A mask as /proc/PID/status prints CapEff and the other sets: 16 lowercase hex digits, e.g.
// "00000000a80025fb".
std::string FormatCapabilityMask(uint64_t mask);

}  // namespace nsbox::policy

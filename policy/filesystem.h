#pragma once

#include <span>
#include <string_view>

namespace nsbox::policy {

// What a jail may see of the host and of the kernel's own files, as tables with reasons.

struct PathRule {
  const char* path;
  const char* reason;
};

// Host /etc entries bound read-only into the jail's generated /etc. Anything not here is absent:
// no shadow, gshadow, sudoers, ssh keys, machine-id, credentials.
std::span<const PathRule> EtcAllowlist();

// /proc entries hidden (a file: /dev/null bound over it; a directory: an empty read-only tmpfs),
// after Docker's MaskedPaths (moby oci/defaults.go).
std::span<const PathRule> ProcMaskedPaths();

// /proc entries made read-only, after Docker's ReadonlyPaths.
std::span<const PathRule> ProcReadonlyPaths();

// Device nodes bound from the host into the jail's minimal /dev.
std::span<const PathRule> DeviceNodes();

}  // namespace nsbox::policy

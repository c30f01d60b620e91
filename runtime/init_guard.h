#pragma once

// What keeps nsbox-init out of its commands' reach where the kernel's own checks would let them
// in (docs/init.md "Start", docs/security.md).
//
// prlimit(2) on another process is allowed to a caller whose real uid equals the target's real,
// effective and saved uids and whose real gid equals its three gids (kernel/sys.c,
// check_prlimit_permission), or that holds CAP_SYS_RESOURCE over it. nsbox-init and its commands
// are all uid 0 of the sandbox's user namespace, so a command could lower nsbox-init's limits
// (`prlimit --pid 1 --nofile=8:8`: every later exec fails; `--cpu=1:1`: the kernel kills
// nsbox-init and the sandbox restarts), and through the id of any of its threads too, which
// hidepid hides but does not make unguessable. A saved uid and gid that differ from the real and
// effective ones match no caller at all: no single real id equals both. Nothing else changes:
// files are made with the effective (fs) ids, which stay 0; capabilities stay (the real and
// effective uids stay 0); and execve copies the effective ids into the saved ones, so every
// command starts with (0, 0, 0) again.

#include <sys/resource.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "fs/protocol.h"

namespace nsbox::runtime {

// An id of the inside of `map_text` (the text of /proc/self/uid_map or gid_map: "inside outside
// count" lines) other than `except`: the overflow id 65534 ("nobody") when it is mapped, else the
// lowest mapped id that is not `except`; nullopt when `except` is the only id mapped.
std::optional<uint32_t> AnotherMappedId(std::string_view map_text, uint32_t except);

// What GuardSavedIds did: the saved uid and gid set (nullopt where the map has one id only).
struct SavedIds {
  std::optional<uint32_t> uid;
  std::optional<uint32_t> gid;
  // True when at least one differs from the real and effective ids: then no process matches
  // nsbox-init's credentials (one mismatch suffices).
  bool guarded() const { return uid.has_value() || gid.has_value(); }
};

// Sets nsbox-init's saved set-user-ID and set-group-ID to another mapped id (AnotherMappedId),
// keeping its real and effective ids. Call it while the process has one thread (before its event
// loop and workers start), so that every thread it starts later inherits the change; it needs
// CAP_SETUID and CAP_SETGID in the jail's user namespace.
Result<SavedIds> GuardSavedIds();

// Every resource limit of this process, RLIMIT_CPU to RLIM_NLIMITS - 1, as getrlimit reads it.
Result<std::vector<fs::proto::Rlimit>> ReadOwnLimits();

// The limits a command starts with: `configured` (the hello's, clamped by the daemon) for the
// resources it names, and `own_at_start` (nsbox-init's own before any command ran) for every
// other. Each command sets all of them before its execve, so that none is inherited from
// whatever nsbox-init holds by then.
std::vector<fs::proto::Rlimit> CommandRlimits(const std::vector<fs::proto::Rlimit>& configured,
                                              const std::vector<fs::proto::Rlimit>& own_at_start);

// Raises nsbox-init's own soft limits whose excess kills the process (RLIMIT_CPU: SIGXCPU,
// RLIMIT_FSIZE: SIGXFSZ) to their hard limits: the server of a sandbox that lives for days must
// not die of its accumulated CPU time under a daemon started with a soft CPU limit. Best effort.
void RaiseOwnSoftLimits();

}  // namespace nsbox::runtime

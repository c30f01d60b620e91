#pragma once

// One /etc for all of a daemon's long-lived jails (host image). Assembled in each jail's own root,
// /etc costs every sandbox a tmpfs inode per entry, a mount per host file and a page per generated
// file, for the same bytes each time (docs/perf-notes.md, "One shared /etc"). Here the generated
// files and copies of the allowlisted host files are written once into a directory on the host,
// which every jail attaches read-only at /etc; each jail then binds only the host's allowlisted
// directories (live, as before) and its own hosts and hostname on top (isolate/mount_plan.h).

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "isolate/mount_plan.h"

namespace nsbox::isolate {

struct SharedEtcRequest {
  std::string cache_dir;     // where the versions live (made 0700 if absent)
  std::string host_etc_dir;  // "/etc"; the files of `entries` are copied from here
  std::vector<JailFsConfig::EtcEntry> entries;  // ScanHostEtc(host_etc_dir)
  std::string nameserver;                       // as GeneratedEtcFiles takes it
  // The jail's root as the host sees it: the owner of the generated files and directories, so
  // that inside they are root's, as those a jail writes into its own root are. Copies keep their
  // host owner and mode.
  uid_t owner_uid = 0;
  gid_t owner_gid = 0;
};

// The directory to bind at /etc for `request`: `cache_dir`/<key>, where the key covers every
// entry's name, type, link target and file version (device, inode, size, ctime, mode), the
// nameserver and the owner. Made on first use (in a temp directory, then renamed) and reused
// while none of that changes; a host file replaced or edited makes a new version, which the jails
// started from then on bind (running ones keep theirs). Thread-safe. Holds placeholders (empty
// files) for hosts and hostname, which each jail binds its own on.
Result<std::string> PrepareSharedEtc(const SharedEtcRequest& request);

}  // namespace nsbox::isolate

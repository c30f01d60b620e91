#pragma once

// A jail's own view of the host's read-only trees (issue 44, docs/isolation.md "File system").
//
// The kernel reports an access to a file (open, read, exec, close) to every inotify or fanotify
// watch on its inode, and a bind mount shares the inode: a jail that binds the host's /usr can
// watch /usr/bin/tsort and see another sandbox, or the host, run it. Which programs others run
// is information the threat model keeps from a sandbox. An overlay has inodes of its own, and
// the kernel does not pass an event on the inode underneath up to an overlay's (nor one of
// another overlay of the same directory): each jail gets overlays of its own, made here on the
// host with the caller's rights (detached, fsopen/fsmount: Linux 5.2), which it attaches:
//
// - each read-only tree of the host image (`/usr`; on a host without merged /usr also /bin,
//   /lib...): lowerdir=<tree>:<empty>, since overlayfs without an upper layer wants two layers;
// - one overlay of a layers directory of nsbox's over the host's /etc
//   (lowerdir=<layers>:/etc), which the jail attaches for a moment to bind from it /etc's
//   allowlisted entries, the device nodes (copies of the host's null, zero, full, random,
//   urandom and tty, made in the layers directory) and nsboxd's shared /etc (whose versions live
//   in the layers directory); never attached whole.
//
// Nothing is copied: reads go to the host's files and their page cache. A jail's overlays cost
// it two superblocks and the inodes and dentries of what it looks at (docs/perf-notes.md
// "Issue 44: listings streamed, and a jail's own overlays").

#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"

namespace nsbox::isolate {

// In a layers directory: the empty layer of the trees' overlays.
inline constexpr char kLayersEmpty[] = ".nsbox-empty";

struct PrivateTreesRequest {
  // nsbox's directory for the layers (0711 in a 0700 parent; made if absent): nsboxd's shared
  // /etc directory, `nsbox run`'s under /run/nsbox-run.
  std::string layers_dir;
  // Host directories that get an overlay each ("/usr").
  std::vector<std::string> trees;
  // The host's /etc, under the layers directory in the layers overlay.
  std::string host_etc = "/etc";
  // The host's device nodes copied into the layers directory (policy::DeviceNodes), from here.
  std::string host_dev = "/dev";
};

struct PrivateTrees {
  std::map<std::string, UniqueFd> trees;  // by host path
  UniqueFd layers;                        // the layers overlay
};

// Makes the layers directory's empty layer and device nodes once (checked and kept afterwards,
// remade when they are not what they should be), then the overlays. ENODEV (no overlayfs) or
// ENOSYS (no fsopen, Linux before 5.2): the error, which the caller may take for "bind the
// host's trees" (saying so); anything else is a failure to start the jail.
Result<PrivateTrees> MakePrivateTrees(const PrivateTreesRequest& request);

// A read-only overlay of `lowers` (the first on top), mounted detached and nosuid; `nodev` too
// unless it holds device nodes to use.
Result<UniqueFd> MountReadonlyOverlay(const std::vector<std::string>& lowers, bool nodev);

}  // namespace nsbox::isolate

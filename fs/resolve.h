#pragma once

// In-root path resolution for the file verbs (fs/file_ops.h): every lookup of a path that the
// sandbox supplies starts at a held root directory fd and can never leave it. A symlink to "/"
// or "../.." lands on `root`, ".." never climbs above it, and a /proc magic link is never
// followed (security-references.md 1.11; CVE-2018-15664 is what a host-side lookup gets wrong).

#include <string_view>

#include "base/unique_fd.h"

namespace nsbox::fs {

// Opens `path` relative to `root` as if `root` were "/". `path` may be absolute or relative and
// may hold ".", ".." and symlinks (the kernel's rules apply: ".." after a symlink is the parent
// of the symlink's target, not a lexical fold). `flags` are open(2) flags without O_CREAT;
// O_CLOEXEC is always added; O_NOFOLLOW means a symlink at the last component is not followed
// (with O_PATH the link itself is opened, as the kernel does). Returns 0 and sets `out`, or an
// errno: ENOENT, ENOTDIR, ELOOP (also for a magic link), ENAMETOOLONG, EACCES, EAGAIN (the
// resolution kept racing with renames and gave up after a bounded number of retries), ...
//
// Uses openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) (Linux 5.6) and, where the kernel lacks
// it (ENOSYS) or a test forces it, a component-by-component O_PATH|O_NOFOLLOW walk that reads
// each symlink itself and resolves it in-root.
int OpenInRoot(int root, std::string_view path, int flags, UniqueFd& out);

// OpenInRoot from the kernel's caches alone (openat2 RESOLVE_CACHED, Linux 5.12): EAGAIN where a
// component is not in the dentry cache, or where openat2 is not used, so that an event loop can
// try it without ever blocking on a disk; other errors as OpenInRoot's. `fs_type`, when given,
// gets the opened file's file system type (statfs's f_type), which the check for the caller's own
// /proc entries (below) reads anyway: a caller that needs it saves an fstatfs.
int OpenInRootCached(int root, std::string_view path, int flags, UniqueFd& out,
                     unsigned long* fs_type = nullptr);

// The calling process's own /proc entries. nsbox-init, which serves the file verbs, makes itself
// non-dumpable and its /proc is mounted hidepid=ptraceable, so no command sees its maps, fds,
// environment or command line; but the kernel shows any process its own entries. OpenInRoot and
// OpenInRootCached therefore answer ENOENT for a path that lands in them (/proc/1, /proc/self,
// /proc/thread-self, /proc/TID of one of its threads, or anything below), as a command's
// `test -e /proc/1` finds nothing; these two let a verb that looks at /proc's entries by name do
// the same.
// Whether `dir` (any fd, O_PATH too) is the root directory of a procfs.
bool IsProcRoot(int dir);
// Whether `name`, an entry of /proc, is the calling process or one of its threads.
bool IsOwnTaskEntry(std::string_view name);

// Whether OpenInRoot uses openat2 (the default, while the kernel has it).
void SetUseOpenat2(bool enabled);
bool UsesOpenat2();

}  // namespace nsbox::fs

#pragma once

#include <sys/types.h>

#include <initializer_list>
#include <string>
#include <string_view>

#include "base/error.h"
#include "base/unique_fd.h"

namespace nsbox {

// open(2) relative to `dirfd` (AT_FDCWD for a plain path), O_CLOEXEC always added.
Result<UniqueFd> OpenAt(int dirfd, const std::string& path, int flags, mode_t mode = 0);
// The whole content of a small file (a /proc or /sys entry, a config file).
Result<std::string> ReadFileAt(int dirfd, const std::string& path);
// The rest of an open file, from its offset to EOF; `what` names it in the error.
Result<std::string> ReadFd(int fd, std::string_view what);
inline Result<std::string> ReadFile(const std::string& path) { return ReadFileAt(-100, path); }
// Writes `content` to an existing file (a cgroup knob, /proc/PID/uid_map) in one write(2), as
// those kernel interfaces require.
Status WriteExistingFileAt(int dirfd, const std::string& path, std::string_view content);
// Writes all of `content` to `fd`, retrying short writes and EINTR.
Status WriteAll(int fd, std::string_view content, std::string_view what);

// mkdir that accepts an existing directory (not a symlink or a file) at `path`.
Status MakeDir(const std::string& path, mode_t mode);
// fsync of a file or directory by path (after a rename, the directory holding it).
Status FsyncPath(const std::string& path);
// A new file (never one that exists: EEXIST) of `size` spaces, fsynced: a slot that
// FillSlotDurable fills later. Durable once its directory is too.
Status MakeSlotDurable(const std::string& dir, const std::string& name, size_t size);
// Writes `data` over the slot `dir/name` (MakeSlotDurable) from its start, padded with spaces to
// the slot's size, and fdatasyncs it. Bytes that fit the slot change no metadata, so the
// fdatasync is a data write and a cache flush, where a new file's fsync also commits the file
// system's journal (0.2-0.5 ms less on this project's virtio disk, bench/put_durability.py);
// longer data grows the file and its fdatasync commits the new size too. For text whose reader
// takes trailing spaces for nothing, as JSON's does.
Status FillSlotDurable(const std::string& dir, const std::string& name, std::string_view data);
// temp file, fsync, rename, fsync of the directory: a crash leaves the old file or the new.
Status WriteFileAtomic(const std::string& dir, const std::string& name, std::string_view data);
// Opens (creating, 0600) `path` and takes an exclusive POSIX record lock on it, held until the
// returned fd closes or this process ends: one owner (a daemon per state directory). The lock is
// the process's, not the open file's: a child forked or cloned while it is held does not share
// it, so a child that outlives its parent's death by a moment (a jail between clone and exec)
// does not keep the next owner out, as an flock would. The process must not open and close the
// file elsewhere (POSIX drops the lock at any close of it). Held by another: EBUSY, and
// `*holder` (when given) is the holder's pid where the kernel names it, else 0.
Result<UniqueFd> LockFileExclusive(const std::string& path, pid_t* holder = nullptr);
// A whole tree (or a file, or a symlink itself), whatever its depth, with three fds at most
// (base/remove_tree.cc): never following a symlink, never entering a mount point (its rmdir is
// EBUSY), and stopping (EBUSY) when a directory it is in was moved elsewhere meanwhile. A missing
// path is success. Meant for trees nothing else writes to; one that something does may stop it.
Status RemoveTree(const std::string& path);
// The same for `name` in the directory `dir_fd`; `display` names it in errors.
Status RemoveTreeAt(int dir_fd, const std::string& name, const std::string& display);

// The first of `relatives` (each "/name" or "/../dir/name", appended to the running executable's
// directory) that is an executable file: how nsbox finds nsbox-init and nsbox-net, installed
// beside it, in ../libexec/nsbox (the package, `cmake --install`) or in the build tree.
Result<std::string> FindBesideSelf(std::initializer_list<const char*> relatives,
                                   std::string_view name);
// The same beside the executable `self` (a path), for tests.
Result<std::string> FindBeside(const std::string& self,
                               std::initializer_list<const char*> relatives, std::string_view name);
// `digits` random hex digits, for unique temp names (not for secrets).
std::string RandomHex(size_t digits);

}  // namespace nsbox

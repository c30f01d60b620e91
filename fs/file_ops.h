#pragma once

// The file verbs of the Sandbox contract (api.md "Files"; where it is silent, Node's
// fs/promises as Flue's local() uses it), carried out relative to a held root directory fd.
// nsbox-init calls them inside the jail with the jail's root; tests call them on a temp dir.
//
// Every path is resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) from `root`
// where the kernel has it (a symlink to "/" or "../.." points at `root`, never above it), and
// with a checked O_NOFOLLOW walk where it does not; SetOpenat2ForTesting(false) forces the walk.
// The functions block (they run on worker threads, never on the event loop) but never hang on
// a FIFO, socket or device: anything that is not a regular file is refused before it is opened
// for reading.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"

namespace nsbox::fs {

// A failed verb as the API reports it: the errno, the syscall Node would name ("open",
// "scandir", "mkdir", "rm", "stat", "lstat", "rmdir", "unlink"), the path as the caller gave it,
// and Node's message: "ENOENT: no such file or directory, open '/workspace/a.txt'".
struct FsError {
  int err = 0;
  std::string syscall;
  std::string path;
  std::string message;
  // api.md: rm of a directory without recursive is EISDIR, which Node names ERR_FS_EISDIR.
  bool node_err_fs_eisdir = false;
};

// The result type of every verb.
template <typename T>
class [[nodiscard]] FsOutcome {
 public:
  FsOutcome(T value) : ok_(true), value_(std::move(value)) {}         // NOLINT
  FsOutcome(FsError error) : ok_(false), error_(std::move(error)) {}  // NOLINT
  bool ok() const { return ok_; }
  T& value() { return value_; }
  const T& value() const { return value_; }
  const FsError& error() const { return error_; }

 private:
  bool ok_;
  T value_{};
  FsError error_;
};

struct Unit {};

// Paths given to the verbs are absolute jail paths, already normalised (fs::ResolvePath); a path
// with a NUL byte, or longer than PATH_MAX (4096 bytes with the NUL), is refused with EINVAL /
// ENAMETOOLONG before any syscall.

// readFile/readFileBuffer: an O_RDONLY fd of the regular file at `path` (symlinks followed) and
// its size; EISDIR for a directory (Node's message, which has no path: "EISDIR: illegal
// operation on a directory, read"), EINVAL for anything else that is not a regular file. The
// file is looked at through an O_PATH fd first and only a regular file is opened for reading.
struct OpenedFile {
  UniqueFd fd;
  uint64_t size = 0;
};
FsOutcome<OpenedFile> OpenForRead(int root, const std::string& path);

// readFile of a small file without ever blocking, for an event loop: the whole of a regular file
// of at most `limit` bytes when everything it takes is in memory now (the lookup in the dentry
// cache, RESOLVE_CACHED; the bytes in the page cache, RWF_NOWAIT; tmpfs read plainly), on a
// local file system (ext4, xfs, btrfs, overlayfs, tmpfs: never FUSE or a network file system,
// whose open may wait for someone). nullopt for anything else (a component or page not cached,
// a larger file, not a regular file, another file system, any error): the caller then takes the
// blocking way (OpenForRead on a worker thread), which gives the exact answer.
std::optional<std::string> ReadCachedFile(int root, const std::string& path, size_t limit);

// writeFile, in three steps so that large files stream: Begin finds the target (a symlink at
// `path` is followed, in-root, up to 40 links, as Node's open(O_CREAT) does: a dangling one
// names the file to create), and if that fails with ENOENT makes the parent directories (Node's
// mkdir -p of dirname(path), whose errors are returned as they are; Flue's writeFile contract)
// and tries once more. It then creates an unnamed O_TMPFILE in the target's directory (nothing
// stays behind if the writer dies), or where the file system lacks it a named temp file beside the
// target (".<name>.nsbox-XXXXXX", at most 200 bytes of <name>) with the existing target's mode and
// owner (owner where permitted), else mode 0644. The caller writes the bytes to `fd`; Commit fsyncs
// it, renames it over the target and fsyncs the directory; Abort removes the temp file. A directory
// at `path` is EISDIR and a FIFO, socket or device EINVAL (never written into, never replaced),
// found in Begin.
struct PendingWrite {
  UniqueFd fd;        // the temp file, O_WRONLY
  UniqueFd dir;       // the directory that holds it
  std::string temp;   // its name in `dir`; empty for an unnamed O_TMPFILE until the commit
  std::string final;  // the target's name in `dir` (after following a symlink at the target)
  std::string path;   // as the caller gave it, for errors
};
// `mode`: the permission bits the file gets (at most 07777); without it an existing file keeps
// its mode and a new one gets 0644.
FsOutcome<PendingWrite> BeginWrite(int root, const std::string& path,
                                   std::optional<uint32_t> mode = std::nullopt);
FsOutcome<Unit> CommitWrite(PendingWrite& write);
void AbortWrite(PendingWrite& write);
// All three at once, for small contents.
FsOutcome<Unit> WriteWholeFile(int root, const std::string& path, std::string_view content);

// stat: isFile/isDirectory/size/mtimeMs of the target (stat), isSymbolicLink of the path itself
// (lstat). ENOENT if missing, also for a dangling symlink.
struct StatInfo {
  bool is_file = false;
  bool is_directory = false;
  bool is_symbolic_link = false;
  uint64_t size = 0;
  double mtime_ms = 0;  // milliseconds since the epoch, with the sub-millisecond fraction
  uint32_t mode = 0;    // st_mode of the target: its type and permission bits
};
FsOutcome<StatInfo> Stat(int root, const std::string& path);

// readdir: names sorted by byte value, without "." and ".."; ENOTDIR if not a directory.
enum class EntryType : uint8_t { kFile, kDirectory, kSymlink, kOther };
struct DirEntry {
  std::string name;  // raw bytes: need not be UTF-8
  EntryType type;
};
FsOutcome<std::vector<DirEntry>> Readdir(int root, const std::string& path);

// exists: true if something is there, symlinks followed. Never an error: false for ENOENT,
// ENOTDIR, ELOOP, EACCES, a NUL byte, an over-long path.
bool Exists(int root, const std::string& path);

// mkdir: exactly Node's fs.mkdir (api.md).
FsOutcome<Unit> Mkdir(int root, const std::string& path, bool recursive);

// rm: exactly Node's fs.rm (api.md); recursive removal never follows a symlink inside the tree,
// needs no recursion and two fds whatever the depth. One deviation: rm of "/" with `recursive`
// is EBUSY ("rm") before anything is removed, where Node would empty the tree first and then
// fail on rmdir("/") with EBUSY.
FsOutcome<Unit> Rm(int root, const std::string& path, bool recursive, bool force);

// Forces the O_NOFOLLOW walk instead of openat2, so both paths are tested.
void SetOpenat2ForTesting(bool enabled);

}  // namespace nsbox::fs

// readFile, writeFile, stat, readdir and exists (fs/file_ops.h). mkdir and rm, which change the
// tree's shape, are in file_ops_tree.cc.

#include "fs/file_ops.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "base/files.h"
#include "fs/fs_error.h"
#include "fs/resolve.h"

namespace nsbox::fs {
namespace {

constexpr int kMaxSymlinks = 40;  // the kernel's MAXSYMLINKS, for the links writeFile follows
constexpr int kMaxReopenRetries = 16;

bool SameInode(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Where a file lives, for readFile on the event loop: a local file system whose open and read
// of a cached file are answered from memory (kLocalOnDisk), tmpfs or ramfs (kInMemory: no disk at
// all), or anything else (kOther: FUSE, network file systems, ... whose open may wait on someone).
enum class FileSystemKind { kLocalOnDisk, kInMemory, kOther };

// `fs_type` is statfs's f_type.
FileSystemKind KindOfFileSystem(unsigned long fs_type) {
  switch (fs_type) {
    case TMPFS_MAGIC:
    case RAMFS_MAGIC:
      return FileSystemKind::kInMemory;
    case EXT4_SUPER_MAGIC:  // also ext2 and ext3
    case XFS_SUPER_MAGIC:
    case BTRFS_SUPER_MAGIC:
    case OVERLAYFS_SUPER_MAGIC:
      return FileSystemKind::kLocalOnDisk;
    default:
      return FileSystemKind::kOther;
  }
}

// Reopens the regular file behind the O_PATH fd `opath` for reading. Through /proc/self/fd when
// /proc is there (it reopens the very inode that was checked, as libpathrs's reopen does), else
// by resolving `path` again. O_NONBLOCK because, if anything was swapped in since the check
// (or /proc is a fake), opening a FIFO must not block; the inode is then compared with the one
// checked, so only that file is ever read.
int ReopenForRead(int root, const std::string& path, int opath, const struct stat& checked,
                  UniqueFd& out) {
  const int flags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
  std::string proc = "/proc/self/fd/" + std::to_string(opath);
  // SAFETY: `opath` is our own O_PATH fd; open(2) follows its magic link to the same inode.
  UniqueFd fd(::open(proc.c_str(), flags));
  if (!fd.valid()) {
    if (int err = OpenInRoot(root, path, flags, fd); err != 0) return err;
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return errno;
  if (!SameInode(st, checked)) return EAGAIN;
  // SAFETY: F_SETFL on our own fd; only O_NONBLOCK changes.
  if (::fcntl(fd.get(), F_SETFL, 0) != 0) return errno;
  out = std::move(fd);
  return 0;
}

// Where writeFile puts the bytes: the directory and name of the file that `path` names after
// following symlinks at the last component (as Node's open(O_CREAT) does), and the file there
// now, if any.
struct WriteTarget {
  UniqueFd dir;
  std::string name;
  bool exists = false;
  struct stat st = {};
};

int FindWriteTarget(int root, const std::string& path, WriteTarget& t) {
  std::string current = path;
  for (int links = 0; links <= kMaxSymlinks;) {
    // A link whose text ends in "/", "." or ".." names a directory: open(O_CREAT) says EISDIR.
    if (current.empty() || current.back() == '/') return EISDIR;
    auto [parent, name] = SplitParent(current);
    if (name == "." || name == "..") return EISDIR;
    if (name.empty()) return EISDIR;  // the root itself
    UniqueFd dir;
    if (int err = OpenInRoot(root, parent, O_RDONLY | O_DIRECTORY, dir); err != 0) return err;
    char buf[PATH_MAX];
    // SAFETY: readlinkat of one component in a directory we hold; at most sizeof(buf) bytes.
    ssize_t n = ::readlinkat(dir.get(), name.c_str(), buf, sizeof(buf));
    if (n >= 0) {
      ++links;
      if (static_cast<size_t>(n) >= sizeof(buf)) return ENAMETOOLONG;
      std::string target(buf, static_cast<size_t>(n));
      if (target.empty()) return ENOENT;
      // Not folded lexically: the kernel resolves "parent/../x" physically, so a ".." in the
      // link's text climbs from where the link's directory really is; OpenInRoot keeps it in-root.
      current = target.front() == '/' ? target : JoinPath(parent, target);
      if (current.size() >= PATH_MAX) return ENAMETOOLONG;
      continue;
    }
    if (errno == ENOENT) {
      t.dir = std::move(dir);
      t.name = std::move(name);
      t.exists = false;
      return 0;
    }
    if (errno != EINVAL) return errno;
    struct stat st;
    // SAFETY: fstatat of one component, not following a symlink.
    if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return errno;
    if (S_ISLNK(st.st_mode)) {  // it became a link since readlinkat: read it again
      ++links;
      continue;
    }
    if (S_ISDIR(st.st_mode)) return EISDIR;
    // A FIFO, socket or device is not replaced by a regular file (nor written into, which could
    // block): the same refusal as readFile's.
    if (!S_ISREG(st.st_mode)) {
      t.st = st;
      return EINVAL;
    }
    t.dir = std::move(dir);
    t.name = std::move(name);
    t.exists = true;
    t.st = st;
    return 0;
  }
  return ELOOP;
}

// ".<name>.nsbox-XXXXXX": hidden, recognisable, and short enough for NAME_MAX whatever `name` is.
std::string TempName(const std::string& name) {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string out = "." + name.substr(0, 200) + ".nsbox-";
  for (int i = 0; i < 6; ++i) out += kAlphabet[arc4random_uniform(sizeof(kAlphabet) - 1)];
  return out;
}

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};

EntryType TypeOf(int dir, const struct dirent* e) {
  unsigned char type = e->d_type;
  if (type == DT_UNKNOWN) {
    struct stat st;
    // SAFETY: fstatat of an entry of a directory we hold, not following a symlink.
    if (::fstatat(dir, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) return EntryType::kOther;
    if (S_ISREG(st.st_mode)) return EntryType::kFile;
    if (S_ISDIR(st.st_mode)) return EntryType::kDirectory;
    if (S_ISLNK(st.st_mode)) return EntryType::kSymlink;
    return EntryType::kOther;
  }
  switch (type) {
    case DT_REG:
      return EntryType::kFile;
    case DT_DIR:
      return EntryType::kDirectory;
    case DT_LNK:
      return EntryType::kSymlink;
    default:
      return EntryType::kOther;
  }
}

// EINVAL for a FIFO, socket or device, saying which: reading one could block for ever, and
// writing one is not a file's replacement.
FsError NotARegularFile(mode_t mode, const std::string& path) {
  FsError e = MakeFsError(EINVAL, "open", path);
  const char* what = S_ISFIFO(mode)   ? "a FIFO"
                     : S_ISSOCK(mode) ? "a socket"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                                      : "not a regular file";
  e.message += std::string(" (") + what + ": the file API reads and writes regular files only)";
  return e;
}

}  // namespace

void SetOpenat2ForTesting(bool enabled) { SetUseOpenat2(enabled); }

FsOutcome<OpenedFile> OpenForRead(int root, const std::string& path) {
  if (auto bad = CheckPath(path, "open")) return *bad;
  for (int attempt = 0;; ++attempt) {
    // O_PATH first: it opens nothing for I/O, so a FIFO or device is looked at, never opened.
    UniqueFd opath;
    if (int err = OpenInRoot(root, path, O_PATH, opath); err != 0) {
      return MakeFsError(err, "open", path);
    }
    struct stat st;
    if (::fstat(opath.get(), &st) != 0) return MakeFsError(errno, "fstat", path);
    if (S_ISDIR(st.st_mode)) {
      // Node opens a directory and fails on read(2), with no path in the message.
      FsError e = MakeFsError(EISDIR, "read", path);
      e.message = "EISDIR: illegal operation on a directory, read";
      return e;
    }
    if (!S_ISREG(st.st_mode)) return NotARegularFile(st.st_mode, path);
    OpenedFile file;
    int err = ReopenForRead(root, path, opath.get(), st, file.fd);
    if (err == EAGAIN && attempt < kMaxReopenRetries) continue;  // swapped under us: look again
    if (err != 0) return MakeFsError(err, "open", path);
    file.size = static_cast<uint64_t>(st.st_size);
    return file;
  }
}

std::optional<std::string> ReadCachedFile(int root, const std::string& path, size_t limit) {
  if (CheckPath(path, "open")) return std::nullopt;
  // As OpenForRead: looked at through O_PATH first, only a regular file is opened for reading,
  // and only on a file system whose open cannot wait for someone else (not FUSE, not NFS).
  UniqueFd opath;
  unsigned long fs_type = 0;
  if (OpenInRootCached(root, path, O_PATH, opath, &fs_type) != 0) return std::nullopt;
  struct stat st;
  if (::fstat(opath.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  if (static_cast<uint64_t>(st.st_size) > limit) return std::nullopt;
  const FileSystemKind kind = KindOfFileSystem(fs_type);
  if (kind == FileSystemKind::kOther) return std::nullopt;
  // The very inode checked, through /proc/self/fd (procfs: no disk); O_NONBLOCK in case
  // something was swapped in since. No /proc: the blocking way, which resolves again.
  std::string proc = "/proc/self/fd/" + std::to_string(opath.get());
  // SAFETY: `opath` is our own O_PATH fd; open(2) follows its magic link to the same inode.
  UniqueFd fd(::open(proc.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) return std::nullopt;
  struct stat opened;
  if (::fstat(fd.get(), &opened) != 0 || !SameInode(opened, st)) return std::nullopt;
  // One byte more than the size: a file that grew since the stat is seen, and left to the
  // blocking way. RWF_NOWAIT: EAGAIN (or a short read) rather than a wait for the disk. tmpfs
  // does not take the flag (EOPNOTSUPP here) and has no disk to wait for: read it plainly.
  std::string data(static_cast<size_t>(st.st_size) + 1, '\0');
  size_t have = 0;
  const int flags = kind == FileSystemKind::kInMemory ? 0 : RWF_NOWAIT;
  for (;;) {
    struct iovec iov = {data.data() + have, data.size() - have};
    ssize_t n = ::preadv2(fd.get(), &iov, 1, static_cast<off_t>(have), flags);
    if (n < 0) return std::nullopt;  // EAGAIN, EOPNOTSUPP, EINTR, ...
    if (n == 0) break;
    have += static_cast<size_t>(n);
    if (have == data.size()) return std::nullopt;  // it grew
  }
  data.resize(have);
  return data;
}

FsOutcome<PendingWrite> BeginWrite(int root, const std::string& path,
                                   std::optional<uint32_t> mode) {
  if (auto bad = CheckPath(path, "open")) return *bad;
  WriteTarget target;
  int err = FindWriteTarget(root, path, target);
  if (err == ENOENT) {
    // Flue's writeFile contract: a missing parent is made (mkdir -p of the parent, which can
    // itself fail the way Node's mkdir does), then the write is tried once more.
    FsOutcome<Unit> made = Mkdir(root, SplitParent(path).first, /*recursive=*/true);
    if (!made.ok()) return made.error();
    err = FindWriteTarget(root, path, target);
  }
  if (err == EINVAL && (target.st.st_mode & S_IFMT) != 0) {
    return NotARegularFile(target.st.st_mode, path);
  }
  if (err != 0) return MakeFsError(err, "open", path);

  PendingWrite write;
  // An unnamed temp file (O_TMPFILE, Linux 3.11) where the file system has it: if the writer
  // dies before the commit (nsbox-init killed with the daemon), nothing is left in the
  // directory. It gets a name only at commit, just before the rename.
  // SAFETY: openat of the directory we hold; the file has no name, so nothing can be planted.
  write.fd.reset(::openat(target.dir.get(), ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600));
  for (int attempt = 0; !write.fd.valid() && attempt < 100; ++attempt) {
    write.temp = TempName(target.name);
    // SAFETY: openat of one fresh name in a directory we hold. O_EXCL|O_NOFOLLOW: never an
    // existing file or a planted symlink. Mode 0600 until the final mode is set below, so a
    // half-written temp file is readable by no one else.
    write.fd.reset(::openat(target.dir.get(), write.temp.c_str(),
                            O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (write.fd.valid() || errno != EEXIST) break;
  }
  if (!write.fd.valid()) {
    if (!target.exists || errno != ENOENT) return MakeFsError(errno, "open", path);
    // The file is there, but its directory takes no new file (/proc, /sys): ENOENT would say
    // the file is missing.
    FsError e = MakeFsError(EPERM, "open", path);
    e.message +=
        " (its file system makes no new file beside it, and the file API writes a new file and "
        "renames it over the old one: it cannot write into this one; a command can)";
    return e;
  }
  write.dir = std::move(target.dir);
  write.final = std::move(target.name);
  write.path = path;
  if (target.exists) {
    // The replacement keeps the old file's owner where we may set it (root; EPERM otherwise is
    // fine) and its mode, unless one is given. fchown first: it clears set-id bits that fchmod
    // then restores.
    // SAFETY: fchown/fchmod on our own temp file's fd.
    (void)::fchown(write.fd.get(), target.st.st_uid, target.st.st_gid);
    err = ::fchmod(write.fd.get(), mode.value_or(target.st.st_mode) & 07777) == 0 ? 0 : errno;
  } else if (mode) {
    // SAFETY: fchmod on our own temp file's fd.
    err = ::fchmod(write.fd.get(), *mode & 07777) == 0 ? 0 : errno;
  } else {
    // 0666 less the umask of 022 (api.md): fixed, not the server's own umask, which is not
    // the sandbox's.
    err = ::fchmod(write.fd.get(), 0644) == 0 ? 0 : errno;
  }
  if (err != 0) {
    AbortWrite(write);
    return MakeFsError(err, "fchmod", path);
  }
  return write;
}

FsOutcome<Unit> CommitWrite(PendingWrite& write) {
  // fsync before rename, so that a crash leaves the old bytes or the new, never an empty file
  // under the old name (security-references.md, "Further requirements").
  if (::fsync(write.fd.get()) != 0) {
    int err = errno;
    AbortWrite(write);
    return MakeFsError(err, "fsync", write.path);
  }
  if (write.temp.empty()) {
    // An O_TMPFILE: link it under a fresh temp name (through /proc/self/fd: linkat with
    // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH, which nsbox-init does not keep), then rename.
    std::string proc_fd = "/proc/self/fd/" + std::to_string(write.fd.get());
    int err = EEXIST;
    for (int attempt = 0; attempt < 100 && err == EEXIST; ++attempt) {
      write.temp = TempName(write.final);
      // SAFETY: the magic link is this process's own fd; the new name is one component in the
      // directory we hold, and linkat never replaces an existing name.
      err = ::linkat(AT_FDCWD, proc_fd.c_str(), write.dir.get(), write.temp.c_str(),
                     AT_SYMLINK_FOLLOW) == 0
                ? 0
                : errno;
    }
    if (err != 0) {
      write.temp.clear();
      AbortWrite(write);
      return MakeFsError(err, "link", write.path);
    }
  }
  write.fd.reset();
  // SAFETY: both names are single components in the directory we hold. rename(2) replaces the
  // target atomically: a reader opens the old inode or the new one, never a mix.
  if (::renameat(write.dir.get(), write.temp.c_str(), write.dir.get(), write.final.c_str()) != 0) {
    int err = errno;
    AbortWrite(write);
    return MakeFsError(err, "rename", write.path);
  }
  write.temp.clear();
  // The rename is durable only once the directory is.
  if (::fsync(write.dir.get()) != 0) return MakeFsError(errno, "fsync", write.path);
  write.dir.reset();
  return Unit{};
}

void AbortWrite(PendingWrite& write) {
  write.fd.reset();
  if (write.dir.valid() && !write.temp.empty()) {
    // SAFETY: unlinkat of our own temp name in the directory we hold.
    (void)::unlinkat(write.dir.get(), write.temp.c_str(), 0);
  }
  write.temp.clear();
  write.dir.reset();
}

FsOutcome<Unit> WriteWholeFile(int root, const std::string& path, std::string_view content) {
  FsOutcome<PendingWrite> begun = BeginWrite(root, path);
  if (!begun.ok()) return begun.error();
  PendingWrite& write = begun.value();
  Status written = WriteAll(write.fd.get(), content, path);
  if (!written.ok()) {
    AbortWrite(write);
    return MakeFsError(written.error().code(), "write", path);
  }
  return CommitWrite(write);
}

FsOutcome<StatInfo> Stat(int root, const std::string& path) {
  if (auto bad = CheckPath(path, "stat")) return *bad;
  // Node's local() calls stat then lstat; errors name "stat" either way.
  UniqueFd link;
  if (int err = OpenInRoot(root, path, O_PATH | O_NOFOLLOW, link); err != 0) {
    return MakeFsError(err, "stat", path);
  }
  struct stat lst;
  if (::fstat(link.get(), &lst) != 0) return MakeFsError(errno, "stat", path);
  struct stat st = lst;
  if (S_ISLNK(lst.st_mode)) {
    UniqueFd target;
    if (int err = OpenInRoot(root, path, O_PATH, target); err != 0) {
      return MakeFsError(err, "stat", path);  // a dangling link is ENOENT, as in Node
    }
    if (::fstat(target.get(), &st) != 0) return MakeFsError(errno, "stat", path);
  }
  StatInfo info;
  info.is_file = S_ISREG(st.st_mode);
  info.is_directory = S_ISDIR(st.st_mode);
  info.is_symbolic_link = S_ISLNK(lst.st_mode);
  info.size = static_cast<uint64_t>(st.st_size);
  info.mode = st.st_mode;
  // Node's Stats.mtimeMs: sec * 1e3 + nsec / 1e6, in double arithmetic.
  info.mtime_ms =
      static_cast<double>(st.st_mtim.tv_sec) * 1e3 + static_cast<double>(st.st_mtim.tv_nsec) / 1e6;
  return info;
}

FsOutcome<std::vector<DirEntry>> Readdir(int root, const std::string& path) {
  if (auto bad = CheckPath(path, "scandir")) return *bad;
  UniqueFd fd;
  // O_DIRECTORY is checked before a FIFO would be opened, so this never blocks.
  if (int err = OpenInRoot(root, path, O_RDONLY | O_DIRECTORY, fd); err != 0) {
    return MakeFsError(err, "scandir", path);
  }
  std::unique_ptr<DIR, DirCloser> dir(::fdopendir(fd.get()));
  if (!dir) return MakeFsError(errno, "scandir", path);
  const int dfd = fd.release();  // owned by `dir` from here on
  // /proc's listing without the server's own entry, as a command's (fs/resolve.h).
  const bool proc_root = IsProcRoot(dfd);
  std::vector<DirEntry> entries;
  for (;;) {
    errno = 0;
    const struct dirent* e = ::readdir(dir.get());
    if (e == nullptr) {
      if (errno != 0) return MakeFsError(errno, "scandir", path);
      break;
    }
    std::string_view name(e->d_name);
    if (name == "." || name == "..") continue;
    if (proc_root && IsOwnTaskEntry(name)) continue;
    entries.push_back(DirEntry{std::string(name), TypeOf(dfd, e)});
  }
  // std::string compares through char_traits<char>, which orders bytes as unsigned char, like
  // memcmp: the API's "sorted by byte value".
  std::sort(entries.begin(), entries.end(),
            [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  return entries;
}

bool Exists(int root, const std::string& path) {
  if (CheckPath(path, "access")) return false;
  UniqueFd fd;
  return OpenInRoot(root, path, O_PATH, fd) == 0;
}

}  // namespace nsbox::fs

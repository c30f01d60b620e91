#include "fs/resolve.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "base/syscalls.h"

namespace nsbox::fs {
namespace {

// The kernel's MAXSYMLINKS: more links than this in one lookup is ELOOP (path_resolution(7)).
constexpr int kMaxSymlinks = 40;
// openat2(RESOLVE_IN_ROOT) answers EAGAIN when a rename anywhere on the system raced with a ".."
// step (the kernel cannot then prove the step stayed inside the root); retrying is the
// documented answer (openat2(2)). Bounded so that a rename storm is an error, not a hang.
constexpr int kMaxRetries = 256;
// The walk keeps fds for at most this many of the deepest directories on its current path;
// shallower ones are reopened from a held ancestor when ".." climbs back to them. A 4,095-byte
// path has up to 2,048 components, more than the default limit of 1,024 fds.
constexpr size_t kMaxHeldLevels = 64;

std::atomic<bool> g_use_openat2{true};

// The directories from `root` down to where the walk stands, by name, with fds for the deepest
// kMaxHeldLevels of them. ".." pops a level, so it can never climb above `root`, and it returns
// to a directory the walk itself went through, never to whatever is the parent now.
class Levels {
 public:
  explicit Levels(int root) : root_(root) {}

  int fd() const { return fds_.empty() ? root_ : fds_.back().get(); }

  void Push(std::string name, UniqueFd fd) {
    names_.push_back(std::move(name));
    fds_.push_back(std::move(fd));
    if (fds_.size() > kMaxHeldLevels) fds_[fds_.size() - 1 - kMaxHeldLevels].reset();
  }

  // ".." : the root stays the root. Returns 0 or an errno (EAGAIN when a directory the walk went
  // through has since been moved or replaced, so the caller starts over).
  int Pop() {
    if (names_.empty()) return 0;
    names_.pop_back();
    fds_.pop_back();
    if (fds_.empty() || fds_.back().valid()) return 0;
    return Reopen();
  }

  void Reset() {
    names_.clear();
    fds_.clear();
  }

 private:
  // Reopens the top level by walking down its names from the deepest ancestor still held (or
  // the root), with O_NOFOLLOW at every step: if any of them is no longer a directory, the tree
  // changed under us and the whole lookup is retried.
  int Reopen() {
    size_t top = fds_.size() - 1;
    size_t start = top;
    while (start > 0 && !fds_[start - 1].valid()) --start;
    int dir = start == 0 ? root_ : fds_[start - 1].get();
    UniqueFd current;
    for (size_t i = start; i <= top; ++i) {
      // SAFETY: openat on a held dirfd with a single component name; O_NOFOLLOW|O_PATH neither
      // follows a link nor opens a FIFO or device for I/O.
      UniqueFd next(::openat(dir, names_[i].c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
      if (!next.valid()) return EAGAIN;
      struct stat st;
      if (::fstat(next.get(), &st) != 0 || !S_ISDIR(st.st_mode)) return EAGAIN;
      if (i + kMaxHeldLevels > top) {
        fds_[i] = std::move(next);
        dir = fds_[i].get();
      } else {
        current = std::move(next);
        dir = current.get();
      }
    }
    return 0;
  }

  int root_;
  std::vector<std::string> names_;
  std::vector<UniqueFd> fds_;  // fds_[i] is the directory names_[i]; invalid when not held
};

// Appends the components of `path` to `todo`, a stack whose back is the next component. A
// trailing slash becomes a "." component so that the component before it must be a directory,
// as the kernel requires.
void PushComponents(std::vector<std::string>& todo, std::string_view path) {
  std::vector<std::string_view> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    if (j > i) parts.push_back(path.substr(i, j - i));
    i = j + 1;
  }
  if (!parts.empty() && path.back() == '/') parts.push_back(".");
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) todo.emplace_back(*it);
}

int ReadLinkOf(int link_fd, std::string& target) {
  char buf[PATH_MAX];
  // SAFETY: readlinkat with an empty path reads the link that the O_PATH fd refers to (Linux
  // 2.6.39); the kernel writes at most sizeof(buf) bytes and returns how many.
  ssize_t n = ::readlinkat(link_fd, "", buf, sizeof(buf));
  if (n < 0) return errno;
  if (static_cast<size_t>(n) >= sizeof(buf)) return ENAMETOOLONG;
  target.assign(buf, static_cast<size_t>(n));
  return 0;
}

// Opens what `fd` (an O_PATH fd of `name` in `dir`) refers to with `flags`, making sure the
// reopened inode is the one the walk checked.
int ReopenChecked(int dir, const char* name, const struct stat& checked, int flags, UniqueFd& out) {
  // SAFETY: openat of one component relative to a held dirfd; O_NOFOLLOW refuses a symlink
  // swapped in since the check.
  UniqueFd fd(::openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return errno == ELOOP ? EAGAIN : errno;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return errno;
  if (st.st_dev != checked.st_dev || st.st_ino != checked.st_ino) return EAGAIN;
  out = std::move(fd);
  return 0;
}

int WalkOnce(int root, std::string_view path, int flags, UniqueFd& out) {
  const bool follow_last = (flags & O_NOFOLLOW) == 0;
  const int open_flags = flags & ~O_NOFOLLOW;
  Levels levels(root);
  std::vector<std::string> todo;
  PushComponents(todo, path);
  int links = 0;
  while (!todo.empty()) {
    std::string name = std::move(todo.back());
    todo.pop_back();
    const bool last = todo.empty();
    if (name == ".") continue;
    if (name == "..") {
      if (int err = levels.Pop(); err != 0) return err;
      continue;
    }
    if (name.size() > NAME_MAX) return ENAMETOOLONG;
    // SAFETY: one component relative to a held dirfd. O_PATH|O_NOFOLLOW opens the entry itself,
    // whatever it is: a symlink is not followed by the kernel (we read it below), and a FIFO or
    // device is not opened for I/O, so this cannot block or have side effects.
    UniqueFd fd(::openat(levels.fd(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.valid()) return errno;
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return errno;
    if (S_ISLNK(st.st_mode)) {
      if (last && !follow_last) {
        if ((open_flags & O_PATH) == 0) return ELOOP;  // what open(O_NOFOLLOW) says for a link
        if ((open_flags & O_DIRECTORY) != 0) return ENOTDIR;
        out = std::move(fd);
        return 0;
      }
      if (++links > kMaxSymlinks) return ELOOP;
      // The link's text is resolved here, in-root, never by the kernel: an absolute target
      // restarts at `root` and ".." pops our own stack. A /proc/self/fd magic link has text
      // like "/etc/x" or "pipe:[1]", which is only ever looked up inside `root` as a name.
      std::string target;
      if (int err = ReadLinkOf(fd.get(), target); err != 0) return err;
      if (target.empty()) return ENOENT;  // the kernel's answer for an empty link
      if (target.front() == '/') levels.Reset();
      PushComponents(todo, target);
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      levels.Push(std::move(name), std::move(fd));
      continue;
    }
    if (!last) return ENOTDIR;
    if ((open_flags & O_DIRECTORY) != 0) return ENOTDIR;
    if ((open_flags & O_PATH) != 0) {
      out = std::move(fd);
      return 0;
    }
    return ReopenChecked(levels.fd(), name.c_str(), st, open_flags, out);
  }
  // The path ended on a directory (or was empty): open the directory the walk stands on.
  // SAFETY: "." of a held directory fd.
  UniqueFd fd(::openat(levels.fd(), ".", open_flags | O_CLOEXEC));
  if (!fd.valid()) return errno;
  out = std::move(fd);
  return 0;
}

int Walk(int root, std::string_view path, int flags, UniqueFd& out) {
  for (int i = 0; i < kMaxRetries; ++i) {
    int err = WalkOnce(root, path, flags, out);
    if (err != EAGAIN) return err;
  }
  return EAGAIN;
}

}  // namespace

bool IsProcRoot(int dir) {
  struct statfs sf;
  struct stat st;
  // procfs's root directory is inode 1 (PROC_ROOT_INO) of its superblock.
  return ::fstatfs(dir, &sf) == 0 && sf.f_type == PROC_SUPER_MAGIC && ::fstat(dir, &st) == 0 &&
         st.st_ino == 1;
}

bool IsOwnTaskEntry(std::string_view name) {
  pid_t pid = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), pid);
  if (ec != std::errc() || end != name.data() + name.size() || pid <= 0) return false;
  // SAFETY: signal 0 is only a check: 0 when `pid` is a thread of this process, ESRCH if not.
  return pid == ::getpid() || ::syscall(SYS_tgkill, ::getpid(), pid, 0) == 0;
}

namespace {

// ENOENT when `fd` is in one of the calling process's own /proc entries (IsOwnTaskEntry), else
// 0; `fs_type` (if given) gets its file system's type. Its path is what the kernel names it from
// this process's root: "/proc/PID/...".
int HideOwnProcEntry(int fd, unsigned long* fs_type) {
  struct statfs sf;
  if (::fstatfs(fd, &sf) != 0) return errno;
  if (fs_type != nullptr) *fs_type = static_cast<unsigned long>(sf.f_type);
  if (sf.f_type != PROC_SUPER_MAGIC) return 0;
  char link[32];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  char buf[PATH_MAX];
  // SAFETY: readlink of our own fd's magic link into a buffer of the size passed.
  ssize_t n = ::readlink(link, buf, sizeof(buf));
  if (n <= 0 || static_cast<size_t>(n) >= sizeof(buf)) return ENOENT;  // on procfs, unnamed
  std::string_view path(buf, static_cast<size_t>(n));
  constexpr std::string_view kProc = "/proc/";
  if (!path.starts_with(kProc)) return 0;
  std::string_view entry = path.substr(kProc.size());
  entry = entry.substr(0, entry.find('/'));
  return IsOwnTaskEntry(entry) ? ENOENT : 0;
}

// What OpenInRoot* answer once the kernel has opened `fd`.
int Opened(int fd, UniqueFd& out, unsigned long* fs_type = nullptr) {
  UniqueFd opened(fd);
  if (int err = HideOwnProcEntry(opened.get(), fs_type); err != 0) return err;
  out = std::move(opened);
  return 0;
}

}  // namespace

void SetUseOpenat2(bool enabled) { g_use_openat2.store(enabled); }
bool UsesOpenat2() { return g_use_openat2.load(); }

namespace {

// `path` relative to the root, for openat2 ("." for the root itself).
std::string RelativeToRoot(std::string_view path) {
  size_t skip = path.find_first_not_of('/');
  return skip == std::string_view::npos ? "." : std::string(path.substr(skip));
}

}  // namespace

int OpenInRootCached(int root, std::string_view path, int flags, UniqueFd& out,
                     unsigned long* fs_type) {
  if (path.size() >= PATH_MAX) return ENAMETOOLONG;
  if (!g_use_openat2.load(std::memory_order_relaxed)) return EAGAIN;
  std::string rel = RelativeToRoot(path);
  struct open_how how = {};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_CACHED;
  // SAFETY: as in OpenInRoot. EAGAIN also for a rename race: the blocking way retries it.
  int fd = sys::Openat2(root, rel.c_str(), &how, sizeof(how));
  if (fd < 0) return errno == ENOSYS || errno == EINVAL ? EAGAIN : errno;  // EINVAL: before 5.12
  return Opened(fd, out, fs_type);
}

int OpenInRoot(int root, std::string_view path, int flags, UniqueFd& out) {
  if (path.size() >= PATH_MAX) return ENAMETOOLONG;
  if (g_use_openat2.load(std::memory_order_relaxed)) {
    std::string rel = RelativeToRoot(path);
    struct open_how how = {};
    how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    for (int i = 0; i < kMaxRetries; ++i) {
      // SAFETY: `how` is a fully initialised open_how of the size passed; `rel` is a
      // NUL-terminated string that outlives the call.
      int fd = sys::Openat2(root, rel.c_str(), &how, sizeof(how));
      if (fd >= 0) return Opened(fd, out);
      if (errno == EAGAIN) continue;
      if (errno != ENOSYS) return errno;
      // A kernel before 5.6 (or a seccomp filter that hides openat2): walk from now on.
      g_use_openat2.store(false);
      break;
    }
    if (g_use_openat2.load()) return EAGAIN;
  }
  UniqueFd walked;
  if (int err = Walk(root, path, flags, walked); err != 0) return err;
  return Opened(walked.release(), out);
}

}  // namespace nsbox::fs

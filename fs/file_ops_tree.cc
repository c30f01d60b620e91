// mkdir and rm (fs/file_ops.h): the verbs that change the tree's shape.

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fs/file_ops.h"
#include "fs/fs_error.h"
#include "fs/resolve.h"

namespace nsbox::fs {
namespace {

// 0777 less the umask of 022 (api.md); passed explicitly because the server's own umask is not
// the sandbox's.
constexpr mode_t kDirMode = 0755;
// Node's recursive mkdir has no bound; ours stops a pathological loop.
constexpr int kMaxMkdirSteps = 10000;
// rm retries a directory that keeps gaining entries while it is emptied, then gives up.
constexpr int kMaxRmdirRetries = 16;

// mkdir(2) of one path, in-root: the parent is resolved (symlinks followed), the last component
// is created there and never followed (a dangling symlink there is EEXIST, as with mkdir(2)).
int MkdirOne(int root, const std::string& path) {
  auto [parent, name] = SplitParent(path);
  if (name.empty()) return EEXIST;  // "/" is always there
  UniqueFd dir;
  if (int err = OpenInRoot(root, parent, O_PATH | O_DIRECTORY, dir); err != 0) return err;
  // SAFETY: mkdirat of one component in a directory we hold.
  return ::mkdirat(dir.get(), name.c_str(), kDirMode) == 0 ? 0 : errno;
}

int StatFollow(int root, const std::string& path, struct stat& st) {
  UniqueFd fd;
  if (int err = OpenInRoot(root, path, O_PATH, fd); err != 0) return err;
  return ::fstat(fd.get(), &st) == 0 ? 0 : errno;
}

// Node 20's MKDirpAsync (src/node_file.cc), step for step, so that every outcome and the path
// it names match: mkdir the top of a stack of paths; ENOENT pushes the path back with its
// parent above it; any other error is judged by a stat of that path. Returns 0, or the errno
// and (in `at`) the path Node's error names.
int MkdirRecursive(int root, const std::string& path, std::string& at) {
  std::vector<std::string> stack{path};
  // Paths that already failed with ENOENT once: their parent was then made or found, so a second
  // ENOENT is final (procfs answers it forever under /proc/self/fd, where Node would loop).
  std::set<std::string> missing_once;
  for (int steps = 0; !stack.empty(); ++steps) {
    if (steps > kMaxMkdirSteps) {
      at = path;
      return ELOOP;
    }
    std::string next = std::move(stack.back());
    stack.pop_back();
    int err = MkdirOne(root, next);
    if (err == 0) continue;
    if (err == EACCES || err == ENOTDIR || err == EPERM) {
      at = next;
      return err;
    }
    if (err == ENOENT && !missing_once.insert(next).second) {
      at = next;
      return ENOENT;
    }
    if (err == ENOENT) {
      size_t slash = next.rfind('/');
      std::string dirname = slash == std::string::npos ? next : next.substr(0, slash);
      if (dirname.empty()) dirname = "/";
      if (dirname != next) {
        stack.push_back(next);
        stack.push_back(std::move(dirname));
        continue;
      }
      if (!stack.empty()) continue;
      err = EEXIST;
    }
    struct stat st;
    int stat_err = StatFollow(root, next, st);
    if (err == EEXIST && !stack.empty()) {
      // An existing parent on the way: fine if it is a directory (or a link to one), else a
      // file on the way.
      if (stat_err == 0 && S_ISDIR(st.st_mode)) continue;
      at = next;
      return ENOTDIR;
    }
    at = next;
    if (stat_err != 0) return stat_err;  // e.g. ENOENT for a dangling symlink at the path
    return S_ISDIR(st.st_mode) ? 0 : EEXIST;
  }
  return 0;
}

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};

struct Identity {
  dev_t dev;
  ino_t ino;
};

// Empties the directory `top` (an fd of `top_path`) without following any symlink in it and
// without recursion: the walk goes down by fd and climbs back with openat("..") checked
// against the identity remembered on the way down, so a 5,000-deep tree needs two fds and no
// stack, and a directory moved away mid-walk stops it instead of sending it elsewhere.
std::optional<FsError> EmptyTree(UniqueFd top, const std::string& top_path) {
  UniqueFd cur = std::move(top);
  std::vector<Identity> ancestors;  // of `cur`, from `top` down
  std::vector<std::string> names;   // of `cur` and the directories above it, below `top`
  auto path_of = [&](std::string_view child) {
    std::string p = top_path;
    for (const std::string& n : names) p = JoinPath(p, n);
    return child.empty() ? p : JoinPath(p, child);
  };
  // errno is read before path_of allocates.
  auto fail = [&](std::string_view syscall, std::string_view child) {
    int err = errno;
    return MakeFsError(err, syscall, path_of(child));
  };
  for (;;) {
    // SAFETY: F_DUPFD_CLOEXEC of our own fd, so that closedir leaves `cur` open.
    int dup = ::fcntl(cur.get(), F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return fail("scandir", "");
    std::unique_ptr<DIR, DirCloser> dir(::fdopendir(dup));
    if (!dir) {
      int err = errno;
      UniqueFd close_it(dup);
      return MakeFsError(err, "scandir", path_of(""));
    }
    bool removed_any = false;
    UniqueFd child;
    std::string child_name;
    for (;;) {
      errno = 0;
      const struct dirent* e = ::readdir(dir.get());
      if (e == nullptr) {
        if (errno != 0) return fail("scandir", "");
        break;
      }
      std::string_view name(e->d_name);
      if (name == "." || name == "..") continue;
      bool is_dir = e->d_type == DT_DIR;
      if (e->d_type == DT_UNKNOWN) {
        struct stat st;
        // SAFETY: fstatat of an entry of a directory we hold, not following a symlink.
        if (::fstatat(cur.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        is_dir = S_ISDIR(st.st_mode);
      }
      if (is_dir) {
        // SAFETY: one component in a directory we hold; O_NOFOLLOW|O_DIRECTORY: never a link.
        child.reset(
            ::openat(cur.get(), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (child.valid()) {
          child_name = e->d_name;
          break;
        }
        if (errno == ENOENT) continue;
        // ENOTDIR/ELOOP: it was swapped for a file or link since readdir; unlinked below.
        if (errno != ENOTDIR && errno != ELOOP) return fail("scandir", name);
      }
      // SAFETY: unlinkat of one entry of a directory we hold; a symlink is removed, not followed.
      if (::unlinkat(cur.get(), e->d_name, 0) != 0 && errno != ENOENT) {
        if (errno != EISDIR) return fail("unlink", name);
      }
      removed_any = true;  // look again: entries can move under a getdents that deletes
    }
    dir.reset();
    if (child.valid()) {
      struct stat st;
      if (::fstat(cur.get(), &st) != 0) return fail("scandir", "");
      ancestors.push_back({st.st_dev, st.st_ino});
      names.push_back(std::move(child_name));
      cur = std::move(child);
      continue;
    }
    if (removed_any) continue;
    if (ancestors.empty()) return std::nullopt;  // `top` is empty; the caller removes it
    // SAFETY: ".." of a directory we hold; checked against the directory we came down from.
    UniqueFd parent(::openat(cur.get(), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!parent.valid()) return fail("scandir", "..");
    struct stat st;
    if (::fstat(parent.get(), &st) != 0) return fail("scandir", "..");
    if (st.st_dev != ancestors.back().dev || st.st_ino != ancestors.back().ino) {
      // Moved while we were in it: stop rather than remove whatever is its parent now.
      return MakeFsError(EBUSY, "rm", path_of(""));
    }
    // SAFETY: rmdir of one (now empty) entry of a directory we hold.
    if (::unlinkat(parent.get(), names.back().c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT &&
        errno != ENOTEMPTY) {
      int err = errno;
      return MakeFsError(err, "rmdir", path_of(""));
    }
    // ENOTEMPTY: something was added meanwhile; the parent's next pass goes down again.
    cur = std::move(parent);
    ancestors.pop_back();
    names.pop_back();
  }
}

// rm of `name` in `dir` (`path`) found a file or a link where a directory was: unlinks that.
FsOutcome<Unit> UnlinkSwapped(int dir, const std::string& name, const std::string& path) {
  // SAFETY: unlinkat of one component; a symlink is removed, never its target.
  if (::unlinkat(dir, name.c_str(), 0) == 0 || errno == ENOENT) return Unit{};
  return MakeFsError(errno, "unlink", path);
}

FsError NodeRmIsDir(const std::string& path) {
  // Node's ERR_FS_EISDIR (a SystemError with errno 21 and syscall "rm").
  FsError e;
  e.err = EISDIR;
  e.syscall = "rm";
  e.path = path;
  e.message = "Path is a directory: rm returned EISDIR (is a directory) " + path;
  e.node_err_fs_eisdir = true;
  return e;
}

}  // namespace

FsOutcome<Unit> Mkdir(int root, const std::string& path, bool recursive) {
  if (auto bad = CheckPath(path, "mkdir")) return *bad;
  if (!recursive) {
    if (int err = MkdirOne(root, path); err != 0) return MakeFsError(err, "mkdir", path);
    return Unit{};
  }
  std::string at;
  if (int err = MkdirRecursive(root, path, at); err != 0) return MakeFsError(err, "mkdir", at);
  return Unit{};
}

FsOutcome<Unit> Rm(int root, const std::string& path, bool recursive, bool force) {
  // Node's rm looks at the path first (lstat): a path it cannot name fails there.
  if (auto bad = CheckPath(path, "lstat")) return *bad;
  auto [parent, name] = SplitParent(path);
  if (name.empty()) {
    // The jail's root itself. Without `recursive` Node's answer is EISDIR; with it, Node's
    // rimraf tries rmdir("/") first, which is EBUSY (the root cannot be removed), and stops
    // there: nothing is touched.
    if (!recursive) return NodeRmIsDir(path);
    return MakeFsError(EBUSY, "rmdir", path);
  }
  // Node's fs.rm starts with lstat(path): its errors are "lstat" errors, and force forgives
  // only ENOENT.
  UniqueFd dir;
  struct stat st;
  int err = OpenInRoot(root, parent, O_PATH | O_DIRECTORY, dir);
  // SAFETY: fstatat of one component in a directory we hold, not following a symlink.
  if (err == 0 && ::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) err = errno;
  // The server's own /proc entry is not there for it, as for a command (fs/resolve.h).
  if (err == 0 && IsOwnTaskEntry(name) && IsProcRoot(dir.get())) err = ENOENT;
  if (err == ENOENT && force) return Unit{};
  if (err != 0) return MakeFsError(err, "lstat", path);
  if (S_ISDIR(st.st_mode) && !recursive) return NodeRmIsDir(path);

  if (!S_ISDIR(st.st_mode)) {
    // SAFETY: unlinkat of one component; a symlink is removed, never its target.
    if (::unlinkat(dir.get(), name.c_str(), 0) == 0 || errno == ENOENT) return Unit{};
    if (errno != EISDIR) return MakeFsError(errno, "unlink", path);
    // It became a directory since the lstat: remove it as one (Node's rimraf does the same).
  }
  // Node's rimraf: rmdir first, and empty the directory only when that says it is not empty
  // (ENOTEMPTY or EEXIST; EPERM too, once, as Node does). Any other refusal (EROFS: its parent is
  // read-only, as for /workspace or /tmp; EBUSY: a mount point; EACCES) is answered before
  // anything in it is touched, instead of after its whole content is gone.
  for (int attempt = 0;; ++attempt) {
    // SAFETY: rmdir of one component in a directory we hold.
    if (::unlinkat(dir.get(), name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return Unit{};
    const int rmdir_err = errno;
    if (rmdir_err == ENOTDIR) return UnlinkSwapped(dir.get(), name, path);
    bool not_empty =
        rmdir_err == ENOTEMPTY || rmdir_err == EEXIST || (rmdir_err == EPERM && attempt == 0);
    if (!not_empty || attempt > kMaxRmdirRetries) return MakeFsError(rmdir_err, "rmdir", path);
    // SAFETY: one component in a directory we hold; O_NOFOLLOW|O_DIRECTORY: never a link.
    UniqueFd top(
        ::openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!top.valid()) {
      if (errno == ENOENT) return Unit{};
      if (errno == ENOTDIR || errno == ELOOP) return UnlinkSwapped(dir.get(), name, path);
      return MakeFsError(errno, "rmdir", path);
    }
    if (auto failed = EmptyTree(std::move(top), path)) return *failed;
  }
}

}  // namespace nsbox::fs

// RemoveTree and RemoveTreeAt (base/files.h): a tree of any depth with three fds at most.
//
// std::filesystem::remove_all (and a recursive walk that keeps each level's directory open)
// holds one fd per level: a sandbox that made a tree deeper than the daemon's RLIMIT_NOFILE
// (22,000 levels under a limit of 20,000) could not be deleted (EMFILE), and the walk took the
// daemon's fds away from everything else while it tried. This walk holds the directory it is in
// (and a duplicate for readdir, and its parent for a moment on the way up), remembers only the
// device and inode of each directory above it, and climbs back with openat(".."), checked
// against that identity: a directory moved away while it is being removed stops the walk instead
// of sending it somewhere else. Nothing is followed: each level is opened with O_NOFOLLOW, a
// symlink is unlinked, and a mount point inside the tree is refused by its rmdir (EBUSY)
// before anything would open it.

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "base/files.h"

namespace nsbox {

namespace {

struct Identity {
  dev_t dev;
  ino_t ino;
};

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};

// A failed call on `name` (an entry of the directory `depth` levels below the tree's top; ""
// for that directory itself), with where it happened: "remove T, 3 levels down: rmdir("x"): ...".
Error Failed(const char* call, std::string_view name, int err, const std::string& display,
             size_t depth) {
  std::string where = "remove " + display;
  if (depth > 0)
    where += ", " + std::to_string(depth) + (depth == 1 ? " level" : " levels") + " down";
  return Error::Sys(call, name, err).Context(where);
}

// Empties the directory `top` (an O_DIRECTORY fd of `display`).
Status EmptyDirectory(UniqueFd top, const std::string& display) {
  UniqueFd cur = std::move(top);
  std::vector<Identity> above;  // the directories above `cur`, `top` first
  for (;;) {
    const size_t depth = above.size();
    // A duplicate for the stream, so that closedir leaves `cur` open.
    const int dup = ::fcntl(cur.get(), F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return Failed("fcntl(F_DUPFD)", "", errno, display, depth);
    std::unique_ptr<DIR, DirCloser> dir(::fdopendir(dup));
    if (!dir) {
      const int err = errno;
      ::close(dup);
      return Failed("fdopendir", "", err, display, depth);
    }
    bool removed_any = false;
    UniqueFd child;
    for (;;) {
      errno = 0;
      const struct dirent* e = ::readdir(dir.get());
      if (e == nullptr) {
        if (errno != 0) return Failed("readdir", "", errno, display, depth);
        break;
      }
      const std::string_view name(e->d_name);
      if (name == "." || name == "..") continue;
      bool is_dir = e->d_type == DT_DIR;
      if (e->d_type == DT_UNKNOWN) {
        struct stat st {};
        if (::fstatat(cur.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
          if (errno == ENOENT) continue;
          return Failed("fstatat", name, errno, display, depth);
        }
        is_dir = S_ISDIR(st.st_mode);
      }
      if (is_dir) {
        // An empty directory goes at once; a full one is entered.
        if (::unlinkat(cur.get(), e->d_name, AT_REMOVEDIR) == 0 || errno == ENOENT) {
          removed_any = true;
          continue;
        }
        const int rmdir_err = errno;
        if (rmdir_err == ENOTEMPTY || rmdir_err == EEXIST) {
          child.reset(
              ::openat(cur.get(), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
          if (child.valid()) break;
          if (errno == ENOENT) continue;
          if (errno != ENOTDIR && errno != ELOOP) {
            return Failed("openat", name, errno, display, depth);
          }
          // Swapped for a file or a link since the rmdir: unlinked below.
        } else if (rmdir_err != ENOTDIR) {
          // EBUSY: a mount point (of this mount namespace), never entered.
          return Failed("rmdir", name, rmdir_err, display, depth);
        }
      }
      // SAFETY: one entry of a directory we hold; a symlink is removed, never followed.
      if (::unlinkat(cur.get(), e->d_name, 0) != 0 && errno != ENOENT) {
        // A directory now (swapped since readdir): the next pass takes it as one.
        if (errno != EISDIR) return Failed("unlink", name, errno, display, depth);
      }
      removed_any = true;
    }
    dir.reset();
    if (child.valid()) {
      struct stat st {};
      if (::fstat(cur.get(), &st) != 0) return Failed("fstat", "", errno, display, depth);
      above.push_back({st.st_dev, st.st_ino});
      cur = std::move(child);
      continue;
    }
    // Entries may move under a readdir that deletes: a directory is empty only when a whole pass
    // found nothing to remove.
    if (removed_any) continue;
    if (above.empty()) return Ok();
    // Up: the parent's next pass removes this directory, empty now.
    UniqueFd parent(::openat(cur.get(), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!parent.valid()) return Failed("openat", "..", errno, display, depth);
    struct stat st {};
    if (::fstat(parent.get(), &st) != 0) {
      return Failed("fstat", "..", errno, display, depth);
    }
    if (st.st_dev != above.back().dev || st.st_ino != above.back().ino) {
      return Failed("openat", "..", EBUSY, display, depth)
          .Context("a directory was moved out of the tree while it was being removed");
    }
    above.pop_back();
    cur = std::move(parent);
  }
}

}  // namespace

Status RemoveTreeAt(int dir_fd, const std::string& name, const std::string& display) {
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return Ok();
    return Error::Sys("fstatat", display, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
      return Error::Sys("unlink", display, errno);
    }
    return Ok();
  }
  // rmdir first: an empty directory needs no walk.
  if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return Ok();
  if (errno != ENOTEMPTY && errno != EEXIST) return Error::Sys("rmdir", display, errno);
  UniqueFd top(::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!top.valid()) {
    if (errno == ENOENT) return Ok();
    return Error::Sys("openat", display, errno);
  }
  NSBOX_TRY(EmptyDirectory(std::move(top), display));
  if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return Error::Sys("rmdir", display, errno);
  }
  return Ok();
}

Status RemoveTree(const std::string& path) {
  if (path.empty()) return Error(EINVAL, "remove: an empty path");
  return RemoveTreeAt(AT_FDCWD, path, path);
}

}  // namespace nsbox

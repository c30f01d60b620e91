#include "images/image.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/syscalls.h"
#include "base/unique_fd.h"

namespace nsbox::images {

namespace {

// The top-level directories of a Debian-like host that programs need: /usr and, depending on
// whether the host has merged /usr, symlinks or real directories for the rest.
constexpr const char* kHostTopLevel[] = {"bin", "sbin", "lib", "lib32", "lib64", "libx32"};

std::string Join(const std::string& root, const std::string& name) {
  return root == "/" ? "/" + name : root + "/" + name;
}

}  // namespace

Result<Image> HostImage(const std::string& host_root) {
  Image image;
  image.name = std::string(kHostImage);
  std::string usr = Join(host_root, "usr");
  struct stat st {};
  if (::stat(usr.c_str(), &st) < 0) return Error::Sys("stat", usr, errno).Context("host image");
  if (!S_ISDIR(st.st_mode)) return Error::Msg("host image: " + usr + " is not a directory");
  image.root.binds.push_back({usr, "/usr", true});

  for (const char* name : kHostTopLevel) {
    std::string path = Join(host_root, name);
    if (::lstat(path.c_str(), &st) < 0) {
      if (errno == ENOENT) continue;
      return Error::Sys("lstat", path, errno).Context("host image");
    }
    if (S_ISLNK(st.st_mode)) {
      char buf[4096];
      ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
      if (n < 0) return Error::Sys("readlink", path, errno).Context("host image");
      image.root.symlinks.push_back(
          {std::string("/") + name, std::string(buf, static_cast<size_t>(n))});
    } else if (S_ISDIR(st.st_mode)) {
      image.root.binds.push_back({path, std::string("/") + name, true});
    }
  }

  std::string bash = Join(host_root, "usr/bin/bash");
  std::string bin_bash = Join(host_root, "bin/bash");
  bool has_bash = ::access(bash.c_str(), X_OK) == 0 || ::access(bin_bash.c_str(), X_OK) == 0;
  image.shell = has_bash ? "/bin/bash" : "/bin/sh";
  return image;
}

namespace {

enum class Found { kExecutable, kOther, kAbsent };

constexpr const char* kBashPaths[] = {"usr/bin/bash", "bin/bash"};

// Looks `path` up inside the root file system at `root_fd`, as a process chrooted there would:
// absolute symlinks of the image (/bin -> /usr/bin) resolve inside it, never on the host.
Result<Found> LookUpInRoot(int root_fd, const char* path, const std::string& display) {
  struct open_how how {};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  // SAFETY: how is a local, fully initialised struct of the size passed.
  UniqueFd fd(sys::Openat2(root_fd, path, &how, sizeof how));
  if (!fd.valid()) {
    if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return Found::kAbsent;
    return Error::Sys("openat2", display + "/" + path, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) < 0) return Error::Sys("fstat", display + "/" + path, errno);
  // An overlay whiteout (a 0/0 character device in the upper layer) hides the lower file.
  if (S_ISREG(st.st_mode) && (st.st_mode & 0111) != 0) return Found::kExecutable;
  return Found::kOther;
}

Result<UniqueFd> OpenRoot(const std::string& root) {
  UniqueFd dir(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return Error::Sys("open", root, errno);
  return dir;
}

}  // namespace

std::string ShellIn(int root_fd) {
  for (const char* path : kBashPaths) {
    auto found = LookUpInRoot(root_fd, path, "the image");
    // An error (no openat2 before Linux 5.6, say) gives the answer that always works.
    if (found.ok() && *found == Found::kExecutable) return "/bin/bash";
  }
  return "/bin/sh";
}

Result<Image> OverlayImage(std::string_view name, const isolate::RootSpec::Overlay& overlay) {
  Image image;
  image.name = std::string(name);
  image.root.overlay = overlay;
  NSBOX_ASSIGN_OR_RETURN(UniqueFd upper, OpenRoot(overlay.upper));
  NSBOX_ASSIGN_OR_RETURN(UniqueFd lower, OpenRoot(overlay.lower));
  bool has_bash = false;
  for (const char* path : kBashPaths) {
    NSBOX_ASSIGN_OR_RETURN(Found found, LookUpInRoot(upper.get(), path, overlay.upper));
    if (found == Found::kAbsent) {
      NSBOX_ASSIGN_OR_RETURN(found, LookUpInRoot(lower.get(), path, overlay.lower));
    }
    if (found == Found::kExecutable) {
      has_bash = true;
      break;
    }
  }
  image.shell = has_bash ? "/bin/bash" : "/bin/sh";
  return image;
}

Result<Image> ResolveImage(std::string_view name) {
  if (name == kHostImage) return HostImage("/");
  return Error(ENOENT, "image '" + std::string(name) + "' does not exist (available: host)");
}

}  // namespace nsbox::images

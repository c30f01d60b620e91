#include "images/image.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

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

Result<Image> ResolveImage(std::string_view name) {
  if (name == kHostImage) return HostImage("/");
  return Error(ENOENT, "image '" + std::string(name) + "' does not exist (available: host)");
}

}  // namespace nsbox::images

#include "base/files.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

namespace nsbox {

Result<UniqueFd> OpenAt(int dirfd, const std::string& path, int flags, mode_t mode) {
  int fd = ::openat(dirfd, path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) {
    return Error::Sys("open", path, errno);
  }
  return UniqueFd(fd);
}

Result<std::string> ReadFileAt(int dirfd, const std::string& path) {
  NSBOX_ASSIGN_OR_RETURN(UniqueFd fd, OpenAt(dirfd, path, O_RDONLY | O_NOCTTY));
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::Sys("read", path, errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Status WriteAll(int fd, std::string_view content, std::string_view what) {
  while (!content.empty()) {
    ssize_t n = ::write(fd, content.data(), content.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::Sys("write", what, errno);
    }
    content.remove_prefix(static_cast<size_t>(n));
  }
  return Ok();
}

Status WriteExistingFileAt(int dirfd, const std::string& path, std::string_view content) {
  NSBOX_ASSIGN_OR_RETURN(UniqueFd fd, OpenAt(dirfd, path, O_WRONLY | O_NOCTTY));
  ssize_t n = ::write(fd.get(), content.data(), content.size());
  if (n < 0) {
    return Error::Sys("write", path, errno);
  }
  if (static_cast<size_t>(n) != content.size()) {
    return Error::Sys("write", path, EIO);
  }
  return Ok();
}

}  // namespace nsbox

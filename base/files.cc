#include "base/files.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

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
  return ReadFd(fd.get(), path);
}

Result<std::string> ReadFd(int fd, std::string_view what) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::Sys("read", what, errno);
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

Status MakeDir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) return Error::Sys("mkdir", path, errno);
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return Error::Sys("stat", path, errno);
  if (!S_ISDIR(st.st_mode)) return Error(ENOTDIR, path + " exists and is not a directory");
  return Ok();
}

Status FsyncPath(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Error::Sys("open", path, errno);
  if (::fsync(fd.get()) != 0) return Error::Sys("fsync", path, errno);
  return Ok();
}

Status MakeSlotDurable(const std::string& dir, const std::string& name, size_t size) {
  const std::string path = dir + "/" + name;
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return Error::Sys("open", path, errno);
  NSBOX_TRY(WriteAll(fd.get(), std::string(size, ' '), path));
  if (::fsync(fd.get()) != 0) return Error::Sys("fsync", path, errno);
  return Ok();
}

Status FillSlotDurable(const std::string& dir, const std::string& name, std::string_view data) {
  const std::string path = dir + "/" + name;
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return Error::Sys("open", path, errno);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Error::Sys("fstat", path, errno);
  std::string padded(data);
  if (padded.size() < static_cast<size_t>(st.st_size)) {
    padded.resize(static_cast<size_t>(st.st_size), ' ');
  }
  NSBOX_TRY(WriteAll(fd.get(), padded, path));
  if (::fdatasync(fd.get()) != 0) return Error::Sys("fdatasync", path, errno);
  return Ok();
}

Status WriteFileAtomic(const std::string& dir, const std::string& name, std::string_view data) {
  const std::string temp = dir + "/." + name + ".tmp";
  const std::string path = dir + "/" + name;
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return Error::Sys("open", temp, errno);
  NSBOX_TRY(WriteAll(fd.get(), data, temp));
  if (::fsync(fd.get()) != 0) return Error::Sys("fsync", temp, errno);
  fd.reset();
  if (::rename(temp.c_str(), path.c_str()) != 0) return Error::Sys("rename", path, errno);
  return FsyncPath(dir);
}

Result<UniqueFd> LockFileExclusive(const std::string& path, pid_t* holder) {
  if (holder != nullptr) *holder = 0;
  NSBOX_ASSIGN_OR_RETURN(UniqueFd fd, OpenAt(AT_FDCWD, path, O_RDWR | O_CREAT, 0600));
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;  // l_start 0 and l_len 0: the whole file, however it grows
  if (::fcntl(fd.get(), F_SETLK, &lock) == 0) return fd;
  const int err = errno;
  if (err != EAGAIN && err != EACCES) return Error::Sys("fcntl(F_SETLK)", path, err);
  struct flock held {};
  held.l_type = F_WRLCK;
  held.l_whence = SEEK_SET;
  pid_t pid = 0;
  if (::fcntl(fd.get(), F_GETLK, &held) == 0 && held.l_type != F_UNLCK && held.l_pid > 0) {
    pid = held.l_pid;
  }
  if (holder != nullptr) *holder = pid;
  return Error(EBUSY, path + " is locked" + (pid > 0 ? " by pid " + std::to_string(pid) : ""));
}

std::string RandomHex(size_t digits) {
  // The kernel's generator: names made from it (exec ids, image content ids, temp names) are
  // not guessable from earlier ones, as those of a seeded PRNG would be.
  static constexpr char kHex[] = "0123456789abcdef";
  std::string bytes((digits + 1) / 2, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = ::getrandom(bytes.data() + got, bytes.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    // getrandom cannot fail once the pool is initialised (Linux 3.17+, long before any boot
    // reaches a daemon); if it does, there is nothing sane to fall back to.
    if (n < 0) std::abort();
    got += static_cast<size_t>(n);
  }
  std::string out;
  for (size_t i = 0; i < digits; ++i) {
    auto byte = static_cast<unsigned char>(bytes[i / 2]);
    out += kHex[(i % 2 == 0 ? byte >> 4 : byte) & 15];
  }
  return out;
}

Result<std::string> FindBesideSelf(std::initializer_list<const char*> relatives,
                                   std::string_view name) {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n < 0) return Error::Sys("readlink", "/proc/self/exe", errno);
  return FindBeside(std::string(buf, static_cast<size_t>(n)), relatives, name);
}

Result<std::string> FindBeside(const std::string& self,
                               std::initializer_list<const char*> relatives,
                               std::string_view name) {
  auto slash = self.rfind('/');
  std::string dir = slash == std::string::npos ? "." : self.substr(0, slash);
  for (const char* relative : relatives) {
    std::string path = dir + relative;
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return Error(ENOENT, std::string(name) + " not found beside " + self);
}

}  // namespace nsbox

#include "fs/fs_error.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#include <cctype>

#include "base/error.h"

namespace nsbox::fs {
namespace {

struct NodeCode {
  int err;
  const char* code;
  const char* description;
};

// From Node 20's util.getSystemErrorMap() (libuv's uv_err_name / uv_strerror), limited to the
// errnos a file syscall can return.
constexpr NodeCode kNodeCodes[] = {
    {EPERM, "EPERM", "operation not permitted"},
    {ENOENT, "ENOENT", "no such file or directory"},
    {EINTR, "EINTR", "interrupted system call"},
    {EIO, "EIO", "i/o error"},
    {ENXIO, "ENXIO", "no such device or address"},
    {E2BIG, "E2BIG", "argument list too long"},
    {EBADF, "EBADF", "bad file descriptor"},
    {EAGAIN, "EAGAIN", "resource temporarily unavailable"},
    {ENOMEM, "ENOMEM", "not enough memory"},
    {EACCES, "EACCES", "permission denied"},
    {EFAULT, "EFAULT", "bad address in system call argument"},
    {EBUSY, "EBUSY", "resource busy or locked"},
    {EEXIST, "EEXIST", "file already exists"},
    {EXDEV, "EXDEV", "cross-device link not permitted"},
    {ENODEV, "ENODEV", "no such device"},
    {ENOTDIR, "ENOTDIR", "not a directory"},
    {EISDIR, "EISDIR", "illegal operation on a directory"},
    {EINVAL, "EINVAL", "invalid argument"},
    {ENFILE, "ENFILE", "file table overflow"},
    {EMFILE, "EMFILE", "too many open files"},
    {ENOTTY, "ENOTTY", "inappropriate ioctl for device"},
    {ETXTBSY, "ETXTBSY", "text file is busy"},
    {EFBIG, "EFBIG", "file too large"},
    {ENOSPC, "ENOSPC", "no space left on device"},
    {ESPIPE, "ESPIPE", "invalid seek"},
    {EROFS, "EROFS", "read-only file system"},
    {EMLINK, "EMLINK", "too many links"},
    {EPIPE, "EPIPE", "broken pipe"},
    {ERANGE, "ERANGE", "result too large"},
    {ENAMETOOLONG, "ENAMETOOLONG", "name too long"},
    {ENOSYS, "ENOSYS", "function not implemented"},
    {ENOTEMPTY, "ENOTEMPTY", "directory not empty"},
    {ELOOP, "ELOOP", "too many symbolic links encountered"},
    {ENODATA, "ENODATA", "no data available"},
    {EOVERFLOW, "EOVERFLOW", "value too large for defined data type"},
    {EILSEQ, "EILSEQ", "illegal byte sequence"},
    {ENOTSUP, "ENOTSUP", "operation not supported on socket"},
    {ECANCELED, "ECANCELED", "operation canceled"},
};

}  // namespace

std::pair<std::string, std::string> NodeErrno(int err) {
  for (const NodeCode& c : kNodeCodes) {
    if (c.err == err) return {c.code, c.description};
  }
  std::string description = strerrordesc_np(err) != nullptr ? strerrordesc_np(err) : "";
  for (char& ch : description) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return {ErrnoName(err), description};
}

FsError MakeFsError(int err, std::string_view syscall, std::string_view path) {
  auto [code, description] = NodeErrno(err);
  FsError e;
  e.err = err;
  e.syscall = std::string(syscall);
  e.path = std::string(path);
  e.message = code + ": " + description + ", " + e.syscall + " '" + e.path + "'";
  return e;
}

std::optional<FsError> CheckPath(const std::string& path, std::string_view syscall) {
  if (path.find('\0') != std::string::npos) {
    // Node refuses such a path before any syscall (ERR_INVALID_ARG_VALUE); the message shows the
    // NUL as \x00 the way Node's does, so that it stays printable.
    std::string shown;
    for (char ch : path) {
      if (ch == '\0') {
        shown += "\\x00";
      } else {
        shown += ch;
      }
    }
    FsError e = MakeFsError(EINVAL, syscall, shown);
    e.path = path;
    return e;
  }
  if (path.size() >= PATH_MAX) return MakeFsError(ENAMETOOLONG, syscall, path);
  return std::nullopt;
}

std::pair<std::string, std::string> SplitParent(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {"/", path};
  std::string parent = slash == 0 ? "/" : path.substr(0, slash);
  return {parent, path.substr(slash + 1)};
}

std::string JoinPath(std::string_view dir, std::string_view name) {
  std::string out(dir);
  if (out.empty() || out.back() != '/') out += '/';
  out += name;
  return out;
}

}  // namespace nsbox::fs

#include "runtime/api_error.h"

#include <errno.h>
#include <string.h>

#include <string>

namespace nsbox::runtime {

ApiError ApiError::SandboxNotFound(const std::string& id) {
  return {404, "sandbox_not_found", "no sandbox with id '" + id + "'", {}, {}};
}

int StatusForErrno(int err) {
  switch (err) {
    case EINVAL:
    case EISDIR:
    case ENOTDIR:
    case ENAMETOOLONG:
    case ELOOP:
      return 400;
    case EACCES:
    case EPERM:
    case EROFS:
      return 403;
    case ENOENT:
      return 404;
    case EEXIST:
    case ENOTEMPTY:
    // Not in api.md's list: the path is in a state that refuses the verb (a mount point, a
    // program running), as 409 says, not a fault of the daemon's (500).
    case EBUSY:
    case ETXTBSY:
      return 409;
    case ENOSPC:
    case EDQUOT:
      return 507;
    default:
      return 500;
  }
}

std::string ErrnoName(int err) {
  // strerrorname_np: glibc 2.32.
  const char* name = ::strerrorname_np(err);
  return name != nullptr ? std::string(name) : "E" + std::to_string(err);
}

ApiError ApiError::FromFs(const fs::FsError& error) {
  if (error.err == 0 ||
      (error.syscall.empty() && (error.err == EPIPE || error.err == ECONNRESET))) {
    return Unavailable("the sandbox's server is not answering: " + error.message);
  }
  ApiError out;
  out.status = StatusForErrno(error.err);
  out.code = ErrnoName(error.err);
  out.message = error.message;
  out.path = error.path;
  out.syscall = error.syscall;
  return out;
}

}  // namespace nsbox::runtime

#include "isolate/shared_etc.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <string_view>

#include "base/files.h"
#include "base/unique_fd.h"

namespace nsbox::isolate {
namespace {

// Versions this process made or found, by path: a jail start that finds its version here makes
// no syscall for it.
std::mutex g_mu;
std::set<std::string>& Known() {
  static std::set<std::string> known;
  return known;
}

// FNV-1a, 64 bits: a cache key, not a secret; a collision would need two host /etc states whose
// descriptions hash alike, and the description includes inode numbers and nanosecond ctimes.
uint64_t Fnv1a(std::string_view text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string KeyOf(const SharedEtcRequest& r) {
  std::string d = "nsbox shared /etc, format 1\n";
  d += r.nameserver;
  d += '\n' + std::to_string(r.owner_uid) + ':' + std::to_string(r.owner_gid) + '\n';
  for (const auto& e : r.entries) {
    d += std::to_string(static_cast<int>(e.type)) + ' ' + e.name + '\0' + e.pointee + '\0';
    d += std::to_string(e.size) + ' ' + std::to_string(e.dev) + ' ' + std::to_string(e.ino) + ' ' +
         std::to_string(e.ctime_ns) + ' ' + std::to_string(e.mode) + '\n';
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(Fnv1a(d)));
  return hex;
}

Status WriteNew(const std::string& path, std::string_view content, mode_t mode, uid_t uid,
                gid_t gid) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!fd.valid()) return Error::Sys("open", path, errno);
  NSBOX_TRY(WriteAll(fd.get(), content, path));
  if (::fchown(fd.get(), uid, gid) != 0) return Error::Sys("fchown", path, errno);
  if (::fchmod(fd.get(), mode) != 0) return Error::Sys("fchmod", path, errno);
  return Ok();
}

Status SymlinkNew(const std::string& pointee, const std::string& path, const SharedEtcRequest& r) {
  if (::symlink(pointee.c_str(), path.c_str()) != 0) return Error::Sys("symlink", path, errno);
  if (::lchown(path.c_str(), r.owner_uid, r.owner_gid) != 0) {
    return Error::Sys("lchown", path, errno);
  }
  return Ok();
}

Status MkdirNew(const std::string& path, const SharedEtcRequest& r) {
  if (::mkdir(path.c_str(), 0755) != 0) return Error::Sys("mkdir", path, errno);
  if (::chown(path.c_str(), r.owner_uid, r.owner_gid) != 0) {
    return Error::Sys("chown", path, errno);
  }
  // Whatever the umask took away.
  if (::chmod(path.c_str(), 0755) != 0) return Error::Sys("chmod", path, errno);
  return Ok();
}

// Copies the host file `name` as it is now, with its owner and permission bits: a jail sees the
// copy as it saw the file bound (a host root's file is nobody's inside, and a mode of 0600 keeps
// it closed to the jail's root). A file that is no longer a regular one (replaced since the
// scan) is left out: the next scan sees the change and makes a new version.
Status CopyHostFile(const SharedEtcRequest& r, const JailFsConfig::EtcEntry& e,
                    const std::string& to) {
  const std::string from = r.host_etc_dir + "/" + e.name;
  UniqueFd in(::open(from.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!in.valid()) {
    if (errno == ENOENT || errno == ELOOP) return Ok();
    return Error::Sys("open", from, errno);
  }
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) return Error::Sys("fstat", from, errno);
  if (!S_ISREG(st.st_mode)) return Ok();
  NSBOX_ASSIGN_OR_RETURN(std::string bytes, ReadFd(in.get(), from));
  return WriteNew(to, bytes, st.st_mode & 0777, st.st_uid, st.st_gid);
}

Status Build(const SharedEtcRequest& r, const std::string& dir) {
  NSBOX_TRY(MkdirNew(dir, r));
  for (const auto& file : GeneratedEtcFiles("", r.nameserver)) {
    // hosts and hostname name the sandbox: each jail binds its own on these placeholders.
    const bool own = file.name == "hosts" || file.name == "hostname";
    NSBOX_TRY(WriteNew(dir + "/" + file.name, own ? std::string_view() : file.content, 0644,
                       r.owner_uid, r.owner_gid));
  }
  NSBOX_TRY(SymlinkNew("../proc/self/mounts", dir + "/mtab", r));
  for (const auto& e : r.entries) {
    const std::string to = dir + "/" + e.name;
    switch (e.type) {
      case JailFsConfig::EtcEntry::Type::kSymlink:
        NSBOX_TRY(SymlinkNew(e.pointee, to, r));
        break;
      case JailFsConfig::EtcEntry::Type::kDirectory:
        NSBOX_TRY(MkdirNew(to, r));  // a mount point: each jail binds the host's, live
        break;
      case JailFsConfig::EtcEntry::Type::kFile:
        NSBOX_TRY(CopyHostFile(r, e, to));
        break;
    }
  }
  return Ok();
}

}  // namespace

Result<std::string> PrepareSharedEtc(const SharedEtcRequest& request) {
  if (request.cache_dir.empty() || request.cache_dir[0] != '/') {
    return Error::Msg("shared /etc: the cache directory must be an absolute path");
  }
  const std::string path = request.cache_dir + "/" + KeyOf(request);
  std::lock_guard<std::mutex> lock(g_mu);
  if (Known().count(path) != 0) return path;
  // Its parent keeps host users out (0700); the directory itself lets the jails' layers overlays
  // through (0711: an overlay's root takes the mode of the directory of its top layer, and the
  // jail's root is no owner of it).
  const std::string parent = request.cache_dir.substr(0, request.cache_dir.rfind('/'));
  if (!parent.empty() && ::access(parent.c_str(), F_OK) != 0) NSBOX_TRY(MakeDir(parent, 0700));
  NSBOX_TRY(MakeDir(request.cache_dir, 0711));
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return Error::Sys("lstat", path, ENOTDIR).Context("shared /etc");
    Known().insert(path);
    return path;
  }
  if (errno != ENOENT) return Error::Sys("lstat", path, errno).Context("shared /etc");
  // Made aside and renamed into place, so that no jail ever binds a half-made one.
  const std::string temp = request.cache_dir + "/.tmp-" + RandomHex(12);
  if (auto built = Build(request, temp); !built.ok()) {
    (void)RemoveTree(temp);
    return std::move(built).error().Context("shared /etc");
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int err = errno;
    (void)RemoveTree(temp);
    // Another process with the same cache made the same version first: use it.
    if (err != EEXIST && err != ENOTEMPTY) {
      return Error::Sys("rename", path, err).Context("shared /etc");
    }
  }
  Known().insert(path);
  return path;
}

}  // namespace nsbox::isolate

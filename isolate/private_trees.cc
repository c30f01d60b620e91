#include "isolate/private_trees.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>
#include <set>
#include <string_view>

#include "base/files.h"
#include "base/syscalls.h"
#include "isolate/mount_plan.h"
#include "policy/filesystem.h"

namespace nsbox::isolate {
namespace {

// Layers directories this process has made ready: a jail start that finds its own here makes
// no syscall for them.
std::mutex g_mu;
std::set<std::string>& Ready() {
  static std::set<std::string> ready;
  return ready;
}

// `path` is a device node like the host's `like` (type, number and permission bits), or made so.
Status CopyDeviceNode(const std::string& like, const std::string& path) {
  struct stat host {};
  if (::stat(like.c_str(), &host) != 0) return Error::Sys("stat", like, errno);
  if (!S_ISCHR(host.st_mode)) return Error::Sys("stat", like, ENODEV);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISCHR(st.st_mode) && st.st_rdev == host.st_rdev && st.st_uid == 0 &&
        (st.st_mode & 07777) == (host.st_mode & 07777)) {
      return Ok();
    }
    if (::unlink(path.c_str()) != 0) return Error::Sys("unlink", path, errno);
  } else if (errno != ENOENT) {
    return Error::Sys("lstat", path, errno);
  }
  // SAFETY: a character device of the same number as a node the host's /dev already offers
  // everyone (null, zero, full, random, urandom, tty), in a directory only root can reach.
  if (::mknod(path.c_str(), S_IFCHR | (host.st_mode & 07777), host.st_rdev) != 0) {
    return Error::Sys("mknod", path, errno);
  }
  if (::chmod(path.c_str(), host.st_mode & 07777) != 0) return Error::Sys("chmod", path, errno);
  return Ok();
}

Status PrepareLayersDir(const PrivateTreesRequest& r) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (Ready().count(r.layers_dir) != 0) return Ok();
  // The layers overlay's root takes the layers directory's mode, which must let the jail's root
  // (no owner of it) through as it binds from it: 0711. Host users are kept out by its parent
  // (0700, made so when missing).
  const std::string parent = r.layers_dir.substr(0, r.layers_dir.rfind('/'));
  if (!parent.empty() && ::access(parent.c_str(), F_OK) != 0) NSBOX_TRY(MakeDir(parent, 0700));
  NSBOX_TRY(MakeDir(r.layers_dir, 0711));
  if (::chmod(r.layers_dir.c_str(), 0711) != 0) return Error::Sys("chmod", r.layers_dir, errno);
  const std::string empty = r.layers_dir + "/" + kLayersEmpty;
  if (::mkdir(empty.c_str(), 0755) != 0 && errno != EEXIST) {
    return Error::Sys("mkdir", empty, errno);
  }
  const std::string devices = r.layers_dir + "/" + kLayersDevices;
  if (::mkdir(devices.c_str(), 0755) != 0 && errno != EEXIST) {
    return Error::Sys("mkdir", devices, errno);
  }
  for (const auto& dev : policy::DeviceNodes()) {
    NSBOX_TRY(CopyDeviceNode(r.host_dev + "/" + dev.path, devices + "/" + dev.path));
  }
  // An empty layer that is not empty would show its entries in every jail's /usr. (Never
  // removed and made again: a jail of another process may use it, and an overlay whose layer was
  // removed lists its root as empty.)
  DIR* dir = ::opendir(empty.c_str());
  if (dir == nullptr) return Error::Sys("opendir", empty, errno);
  bool entries = false;
  while (const dirent* e = ::readdir(dir)) {
    const std::string_view name = e->d_name;
    entries = entries || (name != "." && name != "..");
  }
  ::closedir(dir);
  if (entries) return Error::Sys("readdir", empty, ENOTEMPTY).Context("an empty layer");
  Ready().insert(r.layers_dir);
  return Ok();
}

}  // namespace

Result<UniqueFd> MountReadonlyOverlay(const std::vector<std::string>& lowers, bool nodev) {
  std::string lowerdir;
  for (const auto& l : lowers) lowerdir += (lowerdir.empty() ? "" : ":") + OverlayPathOption(l);
  const std::string what = "a read-only overlay of " + lowerdir;
  // SAFETY: fsopen only creates a configuration context; nothing is mounted until fsmount, and
  // the mount it returns is detached (visible nowhere until a jail attaches it).
  UniqueFd fs(sys::FsOpen("overlay", FSOPEN_CLOEXEC));
  if (!fs.valid()) return Error::Sys("fsopen", "overlay", errno).Context(what);
  // SAFETY: key and value are NUL-terminated strings that outlive the calls.
  if (sys::FsConfig(fs.get(), FSCONFIG_SET_STRING, "lowerdir", lowerdir.c_str(), 0) < 0 ||
      sys::FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0) {
    const int err = errno;
    const std::string log = FsContextLog(fs.get());
    return Error::Sys("fsconfig", "lowerdir=" + lowerdir, err)
        .Context(what + (log.empty() ? "" : " (" + log + ")"));
  }
  // SAFETY: turns the configured context into a detached mount fd. Without an upper layer the
  // overlay is read-only whatever the mount says; the binds from it say ro, nosuid, nodev
  // themselves, but a device node's bind must not be nodev.
  UniqueFd mnt(
      sys::FsMount(fs.get(), FSMOUNT_CLOEXEC,
                   MOUNT_ATTR_NOSUID | (nodev ? MOUNT_ATTR_NODEV | MOUNT_ATTR_RDONLY : 0)));
  if (!mnt.valid()) return Error::Sys("fsmount", "overlay", errno).Context(what);
  return mnt;
}

Result<PrivateTrees> MakePrivateTrees(const PrivateTreesRequest& r) {
  if (r.layers_dir.empty() || r.layers_dir[0] != '/') {
    return Error::Msg("private trees: the layers directory must be an absolute path");
  }
  NSBOX_TRY_CTX(PrepareLayersDir(r), "the layers of a jail's own overlays");
  PrivateTrees out;
  const std::string empty = r.layers_dir + "/" + kLayersEmpty;
  for (const auto& tree : r.trees) {
    NSBOX_ASSIGN_OR_RETURN(out.trees[tree], MountReadonlyOverlay({tree, empty}, /*nodev=*/true));
  }
  NSBOX_ASSIGN_OR_RETURN(out.layers,
                         MountReadonlyOverlay({r.layers_dir, r.host_etc}, /*nodev=*/false));
  return out;
}

}  // namespace nsbox::isolate

#include "isolate/disk.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <linux/mount.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "base/files.h"
#include "base/process.h"
#include "base/syscalls.h"
#include "isolate/mount_plan.h"

namespace nsbox::isolate {

namespace {

std::optional<std::string> MkfsBinary() {
  for (const char* p : {"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"}) {
    if (::access(p, X_OK) == 0) return std::string(p);
  }
  return std::nullopt;
}

// Runs mkfs.ext4 with `options` on `image`, a file system of `blocks`; its output is the error's
// message when it fails. It gets none of the daemon's environment (which may hold secrets), only
// a PATH and the C locale.
Status RunMkfs(const std::string& mkfs, const std::vector<std::string>& options,
               const std::string& image, uint64_t blocks) {
  std::vector<std::string> argv = {mkfs};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back(image);
  argv.push_back(std::to_string(blocks));
  const std::vector<std::string> env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"};
  NSBOX_ASSIGN_OR_RETURN(ProgramRun run, RunProgram(argv, &env, 4096));
  if (WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0) return Ok();
  std::string out = std::move(run.output);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  for (char& ch : out) {
    if (ch == '\n') ch = ' ';
  }
  return Error::Msg(mkfs + " " + image + " failed (" + DescribeExit(run.status) + ")" +
                    (out.empty() ? "" : ": " + out));
}

// The loop device already attached to the image (dev, ino), if any: a mount of the image that
// still lives (a jail not yet ended) holds it, and the image must be mounted through it again.
Result<std::optional<std::pair<UniqueFd, std::string>>> FindLoop(dev_t dev, ino_t ino) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir("/sys/block"), ::closedir);
  if (!d) return Error::Sys("opendir", "/sys/block", errno);
  while (struct dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name.rfind("loop", 0) != 0) continue;
    // Only a bound loop device has a loop/ directory in sysfs.
    if (::access(("/sys/block/" + name + "/loop").c_str(), F_OK) != 0) continue;
    const std::string device = "/dev/" + name;
    // Held open from here, the device cannot be detached (LO_FLAGS_AUTOCLEAR) before the mount.
    // A device that cannot be looked at is an error, never skipped: it may be the one that holds
    // the image, and a second one would make two file systems write it.
    UniqueFd fd(::open(device.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT || errno == ENXIO || errno == ENODEV) continue;  // gone meanwhile
      return Error::Sys("open", device, errno).Context("find the loop device of an image");
    }
    struct loop_info64 info {};
    // SAFETY: LOOP_GET_STATUS64 fills `info`; ENXIO when the device is not (or no more) bound.
    if (::ioctl(fd.get(), LOOP_GET_STATUS64, &info) != 0) {
      if (errno == ENXIO) continue;
      return Error::Sys("ioctl LOOP_GET_STATUS64", device, errno)
          .Context("find the loop device of an image");
    }
    if (info.lo_device == dev && info.lo_inode == ino) {
      return std::optional<std::pair<UniqueFd, std::string>>(std::pair{std::move(fd), device});
    }
  }
  return std::optional<std::pair<UniqueFd, std::string>>();
}

// A loop device of the image: the one that already holds it, or a free one attached to it.
Result<std::pair<UniqueFd, std::string>> AttachLoop(const std::string& image) {
  UniqueFd file(::open(image.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!file.valid()) return Error::Sys("open", image, errno);
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) return Error::Sys("fstat", image, errno);
  if (!S_ISREG(st.st_mode)) return Error(EINVAL, image + " is not a regular file");
  NSBOX_ASSIGN_OR_RETURN(auto held, FindLoop(st.st_dev, st.st_ino));
  if (held) return std::move(*held);
  UniqueFd control(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!control.valid()) return Error::Sys("open", "/dev/loop-control", errno);
  for (int attempt = 0;; ++attempt) {
    // SAFETY: LOOP_CTL_GET_FREE takes no argument; it returns a free device's number.
    const int n = ::ioctl(control.get(), LOOP_CTL_GET_FREE);
    if (n < 0) return Error::Sys("ioctl LOOP_CTL_GET_FREE", "/dev/loop-control", errno);
    const std::string device = "/dev/loop" + std::to_string(n);
    UniqueFd loop(::open(device.c_str(), O_RDWR | O_CLOEXEC));
    if (!loop.valid()) return Error::Sys("open", device, errno);
    struct loop_config config {};
    config.fd = static_cast<uint32_t>(file.get());
    config.block_size = kDiskBlockBytes;
    // Detached with its last user; direct I/O so that the image's blocks are not cached twice
    // (by the loop's file system and by the host's).
    config.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
    std::strncpy(reinterpret_cast<char*>(config.info.lo_file_name), image.c_str(),
                 LO_NAME_SIZE - 1);
    // SAFETY: LOOP_CONFIGURE reads `config`; the backing fd is ours for the call.
    if (::ioctl(loop.get(), LOOP_CONFIGURE, &config) == 0) {
      return std::pair{std::move(loop), device};
    }
    const int err = errno;
    // Another process took the free device between the two calls: ask again.
    if (err != EBUSY || attempt == 16) return Error::Sys("ioctl LOOP_CONFIGURE", device, err);
  }
}

}  // namespace

Status MakeDiskImage(const std::string& path, uint64_t bytes, const std::vector<DiskDir>& dirs) {
  if (bytes < kMinDiskBytes || bytes > kMaxDiskBytes || bytes % kDiskBlockBytes != 0) {
    return Error(EINVAL, "a disk of " + std::to_string(bytes) +
                             " bytes: expected a multiple of 4096 from 16 MiB to 8 TiB");
  }
  const std::optional<std::string> mkfs = MkfsBinary();
  if (!mkfs) return Error(ENOENT, "mkfs.ext4 is not installed (Debian package e2fsprogs)");
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return Error::Sys("open", path, errno);
  auto made = [&]() -> Status {
    // Every block reserved now: a sandbox's disk that is full fails with ENOSPC inside it, never
    // with an I/O error because the host's disk filled up under a sparse image.
    if (::fallocate(fd.get(), 0, 0, static_cast<off_t>(bytes)) != 0) {
      return Error::Sys("fallocate", path + " (" + std::to_string(bytes) + " bytes)", errno);
    }
    // The blocks fallocate reserved read as zeros: mkfs need not write its inode tables and
    // journal (assume_storage_prezeroed, e2fsprogs 1.47), and must not discard (punch) them.
    // Older e2fsprogs lack that option; the kernel then zeroes the tables in the background.
    const uint64_t fs_blocks = (bytes - kDiskTailBytes) / kDiskBlockBytes;
    std::vector<std::string> options = {
        "-q", "-F",                             // quiet; a file, not a device
        "-b", std::to_string(kDiskBlockBytes),  // the loop device's block size
        "-m", "0",                              // none kept for root: the sandbox has all
        "-L", "nsbox",                          // its label
        "-e", "remount-ro",                     // a corrupt disk stops its writes
        "-E", "nodiscard,assume_storage_prezeroed=1"};
    Status st = RunMkfs(*mkfs, options, path, fs_blocks);
    if (!st.ok() && st.error().message().find("assume_storage_prezeroed") != std::string::npos) {
      options.back() = "nodiscard";
      st = RunMkfs(*mkfs, options, path, fs_blocks);
    }
    NSBOX_TRY(st);
    NSBOX_ASSIGN_OR_RETURN(auto disk, Disk::Open(path));
    for (const DiskDir& d : dirs) {
      const std::string where = path + ":/" + d.name;
      if (::mkdirat(disk->mount_fd(), d.name.c_str(), 0700) != 0) {
        return Error::Sys("mkdir", where, errno);
      }
      // SAFETY: a directory we just made in a file system nobody else has mounted.
      if (::fchownat(disk->mount_fd(), d.name.c_str(), d.uid, d.gid, AT_SYMLINK_NOFOLLOW) != 0) {
        return Error::Sys("chown", where, errno);
      }
      // After the chown, which would clear a set-id bit.
      if (::fchmodat(disk->mount_fd(), d.name.c_str(), d.mode & 07777, 0) != 0) {
        return Error::Sys("chmod", where, errno);
      }
    }
    // The mount fd is an O_PATH one; syncfs needs a file opened for real.
    UniqueFd root(::openat(disk->mount_fd(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root.valid()) return Error::Sys("open", path + ":/", errno);
    if (::syncfs(root.get()) != 0) return Error::Sys("syncfs", path, errno);
    disk.reset();
    if (::fsync(fd.get()) != 0) return Error::Sys("fsync", path, errno);
    return Ok();
  }();
  if (!made.ok()) {
    (void)::unlink(path.c_str());
    return std::move(made).error().Context("make the sandbox's disk");
  }
  return Ok();
}

Result<std::unique_ptr<Disk>> Disk::Open(const std::string& image) {
  NSBOX_ASSIGN_OR_RETURN(auto loop, AttachLoop(image));
  const std::string& device = loop.second;
  // SAFETY: fsopen only creates a configuration context; fsmount below returns a detached mount.
  UniqueFd fs(sys::FsOpen("ext4", FSOPEN_CLOEXEC));
  if (!fs.valid()) return Error::Sys("fsopen", "ext4", errno).Context("mount " + image);
  // SAFETY: key and value are NUL-terminated strings that outlive the call.
  if (sys::FsConfig(fs.get(), FSCONFIG_SET_STRING, "source", device.c_str(), 0) < 0) {
    int err = errno;
    return Error::Sys("fsconfig", "source=" + device, err).Context("mount " + image);
  }
  if (sys::FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0) {
    int err = errno;
    const std::string log = FsContextLog(fs.get());
    return Error::Sys("fsconfig", "create ext4 on " + device, err)
        .Context("mount " + image + (log.empty() ? "" : " (" + log + ")") + "; `e2fsck -f " +
                 image + "` checks it");
  }
  // SAFETY: the configured context becomes a detached mount fd, nosuid and nodev like every
  // writable place of a jail.
  UniqueFd mnt(sys::FsMount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  if (!mnt.valid()) return Error::Sys("fsmount", device, errno).Context("mount " + image);
  // The file system holds the loop device from now on; our fd on it closes with `loop`.
  return std::unique_ptr<Disk>(new Disk(std::move(mnt), device));
}

Result<uint32_t> DiskMountCount(const std::string& image) {
  UniqueFd fd(::open(image.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return Error::Sys("open", image, errno);
  // The ext4 superblock, 1024 bytes from the start: s_mnt_count at 52, s_magic at 56 (both
  // little-endian 16-bit).
  unsigned char sb[64];
  const ssize_t got = ::pread(fd.get(), sb, sizeof sb, 1024);
  if (got < 0) return Error::Sys("pread", image, errno);
  if (got != static_cast<ssize_t>(sizeof sb) || sb[56] != 0x53 || sb[57] != 0xef) {
    return Error(EINVAL, image + " holds no ext4 file system");
  }
  return static_cast<uint32_t>(sb[52] | (sb[53] << 8));
}

std::string Disk::PathOf(const std::string& sub) const {
  return "/proc/self/fd/" + std::to_string(mount_.get()) + "/" + sub;
}

Status DiskSupport() {
  if (::access("/dev/loop-control", R_OK | W_OK) != 0) {
    return Error::Sys("access", "/dev/loop-control", errno).Context("loop devices");
  }
  auto fs = ReadFile("/proc/filesystems");
  if (!fs.ok()) return std::move(fs).error();
  if (fs->find("\text4\n") == std::string::npos) {
    return Error(ENODEV, "the kernel has no ext4 (/proc/filesystems)");
  }
  if (!MkfsBinary()) return Error(ENOENT, "mkfs.ext4 is not installed (Debian package e2fsprogs)");
  // The jail's setup clones (open_tree) a directory of the disk's detached mount; kernels before
  // 6.15 refuse a detached mount there (EINVAL). Probed once, on a small tmpfs.
  static const Status clones = []() -> Status {
    UniqueFd tmpfs(sys::FsOpen("tmpfs", FSOPEN_CLOEXEC));
    if (!tmpfs.valid()) return Error::Sys("fsopen", "tmpfs", errno);
    // SAFETY: NUL-terminated key and value; a detached tmpfs of 64 KiB, gone with its fds.
    if (sys::FsConfig(tmpfs.get(), FSCONFIG_SET_STRING, "size", "64k", 0) < 0 ||
        sys::FsConfig(tmpfs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0) {
      return Error::Sys("fsconfig", "tmpfs", errno);
    }
    UniqueFd mnt(sys::FsMount(tmpfs.get(), FSMOUNT_CLOEXEC, 0));
    if (!mnt.valid()) return Error::Sys("fsmount", "tmpfs", errno);
    if (::mkdirat(mnt.get(), "d", 0700) != 0) return Error::Sys("mkdir", "tmpfs:/d", errno);
    // SAFETY: open_tree only reads the fds and returns a new one.
    UniqueFd tree(sys::OpenTree(mnt.get(), "d", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
    if (!tree.valid()) {
      return Error::Sys("open_tree", "a directory of a detached mount", errno)
          .Context("the kernel cannot clone a directory of a detached mount (Linux 6.15 can)");
    }
    return Ok();
  }();
  return clones;
}

}  // namespace nsbox::isolate

#pragma once

// A sandbox's own disk (`limits.diskBytes`, docs/daemon.md "Disk limits"): an ext4 file system
// in an image file of the sandbox's directory, whose blocks are reserved on the host's disk when
// it is made. Its workspace/ and home/ are the sandbox's /workspace and /root (an image's
// upper/ and work/: its whole layer), so what the sandbox keeps is bounded by the image's size:
// a write past it fails with ENOSPC inside the sandbox, not on the host's disk. (What the daemon
// keeps for it, its exec logs' spill files, stays on the state dir's disk.)
//
// The image is attached to a loop device and mounted detached (fsopen/fsmount): the mount is in
// no mount table, the jail attaches clones of its directories (open_tree), and it goes away with
// its last user, the loop device with it (LO_FLAGS_AUTOCLEAR). One image is only ever mounted
// through one loop device: Disk::Open reuses the device an earlier mount of the image still holds
// (a jail of a dead daemon that has not yet ended), so two file systems never write one image.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"

namespace nsbox::isolate {

inline constexpr uint32_t kDiskBlockBytes = 4096;  // the file system's and the loop device's
inline constexpr uint64_t kMinDiskBytes = uint64_t{16} << 20;  // room for ext4's own metadata
// Half of ext4's largest file with 4 KiB blocks (16 TiB less a block), where the image lives.
inline constexpr uint64_t kMaxDiskBytes = uint64_t{8} << 40;
// The image's last MiB, which the file system never covers: blkid and udev rules look there for
// RAID and ZFS labels, and no byte the sandbox writes may ever be read as one on the host.
inline constexpr uint64_t kDiskTailBytes = uint64_t{1} << 20;

// A directory at the top of a new disk (and of a sandbox's directory, runtime/registry.cc).
struct DiskDir {
  std::string name;
  mode_t mode = 0700;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Makes the image at `path`, which must not exist: `bytes` (a multiple of 4096, between the two
// bounds above) reserved on the host's disk, an ext4 file system on it (all but its last
// kDiskTailBytes) with the directories `dirs`, all of it durable. ENOSPC when the host's disk
// cannot hold it. On failure nothing is left at `path`.
Status MakeDiskImage(const std::string& path, uint64_t bytes, const std::vector<DiskDir>& dirs);

// A mounted disk image. Holding it keeps the file system mounted (detached).
class Disk {
 public:
  static Result<std::unique_ptr<Disk>> Open(const std::string& image);

  // A path that reaches `sub` of the file system from this process, for as long as this Disk
  // lives ("/proc/self/fd/N/workspace"): what the jail's setup pins and clones.
  std::string PathOf(const std::string& sub) const;
  int mount_fd() const { return mount_.get(); }
  const std::string& device() const { return device_; }

 private:
  Disk(UniqueFd mount, std::string device) : mount_(std::move(mount)), device_(std::move(device)) {}
  UniqueFd mount_;
  std::string device_;
};

// How many times the image's file system was mounted read-write (its superblock's
// s_mnt_count): 1 for a disk made by MakeDiskImage that no sandbox has used yet.
Result<uint32_t> DiskMountCount(const std::string& image);

// Ok when this host can give a sandbox its own disk (loop devices, ext4, mkfs.ext4, and a kernel
// that clones directories of a detached mount, as the jail's setup does), else why not: for
// `nsbox doctor`, and for a PUT with diskBytes.
Status DiskSupport();

}  // namespace nsbox::isolate

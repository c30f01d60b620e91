#include "isolate/mount_plan.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "base/syscalls.h"
#include "policy/filesystem.h"

namespace nsbox::isolate {

namespace {

using Kind = MountOp::Kind;

std::string FlagText(unsigned long flags) {
  std::string out = (flags & MS_RDONLY) ? "ro" : "rw";
  if (flags & MS_NOSUID) out += ",nosuid";
  if (flags & MS_NODEV) out += ",nodev";
  if (flags & MS_NOEXEC) out += ",noexec";
  return out;
}

class Planner {
 public:
  explicit Planner(std::string staging) { plan_.staging = std::move(staging); }

  MountOp& Add(Kind kind, const std::string& target) {
    MountOp op{};
    op.kind = kind;
    op.target = target;
    op.staged = target == "/" ? plan_.staging : plan_.staging + target;
    plan_.ops.push_back(std::move(op));
    return plan_.ops.back();
  }
  void Mkdir(const std::string& target, mode_t mode = 0755) {
    Add(Kind::kMkdir, target).mode = mode;
  }
  void Tmpfs(const std::string& target, unsigned long flags, const std::string& data) {
    auto& op = Add(Kind::kTmpfs, target);
    op.flags = flags;
    op.data = data;
  }
  MountOp& Bind(const std::string& source, const std::string& target, unsigned long flags,
                bool recursive) {
    auto& op = Add(Kind::kBind, target);
    op.source = source;
    op.flags = flags;
    op.recursive = recursive;
    return op;
  }
  void Symlink(const std::string& pointee, const std::string& target) {
    Add(Kind::kSymlink, target).source = pointee;
  }
  MountPlan Take() { return std::move(plan_); }

 private:
  MountPlan plan_;
};

bool IsAbsoluteNormal(const std::string& p) {
  if (p.empty() || p[0] != '/') return false;
  if (p.find("//") != std::string::npos) return false;
  if (p.size() > 1 && p.back() == '/') return false;
  // No "." or ".." components: targets are fixed by nsbox or by an image definition.
  size_t i = 0;
  while (i < p.size()) {
    size_t j = p.find('/', i + 1);
    std::string_view comp(p.data() + i + 1, (j == std::string::npos ? p.size() : j) - i - 1);
    if (comp == "." || comp == "..") return false;
    if (j == std::string::npos) break;
    i = j;
  }
  return true;
}

}  // namespace

std::string MountOp::Describe() const {
  switch (kind) {
    case Kind::kRootTmpfs:
      return "new root tmpfs at " + staged;
    case Kind::kRootTree:
      return "new root: the image's overlay at " + staged;
    case Kind::kMkdir:
      return std::string(if_absent ? "mkdir (if absent) " : "mkdir ") + target;
    case Kind::kTouch:
      return "create " + target;
    case Kind::kWriteFile:
      return "write " + target;
    case Kind::kCopyFile:
      return "copy " + source + " -> " + target;
    case Kind::kSymlink:
      return "symlink " + target + " -> " + source;
    case Kind::kTmpfs:
      return "tmpfs " + target + " (" + FlagText(flags) + (data.empty() ? "" : "," + data) + ")";
    case Kind::kBind:
      return std::string(recursive ? "rbind " : "bind ") + source + " -> " + target + " (" +
             FlagText(flags) + ")";
    case Kind::kProc:
      return "proc " + target + " (" + data + ")";
    case Kind::kDevpts:
      return "devpts " + target + " (" + data + ")";
    case Kind::kMaskPath:
      return "mask " + target;
    case Kind::kReadonlyPath:
      return "read-only " + target;
    case Kind::kPivotRoot:
      return "pivot_root " + staged;
    case Kind::kRemountRootReadonly:
      return "remount / read-only";
    case Kind::kHoldDir:
      return "hold " + target;
    case Kind::kUnmount:
      return "unmount " + target;
  }
  return "?";
}

Result<std::vector<JailFsConfig::EtcEntry>> ScanHostEtc(const std::string& host_etc_dir) {
  std::vector<JailFsConfig::EtcEntry> out;
  for (const auto& rule : policy::EtcAllowlist()) {
    std::string path = host_etc_dir + "/" + rule.path;
    struct stat st {};
    if (::lstat(path.c_str(), &st) < 0) {
      if (errno == ENOENT || errno == ENOTDIR) continue;
      return Error::Sys("lstat", path, errno);
    }
    JailFsConfig::EtcEntry e;
    e.name = rule.path;
    if (S_ISLNK(st.st_mode)) {
      char buf[4096];
      ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
      if (n < 0) return Error::Sys("readlink", path, errno);
      if (static_cast<size_t>(n) == sizeof buf) return Error::Sys("readlink", path, ENAMETOOLONG);
      e.type = JailFsConfig::EtcEntry::Type::kSymlink;
      e.pointee.assign(buf, static_cast<size_t>(n));
    } else if (S_ISDIR(st.st_mode)) {
      e.type = JailFsConfig::EtcEntry::Type::kDirectory;
    } else if (S_ISREG(st.st_mode)) {
      e.type = JailFsConfig::EtcEntry::Type::kFile;
      e.size = static_cast<uint64_t>(st.st_size);
      e.dev = static_cast<uint64_t>(st.st_dev);
      e.ino = static_cast<uint64_t>(st.st_ino);
      e.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
      e.mode = static_cast<uint32_t>(st.st_mode & 0777);
    } else {
      continue;  // a FIFO or device in /etc is nothing a program needs
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<GeneratedFile> GeneratedEtcFiles(const std::string& hostname,
                                             const std::string& nameserver) {
  return {
      {"passwd",
       "root:x:0:0:root:/root:/bin/bash\n"
       "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"},
      {"group", "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n"},
      {"hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" +
                    hostname + "\n"},
      {"hostname", hostname + "\n"},
      // Without a network the jail's namespace has loopback only: there is no resolver to name.
      // nsboxd's sandboxes always name its resolver, so that a network policy given to a running
      // sandbox needs no change here; it answers only what the policy allows
      // (docs/network.md), and while the policy is "none" there is no route to it.
      {"resolv.conf",
       nameserver.empty()
           ? std::string("# nsbox: this sandbox has no network; only loopback is up.\n")
           : "# nsbox: the sandbox's resolver, run by nsboxd; it answers only the names the\n"
             "# sandbox's network policy allows (docs/network.md).\nnameserver " +
                 nameserver + "\noptions timeout:2 attempts:2\n"},
      {"nsswitch.conf",
       "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
       "protocols: files\nservices: files\nethers: files\nrpc: files\n"},
  };
}

Result<MountPlan> PlanMounts(const JailFsConfig& config) {
  if (!IsAbsoluteNormal(config.staging) || config.staging == "/") {
    return Error::Msg("staging directory '" + config.staging + "' must be an absolute path");
  }
  if (config.adopt_later && (config.root_tree_fd >= 0 || config.shared_etc.empty())) {
    return Error::Msg("a jail adopted later needs the host image and a shared /etc");
  }
  if (config.workspace_source.empty() && config.root_tree_fd < 0 && !config.adopt_later) {
    return Error::Msg("no workspace to bind");
  }
  Planner p(config.staging);
  constexpr unsigned long kRo = MS_RDONLY | MS_NOSUID | MS_NODEV;
  // The size of the tmpfs that holds /tmp and /dev/shm (step 5). Memory like any other: with a
  // memory limit, they may hold half of it together, so that files left there never leave the
  // sandbox's processes without room (cases MemoryBombThroughUploadToTmpfs and
  // MemoryBombThroughTmpfsFromInside).
  const std::string size =
      config.tmpfs_size_bytes == 0 ? "" : ",size=" + std::to_string(config.tmpfs_size_bytes / 2);

  const bool overlay = config.root_tree_fd >= 0;
  // The layers overlay (JailFsConfig::layers_tree), attached in the root's tmpfs or, on an
  // image's root, in its /dev; what the plan binds from the host's /etc and /dev comes from it.
  const bool layers = config.layers_tree >= 0;
  const std::string layers_at = overlay ? kLayersDirInImage : kLayersDir;
  auto attach_layers = [&] {
    p.Mkdir(layers_at, 0700);
    auto& op = p.Bind("(the jail's layers overlay)", layers_at, 0, false);
    op.source_fd = config.layers_tree;
    op.source_is_tree = true;
  };
  // The source of a read-only bind of a host /etc entry ("ssl") or device node ("null").
  auto from_etc = [&](const std::string& name) {
    return layers ? config.staging + layers_at + "/" + name : "/etc/" + name;
  };
  auto from_dev = [&](const std::string& name) {
    return layers ? config.staging + layers_at + "/" + kLayersDevices + "/" + name : "/dev/" + name;
  };
  if (overlay) {
    // 1-3. An imported image: its overlay is the whole root, /etc included, and persistent.
    if (!config.root.binds.empty() || !config.root.symlinks.empty()) {
      return Error::Msg("an overlay root takes no binds or symlinks");
    }
    if (!config.shared_etc.empty()) return Error::Msg("an overlay root has its own /etc");
    p.Add(Kind::kRootTree, "/").source_fd = config.root_tree_fd;
  } else {
    // 1. The new root: a tmpfs holding mount points, /etc and symlinks, and the writable
    //    directories of step 5. Its mount becomes read-only once everything is in place (the last
    //    step); the binds of those directories stay writable.
    auto& root = p.Add(Kind::kRootTmpfs, "/");
    root.flags = MS_NOSUID | MS_NODEV;
    root.data = "mode=0755" + size;
    if (layers) attach_layers();

    // 2. The image: read-only binds of the host's /usr (and the rest of its layout).
    for (const auto& link : config.root.symlinks) {
      if (!IsAbsoluteNormal(link.target)) return Error::Msg("bad image symlink " + link.target);
      p.Symlink(link.pointee, link.target);
    }
    for (const auto& bind : config.root.binds) {
      if (!IsAbsoluteNormal(bind.target) || bind.target == "/") {
        return Error::Msg("bad image bind target '" + bind.target + "'");
      }
      p.Mkdir(bind.target);
      auto& op =
          p.Bind(bind.source, bind.target, bind.readonly ? kRo : (MS_NOSUID | MS_NODEV), true);
      // A read-only tree of the host is attached as an overlay of the jail's own, if it has one.
      auto own = config.private_binds.find(bind.source);
      if (bind.readonly && own != config.private_binds.end()) {
        op.source_fd = own->second;
        op.source_is_tree = true;
      }
    }

    // 3. /etc: generated files plus read-only binds of the allowlisted host entries.
    if (!config.shared_etc.empty()) {
      if (config.shared_etc_tree < 0 && (!layers || config.shared_etc_layer.empty())) {
        return Error::Msg("a shared /etc needs its tree");
      }
      // One directory shared by the daemon's jails holds the generated files and copies of the
      // host's files; only the host's directories and the sandbox's two own files are bound.
      p.Mkdir("/etc");
      if (layers && !config.shared_etc_layer.empty()) {
        p.Bind(config.staging + layers_at + "/" + config.shared_etc_layer, "/etc", kRo, false);
      } else {
        auto& etc = p.Bind(config.shared_etc, "/etc", kRo, false);
        etc.source_fd = config.shared_etc_tree;
        etc.source_is_tree = true;
      }
      for (const auto& e : config.host_etc) {
        if (e.type == JailFsConfig::EtcEntry::Type::kDirectory) {
          p.Bind(from_etc(e.name), "/etc/" + e.name, kRo, !layers);
        }
      }
      // hosts and hostname name the sandbox: written into the jail's own root (a tmpfs: no disk
      // and no journal on the start's path) and bound on the placeholders. They are kept under
      // the mount point of /proc, which the jail's procfs covers below: out of sight, and not
      // unlinked (a tmpfs with an unlinked file still in use refuses the final read-only
      // remount).
      const std::string own = kOwnEtcDir;
      p.Mkdir("/proc", 0555);
      p.Mkdir(own, 0700);
      for (const auto& file : GeneratedEtcFiles(config.hostname, config.nameserver)) {
        if (file.name != "hosts" && file.name != "hostname") continue;
        auto& op = p.Add(Kind::kWriteFile, own + "/" + file.name);
        op.data = file.content;
        op.mode = 0644;
        p.Bind(config.staging + own + "/" + file.name, "/etc/" + file.name, kRo, false);
      }
      // The adoption rewrites them through this directory's fd: reaching it once the procfs
      // covers it would take a clone of the root mount, whose release waits for an RCU grace
      // period (docs/perf-notes.md "Where a first use's exec goes").
      if (config.adopt_later) p.Add(Kind::kHoldDir, own);
    }
  }
  if (!overlay && config.shared_etc.empty()) {
    p.Mkdir("/etc");
    for (const auto& file : GeneratedEtcFiles(config.hostname, config.nameserver)) {
      auto& op = p.Add(Kind::kWriteFile, "/etc/" + file.name);
      op.data = file.content;
      op.mode = 0644;
    }
    p.Symlink("../proc/self/mounts", "/etc/mtab");
    for (const auto& e : config.host_etc) {
      std::string target = "/etc/" + e.name;
      switch (e.type) {
        case JailFsConfig::EtcEntry::Type::kSymlink:
          p.Symlink(e.pointee, target);
          break;
        case JailFsConfig::EtcEntry::Type::kDirectory:
          p.Mkdir(target);
          p.Bind(from_etc(e.name), target, kRo, !layers);
          break;
        case JailFsConfig::EtcEntry::Type::kFile:
          if (e.size <= config.etc_copy_limit) {
            // Small files are copied into the root, which becomes read-only: a copy costs a few
            // syscalls where a bind costs two mounts at set-up and an unmount at teardown.
            auto& op = p.Add(Kind::kCopyFile, target);
            op.source = "/etc/" + e.name;
            op.mode = 0644;
          } else {
            p.Add(Kind::kTouch, target).mode = 0644;
            p.Bind(from_etc(e.name), target, kRo, false);
          }
          break;
      }
    }
  }

  // 4. The writable places: /workspace and /root (persistent), /tmp.
  if (overlay) {
    // Plain directories of the persistent root, made once; what the sandbox later makes of
    // them (a chmod, even a symlink in their place) is its own business.
    for (const auto& [dir, mode] : {std::pair{"/workspace", 0755}, std::pair{"/root", 0700}}) {
      auto& op = p.Add(Kind::kMkdir, dir);
      op.mode = static_cast<mode_t>(mode);
      op.if_absent = true;
    }
  } else if (config.adopt_later) {
    // Attached by ApplyAdoption.
    p.Mkdir("/workspace");
    p.Mkdir("/root", 0700);
  } else {
    p.Mkdir("/workspace");
    auto& workspace = p.Bind(config.workspace_source, "/workspace", MS_NOSUID | MS_NODEV, false);
    workspace.source_fd = config.workspace_fd;
    workspace.source_is_tree = config.workspace_fd_is_tree;
    p.Mkdir("/root", 0700);
    if (config.home_tmpfs || config.home_source.empty()) {
      p.Tmpfs("/root", MS_NOSUID | MS_NODEV, "mode=0700");
    } else {
      auto& home = p.Bind(config.home_source, "/root", MS_NOSUID | MS_NODEV, false);
      home.source_fd = config.home_fd;
      home.source_is_tree = config.home_fd_is_tree;
    }
  }
  // 5. The scratch places, /dev, /tmp and /dev/shm, are one tmpfs, the root's own where the
  //    root is a tmpfs: every superblock costs the kernel ≈ 5 KiB, and each memory cgroup of the
  //    host a slot per superblock alive (docs/perf-notes.md, "What an idle sandbox costs the
  //    kernel"). /dev is a writable bind of its directory (an image's root has a tmpfs there);
  //    /tmp is a bind of a directory under the mount point of /dev/pts, which the devpts
  //    mounted there below covers, and so is the empty directory that masks /proc's.
  p.Mkdir("/dev");
  if (overlay) {
    p.Tmpfs("/dev", MS_NOSUID | MS_NOEXEC, "mode=0755" + size);
    if (layers) attach_layers();
  } else {
    p.Bind(config.staging + "/dev", "/dev", MS_NOSUID | MS_NOEXEC, false).exact_flags = true;
  }
  p.Mkdir("/dev/pts");
  p.Mkdir(kScratchTmpDir, 01777);
  p.Mkdir(kScratchEmptyDir, 0555);
  p.Mkdir("/tmp", 01777);
  p.Bind(config.staging + kScratchTmpDir, "/tmp", MS_NOSUID | MS_NODEV, false).exact_flags = true;

  // 6. A fresh /proc for the new PID namespace, with Docker's masked and read-only paths.
  p.Mkdir("/proc", 0555);
  auto& proc = p.Add(Kind::kProc, "/proc");
  proc.flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
  proc.data = "hidepid=ptraceable";
  for (const auto& rule : policy::ProcMaskedPaths()) {
    auto& op = p.Add(Kind::kMaskPath, rule.path);
    op.source = config.staging + kScratchEmptyDir;
    if (layers) op.data = from_dev("null");
  }
  for (const auto& rule : policy::ProcReadonlyPaths()) p.Add(Kind::kReadonlyPath, rule.path);

  // 7. The rest of /dev: a few host device nodes bound in (a user namespace cannot mknod), a
  //    private devpts, shm, and the usual symlinks. No host /sys at all.
  for (const auto& dev : policy::DeviceNodes()) {
    std::string target = std::string("/dev/") + dev.path;
    p.Add(Kind::kTouch, target).mode = 0666;
    // No flags to add: a device node is neither executable nor setuid, and nodev would break it.
    p.Bind(from_dev(dev.path), target, 0, false);
  }
  auto& pts = p.Add(Kind::kDevpts, "/dev/pts");
  pts.flags = MS_NOSUID | MS_NOEXEC;
  pts.data = "newinstance,ptmxmode=0666,mode=0620,gid=5,max=" + std::to_string(kMaxPtys);
  p.Symlink("pts/ptmx", "/dev/ptmx");
  p.Mkdir("/dev/shm", 01777);
  // Bound onto itself for its own flags: nodev, where /dev itself may not have it.
  p.Bind(config.staging + "/dev/shm", "/dev/shm", MS_NOSUID | MS_NODEV | MS_NOEXEC, false);
  p.Symlink("/proc/self/fd", "/dev/fd");
  p.Symlink("/proc/self/fd/0", "/dev/stdin");
  p.Symlink("/proc/self/fd/1", "/dev/stdout");
  p.Symlink("/proc/self/fd/2", "/dev/stderr");

  // 8. Switch roots, drop the host's, and freeze what is not meant to change. The binds from the
  //    layers overlay hold its superblock; its own mount goes, and its mount point with it.
  if (layers) p.Add(Kind::kUnmount, layers_at);
  p.Add(Kind::kPivotRoot, "/");
  if (!overlay && !config.adopt_later) p.Add(Kind::kRemountRootReadonly, "/");
  return p.Take();
}

// overlayfs splits lowerdir at ':' and unescapes every layer path: a state dir with ':' or '\\'
// in its name must not become two layers.
std::string OverlayPathOption(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (c == ':' || c == '\\' || c == ',') out += '\\';
    out += c;
  }
  return out;
}

std::string FsContextLog(int fd) {
  std::string out;
  char buf[512];
  for (int i = 0; i < 8; ++i) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    if (!out.empty()) out += "; ";
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Result<UniqueFd> MountOverlay(const RootSpec::Overlay& overlay) {
  // SAFETY: fsopen only creates a configuration context; nothing is mounted until fsmount, and
  // the mount it returns is detached (visible nowhere until the jail attaches it).
  UniqueFd fs(sys::FsOpen("overlay", FSOPEN_CLOEXEC));
  if (!fs.valid())
    return Error::Sys("fsopen", "overlay", errno).Context("mount the image's overlay");
  const std::pair<const char*, std::string> options[] = {
      {"lowerdir", OverlayPathOption(overlay.lower)},
      {"upperdir", OverlayPathOption(overlay.upper)},
      {"workdir", OverlayPathOption(overlay.work)},
  };
  for (const auto& [key, value] : options) {
    // SAFETY: key and value are NUL-terminated strings that outlive the call.
    if (sys::FsConfig(fs.get(), FSCONFIG_SET_STRING, key, value.c_str(), 0) < 0) {
      int err = errno;
      std::string log = FsContextLog(fs.get());
      return Error::Sys("fsconfig", std::string(key) + "=" + value, err)
          .Context("mount the image's overlay" + (log.empty() ? "" : " (" + log + ")"));
    }
  }
  if (sys::FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0) {
    int err = errno;
    std::string log = FsContextLog(fs.get());
    return Error::Sys("fsconfig", "create overlay of " + overlay.lower, err)
        .Context("mount the image's overlay" + (log.empty() ? "" : " (" + log + ")"));
  }
  // SAFETY: turns the configured context into a detached mount fd; nosuid and nodev, like every
  // writable place of a jail.
  UniqueFd mnt(sys::FsMount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  if (!mnt.valid()) {
    return Error::Sys("fsmount", "overlay of " + overlay.lower, errno)
        .Context("mount the image's overlay");
  }
  return mnt;
}

// ---------------------------------------------------------------------------------------------
// The child side. Everything below runs between clone and execve: syscalls only.

namespace {

// The flags a remount must keep: in a user namespace the kernel refuses to clear the "locked"
// flags a mount inherited from a more privileged namespace (mount(2), EPERM), so a read-only
// remount of a bind carries the source's nosuid/nodev/noexec/atime flags over.
unsigned long LockedFlags(const char* path) {
  struct statvfs sv {};
  if (::statvfs(path, &sv) < 0) return 0;
  unsigned long out = 0;
  if (sv.f_flag & ST_NOSUID) out |= MS_NOSUID;
  if (sv.f_flag & ST_NODEV) out |= MS_NODEV;
  if (sv.f_flag & ST_NOEXEC) out |= MS_NOEXEC;
  if (sv.f_flag & ST_NOATIME) out |= MS_NOATIME;
  if (sv.f_flag & ST_NODIRATIME) out |= MS_NODIRATIME;
  if (sv.f_flag & ST_RELATIME) out |= MS_RELATIME;
  return out;
}

// Applies ro/nosuid/nodev/noexec to a bind mount (and, if recursive, all its submounts).
int RestrictBind(const char* path, unsigned long flags, bool recursive, bool exact = false) {
  constexpr unsigned long kAll = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
  unsigned long wanted = flags & kAll;
  if (wanted == 0 && !exact) return 0;
  struct mount_attr attr {};
  for (const auto& [ms, attr_bit] :
       {std::pair{MS_RDONLY, MOUNT_ATTR_RDONLY}, std::pair{MS_NOSUID, MOUNT_ATTR_NOSUID},
        std::pair{MS_NODEV, MOUNT_ATTR_NODEV}, std::pair{MS_NOEXEC, MOUNT_ATTR_NOEXEC}}) {
    if (wanted & ms) {
      attr.attr_set |= attr_bit;
    } else if (exact) {
      attr.attr_clr |= attr_bit;
    }
  }
  // SAFETY: attr is a local, fully initialised struct of the size passed.
  if (sys::MountSetattr(AT_FDCWD, path, recursive ? AT_RECURSIVE : 0, &attr, sizeof attr) == 0) {
    return 0;
  }
  if (errno != ENOSYS) return errno;
  // Kernels before 5.12: a remount reaches only the top mount of a recursive bind, and sets the
  // flags it is given (those of the mount that the kernel locks must be among them).
  unsigned long kept = LockedFlags(path);
  if (exact) kept &= ~kAll;
  if (::mount(nullptr, path, nullptr, MS_REMOUNT | MS_BIND | wanted | kept, nullptr) < 0) {
    return errno;
  }
  return 0;
}

// Attaches a detached tree the host made (open_tree(OPEN_TREE_CLONE)) at `path`; the fd is
// consumed by the move. On failure, `*call` (when given) names the step that failed.
int AttachTree(int tree, const char* path, unsigned long flags, bool recursive,
               const char** call = nullptr) {
  auto failed = [call](const char* name) {
    if (call != nullptr) *call = name;
    return errno;
  };
  // SAFETY: move_mount only reads the fd and the path.
  if (sys::MoveMount(tree, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
    return failed("move_mount");
  }
  // A clone of a shared host mount (systemd makes / shared) is in the host mount's peer group,
  // whatever the jail's own mounts are: private at once, before anything is mounted on it, or
  // the binds made on it here would appear on the host and in every other jail that attached a
  // clone of the same mount (and the host's mounts under it in here).
  if (::mount(nullptr, path, nullptr, MS_PRIVATE | (recursive ? MS_REC : 0), nullptr) < 0) {
    return failed("mount");
  }
  const int err = RestrictBind(path, flags, recursive);
  if (err != 0 && call != nullptr) *call = "mount_setattr";
  return err;
}

// "/proc/self/fd/N" into buf (at least 32 bytes), without allocating.
void FdPath(int fd, char* buf) {
  static constexpr char kPrefix[] = "/proc/self/fd/";
  std::memcpy(buf, kPrefix, sizeof kPrefix - 1);
  char digits[12];
  int n = 0;
  unsigned v = static_cast<unsigned>(fd);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  char* out = buf + sizeof kPrefix - 1;
  while (n > 0) *out++ = digits[--n];
  *out = '\0';
}

int WriteWholeFile(const char* path, const std::string& data, mode_t mode) {
  int fd = ::open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return errno;
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return err;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  ::close(fd);
  return 0;
}

int CopyFile(const char* from, const char* to, mode_t mode) {
  int in = ::open(from, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (in < 0) return errno;
  int out = ::open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (out < 0) {
    int err = errno;
    ::close(in);
    return err;
  }
  int err = 0;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(in, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n < 0) err = errno;
      break;
    }
    for (ssize_t done = 0; done < n;) {
      ssize_t w = ::write(out, buf + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        err = errno;
        break;
      }
      done += w;
    }
    if (err != 0) break;
  }
  ::close(in);
  ::close(out);
  return err;
}

int ApplyOne(const MountPlan& plan, const MountOp& op, int opened_fd) {
  const char* staged = op.staged.c_str();
  switch (op.kind) {
    case Kind::kRootTmpfs:
      // Nothing of the host's mounts may propagate into the jail, nor the jail's back out.
      if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) return errno;
      if (::mount("tmpfs", staged, "tmpfs", op.flags, op.data.c_str()) < 0) return errno;
      return 0;
    case Kind::kRootTree:
      if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) return errno;
      // SAFETY: attaches the overlay the host mounted detached; the fd is consumed by the move.
      if (sys::MoveMount(op.source_fd, "", AT_FDCWD, staged, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
        return errno;
      }
      return 0;
    case Kind::kMkdir: {
      if (::mkdir(staged, op.mode) == 0) {
        // mkdir applies the umask; the mode of a mount point matters for /tmp and /root.
        if (::chmod(staged, op.mode) < 0) return errno;
        return 0;
      }
      if (errno != EEXIST) return errno;
      if (op.if_absent) return 0;
      // Something is there already (only in an image's persistent root): it must be a real
      // directory, or the mount that follows would land where a symlink points, outside.
      struct stat st {};
      if (::lstat(staged, &st) < 0) return errno;
      return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    }
    case Kind::kTouch: {
      int fd = ::open(staged, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, op.mode);
      if (fd < 0) return errno;
      ::close(fd);
      return 0;
    }
    case Kind::kWriteFile:
      return WriteWholeFile(staged, op.data, op.mode);
    case Kind::kCopyFile:
      return CopyFile(op.source.c_str(), staged, op.mode);
    case Kind::kSymlink:
      if (::symlink(op.source.c_str(), staged) < 0) return errno;
      return 0;
    case Kind::kTmpfs:
      if (::mount("tmpfs", staged, "tmpfs", op.flags, op.data.c_str()) < 0) return errno;
      return 0;
    case Kind::kBind: {
      unsigned long bind = MS_BIND | (op.recursive ? MS_REC : 0);
      if (op.source_is_tree) return AttachTree(op.source_fd, staged, op.flags, op.recursive);
      if (opened_fd < 0) {
        if (::mount(op.source.c_str(), staged, nullptr, bind, nullptr) < 0) return errno;
      } else {
        char path[32];
        FdPath(opened_fd, path);
        if (::mount(path, staged, nullptr, bind, nullptr) < 0) return errno;
      }
      return RestrictBind(staged, op.flags, op.recursive, op.exact_flags);
    }
    case Kind::kProc:
      // hidepid=ptraceable (Linux 5.8): a process's /proc entry is visible only to those who
      // may ptrace it. nsbox-init is non-dumpable and no command holds CAP_SYS_PTRACE, so its
      // /proc/1 (owned by the jail's root since Linux 4.11, so listable by it) disappears; the
      // commands still see each other. Older kernels refuse the option: mount without it.
      if (::mount("proc", staged, "proc", op.flags, op.data.c_str()) == 0) return 0;
      if (errno != EINVAL || ::mount("proc", staged, "proc", op.flags, nullptr) < 0) {
        return errno;
      }
      return 0;
    case Kind::kDevpts:
      if (::mount("devpts", staged, "devpts", op.flags, op.data.c_str()) < 0) return errno;
      return 0;
    case Kind::kMaskPath: {
      struct stat st {};
      if (::lstat(staged, &st) < 0) return errno == ENOENT ? 0 : errno;
      if (S_ISDIR(st.st_mode)) {
        // The scratch tmpfs's empty directory, read-only: no superblock of its own per mask.
        if (::mount(op.source.c_str(), staged, nullptr, MS_BIND, nullptr) < 0) return errno;
        return RestrictBind(staged, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, false);
      }
      // A null device, as Docker's masks: reads are empty, writes vanish. The layers' own (in
      // `data`), else the host's: the staged /dev may not be there yet; the host's always is.
      // Not nodev, or opening it fails.
      const char* null_device = op.data.empty() ? "/dev/null" : op.data.c_str();
      if (::mount(null_device, staged, nullptr, MS_BIND, nullptr) < 0) return errno;
      return 0;
    }
    case Kind::kReadonlyPath: {
      struct stat st {};
      if (::lstat(staged, &st) < 0) return errno == ENOENT ? 0 : errno;
      if (::mount(staged, staged, nullptr, MS_BIND | MS_REC, nullptr) < 0) return errno;
      return RestrictBind(staged, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, true);
    }
    case Kind::kPivotRoot:
      // pivot_root(".", ".") stacks the old root under the new one; detaching it leaves the
      // jail with no path to the host's tree (pivot_root(2), "new_root and put_old may be the
      // same directory").
      if (::chdir(plan.staging.c_str()) < 0) return errno;
      if (sys::PivotRoot(".", ".") < 0) return errno;
      if (::umount2(".", MNT_DETACH) < 0) return errno;
      if (::chdir("/") < 0) return errno;
      return 0;
    case Kind::kRemountRootReadonly:
      // The root's mount, not its tmpfs: the binds of its /dev and /tmp stay writable.
      if (::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
                  nullptr) < 0) {
        return errno;
      }
      return 0;
    case Kind::kHoldDir:
      return EINVAL;  // ApplyMountPlan's own
    case Kind::kUnmount:
      // What was bound from it stays: each bind holds the superblock.
      if (::umount2(staged, MNT_DETACH) < 0) return errno;
      if (::rmdir(staged) < 0) return errno;
      return 0;
  }
  return EINVAL;
}

// Opens, in the jail's mount namespace, the source of a bind that the caller pinned with an fd,
// and checks it is the same directory (device and inode). Done before the new root hides any
// host path (it is assembled on a host directory such as /tmp, where a workspace may live).
int OpenPinnedSource(const MountOp& op, int* out) {
  int fd = ::open(op.source.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  struct stat expected {
  }, got{};
  int err = 0;
  if (::fstat(op.source_fd, &expected) < 0 || ::fstat(fd, &got) < 0) {
    err = errno;
  } else if (expected.st_dev != got.st_dev || expected.st_ino != got.st_ino) {
    err = ESTALE;  // the path now names another directory than the one the caller opened
  }
  if (err != 0) {
    ::close(fd);
    return err;
  }
  *out = fd;
  return 0;
}

}  // namespace

int ApplyMountPlan(const MountPlan& plan, size_t* failed_op, int* held_fd) noexcept {
  // Binds pinned by an fd, opened first: (op index, fd in this mount namespace).
  constexpr size_t kMaxPinned = 8;
  size_t pinned_op[kMaxPinned];
  int pinned_fd[kMaxPinned];
  size_t pinned = 0;
  int err = 0;
  for (size_t i = 0; i < plan.ops.size() && err == 0; ++i) {
    if (plan.ops[i].kind != Kind::kBind || plan.ops[i].source_fd < 0 ||
        plan.ops[i].source_is_tree) {
      continue;
    }
    if (pinned == kMaxPinned) {
      err = E2BIG;
    } else if ((err = OpenPinnedSource(plan.ops[i], &pinned_fd[pinned])) == 0) {
      pinned_op[pinned++] = i;
    }
    if (err != 0) *failed_op = i;
  }
  for (size_t i = 0; i < plan.ops.size() && err == 0; ++i) {
    int fd = -1;
    for (size_t k = 0; k < pinned; ++k) {
      if (pinned_op[k] == i) fd = pinned_fd[k];
    }
    const MountOp& op = plan.ops[i];
    if (op.kind == Kind::kHoldDir) {
      if (held_fd == nullptr || *held_fd >= 0) {
        err = EINVAL;
      } else {
        *held_fd = ::open(op.staged.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (*held_fd < 0) err = errno;
      }
    } else {
      err = ApplyOne(plan, op, fd);
    }
    if (err != 0) *failed_op = i;
  }
  for (size_t k = 0; k < pinned; ++k) ::close(pinned_fd[k]);
  return err;
}

Status RewriteOwnEtcFile(int own_etc_dir, const std::string& name, const std::string& content) {
  const std::string path = std::string(kOwnEtcDir + 1) + "/" + name;
  UniqueFd fd(::openat(own_etc_dir, name.c_str(), O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return Error::Sys("open", "/" + path, errno);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd.get(), content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::Sys("write", "/" + path, errno);
    done += static_cast<size_t>(n);
  }
  return Ok();
}

namespace {

Status ResizeTmpfs(const char* path, unsigned long flags, uint64_t size) {
  if (size == 0) return Ok();
  const std::string data = "size=" + std::to_string(size);
  if (::mount(nullptr, path, nullptr, MS_REMOUNT | flags, data.c_str()) < 0) {
    return Error::Sys("mount", path, errno).Context("size the tmpfs to " + data);
  }
  return Ok();
}

}  // namespace

Status ApplyAdoption(const AdoptionSpec& spec) {
  for (const auto& [tree, path] :
       {std::pair{spec.workspace_tree, "/workspace"}, std::pair{spec.home_tree, "/root"}}) {
    if (tree < 0) return Error(EBADF, std::string("no tree to attach at ") + path);
    const char* call = "move_mount";
    if (int err = AttachTree(tree, path, MS_NOSUID | MS_NODEV, false, &call); err != 0) {
      return Error::Sys(call, path, err).Context("attach the sandbox's directory");
    }
  }
  if (spec.own_etc_dir < 0) {
    return Error(EBADF,
                 std::string("no fd of ") + kOwnEtcDir + " (a jail adopted later holds one)");
  }
  NSBOX_TRY(RewriteOwnEtcFile(spec.own_etc_dir, "hosts", spec.etc_hosts));
  NSBOX_TRY(RewriteOwnEtcFile(spec.own_etc_dir, "hostname", spec.etc_hostname));
  // The tmpfs of /dev (the root's) holds /tmp and /dev/shm (PlanMounts).
  NSBOX_TRY(ResizeTmpfs("/dev", MS_NOSUID | MS_NOEXEC, spec.tmpfs_size));
  if (::sethostname(spec.hostname.data(), spec.hostname.size()) < 0) {
    return Error::Sys("sethostname", spec.hostname, errno);
  }
  if (spec.ahead) {
    // SAFETY: open_tree only reads the fd and returns a new one.
    UniqueFd clone(
        sys::OpenTree(spec.own_etc_dir, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH));
    if (!clone.valid()) return Error::Sys("open_tree", kOwnEtcDir, errno);
    if (::dup3(clone.get(), spec.own_etc_dir, O_CLOEXEC) < 0) {
      return Error::Sys("dup3", kOwnEtcDir, errno);
    }
  }
  if (::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
              nullptr) < 0) {
    return Error::Sys("mount", "/", errno).Context("make the root read-only");
  }
  return Ok();
}

}  // namespace nsbox::isolate

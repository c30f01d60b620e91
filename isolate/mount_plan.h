#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"

namespace nsbox::isolate {

// Pseudo-terminals a sandbox may hold at once (its devpts's `max=`): kernel.pty.max is one pool
// for the whole host, which one sandbox must not empty for the others (docs/isolation.md).
inline constexpr int kMaxPtys = 128;

// One step of building a jail's file system, as a plain value. The plan is made in the parent
// (where it may allocate, read the host and be unit-tested byte for byte), then applied by the
// child between clone and execve by a loop that only issues syscalls (ApplyMountPlan).
//
// `target` is the path inside the jail ("/usr"); `staged` the same path under the staging root
// where the new root is assembled before pivot_root ("/tmp/usr").
struct MountOp {
  enum class Kind {
    kRootTmpfs,     // mount the new root (a small tmpfs) on the staging directory
    kRootTree,      // attach the detached mount `source_fd` (an image's overlay) as the new root
    kMkdir,         // mkdir target (parents exist), mode; an existing entry must be a real
                    // directory (not a symlink: ENOTDIR) and keeps its mode
    kTouch,         // create an empty file to bind over
    kWriteFile,     // create target with `data` as content, mode
    kCopyFile,      // create target with the content of the host file `source`, mode
    kSymlink,       // symlink at target pointing to `source`
    kTmpfs,         // mount a tmpfs with `data` options and `flags`
    kBind,          // bind `source` (a host path, or /proc/self/fd/N) onto target; `flags`
                    // (MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC) are then applied to it
    kProc,          // mount a new procfs (needs the new PID namespace)
    kDevpts,        // mount a private devpts instance with `data` options
    kMaskPath,      // hide a path of the new /proc: a null device over a file (`data`, else the
                    // host's /dev/null), a read-only bind of the empty directory `source` over a
                    // directory; skipped when absent
    kReadonlyPath,  // bind a path onto itself read-only; skipped when absent
    kPivotRoot,     // pivot_root into the staging root and detach the old root
    kRemountRootReadonly,  // make the new root's mount read-only (after everything is in)
    kHoldDir,  // open the directory target (O_PATH) and keep it: ApplyMountPlan's *held_fd
    kUnmount,  // detach the mount at target (MNT_DETACH), then remove its mount point
  };

  Kind kind;
  std::string target;
  std::string staged;
  std::string source;
  std::string data;
  unsigned long flags = 0;
  mode_t mode = 0;
  bool recursive = false;  // kBind: rbind (submounts too)
  // kBind: the bind gets exactly `flags`, losing those of its source mount that `flags` lacks
  // (a bind of a directory of /dev's tmpfs would otherwise keep its noexec).
  bool exact_flags = false;
  // kMkdir: whatever already exists there is left as it is, directory or not (the persistent
  // root of an imported image, where the sandbox may have replaced /workspace by a symlink).
  bool if_absent = false;
  // kBind: an fd the caller opened on the source before clone. The child opens `source` in its
  // own mount namespace (a mount of another namespace cannot be bound: EINVAL), checks that it
  // is the same directory (device and inode), and binds that, so nothing swapped in between
  // can redirect the bind (CVE-2024-42472). -1 for none.
  int source_fd = -1;
  // kBind: `source_fd` is a detached copy of the source made on the host with
  // open_tree(OPEN_TREE_CLONE) (Linux 5.2): the child attaches it with move_mount, so the path
  // is never walked again inside the jail, where a parent directory the jail's root may not
  // traverse (a 0700 temp dir) would refuse it.
  bool source_is_tree = false;

  // "bind /usr -> /usr (ro,nosuid,nodev)" for error messages and `nsbox run --dry-run`.
  std::string Describe() const;
};

struct MountPlan {
  std::string staging;  // where the new root is assembled, e.g. "/tmp"
  std::vector<MountOp> ops;
};

// The root file system a jail runs on, as the images layer describes it.
struct RootSpec {
  struct Bind {
    std::string source;  // host path
    std::string target;  // path inside
    bool readonly = true;
  };
  struct Symlink {
    std::string target;   // path inside
    std::string pointee;  // what it points at
  };
  std::vector<Bind> binds;
  std::vector<Symlink> symlinks;
  // An imported image: the root is an overlay of the unpacked image (`lower`, read-only and
  // shared by every sandbox of the image) and this sandbox's own `upper` and `work`
  // directories, persistent in the state dir. The binds and symlinks above are then empty.
  struct Overlay {
    std::string lower;
    std::string upper;
    std::string work;
  };
  std::optional<Overlay> overlay;
};

// Everything the plan depends on. Host facts (which /etc entries exist and what they are) are
// read by the caller, so the planner is a pure function.
struct JailFsConfig {
  RootSpec root;
  // root.overlay, mounted detached on the host (MountOverlay): the plan attaches it as the new
  // root, which then holds /etc, /workspace and /root itself and stays writable.
  int root_tree_fd = -1;
  std::string staging = "/tmp";
  // The workspace, bound read-write at /workspace: its host path and an O_PATH fd the caller
  // opened on it, against which the child checks what it binds.
  std::string workspace_source;
  int workspace_fd = -1;
  bool workspace_fd_is_tree = false;  // workspace_fd came from open_tree(OPEN_TREE_CLONE)
  std::string hostname;
  // The resolver /etc/resolv.conf names (nsboxd's, for its sandboxes); "" for none: the
  // sandbox has loopback only.
  std::string nameserver;
  // The sandbox's memory limit, of which /tmp and /dev/shm (one tmpfs) may hold a half together;
  // 0 for the kernel's default (half the RAM). Tmpfs pages written by the daemon through the files
  // API are charged to the daemon, not to the sandbox's cgroup: the size is what bounds them.
  uint64_t tmpfs_size_bytes = 0;
  struct EtcEntry {
    enum class Type { kFile, kDirectory, kSymlink } type;
    std::string name;     // "ld.so.cache"
    std::string pointee;  // kSymlink: the link's target
    uint64_t size = 0;    // kFile: its size
    // kFile: which version of the file this is (lstat), for the shared /etc's cache key: a
    // change of content or metadata changes the ctime, a replacement the inode.
    uint64_t dev = 0;
    uint64_t ino = 0;
    int64_t ctime_ns = 0;
    uint32_t mode = 0;  // permission bits
  };
  std::vector<EtcEntry> host_etc;  // allowlisted host /etc entries that exist
  bool home_tmpfs = true;          // /root as a tmpfs (one-shot runs)
  // Host /etc files up to this size are copied into the root instead of bound: faster to set
  // up and tear down (nsbox run), but their bytes then sit in the jail's tmpfs for its whole
  // life, so long-lived sandboxes set 0 and bind them all.
  uint64_t etc_copy_limit = 256 * 1024;
  // A host directory made by PrepareSharedEtc (isolate/shared_etc.h), shared by the jails of
  // one daemon: attached read-only at /etc in place of the per-jail assembly above, with the
  // host's allowlisted directories bound on its empty ones and the sandbox's own hosts and
  // hostname (written in the jail's root, under /proc's mount point) on its placeholders.
  // Empty: /etc is assembled in the jail's root.
  std::string shared_etc;
  // Its open_tree(OPEN_TREE_CLONE) copy, made on the host: attached without walking the path,
  // which passes through directories the jail's root may not traverse (the state dir).
  int shared_etc_tree = -1;
  std::string home_source;  // else: a host path bound read-write at /root
  int home_fd = -1;         // pinned like the workspace (an open_tree clone where possible)
  bool home_fd_is_tree = false;
  // Overlays of the jail's own over the host's read-only trees (isolate/private_trees.h), made
  // detached on the host: none of the inodes the jail can watch (inotify, fanotify) is then one
  // that another sandbox or the host reads or runs (issue 44). Empty / -1: the host's trees are
  // bound as they are.
  // The image's read-only binds (root.binds): the host path ("/usr") -> its overlay, attached in
  // the bind's place.
  std::map<std::string, int> private_binds;
  // The overlay of a layers directory of nsbox's over the host's /etc (lowerdir=layers:/etc),
  // attached at kLayersDir (kLayersDirInImage on an image's root) while the plan binds from it
  // /etc's allowlisted host entries (its top level is the host's /etc), the device nodes (its
  // kLayersDevices) and, with a shared /etc, that /etc (its `shared_etc_layer`); then unmounted.
  int layers_tree = -1;
  // The shared /etc's version as a directory of the layers directory (its name there).
  std::string shared_etc_layer;
  // A jail started ahead of its sandbox (nsboxd's pool; needs shared_etc): /workspace and /root
  // stay empty mount points, hosts and hostname are written for `hostname` and rewritten later,
  // and the root stays writable. ApplyAdoption, run by the jail's nsbox-init once the sandbox
  // is known, does the rest; until then no command runs there.
  bool adopt_later = false;
};

// Where a jail's layers overlay (JailFsConfig::layers_tree) is attached while the plan binds from
// it: a directory of the root's tmpfs, or, on an image's persistent root, of its /dev tmpfs;
// removed before the pivot. In the layers directory, the device nodes' directory.
inline constexpr char kLayersDir[] = "/.nsbox-layers";
inline constexpr char kLayersDirInImage[] = "/dev/.nsbox-layers";
inline constexpr char kLayersDevices[] = ".nsbox-dev";

// Where a jail with a shared /etc keeps its own hosts and hostname: in its root tmpfs, under the
// mount point of /proc, which its procfs covers.
inline constexpr char kOwnEtcDir[] = "/proc/.nsbox-etc";

// A jail's /dev, /tmp and /dev/shm are one tmpfs, its root's where the root is a tmpfs
// (docs/isolation.md "File system"): /tmp is a bind of this directory of it, and masked /proc
// directories read-only binds of the empty one. Both sit under the mount point of /dev/pts,
// which the jail's devpts covers.
inline constexpr char kScratchTmpDir[] = "/dev/pts/nsbox-tmp";
inline constexpr char kScratchEmptyDir[] = "/dev/pts/nsbox-empty";

// What ApplyAdoption makes of a jail planned with adopt_later.
struct AdoptionSpec {
  int workspace_tree = -1;  // open_tree(OPEN_TREE_CLONE) copies made by the host
  int home_tree = -1;
  std::string hostname;
  std::string etc_hosts;
  std::string etc_hostname;
  uint64_t tmpfs_size = 0;  // of /dev, /tmp and /dev/shm, in bytes; 0: leave the kernel's default
  // The jail's own /etc directory (kOwnEtcDir), held (kHoldDir) from before the procfs covered
  // it: hosts and hostname are rewritten through it.
  int own_etc_dir = -1;
  // Adopted ahead of its sandbox, whose hosts and hostname the host writes later: `own_etc_dir`
  // is replaced (same fd number) by a clone of that directory's mount made before the root is
  // read-only, which stays writable (only that directory is reachable through it), for the host
  // to open through /proc/PID/fd.
  bool ahead = false;
};

// Run inside such a jail, by a process that still holds CAP_SYS_ADMIN in its namespaces: attaches
// the trees at /workspace and /root (private, nosuid, nodev), writes hosts and hostname, sizes
// the tmpfs of /tmp and /dev/shm, sets the hostname and makes the root read-only, as PlanMounts
// would have. Errors name the step and the path.
Status ApplyAdoption(const AdoptionSpec& spec);

// Replaces the content of `name` ("hosts", "hostname") in a jail's own /etc directory (kOwnEtcDir),
// which its procfs covers: through `own_etc_dir`, an fd of that directory held from before it was
// covered (kHoldDir), by nsbox-init during ApplyAdoption or by the host for a jail adopted ahead.
Status RewriteOwnEtcFile(int own_etc_dir, const std::string& name, const std::string& content);

// Reads which allowlisted /etc entries the host has (lstat + readlink), for JailFsConfig.
Result<std::vector<JailFsConfig::EtcEntry>> ScanHostEtc(const std::string& host_etc_dir);

// The generated files of /etc: passwd, group, hosts, hostname, resolv.conf, nsswitch.conf.
struct GeneratedFile {
  std::string name;
  std::string content;
};
std::vector<GeneratedFile> GeneratedEtcFiles(const std::string& hostname,
                                             const std::string& nameserver = "");

Result<MountPlan> PlanMounts(const JailFsConfig& config);

// Mounts `overlay` detached (fsopen/fsconfig/fsmount, Linux 5.2), nosuid and nodev, with the
// caller's credentials: the daemon's, so that the jail, which may not mount an overlay of host
// directories, only attaches it. Errors carry the kernel's own message about the options.
Result<UniqueFd> MountOverlay(const RootSpec::Overlay& overlay);

// `path` as an overlayfs layer option takes it: ':', '\\' and ',' escaped.
std::string OverlayPathOption(const std::string& path);

// What the kernel said about a failed fsconfig/fsmount on the fs_context `fd`: its log ("e
// overlayfs: failed to resolve '...': -2"), one message per read, "; "-joined.
std::string FsContextLog(int fd);

// Applies the plan in the child. Async-signal-safe: no allocation, no logging. Returns 0, or an
// errno with *failed_op set to the index of the step that failed. The directory of a kHoldDir
// step (at most one) is left open in *held_fd (close-on-exec; EINVAL without a held_fd).
int ApplyMountPlan(const MountPlan& plan, size_t* failed_op, int* held_fd = nullptr) noexcept;

}  // namespace nsbox::isolate

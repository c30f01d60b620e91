#include "base/features.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/files.h"
#include "base/mountinfo.h"
#include "base/strings.h"
#include "base/syscalls.h"
#include "base/unique_fd.h"

namespace nsbox {
namespace {

// The namespaces nsbox asks for in the one clone that starts a jail (design.md).
constexpr struct {
  unsigned long flag;
  const char* name;
} kJailNamespaces[] = {
    {CLONE_NEWNS, "mount"}, {CLONE_NEWPID, "pid"}, {CLONE_NEWNET, "net"},
    {CLONE_NEWIPC, "ipc"},  {CLONE_NEWUTS, "uts"}, {CLONE_NEWCGROUP, "cgroup"},
};

// Debian 12's liburing 2.3 predates IORING_OP_WAITID (Linux 6.7); its number in the kernel's
// enum io_uring_op is 50 (after READ_MULTISHOT = 49).
constexpr int kIoringOpWaitid = 50;

// The opcodes the exec reactor uses: pipes, pidfd polls, deadlines, cancellation, exit waits and
// the control channel's SCM_RIGHTS messages.
constexpr struct {
  int op;
  const char* name;
} kUringOps[] = {
    {IORING_OP_READ, "READ"},
    {IORING_OP_WRITE, "WRITE"},
    {IORING_OP_POLL_ADD, "POLL_ADD"},
    {IORING_OP_TIMEOUT, "TIMEOUT"},
    {IORING_OP_LINK_TIMEOUT, "LINK_TIMEOUT"},
    {IORING_OP_ASYNC_CANCEL, "ASYNC_CANCEL"},
    {kIoringOpWaitid, "WAITID"},
    {IORING_OP_RECVMSG, "RECVMSG"},
    {IORING_OP_SENDMSG, "SENDMSG"},
};

// Real v1 controllers (as opposed to mount options such as "rw" or "name=systemd").
constexpr std::string_view kV1Controllers[] = {
    "cpuset",     "cpu",      "cpuacct", "blkio", "memory", "devices", "freezer", "net_cls",
    "perf_event", "net_prio", "hugetlb", "pids",  "rdma",   "misc",    "debug",
};

std::string Trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  return std::string(s);
}

// A sysctl or /proc number; nullopt when the file does not exist or is not a number.
std::optional<long> ReadLong(const char* path) {
  auto content = ReadFile(path);
  if (!content.ok()) return std::nullopt;
  std::string text = Trim(*content);
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

std::string Missing(int err, std::string_view why) {
  std::string out = ErrnoText(err);
  if (!why.empty()) {
    out += ": ";
    out += why;
  }
  return out;
}

// Starts a child in the namespaces `flags` that exits at once; 0 or the clone errno.
int TryCloneNamespaces(unsigned long flags) {
  // SAFETY: a fork-like clone (no new stack, no CLONE_VM): the child has its own copy of memory
  // and only calls _exit, so no state of this process is touched. clone, not unshare, because
  // unshare(CLONE_NEWUSER) fails in a multi-threaded process and would change our own namespaces.
  long pid = ::syscall(SYS_clone, flags | SIGCHLD, nullptr, nullptr, nullptr, nullptr);
  if (pid == 0) {
    ::_exit(0);
  }
  if (pid < 0) return errno;
  int status = 0;
  while (::waitpid(static_cast<pid_t>(pid), &status, 0) < 0 && errno == EINTR) {
  }
  return 0;
}

void ProbeNamespaces(Features& f) {
  f.max_user_namespaces = ReadLong("/proc/sys/user/max_user_namespaces").value_or(-1);
  unsigned long all = CLONE_NEWUSER;
  for (const auto& ns : kJailNamespaces) all |= ns.flag;
  // One clone for the common case; only a failure costs more clones, to say which part is off.
  int err = TryCloneNamespaces(all);
  if (err == 0) {
    f.user_namespaces.available = true;
    f.mount_namespaces.available = true;
    return;
  }
  int user_err = TryCloneNamespaces(CLONE_NEWUSER);
  if (user_err != 0) {
    std::string hint;
    auto unpriv = ReadLong("/proc/sys/kernel/unprivileged_userns_clone");
    auto apparmor = ReadLong("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    if (f.max_user_namespaces == 0) {
      hint = "user.max_user_namespaces = 0; fix: sysctl -w user.max_user_namespaces=15000";
    } else if (user_err == ENOSPC) {
      hint = "the user.max_user_namespaces limit (" + std::to_string(f.max_user_namespaces) +
             ") is reached; fix: raise it with sysctl -w user.max_user_namespaces=N";
    } else if (user_err == EINVAL) {
      hint = "the kernel is built without CONFIG_USER_NS; fix: use a kernel with it";
    } else if (::geteuid() != 0 && unpriv.has_value() && *unpriv == 0) {
      hint =
          "kernel.unprivileged_userns_clone = 0; fix: run as root or sysctl -w "
          "kernel.unprivileged_userns_clone=1";
    } else if (::geteuid() != 0 && apparmor.has_value() && *apparmor != 0) {
      hint =
          "AppArmor restricts unprivileged user namespaces; fix: run as root, or sysctl -w "
          "kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile with "
          "'userns,'";
    } else {
      hint =
          "denied, likely by the host's seccomp profile (a container?) or an LSM; fix: run "
          "nsbox on the host or with a profile that allows clone with namespace flags";
    }
    f.user_namespaces.detail = "clone(CLONE_NEWUSER): " + Missing(user_err, hint);
    f.mount_namespaces.detail = "needs user namespaces";
    return;
  }
  f.user_namespaces.available = true;
  std::string failed;
  for (const auto& ns : kJailNamespaces) {
    int ns_err = TryCloneNamespaces(CLONE_NEWUSER | ns.flag);
    if (ns_err != 0) {
      if (!failed.empty()) failed += "; ";
      failed += std::string(ns.name) + ": " + ErrnoText(ns_err);
    }
  }
  if (failed.empty()) {
    failed = "the combined clone failed: " + ErrnoText(err);
  }
  f.mount_namespaces.detail =
      failed +
      "; fix: a kernel with CONFIG_{PID,NET,IPC,UTS,CGROUP}_NS and no seccomp or LSM "
      "rule against them";
}

void ProbeSeccomp(Features& f) {
  // SAFETY: PR_GET_SECCOMP only reads this thread's mode.
  if (::prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0) {
    f.seccomp_filter.detail =
        "prctl(PR_GET_SECCOMP): " + Missing(errno, "kernel built without CONFIG_SECCOMP");
    return;
  }
  for (uint32_t action : {SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO}) {
    if (sys::Seccomp(SECCOMP_GET_ACTION_AVAIL, 0, &action) < 0) {
      f.seccomp_filter.detail = "seccomp(SECCOMP_GET_ACTION_AVAIL): " +
                                Missing(errno, "kernel < 4.14; fix: upgrade the kernel");
      return;
    }
  }
  // A NULL program makes the kernel fail its copy with EFAULT before installing anything;
  // EINVAL would mean SECCOMP_SET_MODE_FILTER itself is unknown (CONFIG_SECCOMP_FILTER=n).
  if (sys::Seccomp(SECCOMP_SET_MODE_FILTER, 0, nullptr) == 0 || errno != EFAULT) {
    f.seccomp_filter.detail = "seccomp(SECCOMP_SET_MODE_FILTER): " +
                              Missing(errno, "kernel built without CONFIG_SECCOMP_FILTER");
    return;
  }
  f.seccomp_filter.available = true;
}

void ProbeClone3(Features& f) {
  // A NULL argument block fails its copy (EFAULT) on a kernel that has clone3; ENOSYS means the
  // kernel (< 5.3) or a seccomp profile (Docker's returns ENOSYS on purpose) lacks it.
  if (sys::Clone3(nullptr, CLONE_ARGS_SIZE_VER0) < 0 && errno == ENOSYS) {
    f.clone3.detail = "clone3: " + Missing(ENOSYS, "kernel < 5.3 or a seccomp profile hides it");
    f.clone_into_cgroup.detail = "needs clone3";
    return;
  }
  f.clone3.available = true;

  // INT_MAX passes the kernel's range check on the fd (<= INT_MAX) but is never an open fd
  // (fs.nr_open is below it), so a kernel that knows CLONE_INTO_CGROUP fails with EBADF; one
  // that does not (< 5.7) rejects the flag or the larger struct with EINVAL or E2BIG.
  struct clone_args args {};
  args.flags = CLONE_INTO_CGROUP;
  args.exit_signal = SIGCHLD;
  args.cgroup = INT_MAX;
  long pid = sys::Clone3(&args, sizeof args);
  if (pid == 0) {
    ::_exit(0);  // Cannot happen (see above); if it did, the copy leaves at once.
  }
  if (pid > 0) {
    int status = 0;
    while (::waitpid(static_cast<pid_t>(pid), &status, 0) < 0 && errno == EINTR) {
    }
    f.clone_into_cgroup.available = true;
    return;
  }
  if (errno == EBADF) {
    f.clone_into_cgroup.available = true;
  } else {
    f.clone_into_cgroup.detail =
        "clone3(CLONE_INTO_CGROUP): " +
        Missing(errno, "kernel < 5.7; nsbox moves the child after clone (a short window)");
  }
}

void ProbePidfd(Features& f) {
  int fd = sys::PidfdOpen(::getpid(), 0);
  if (fd < 0) {
    f.pidfd.detail = "pidfd_open: " + Missing(errno, "kernel < 5.3; fix: upgrade the kernel");
    return;
  }
  UniqueFd pidfd(fd);
  if (sys::PidfdSendSignal(pidfd.get(), 0, nullptr, 0) < 0) {
    f.pidfd.detail =
        "pidfd_send_signal: " + Missing(errno, "kernel < 5.1; fix: upgrade the kernel");
    return;
  }
  // We are not our own child: a kernel that knows P_PIDFD says ECHILD, an older one EINVAL.
  siginfo_t info{};
  if (::waitid(P_PIDFD, static_cast<id_t>(pidfd.get()), &info, WEXITED | WNOHANG) < 0 &&
      errno != ECHILD) {
    f.pidfd.detail = "waitid(P_PIDFD): " + Missing(errno, "kernel < 5.4; fix: upgrade the kernel");
    return;
  }
  f.pidfd.available = true;
}

void ProbeOpenat2(Features& f) {
  struct open_how how {};
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT;
  int fd = sys::Openat2(AT_FDCWD, "/", &how, sizeof how);
  if (fd < 0) {
    f.openat2.detail =
        "openat2(RESOLVE_IN_ROOT): " +
        Missing(errno, "kernel < 5.6; the file verbs fall back to an O_NOFOLLOW walk");
    return;
  }
  UniqueFd owned(fd);
  f.openat2.available = true;
}

void ProbeMountSetattr(Features& f) {
  // fd -1 is never valid: a kernel with the call fails the lookup (EBADF) and changes nothing.
  struct mount_attr attr {};
  attr.attr_set = MOUNT_ATTR_RDONLY;
  if (sys::MountSetattr(-1, "", AT_EMPTY_PATH, &attr, sizeof attr) == 0 || errno == EBADF) {
    f.mount_setattr.available = true;
  } else if (errno == ENOSYS) {
    f.mount_setattr.detail =
        "mount_setattr: " +
        Missing(ENOSYS, "kernel < 5.12; read-only binds are remounted one mount at a time");
  } else {
    f.mount_setattr.detail =
        "mount_setattr: " + Missing(errno,
                                    "present but refused (needs CAP_SYS_ADMIN, or a "
                                    "seccomp profile denies it); fix: run as root, outside "
                                    "a container's seccomp profile");
  }
}

void ProbeOverlayfs(Features& f) {
  auto content = ReadFile("/proc/filesystems");
  if (!content.ok()) {
    f.overlayfs.detail = content.error().message();
    return;
  }
  for (std::string_view line : Split(*content, '\n')) {
    size_t tab = line.rfind('\t');
    if (tab != std::string_view::npos && line.substr(tab + 1) == "overlay") {
      f.overlayfs.available = true;
      return;
    }
  }
  f.overlayfs.detail = "overlay is not in /proc/filesystems; fix: modprobe overlay";
}

void ProbeIoUring(Features& f) {
  auto disabled = ReadLong("/proc/sys/kernel/io_uring_disabled");  // Linux 6.6+
  struct io_uring ring {};
  int ret = io_uring_queue_init(4, &ring, 0);
  if (ret < 0) {
    int err = -ret;
    std::string why;
    if (disabled.has_value() && *disabled != 0) {
      why = "kernel.io_uring_disabled = " + std::to_string(*disabled) +
            "; fix: sysctl -w kernel.io_uring_disabled=0";
    } else if (err == ENOSYS) {
      why = "kernel built without CONFIG_IO_URING, or a seccomp profile denies it";
    } else if (err == EPERM) {
      why = "denied by the host's seccomp profile or an LSM";
    } else if (err == ENOMEM) {
      why = "RLIMIT_MEMLOCK too small for the ring (kernel < 5.12)";
    }
    f.io_uring.detail = "io_uring_setup: " + Missing(err, why);
    return;
  }
  f.io_uring.available = true;
  struct io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  for (const auto& op : kUringOps) {
    if (probe == nullptr || !io_uring_opcode_supported(probe, op.op)) {
      f.io_uring_missing_ops.emplace_back(op.name);
    }
  }
  if (probe == nullptr) {
    f.io_uring.detail = "IORING_REGISTER_PROBE failed (kernel < 5.6): opcodes unknown";
  } else {
    io_uring_free_probe(probe);
  }
  io_uring_queue_exit(&ring);
}

struct MountLine {
  std::string root;
  std::string mount_point;
  std::string fstype;
  std::string super_options;
};

std::vector<MountLine> ParseMountinfo(std::string_view mountinfo) {
  std::vector<MountLine> out;
  for (std::string_view line : Split(mountinfo, '\n')) {
    std::vector<std::string_view> fields = Split(line, ' ');
    size_t dash = 0;
    for (size_t i = 6; i < fields.size(); ++i) {
      if (fields[i] == "-") {
        dash = i;
        break;
      }
    }
    if (dash == 0 || dash + 3 >= fields.size()) continue;
    out.push_back(MountLine{UnescapeMountField(fields[3]), UnescapeMountField(fields[4]),
                            std::string(fields[dash + 1]), std::string(fields[dash + 3])});
  }
  return out;
}

// Our own cgroup v2 directory: the cgroup2 mount whose root contains our "0::" path.
std::optional<std::string> OwnV2Dir(const std::vector<MountLine>& mounts,
                                    std::string_view proc_self_cgroup) {
  std::optional<std::string> path;
  for (std::string_view line : Split(proc_self_cgroup, '\n')) {
    if (line.substr(0, 3) == "0::") path = std::string(line.substr(3));
  }
  if (!path.has_value()) return std::nullopt;
  std::optional<std::string> dir;
  for (const MountLine& m : mounts) {
    if (m.fstype != "cgroup2") continue;
    std::string root = m.root == "/" ? "" : m.root;
    if (path->compare(0, root.size(), root) != 0) continue;
    std::string rest = path->substr(root.size());
    if (!rest.empty() && rest[0] != '/') continue;
    dir = m.mount_point + (rest == "/" ? "" : rest);  // the last visible mount wins
  }
  return dir;
}

bool ExistsAt(int dirfd, const char* name) {
  return ::faccessat(dirfd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

// cgroup.kill (5.14) exists in every non-root cgroup, never in the root. At the root, look at a
// child: an existing one, or a temporary one made for the purpose and removed at once.
void ProbeCgroupKill(Features& f, const std::string& dir) {
  auto fd = OpenAt(AT_FDCWD, dir, O_RDONLY | O_DIRECTORY);
  if (!fd.ok()) {
    f.cgroup_kill.detail = fd.error().message();
    return;
  }
  if (ExistsAt(fd->get(), "cgroup.kill")) {
    f.cgroup_kill.available = true;
    return;
  }
  constexpr const char* kNoKill = "kernel < 5.14: kills go to each pid of the cgroup instead";
  if (ExistsAt(fd->get(), "cgroup.type")) {  // not the root, so the kernel lacks it
    f.cgroup_kill.detail = std::string("no cgroup.kill in ") + dir + ": " + kNoKill;
    return;
  }
  std::string probe_name = "nsbox-probe-" + std::to_string(::getpid());
  if (::mkdirat(fd->get(), probe_name.c_str(), 0700) < 0) {
    f.cgroup_kill.detail =
        "cannot tell: " + Error::Sys("mkdir", dir + "/" + probe_name, errno).message() +
        "; fix: run as root to check";
    return;
  }
  std::string kill_path = probe_name + "/cgroup.kill";
  bool has_kill = ExistsAt(fd->get(), kill_path.c_str());
  // An empty cgroup that no process has entered: rmdir does not fail with EBUSY.
  (void)::unlinkat(fd->get(), probe_name.c_str(), AT_REMOVEDIR);
  f.cgroup_kill.available = has_kill;
  if (!has_kill) f.cgroup_kill.detail = kNoKill;
}

void ProbeCgroups(Features& f) {
  auto mountinfo = ReadFile("/proc/self/mountinfo");
  auto cgroup = ReadFile("/proc/self/cgroup");
  if (!mountinfo.ok() || !cgroup.ok()) {
    f.cgroup_v2.detail = (!mountinfo.ok() ? mountinfo.error() : cgroup.error()).message();
    f.cgroup_kill.detail = "needs cgroup v2";
    return;
  }
  std::vector<MountLine> mounts = ParseMountinfo(*mountinfo);
  for (const MountLine& m : mounts) {
    if (m.fstype != "cgroup") continue;
    for (std::string_view opt : Split(m.super_options, ',')) {
      for (std::string_view known : kV1Controllers) {
        if (opt != known) continue;
        bool seen = false;
        for (const std::string& c : f.cgroup_v1_controllers) seen = seen || c == opt;
        if (!seen) f.cgroup_v1_controllers.emplace_back(opt);
      }
    }
  }
  std::optional<std::string> dir = OwnV2Dir(mounts, *cgroup);
  if (!dir.has_value()) {
    bool mounted = false;
    for (const MountLine& m : mounts) mounted = mounted || m.fstype == "cgroup2";
    f.cgroup_v2.detail =
        mounted ? "our cgroup (the 0:: line of /proc/self/cgroup) is under no visible cgroup2 "
                  "mount"
                : "no cgroup2 mount; fix: mount -t cgroup2 none /sys/fs/cgroup/unified (or boot "
                  "with systemd.unified_cgroup_hierarchy=1)";
    f.cgroup_kill.detail = "needs cgroup v2";
    return;
  }
  f.cgroup_v2.available = true;
  auto controllers = ReadFile(*dir + "/cgroup.controllers");
  if (controllers.ok()) {
    const std::string trimmed = Trim(*controllers);  // outlives the views Split returns
    for (std::string_view c : Split(trimmed, ' ')) {
      if (!c.empty()) f.cgroup_v2_controllers.emplace_back(c);
    }
  } else {
    f.cgroup_v2.detail = controllers.error().message();
  }
  ProbeCgroupKill(f, *dir);
}

Features Probe() {
  Features f;
  ProbeNamespaces(f);
  ProbeSeccomp(f);
  ProbeClone3(f);
  ProbePidfd(f);
  ProbeOpenat2(f);
  ProbeMountSetattr(f);
  ProbeOverlayfs(f);
  ProbeIoUring(f);
  ProbeCgroups(f);
  return f;
}

}  // namespace

const Features& ProbeFeatures() {
  // A function-local static: probed on first use (never at load time), once, thread-safely.
  static const Features features = Probe();
  return features;
}

}  // namespace nsbox

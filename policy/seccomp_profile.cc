#include "policy/seccomp_profile.h"

#include <errno.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/socket.h>

#include <algorithm>
#include <string_view>

namespace nsbox::policy {

namespace {

// Every CLONE_NEW* flag clone(2) takes: NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
// (0x7E020000, Docker's mask). CLONE_NEWTIME (0x80) is clone3- and unshare-only; in clone's
// flags 0x80 is part of the exit signal.
constexpr uint64_t kCloneNewMask = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC |
                                   CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET;
static_assert(kCloneNewMask == 0x7E020000);

// ioctl(2) requests are 32-bit in the kernel: compare the low half only, so that a request with
// garbage in the high bits cannot slip past an exact 64-bit match (CVE-2019-10063).
constexpr uint64_t kIoctlRequestMask = 0xFFFFFFFF;

// pid_t arguments are 32-bit in the kernel (SYSCALL_DEFINE4(prlimit64, pid_t pid, ...)).
constexpr uint64_t kPidMask = 0xFFFFFFFF;

// Query-only personality(0xffffffff) and the four personalities Docker allows.
constexpr uint64_t kPersonalityQuery = 0xFFFFFFFF;
constexpr uint64_t kUname26Linux32 = uint64_t{UNAME26} | uint64_t{PER_LINUX32};
static_assert(kUname26Linux32 == 0x20008);

using Cmp = SyscallArgCmp;

// x86_64 numbers from the kernel's arch/x86/entry/syscalls/syscall_64.tbl (Linux 6.19), for the
// syscalls newer than set_mempolicy_home_node (450), which upstream libseccomp 2.5.4 cannot name.
// Debian's 2.5.4 knows up to futex_requeue (456); the seccomp unit test checks that libseccomp and
// this table agree wherever both know a name.
constexpr SyscallNumber kX8664Fallbacks[] = {
    {"cachestat", 451},          // Linux 6.5
    {"fchmodat2", 452},          // Linux 6.6
    {"map_shadow_stack", 453},   // Linux 6.6
    {"futex_wake", 454},         // Linux 6.7
    {"futex_wait", 455},         // Linux 6.7
    {"futex_requeue", 456},      // Linux 6.7
    {"statmount", 457},          // Linux 6.8
    {"listmount", 458},          // Linux 6.8
    {"lsm_get_self_attr", 459},  // Linux 6.8
    {"lsm_set_self_attr", 460},  // Linux 6.8
    {"lsm_list_modules", 461},   // Linux 6.8
    {"mseal", 462},              // Linux 6.10
    {"setxattrat", 463},         // Linux 6.13
    {"getxattrat", 464},         // Linux 6.13
    {"listxattrat", 465},        // Linux 6.13
    {"removexattrat", 466},      // Linux 6.13
    {"open_tree_attr", 467},     // Linux 6.15
    {"file_getattr", 468},       // Linux 6.17
    {"file_setattr", 469},       // Linux 6.17
    {"listns", 470},             // Linux 6.19
};

}  // namespace

// Deliberately absent, because x86_64 has no such syscall: umount (only umount2), stime,
// clock_settime64, vm86, vm86old, socketcall. The i386 and x32 ABIs that have them are refused
// whole by the compiled filter.
//
// Deliberately allowed, like Docker: adjtimex and clock_adjtime (the kernel wants CAP_SYS_TIME
// in the initial namespace before it changes anything, and BPF cannot read the mode in the
// struct), name_to_handle_at (harmless without open_by_handle_at), seccomp and the landlock
// calls (workloads may restrict themselves further; filters only tighten), memfd_secret,
// process_mrelease, futex_waitv.
SeccompProfile DefaultSeccompProfile() {
  SeccompProfile p;
  p.deny = {
      // Namespaces and the VFS: the jail's shape is nsbox-init's to decide, once. A nested user
      // namespace is the way to cgroup v1's release_agent (CVE-2022-0492).
      {"unshare", EPERM, {}, "new namespaces reach kernel code closed to the jail"},
      {"setns", EPERM, {}, "joining another namespace leaves the jail"},
      {"clone", EPERM, {{0, Cmp::kAnyBitSet, kCloneNewMask}}, "CLONE_NEW*: as unshare"},
      // BPF cannot read clone3's flags (they are in a struct); ENOSYS makes libc fall back to
      // clone, whose flags the rule above checks (Flatpak, CVE-2021-41133).
      {"clone3", ENOSYS, {}, "its flags are out of BPF's reach; libc falls back to clone"},
      {"mount", EPERM, {}, "remounting or overmounting would unmask masked paths"},
      {"umount2", EPERM, {}, "unmounting would uncover what the jail's mounts hide"},
      {"pivot_root", EPERM, {}, "only nsbox-init pivots; a second pivot could reach the old root"},
      {"chroot", EPERM, {}, "changes the root; CAP_SYS_CHROOT is not granted either"},
      // The new mount API (5.2+) can attach detached trees (Flatpak, CVE-2021-41133). ENOSYS, as
      // on an older kernel, so tools fall back to mount(2), which is denied above.
      {"fsopen", ENOSYS, {}, "new mount API: creates filesystem contexts"},
      {"fsconfig", ENOSYS, {}, "new mount API: configures filesystem contexts"},
      {"fsmount", ENOSYS, {}, "new mount API: turns a context into a detached mount"},
      {"fspick", ENOSYS, {}, "new mount API: reconfigures an existing mount"},
      {"move_mount", ENOSYS, {}, "new mount API: attaches detached trees"},
      {"open_tree", ENOSYS, {}, "new mount API: clones mount trees (OPEN_TREE_CLONE)"},
      {"open_tree_attr", ENOSYS, {}, "new mount API (6.15): open_tree with mount attributes"},
      {"mount_setattr", ENOSYS, {}, "new mount API: changes mount flags such as read-only"},
      // Mount introspection by id (6.8); libmount falls back to mountinfo on ENOSYS.
      {"statmount", ENOSYS, {}, "mount introspection by mount id, beyond mountinfo"},
      {"listmount", ENOSYS, {}, "mount introspection by mount id, beyond mountinfo"},
      {"listns", ENOSYS, {}, "lists namespaces across the whole system (6.19)"},
      // The kernel keyring is not namespaced.
      {"add_key", EPERM, {}, "the kernel keyring is shared with the host"},
      {"keyctl", EPERM, {}, "the kernel keyring is shared with the host"},
      {"request_key", EPERM, {}, "the kernel keyring is shared with the host"},
      // Other processes, above all nsbox-init, which serves the sandbox from inside the jail:
      // its memory, its fds and its channel to the daemon. Docker allows ptrace on 4.8+.
      {"ptrace", EPERM, {}, "would read or control nsbox-init"},
      {"process_vm_readv", EPERM, {}, "reads another process's memory"},
      {"process_vm_writev", EPERM, {}, "writes another process's memory"},
      {"kcmp", EPERM, {}, "compares other processes' kernel objects"},
      {"pidfd_getfd", EPERM, {}, "copies a file descriptor out of another process"},
      {"process_madvise", EPERM, {}, "acts on another process's memory"},
      // nsbox-init's resource limits: a lowered nofile fails every later exec, a CPU limit gets
      // it killed. Its credentials already refuse every command (runtime/init_guard.h); this
      // names PID 1 once more, under the pid_t's 32 bits (as kIoctlRequestMask), so that a
      // change there cannot open it. Other pids (a command's own children) stay allowed.
      {"prlimit64", EPERM, {{0, Cmp::kMaskedEq, kPidMask, 1}}, "would change nsbox-init's limits"},
      // Large kernel attack surface.
      {"bpf", EPERM, {}, "a large kernel attack surface"},
      {"perf_event_open", EPERM, {}, "a long CVE history; observes host activity"},
      {"userfaultfd", EPERM, {}, "widens race windows in kernel exploits"},
      // io_uring bugs gave container breakouts (Google kCTF). EPERM is also what the kernel
      // answers under io_uring_disabled=2, so programs already fall back on it.
      {"io_uring_setup", EPERM, {}, "io_uring: a rich source of kernel bugs"},
      {"io_uring_enter", EPERM, {}, "io_uring: a rich source of kernel bugs"},
      {"io_uring_register", EPERM, {}, "io_uring: a rich source of kernel bugs"},
      // Kernel code and the host kernel's life.
      {"init_module", EPERM, {}, "loads kernel code"},
      {"finit_module", EPERM, {}, "loads kernel code"},
      {"delete_module", EPERM, {}, "unloads kernel code"},
      {"create_module", EPERM, {}, "obsolete module call (ENOSYS since 2.6)"},
      {"query_module", EPERM, {}, "obsolete module call (ENOSYS since 2.6)"},
      {"get_kernel_syms", EPERM, {}, "obsolete module call (ENOSYS since 2.6)"},
      {"kexec_load", EPERM, {}, "replaces the host kernel"},
      {"kexec_file_load", EPERM, {}, "replaces the host kernel"},
      {"reboot", EPERM, {}, "would stop the sandbox's pid namespace, or the host"},
      // Host-wide state that is not namespaced.
      {"settimeofday", EPERM, {}, "the clock is shared with the host"},
      {"clock_settime", EPERM, {}, "the clock is shared with the host"},
      {"acct", EPERM, {}, "process accounting is host-wide"},
      {"quotactl", EPERM, {}, "disk quotas are host-wide"},
      {"quotactl_fd", EPERM, {}, "disk quotas are host-wide"},
      {"swapon", EPERM, {}, "swap is host-wide"},
      {"swapoff", EPERM, {}, "swap is host-wide"},
      {"syslog", EPERM, {}, "reads the host's kernel log (dmesg)"},
      {"lookup_dcookie", EPERM, {}, "host profiling interface"},
      {"fanotify_init", EPERM, {}, "watches file activity beyond the jail's mounts"},
      {"open_by_handle_at", EPERM, {}, "opens files outside the jail's root (\"shocker\", 2014)"},
      {"vhangup", EPERM, {}, "hangs up the terminal (CAP_SYS_TTY_CONFIG in Docker)"},
      {"sethostname", EPERM, {}, "the hostname is the sandbox's, set by the API"},
      {"setdomainname", EPERM, {}, "the domain name is the sandbox's, set by the API"},
      // Legacy interfaces with raw hardware access or little testing. modify_ldt is allowed by
      // Docker; only Wine and 16-bit code need it.
      {"iopl", EPERM, {}, "raw I/O port access"},
      {"ioperm", EPERM, {}, "raw I/O port access"},
      {"modify_ldt", EPERM, {}, "16-bit segments: rarely used, rarely tested"},
      {"uselib", EPERM, {}, "legacy a.out loader"},
      {"ustat", EPERM, {}, "legacy; host filesystem statistics"},
      {"sysfs", EPERM, {}, "legacy filesystem-type query"},
      {"_sysctl", EPERM, {}, "legacy sysctl interface (removed in 5.5)"},
      {"nfsservctl", EPERM, {}, "legacy NFS server control (removed in 3.1)"},
      // NUMA policy: memory placement across the host.
      {"mbind", EPERM, {}, "NUMA placement across the host"},
      {"set_mempolicy", EPERM, {}, "NUMA placement across the host"},
      {"get_mempolicy", EPERM, {}, "NUMA placement across the host"},
      {"set_mempolicy_home_node", EPERM, {}, "NUMA placement across the host"},
      {"move_pages", EPERM, {}, "moves other processes' pages between NUMA nodes"},
      {"migrate_pages", EPERM, {}, "moves other processes' pages between NUMA nodes"},
      // LSM attributes (6.8). ENOSYS, as on an older kernel, so libraries fall back.
      {"lsm_get_self_attr", ENOSYS, {}, "reveals LSM labels; new attack surface"},
      {"lsm_set_self_attr", ENOSYS, {}, "changes LSM labels; new attack surface"},
      {"lsm_list_modules", ENOSYS, {}, "reveals the host's LSMs; new attack surface"},
      // Terminal injection: typing into the terminal of whoever is attached (CVE-2017-5226,
      // CVE-2023-28100). The request is compared under kIoctlRequestMask.
      {"ioctl", EPERM, {{1, Cmp::kMaskedEq, kIoctlRequestMask, TIOCSTI}}, "TIOCSTI fakes input"},
      {"ioctl", EPERM, {{1, Cmp::kMaskedEq, kIoctlRequestMask, TIOCLINUX}}, "pastes as input"},
  };
  // Each call fails unless the argument is one of the listed values.
  p.arg_allowlists = {
      // Other personalities (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO) are poorly
      // tested kernel paths or weaken ASLR. Docker's list.
      {"personality",
       0,
       {PER_LINUX, PER_LINUX32, UNAME26, kUname26Linux32, kPersonalityQuery},
       EPERM,
       "exotic personalities weaken ASLR or are poorly tested"},
      // Rare families autoload modules with bugs (DCCP, TIPC, RDS, AF_ALG, AF_VSOCK). Flatpak's
      // list. socketpair creates sockets of the family too.
      {"socket", 0, {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK}, EAFNOSUPPORT, "rare families"},
      {"socketpair", 0, {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK}, EAFNOSUPPORT, "rare families"},
  };
  // Linux 5.17's last syscall: everything above it is ENOSYS unless reviewed and listed below.
  // Not listed, so ENOSYS: setxattrat and its siblings (6.13) and file_getattr/file_setattr
  // (6.17), newer forms of calls that stay allowed, which libc does not use yet.
  p.enosys_above = 450;
  p.allow_newer = {
      {"cachestat", "page-cache residency of a file the caller holds, like mincore (6.5)"},
      {"fchmodat2", "chmod with AT_SYMLINK_NOFOLLOW; glibc 2.39 uses it (6.6)"},
      {"map_shadow_stack", "CET shadow stacks for the caller's own threads (6.6)"},
      {"futex_wake", "futex2: what futex does (6.7)"},
      {"futex_wait", "futex2: what futex does (6.7)"},
      {"futex_requeue", "futex2: what futex does (6.7)"},
      {"mseal", "seals the caller's own mappings; it can only restrict (6.10)"},
  };
  return p;
}

void SeccompProfile::Allow(const char* name, const char* reason) {
  const std::string_view n(name);
  std::erase_if(deny, [n](const SyscallRule& r) { return n == r.name; });
  std::erase_if(arg_allowlists, [n](const SyscallArgAllowlist& r) { return n == r.name; });
  const std::optional<int> nr = X8664SyscallNumberFallback(n);
  const bool listed = std::any_of(allow_newer.begin(), allow_newer.end(),
                                  [n](const NewerSyscall& s) { return n == s.name; });
  if (nr.has_value() && static_cast<uint32_t>(*nr) > enosys_above && !listed) {
    allow_newer.push_back({name, reason});
  }
}

std::optional<int> X8664SyscallNumberFallback(std::string_view name) {
  for (const SyscallNumber& s : kX8664Fallbacks) {
    if (name == s.name) return s.nr;
  }
  return std::nullopt;
}

std::span<const SyscallNumber> X8664SyscallNumberFallbacks() { return kX8664Fallbacks; }

namespace {

struct InitOnly {
  const char* name;
  const char* reason;
};
constexpr InitOnly kInitOnly[] = {
    {"clone3", "nsbox-init starts each command inside its cgroup (CLONE_INTO_CGROUP)"},
    {"io_uring_setup", "nsbox-init's event loop"},
    {"io_uring_enter", "nsbox-init's event loop"},
    {"io_uring_register", "nsbox-init's event loop"},
};

}  // namespace

SeccompProfile InitSeccompProfile() {
  SeccompProfile p = DefaultSeccompProfile();
  for (const auto& s : kInitOnly) p.Allow(s.name, s.reason);
  return p;
}

SeccompProfile CommandOverInitSeccompProfile() {
  SeccompProfile all = DefaultSeccompProfile();
  SeccompProfile p;
  for (const auto& rule : all.deny) {
    for (const auto& s : kInitOnly) {
      if (std::string_view(rule.name) == s.name) p.deny.push_back(rule);
    }
  }
  // Everything else was decided by nsbox-init's filter, newer syscalls included.
  p.enosys_above = 0xffff;
  return p;
}

}  // namespace nsbox::policy

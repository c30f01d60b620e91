// nsbox-probe: a small static program that runs inside a jail and reports what it sees, one
// "key=value" line per fact, so that the integration tests assert isolation from the inside
// (youki's contest/runtimetest, crun's static /init).
//
// Every subcommand that is part of a test's control run (status, syscalls, escape, stat, read,
// list, mounts, tiocsti without --stdin) is harmless when run directly on the host as root: each
// probed syscall gets arguments that make it fail before it does anything (a bad fd, a bad
// pointer, invalid flags), or runs in a forked child that exits at once, or acts only on objects
// the probe itself created (a temp dir under /tmp, a pty pair of its own). The subcommands that
// would disturb a host (forkbomb, signal-init, tiocsti --stdin) refuse to run in the initial pid
// namespace. `write PATH` creates or truncates PATH and `memhog` allocates what it is told: the
// tests give them only paths and sizes inside the jail. `openw` opens without writing.
//
// Errors are printed as errno names ("EPERM"), success as "0", a child killed by a signal as the
// signal's name ("SIGSYS").

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

namespace {

// A user-space address that is never mapped (page 0), so the kernel answers EFAULT as soon as it
// reads through it, before acting on anything.
void* const kBadPtr = reinterpret_cast<void*>(1);  // NOLINT: an invalid address on purpose.

// /proc/self/ns/pid of the initial pid namespace: PROC_PID_INIT_INO (include/linux/proc_ns.h).
constexpr const char* kInitialPidNs = "pid:[4026531836]";

const char* ErrName(int err) {
  if (err == 0) return "0";
  const char* name = strerrorname_np(err);
  return name != nullptr ? name : "E?";
}

// What a raw syscall() returned: "0" for any success, else the errno's name.
const char* Outcome(long rc) { return rc < 0 ? ErrName(errno) : "0"; }

void Print(const char* key, const char* value) {
  printf("%s=%s\n", key, value);
  fflush(stdout);
}

void PrintLong(const char* key, long value) {
  printf("%s=%ld\n", key, value);
  fflush(stdout);
}

bool InInitialPidNamespace() {
  char buf[64] = {};
  ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  // Without /proc we cannot tell: assume the host, the cautious answer.
  return n <= 0 || strcmp(buf, kInitialPidNs) == 0;
}

int RefuseOnHost(const char* what) {
  if (!InInitialPidNamespace()) return 0;
  printf("refused=%s would disturb the host; it runs only in a new pid namespace\n", what);
  return 2;
}

// Runs `fn` in a forked child, for calls that would change the probe itself when they succeed
// (unshare, chroot, setns, personality). Returns "0", the child's errno name, or a signal name.
template <typename Fn>
const char* InChild(Fn fn) {
  pid_t pid = fork();
  if (pid < 0) return ErrName(errno);
  if (pid == 0) {
    errno = 0;
    int err = fn();
    _exit(err);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrName(errno);
  }
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    static char buf[32];
    snprintf(buf, sizeof buf, "SIG%s", name != nullptr ? name : "?");
    return buf;
  }
  return ErrName(WEXITSTATUS(status));
}

// The errno of a raw syscall in a forked child, 0 on success.
int ErrnoOf(long rc) { return rc < 0 ? errno : 0; }

// First line of a file, runs of blanks collapsed to one space, trimmed.
bool FirstLineCollapsed(const char* path, char* out, size_t size) {
  FILE* f = fopen(path, "re");
  if (f == nullptr) {
    snprintf(out, size, "%s", ErrName(errno));
    return false;
  }
  char line[512] = {};
  if (fgets(line, sizeof line, f) == nullptr) line[0] = '\0';
  fclose(f);
  size_t o = 0;
  bool blank = true;  // drops leading blanks
  for (const char* p = line; *p != '\0' && *p != '\n' && o + 1 < size; ++p) {
    if (*p == ' ' || *p == '\t') {
      if (!blank) out[o++] = ' ';
      blank = true;
    } else {
      out[o++] = *p;
      blank = false;
    }
  }
  while (o > 0 && out[o - 1] == ' ') --o;
  out[o] = '\0';
  return true;
}

void PrintStatusFields() {
  static const char* const kFields[] = {"CapInh", "CapPrm",     "CapEff",  "CapBnd",
                                        "CapAmb", "NoNewPrivs", "Seccomp", "Seccomp_filters"};
  FILE* f = fopen("/proc/self/status", "re");
  if (f == nullptr) {
    Print("proc_status", ErrName(errno));
    return;
  }
  char line[512];
  while (fgets(line, sizeof line, f) != nullptr) {
    char* colon = strchr(line, ':');
    if (colon == nullptr) continue;
    *colon = '\0';
    for (const char* field : kFields) {
      if (strcmp(line, field) != 0) continue;
      char* v = colon + 1;
      while (*v == ' ' || *v == '\t') ++v;
      v[strcspn(v, "\n")] = '\0';
      Print(field, v);
    }
  }
  fclose(f);
}

int CompareLong(const void* a, const void* b) {
  long x = *static_cast<const long*>(a);
  long y = *static_cast<const long*>(b);
  return (x > y) - (x < y);
}

// "1,2": the numeric entries of /proc, sorted.
void PrintProcPids() {
  DIR* d = opendir("/proc");
  if (d == nullptr) {
    Print("pids", ErrName(errno));
    return;
  }
  long pids[4096];
  size_t n = 0;
  while (struct dirent* e = readdir(d)) {
    char* end = nullptr;
    long v = strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && n < sizeof pids / sizeof pids[0]) pids[n++] = v;
  }
  closedir(d);
  qsort(pids, n, sizeof pids[0], CompareLong);
  printf("pids=");
  for (size_t i = 0; i < n; ++i) printf(i == 0 ? "%ld" : ",%ld", pids[i]);
  printf("\n");
  fflush(stdout);
}

// "lo": the interface names of /proc/net/dev, in its order.
void PrintInterfaces() {
  FILE* f = fopen("/proc/net/dev", "re");
  if (f == nullptr) {
    Print("ifaces", ErrName(errno));
    return;
  }
  char line[512];
  char names[1024] = {};
  while (fgets(line, sizeof line, f) != nullptr) {
    char* colon = strchr(line, ':');
    if (colon == nullptr) continue;  // the two header lines have '|', not ':'
    *colon = '\0';
    const char* name = line;
    while (*name == ' ') ++name;
    if (names[0] != '\0') strncat(names, ",", sizeof names - strlen(names) - 1);
    strncat(names, name, sizeof names - strlen(names) - 1);
  }
  fclose(f);
  Print("ifaces", names);
  // Which of them are up (SIOCGIFFLAGS on an AF_INET socket, which the filter allows).
  int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return;
  char* save = nullptr;
  for (char* name = strtok_r(names, ",", &save); name != nullptr;
       name = strtok_r(nullptr, ",", &save)) {
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
    char key[64];
    snprintf(key, sizeof key, "iface.%s.up", name);
    if (ioctl(sock, SIOCGIFFLAGS, &ifr) < 0) {
      Print(key, ErrName(errno));
    } else {
      Print(key, (ifr.ifr_flags & IFF_UP) != 0 ? "1" : "0");
    }
  }
  close(sock);
}

// "0" when the path exists (lstat), else the errno name: ENOENT for absent.
void PrintExists(const char* key, const char* path) {
  struct stat st;
  Print(key, lstat(path, &st) == 0 ? "0" : ErrName(errno));
}

void PrintRlimit(const char* key, int resource) {
  struct rlimit rl;
  if (getrlimit(static_cast<__rlimit_resource>(resource), &rl) < 0) {
    Print(key, ErrName(errno));
    return;
  }
  char buf[64];
  auto fmt = [](rlim_t v, char* out, size_t n) {
    if (v == RLIM_INFINITY) {
      snprintf(out, n, "unlimited");
    } else {
      snprintf(out, n, "%llu", static_cast<unsigned long long>(v));
    }
  };
  char soft[24];
  char hard[24];
  fmt(rl.rlim_cur, soft, sizeof soft);
  fmt(rl.rlim_max, hard, sizeof hard);
  snprintf(buf, sizeof buf, "%s %s", soft, hard);
  Print(key, buf);
}

int CmdStatus() {
  char buf[512];
  FirstLineCollapsed("/proc/self/uid_map", buf, sizeof buf);
  Print("uid_map", buf);
  FirstLineCollapsed("/proc/self/gid_map", buf, sizeof buf);
  Print("gid_map", buf);
  PrintLong("uid", getuid());
  PrintLong("euid", geteuid());
  PrintLong("gid", getgid());
  PrintLong("egid", getegid());
  PrintStatusFields();
  PrintLong("prctl_no_new_privs", prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0));
  struct utsname u;
  Print("hostname", uname(&u) == 0 ? u.nodename : ErrName(errno));
  PrintLong("pid", getpid());
  PrintLong("ppid", getppid());
  PrintLong("sid", getsid(0));
  PrintLong("pgid", getpgid(0));
  PrintProcPids();
  PrintInterfaces();
  PrintExists("shadow", "/etc/shadow");
  PrintExists("sys", "/sys");
  PrintExists("proc_self", "/proc/self");
  PrintExists("workspace", "/workspace");
  PrintRlimit("rlimit.core", RLIMIT_CORE);
  PrintRlimit("rlimit.nofile", RLIMIT_NOFILE);
  PrintRlimit("rlimit.nproc", RLIMIT_NPROC);
  mode_t old = umask(022);
  umask(old);
  snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(old));
  Print("umask", buf);
  Print("cwd", getcwd(buf, sizeof buf) != nullptr ? buf : ErrName(errno));
  // The controlling terminal: tty_nr, field 7 of /proc/self/stat (after the parenthesised comm).
  FILE* f = fopen("/proc/self/stat", "re");
  if (f != nullptr) {
    char text[1024] = {};
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    const char* p = strrchr(text, ')');
    char state = 0;
    int ppid = 0, pgrp = 0, session = 0, tty_nr = 0;
    if (p != nullptr &&
        sscanf(p + 1, " %c %d %d %d %d", &state, &ppid, &pgrp, &session, &tty_nr) == 5) {
      PrintLong("tty_nr", tty_nr);
    }
  }
  for (char** e = environ; *e != nullptr; ++e) printf("env.%s\n", *e);
  fflush(stdout);
  return 0;
}

// One probed syscall: `fn` makes the call with harmless arguments and returns its outcome.
struct Probe {
  const char* name;
  const char* (*fn)();
};

// Each entry: the call, the arguments that make it fail harmlessly when it is not filtered, and
// what it answers then on this kind of host as root. Filtered, it answers the profile's errno.
const Probe kProbes[] = {
    // mount(NULL dev, bad target): the target is read first -> EFAULT.
    {"mount", [] { return Outcome(syscall(SYS_mount, nullptr, kBadPtr, nullptr, 0, nullptr)); }},
    // umount2(bad path) -> EFAULT.
    {"umount2", [] { return Outcome(syscall(SYS_umount2, kBadPtr, 0)); }},
    // pivot_root(bad, bad) -> EFAULT.
    {"pivot_root", [] { return Outcome(syscall(SYS_pivot_root, kBadPtr, kBadPtr)); }},
    // chroot(bad path) -> EFAULT.
    {"chroot", [] { return Outcome(syscall(SYS_chroot, kBadPtr)); }},
    // unshare(CLONE_NEWUSER) really: succeeds as root on the host, so in a child that exits.
    {"unshare_newuser",
     [] { return InChild([] { return ErrnoOf(syscall(SYS_unshare, CLONE_NEWUSER)); }); }},
    // setns(-1, 0) -> EBADF.
    {"setns", [] { return Outcome(syscall(SYS_setns, -1, 0)); }},
    // clone(CLONE_NEWUSER | CLONE_FS): the kernel refuses the combination before creating
    // anything (kernel/fork.c copy_process) -> EINVAL; the filter sees CLONE_NEWUSER.
    {"clone_newuser",
     [] { return Outcome(syscall(SYS_clone, CLONE_NEWUSER | CLONE_FS, 0, 0, 0, 0)); }},
    // clone3(NULL, 0): a size below CLONE_ARGS_SIZE_VER0 -> EINVAL.
    {"clone3", [] { return Outcome(syscall(SYS_clone3, nullptr, 0)); }},
    // keyctl(-1): no such operation -> EOPNOTSUPP.
    {"keyctl", [] { return Outcome(syscall(SYS_keyctl, -1, 0, 0, 0, 0)); }},
    // add_key(bad type) -> EFAULT.
    {"add_key", [] { return Outcome(syscall(SYS_add_key, kBadPtr, kBadPtr, nullptr, 0, 0)); }},
    // request_key(bad type) -> EFAULT.
    {"request_key", [] { return Outcome(syscall(SYS_request_key, kBadPtr, kBadPtr, nullptr, 0)); }},
    // ptrace(PTRACE_PEEKDATA, 1): pid 1 is not our tracee -> ESRCH. Never ATTACH (it would work).
    {"ptrace", [] { return Outcome(syscall(SYS_ptrace, PTRACE_PEEKDATA, 1, nullptr, nullptr)); }},
    // process_vm_readv(1, NULL, 0, NULL, 0, flags 1): flags must be 0 -> EINVAL.
    {"process_vm_readv",
     [] { return Outcome(syscall(SYS_process_vm_readv, 1, nullptr, 0, nullptr, 0, 1)); }},
    {"process_vm_writev",
     [] { return Outcome(syscall(SYS_process_vm_writev, 1, nullptr, 0, nullptr, 0, 1)); }},
    // kcmp(0, 0, ...): no pid 0 -> ESRCH.
    {"kcmp", [] { return Outcome(syscall(SYS_kcmp, 0, 0, -1, 0, 0)); }},
    // pidfd_getfd(-1, ...) -> EBADF.
    {"pidfd_getfd", [] { return Outcome(syscall(SYS_pidfd_getfd, -1, 0, 0)); }},
    // process_madvise(-1, NULL, 0, 0, 0) -> EBADF.
    {"process_madvise", [] { return Outcome(syscall(SYS_process_madvise, -1, nullptr, 0, 0, 0)); }},
    // bpf(-1, NULL, 0): no such command -> EINVAL.
    {"bpf", [] { return Outcome(syscall(SYS_bpf, -1, nullptr, 0)); }},
    // perf_event_open(NULL attr) -> EFAULT.
    {"perf_event_open",
     [] { return Outcome(syscall(SYS_perf_event_open, nullptr, 0, -1, -1, 0)); }},
    // userfaultfd(all flags) -> EINVAL.
    {"userfaultfd", [] { return Outcome(syscall(SYS_userfaultfd, ~0U)); }},
    // io_uring_setup(0, NULL) -> EFAULT/EINVAL; enter/register on fd -1 -> EBADF.
    {"io_uring_setup", [] { return Outcome(syscall(SYS_io_uring_setup, 0, nullptr)); }},
    {"io_uring_enter",
     [] { return Outcome(syscall(SYS_io_uring_enter, -1, 0, 0, 0, nullptr, 0)); }},
    {"io_uring_register",
     [] { return Outcome(syscall(SYS_io_uring_register, -1, 0, nullptr, 0)); }},
    // init_module(NULL, 0): shorter than an ELF header -> ENOEXEC.
    {"init_module", [] { return Outcome(syscall(SYS_init_module, nullptr, 0, "")); }},
    // finit_module(-1) -> EBADF.
    {"finit_module", [] { return Outcome(syscall(SYS_finit_module, -1, "", 0)); }},
    // delete_module(bad name) -> EFAULT.
    {"delete_module", [] { return Outcome(syscall(SYS_delete_module, kBadPtr, 0)); }},
    // kexec_load with 1000 segments (max 16) and invalid flags -> EINVAL (ENOSYS without
    // CONFIG_KEXEC). Never 0 segments: that would unload a loaded crash kernel.
    {"kexec_load", [] { return Outcome(syscall(SYS_kexec_load, 0, 1000, kBadPtr, 0xffffffffUL)); }},
    // kexec_file_load with an unknown flag (never KEXEC_FILE_UNLOAD) -> EINVAL (or ENOSYS).
    {"kexec_file_load",
     [] { return Outcome(syscall(SYS_kexec_file_load, -1, -1, 0, nullptr, 0x80000000UL)); }},
    // reboot(bad magic) -> EINVAL.
    {"reboot", [] { return Outcome(syscall(SYS_reboot, 0, 0, 0, nullptr)); }},
    // settimeofday(bad tv) -> EFAULT.
    {"settimeofday", [] { return Outcome(syscall(SYS_settimeofday, kBadPtr, nullptr)); }},
    // clock_settime(clock 100, bad): no such clock -> EINVAL.
    {"clock_settime", [] { return Outcome(syscall(SYS_clock_settime, 100, kBadPtr)); }},
    // acct(bad path) -> EFAULT. Never acct(NULL): that switches accounting off.
    {"acct", [] { return Outcome(syscall(SYS_acct, kBadPtr)); }},
    // quotactl(-1 cmd): type 255 >= MAXQUOTAS -> EINVAL; quotactl_fd(-1) -> EBADF.
    {"quotactl", [] { return Outcome(syscall(SYS_quotactl, -1, kBadPtr, 0, nullptr)); }},
    {"quotactl_fd", [] { return Outcome(syscall(SYS_quotactl_fd, -1, 0, 0, nullptr)); }},
    // swapon(bad, invalid flags) -> EINVAL; swapoff(bad) -> EFAULT.
    {"swapon", [] { return Outcome(syscall(SYS_swapon, kBadPtr, -1)); }},
    {"swapoff", [] { return Outcome(syscall(SYS_swapoff, kBadPtr)); }},
    // syslog(-1): no such action -> EINVAL. Never 5 (clear) or 6/7 (console level).
    {"syslog", [] { return Outcome(syscall(SYS_syslog, -1, nullptr, 0)); }},
    // lookup_dcookie: removed in 6.10 -> ENOSYS.
    {"lookup_dcookie", [] { return Outcome(syscall(SYS_lookup_dcookie, 0, nullptr, 0)); }},
    // fanotify_init(all flags) -> EINVAL.
    {"fanotify_init", [] { return Outcome(syscall(SYS_fanotify_init, ~0U, 0)); }},
    // open_by_handle_at(-1, bad handle) -> EFAULT or EBADF.
    {"open_by_handle_at",
     [] { return Outcome(syscall(SYS_open_by_handle_at, -1, kBadPtr, O_RDONLY)); }},
    // sethostname/setdomainname(bad, -1): negative length -> EINVAL.
    {"sethostname", [] { return Outcome(syscall(SYS_sethostname, kBadPtr, -1L)); }},
    {"setdomainname", [] { return Outcome(syscall(SYS_setdomainname, kBadPtr, -1L)); }},
    // iopl(4): levels are 0..3 -> EINVAL. ioperm past the 65536 ports -> EINVAL.
    {"iopl", [] { return Outcome(syscall(SYS_iopl, 4)); }},
    {"ioperm", [] { return Outcome(syscall(SYS_ioperm, 0xffffffffUL, 1, 1)); }},
    // modify_ldt(0 = read, NULL, 0 bytes): reads nothing -> 0. (An unknown function would not
    // do: the kernel casts its -ENOSYS to unsigned int, which syscall() reports as success.)
    {"modify_ldt", [] { return Outcome(syscall(SYS_modify_ldt, 0, nullptr, 0)); }},
    // uselib(bad) -> EFAULT (ENOSYS without CONFIG_USELIB).
    {"uselib", [] { return Outcome(syscall(SYS_uselib, kBadPtr)); }},
    // Module calls gone since 2.6 and _sysctl, nfsservctl (removed in 5.5, 3.1): ENOSYS on the
    // host whatever the arguments.
    {"create_module", [] { return Outcome(syscall(SYS_create_module, nullptr, 0)); }},
    {"get_kernel_syms", [] { return Outcome(syscall(SYS_get_kernel_syms, nullptr)); }},
    {"query_module",
     [] { return Outcome(syscall(SYS_query_module, nullptr, 0, nullptr, 0, nullptr)); }},
    {"_sysctl", [] { return Outcome(syscall(SYS__sysctl, kBadPtr)); }},
    {"nfsservctl", [] { return Outcome(syscall(SYS_nfsservctl, 0, nullptr, nullptr)); }},
    // vhangup hangs up the caller's controlling terminal: in a child that first leaves it
    // (setsid), so that on the host it has nothing to hang up -> 0.
    {"vhangup",
     [] {
       return InChild([] {
         if (setsid() < 0) return 1000;  // not a valid errno: reported as "E?"
         return ErrnoOf(syscall(SYS_vhangup));
       });
     }},
    // ustat(dev 0, bad) -> EINVAL; sysfs(-1) -> EINVAL.
    {"ustat", [] { return Outcome(syscall(SYS_ustat, 0, kBadPtr)); }},
    {"sysfs", [] { return Outcome(syscall(SYS_sysfs, -1, 0, 0)); }},
    // NUMA calls with invalid modes or flags -> EINVAL; migrate_pages(bad masks) -> EFAULT.
    {"mbind", [] { return Outcome(syscall(SYS_mbind, 0, 0, -1, nullptr, 0, 0)); }},
    {"set_mempolicy", [] { return Outcome(syscall(SYS_set_mempolicy, -1, nullptr, 0)); }},
    {"get_mempolicy",
     [] { return Outcome(syscall(SYS_get_mempolicy, nullptr, nullptr, 0, nullptr, ~0UL)); }},
    {"set_mempolicy_home_node",
     [] { return Outcome(syscall(SYS_set_mempolicy_home_node, 0, 0, 0, 1)); }},
    {"move_pages",
     [] { return Outcome(syscall(SYS_move_pages, 0, 0, nullptr, nullptr, nullptr, ~0)); }},
    {"migrate_pages", [] { return Outcome(syscall(SYS_migrate_pages, 0, 64, kBadPtr, kBadPtr)); }},
    // lsm_* (459..461) with invalid flags -> EINVAL.
    {"lsm_get_self_attr", [] { return Outcome(syscall(459, 0, nullptr, nullptr, ~0U)); }},
    {"lsm_set_self_attr", [] { return Outcome(syscall(460, 0, nullptr, 0, ~0U)); }},
    {"lsm_list_modules", [] { return Outcome(syscall(461, nullptr, nullptr, ~0U)); }},
    // The new mount API, all with fd -1, bad pointers or invalid flags.
    {"fsopen", [] { return Outcome(syscall(SYS_fsopen, kBadPtr, 0)); }},
    {"fsconfig", [] { return Outcome(syscall(SYS_fsconfig, -1, 0, nullptr, nullptr, 0)); }},
    {"fsmount", [] { return Outcome(syscall(SYS_fsmount, -1, 0, 0)); }},
    {"fspick", [] { return Outcome(syscall(SYS_fspick, -1, kBadPtr, 0)); }},
    {"move_mount", [] { return Outcome(syscall(SYS_move_mount, -1, kBadPtr, -1, kBadPtr, 0)); }},
    {"open_tree", [] { return Outcome(syscall(SYS_open_tree, -1, kBadPtr, 0)); }},
    // open_tree_attr (467, 6.15): fd -1, bad path.
    {"open_tree_attr", [] { return Outcome(syscall(467, -1, kBadPtr, 0, nullptr, 0)); }},
    // mount_setattr(-1, bad, 0, bad, size 0): size below MOUNT_ATTR_SIZE_VER0 -> EINVAL.
    {"mount_setattr",
     [] { return Outcome(syscall(SYS_mount_setattr, -1, kBadPtr, 0, kBadPtr, 0)); }},
    // statmount (457, 6.8) with a bad request -> EFAULT.
    {"statmount", [] { return Outcome(syscall(457, kBadPtr, kBadPtr, 0, 0)); }},
    // listmount (458, 6.8) with a bad request -> EFAULT; listns (470, 6.19) likewise, or ENOSYS
    // on a kernel that predates it.
    {"listmount", [] { return Outcome(syscall(458, kBadPtr, nullptr, 0, 0)); }},
    {"listns", [] { return Outcome(syscall(470, kBadPtr, nullptr, 0, 0)); }},
    // file_getattr (468, 6.17): listed nowhere in the profile, so it is above enosys_above and
    // not reviewed -> ENOSYS in the jail; size 0 -> EINVAL on the host.
    {"file_getattr", [] { return Outcome(syscall(468, -1, kBadPtr, kBadPtr, 0, 0)); }},
    // personality(READ_IMPLIES_EXEC) succeeds unfiltered and changes the caller: in a child.
    {"personality",
     [] { return InChild([] { return ErrnoOf(syscall(SYS_personality, READ_IMPLIES_EXEC)); }); }},
    // personality(0xffffffff) only queries: allowed everywhere.
    {"personality_query", [] { return Outcome(syscall(SYS_personality, 0xffffffffUL)); }},
    // Socket families outside the allowlist. The sockets made on the host are closed at once.
    {"socket_packet",
     [] {
       long fd = syscall(SYS_socket, AF_PACKET, SOCK_DGRAM, 0);
       const char* r = Outcome(fd);
       if (fd >= 0) close(static_cast<int>(fd));
       return r;
     }},
    {"socket_vsock",
     [] {
       long fd = syscall(SYS_socket, AF_VSOCK, SOCK_STREAM, 0);
       const char* r = Outcome(fd);
       if (fd >= 0) close(static_cast<int>(fd));
       return r;
     }},
    {"socket_alg",
     [] {
       long fd = syscall(SYS_socket, AF_ALG, SOCK_SEQPACKET, 0);
       const char* r = Outcome(fd);
       if (fd >= 0) close(static_cast<int>(fd));
       return r;
     }},
    // socketpair(AF_PACKET): packet sockets have no pairs -> EOPNOTSUPP on the host.
    {"socketpair_packet",
     [] {
       int sv[2] = {-1, -1};
       long rc = syscall(SYS_socketpair, AF_PACKET, SOCK_DGRAM, 0, sv);
       const char* r = Outcome(rc);
       if (rc == 0) {
         close(sv[0]);
         close(sv[1]);
       }
       return r;
     }},
    // An allowed family, for contrast: the filter must not refuse AF_UNIX.
    {"socket_unix",
     [] {
       long fd = syscall(SYS_socket, AF_UNIX, SOCK_STREAM, 0);
       const char* r = Outcome(fd);
       if (fd >= 0) close(static_cast<int>(fd));
       return r;
     }},
    // ioctl(-1, TIOCSTI) -> EBADF; the same request with high garbage bits (CVE-2019-10063), which
    // the kernel truncates to 32 bits -> EBADF; TIOCLINUX -> EBADF.
    {"ioctl_tiocsti", [] { return Outcome(syscall(SYS_ioctl, -1, TIOCSTI, kBadPtr)); }},
    {"ioctl_tiocsti_high",
     [] { return Outcome(syscall(SYS_ioctl, -1, TIOCSTI | (1UL << 32), kBadPtr)); }},
    {"ioctl_tioclinux", [] { return Outcome(syscall(SYS_ioctl, -1, TIOCLINUX, kBadPtr)); }},
    // prlimit64 of pid 1 that reads and sets nothing: 0 on the host (root, or the same user as
    // init), refused by the filter; with a high bit in the register too, which the kernel drops
    // (pid_t); of itself (pid 0) for contrast: 0 everywhere.
    {"prlimit_pid1", [] { return Outcome(syscall(SYS_prlimit64, 1, RLIMIT_CORE, 0, 0)); }},
    {"prlimit_pid1_high",
     [] { return Outcome(syscall(SYS_prlimit64, 1UL | (1UL << 32), RLIMIT_CORE, 0, 0)); }},
    {"prlimit_self", [] { return Outcome(syscall(SYS_prlimit64, 0, RLIMIT_CORE, 0, 0)); }},
    // An allowed ioctl, for contrast: FIONREAD on fd -1 -> EBADF everywhere.
    {"ioctl_fionread", [] { return Outcome(syscall(SYS_ioctl, -1, FIONREAD, kBadPtr)); }},
    // The i386 ABI (int 0x80, getpid = 20), in a child: the filter kills a foreign ABI.
    {"abi_i386",
     [] {
       return InChild([] {
         long ret = 0;
         // SAFETY: a 32-bit getpid through the compat entry: no arguments, no side effect.
         asm volatile("int $0x80" : "=a"(ret) : "a"(20L) : "memory", "r8", "r9", "r10", "r11");
         return ret > 0 ? 0 : static_cast<int>(-ret);
       });
     }},
    // The x32 ABI (__X32_SYSCALL_BIT | getpid), in a child.
    {"abi_x32", [] { return InChild([] { return ErrnoOf(syscall(0x40000000L | SYS_getpid)); }); }},
};

int CmdSyscalls(int argc, char** argv) {
  for (const Probe& p : kProbes) {
    bool wanted = argc == 0;
    for (int i = 0; i < argc; ++i) wanted = wanted || strcmp(argv[i], p.name) == 0;
    if (!wanted) continue;
    errno = 0;
    const char* r = p.fn();
    printf("sys.%s=%s\n", p.name, r);
    fflush(stdout);
  }
  return 0;
}

// The per-path subcommands print "KEY[PATH]=VALUE" so that one run can cover many paths.
void PrintAt(const char* key, const char* path, const char* value) {
  printf("%s[%s]=%s\n", key, path, value);
  fflush(stdout);
}

void PrintLongAt(const char* key, const char* path, long value) {
  printf("%s[%s]=%ld\n", key, path, value);
  fflush(stdout);
}

// Creates (or truncates) PATH and writes a line to it; leaves it there for the test to inspect.
void WriteOne(const char* path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    PrintAt("write", path, ErrName(errno));
    return;
  }
  const char kLine[] = "written by nsbox-probe\n";
  ssize_t n = write(fd, kLine, sizeof kLine - 1);
  int err = n < 0 ? errno : 0;
  if (close(fd) < 0 && err == 0) err = errno;
  PrintAt("write", path, ErrName(err));
}

// Opens PATH for writing without writing anything (for files such as /proc/sys/...). On procfs
// it adds O_TRUNC, which procfs ignores but which makes the kernel check the mount's read-only
// flag before the file's permissions (fs/namei.c, do_open): a read-only /proc/sys then answers
// EROFS even for a sysctl the caller could not write anyway. Never O_TRUNC elsewhere: that would
// empty a real file.
void OpenWriteOne(const char* path) {
  int flags = O_WRONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  struct statfs fs;
  if (statfs(path, &fs) == 0 && fs.f_type == PROC_SUPER_MAGIC) flags |= O_TRUNC;
  int fd = open(path, flags);
  PrintAt("openw", path, fd < 0 ? ErrName(errno) : "0");
  if (fd >= 0) close(fd);
}

void StatOne(const char* path) {
  struct stat st;
  if (lstat(path, &st) < 0) {
    PrintAt("stat", path, ErrName(errno));
    return;
  }
  PrintAt("stat", path, "0");
  PrintLongAt("stat.uid", path, st.st_uid);
  PrintLongAt("stat.gid", path, st.st_gid);
  char mode[16];
  snprintf(mode, sizeof mode, "%o", static_cast<unsigned>(st.st_mode));
  PrintAt("stat.mode", path, mode);
  PrintLongAt("stat.size", path, st.st_size);
}

// Reads at most 1 MiB of PATH: the errno (0) and the byte count.
void ReadOne(const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    PrintAt("read", path, ErrName(errno));
    return;
  }
  static char buf[1 << 20];
  size_t total = 0;
  int err = 0;
  while (total < sizeof buf) {
    ssize_t n = read(fd, buf + total, sizeof buf - total);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = errno;
      break;
    }
    if (n == 0) break;
    total += static_cast<size_t>(n);
  }
  close(fd);
  PrintAt("read", path, ErrName(err));
  PrintLongAt("read.bytes", path, static_cast<long>(total));
  // The first line, with anything unprintable replaced by '?'.
  char line[256];
  size_t n = 0;
  for (; n < total && n + 1 < sizeof line && buf[n] != '\n'; ++n) {
    line[n] = (buf[n] >= 0x20 && buf[n] < 0x7f) ? buf[n] : '?';
  }
  line[n] = '\0';
  PrintAt("read.line1", path, line);
}

// The entries of DIR without . and .., sorted and comma-separated.
void ListOne(const char* path) {
  DIR* d = opendir(path);
  if (d == nullptr) {
    PrintAt("list", path, ErrName(errno));
    return;
  }
  static char names[512][256];
  size_t n = 0;
  while (struct dirent* e = readdir(d)) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (n < 512) snprintf(names[n++], sizeof names[0], "%s", e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof names[0], [](const void* a, const void* b) {
    return strcmp(static_cast<const char*>(a), static_cast<const char*>(b));
  });
  PrintAt("list", path, "0");
  printf("list.entries[%s]=", path);
  for (size_t i = 0; i < n; ++i) printf(i == 0 ? "%s" : ",%s", names[i]);
  printf("\n");
  fflush(stdout);
}

int ForEachPath(int argc, char** argv, void (*fn)(const char*)) {
  for (int i = 0; i < argc; ++i) fn(argv[i]);
  return 0;
}

// mount.<mount point>=<fstype> <per-mount options> from /proc/self/mountinfo.
int CmdMounts() {
  FILE* f = fopen("/proc/self/mountinfo", "re");
  if (f == nullptr) {
    Print("mounts", ErrName(errno));
    return 0;
  }
  char line[4096];
  while (fgets(line, sizeof line, f) != nullptr) {
    // id parent major:minor root mountpoint options [optional...] - fstype source superopts
    char root[1024], point[1024], opts[512], fstype[128];
    int id = 0, parent = 0;
    unsigned major = 0, minor = 0;
    if (sscanf(line, "%d %d %u:%u %1023s %1023s %511s", &id, &parent, &major, &minor, root, point,
               opts) != 7) {
      continue;
    }
    const char* dash = strstr(line, " - ");
    if (dash == nullptr || sscanf(dash + 3, "%127s", fstype) != 1) continue;
    printf("mount.%s=%s %s\n", point, fstype, opts);
  }
  fclose(f);
  fflush(stdout);
  return 0;
}

// TIOCSTI on a pty pair of the probe's own (harmless anywhere: the character goes to a terminal
// nobody reads), and with --stdin on fd 0 (only in a jail): TIOCSTI and TIOCLINUX.
int CmdTiocsti(bool on_stdin) {
  const char c = '\n';
  if (on_stdin) {
    if (int rc = RefuseOnHost("tiocsti --stdin")) return rc;
    Print("tiocsti.stdin_isatty", isatty(STDIN_FILENO) ? "1" : "0");
    Print("tiocsti.stdin", Outcome(ioctl(STDIN_FILENO, TIOCSTI, &c)));
    // TIOCLINUX subcode 6 (TIOCL_GETSHIFTSTATE) only reads; on a pty it is ENOTTY unfiltered.
    char subcode = 6;
    Print("tioclinux.stdin", Outcome(ioctl(STDIN_FILENO, TIOCLINUX, &subcode)));
  }
  int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) {
    Print("tiocsti.pty", ErrName(errno));
    return 0;
  }
  const char* slave_name = nullptr;
  int slave = -1;
  if (grantpt(master) == 0 && unlockpt(master) == 0 && (slave_name = ptsname(master)) != nullptr) {
    slave = open(slave_name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  }
  if (slave < 0) {
    Print("tiocsti.pty", ErrName(errno));
  } else {
    Print("tiocsti.pty", Outcome(ioctl(slave, TIOCSTI, &c)));
    close(slave);
  }
  close(master);
  return 0;
}

pid_t g_children[65536];

// Forks children that wait until fork fails, then kills them all.
int CmdForkbomb() {
  if (int rc = RefuseOnHost("forkbomb")) return rc;
  size_t n = 0;
  int err = 0;
  while (n < sizeof g_children / sizeof g_children[0]) {
    pid_t pid = fork();
    if (pid < 0) {
      err = errno;
      break;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
      for (;;) pause();
    }
    g_children[n++] = pid;
  }
  PrintLong("forks", static_cast<long>(n));
  Print("fork_errno", ErrName(err));
  for (size_t i = 0; i < n; ++i) kill(g_children[i], SIGKILL);
  size_t reaped = 0;
  for (size_t i = 0; i < n; ++i) {
    if (waitpid(g_children[i], nullptr, 0) == g_children[i]) ++reaped;
  }
  PrintLong("reaped", static_cast<long>(reaped));
  return 0;
}

// Allocates and touches MB mebibytes, 1 MiB at a time.
int CmdMemhog(const char* mb_text) {
  long mb = strtol(mb_text, nullptr, 10);
  if (mb <= 0 || mb > 65536) {
    Print("memhog", "EINVAL");
    return 2;
  }
  for (long i = 1; i <= mb; ++i) {
    char* p = static_cast<char*>(malloc(1 << 20));
    if (p == nullptr) {
      Print("memhog", ErrName(errno));
      return 1;
    }
    memset(p, static_cast<int>(i), 1 << 20);
    // The pages must be written: an allocation nothing reads is one a compiler may drop (clang
    // does), and the bomb would then never reach the limit. The empty asm makes them used.
    __asm__ volatile("" : : "r"(p) : "memory");
    if (i % 16 == 0) PrintLong("memhog.mb", i);
  }
  Print("memhog", "done");
  return 0;
}

// Escape attempts. On the host each succeeds harmlessly: the mount is on a temp dir of the
// probe's own and undone at once, unshare/chroot/setns happen in a child that exits.
int CmdEscape() {
  char dir[] = "/tmp/nsbox-probe-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    Print("escape.mount", ErrName(errno));
  } else {
    int rc = mount("tmpfs", dir, "tmpfs", 0, "size=16k");
    Print("escape.mount", rc < 0 ? ErrName(errno) : "0");
    if (rc == 0) umount2(dir, MNT_DETACH);
    rmdir(dir);
  }
  Print("escape.unshare_user", InChild([] { return ErrnoOf(unshare(CLONE_NEWUSER)); }));
  Print("escape.unshare_mount", InChild([] { return ErrnoOf(unshare(CLONE_NEWNS)); }));
  Print("escape.chroot", InChild([] { return ErrnoOf(chroot("/tmp")); }));
  // setns into the probe's own mount namespace: allowed to root on the host (in a child), and
  // refused in the jail whatever the namespace.
  Print("escape.setns_mnt", InChild([] {
          int fd = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
          if (fd < 0) return errno;
          return ErrnoOf(setns(fd, CLONE_NEWNS));
        }));
  // PID 1's namespaces: nsbox-init is not the probe's to inspect.
  int ns = open("/proc/1/ns/mnt", O_RDONLY | O_CLOEXEC);
  Print("escape.open_proc1_ns", ns < 0 ? ErrName(errno) : "0");
  if (ns >= 0) close(ns);
  int fd = open("/proc/1/root/etc/shadow", O_RDONLY | O_CLOEXEC);
  Print("escape.proc1_shadow", fd < 0 ? ErrName(errno) : "0");
  if (fd >= 0) close(fd);
  fd = open("/etc/shadow", O_RDONLY | O_CLOEXEC);
  Print("escape.shadow", fd < 0 ? ErrName(errno) : "0");
  if (fd >= 0) close(fd);
  // A block device node for the host's first disk: needs CAP_MKNOD in the initial user namespace.
  char node[] = "/tmp/nsbox-probe-node-XXXXXX";
  int tmp = mkstemp(node);
  if (tmp >= 0) {
    close(tmp);
    unlink(node);
    int rc = mknod(node, S_IFBLK | 0600, makedev(8, 0));
    Print("escape.mknod", rc < 0 ? ErrName(errno) : "0");
    if (rc == 0) unlink(node);
  }
  return 0;
}

// Signals PID 1 from inside: a pid namespace's init ignores what it has no handler for, and
// SIGKILL from inside is always ignored (pid_namespaces(7)).
int CmdSignalInit() {
  if (int rc = RefuseOnHost("signal-init")) return rc;
  struct timespec pause_ts = {0, 200 * 1000 * 1000};
  Print("kill.TERM", kill(1, SIGTERM) < 0 ? ErrName(errno) : "0");
  nanosleep(&pause_ts, nullptr);
  Print("kill.KILL", kill(1, SIGKILL) < 0 ? ErrName(errno) : "0");
  nanosleep(&pause_ts, nullptr);
  Print("init_alive", kill(1, 0) == 0 ? "1" : ErrName(errno));
  Print("alive", "1");
  return 0;
}

int Usage() {
  fprintf(stderr,
          "usage: nsbox-probe status | syscalls [NAME...] | mounts | escape | tiocsti [--stdin]\n"
          "       | write PATH... | openw PATH... | stat PATH... | read PATH... | list DIR...\n"
          "       | forkbomb | memhog MB | signal-init\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const char* cmd = argv[1];
  if (strcmp(cmd, "status") == 0) return CmdStatus();
  if (strcmp(cmd, "syscalls") == 0) return CmdSyscalls(argc - 2, argv + 2);
  if (strcmp(cmd, "mounts") == 0) return CmdMounts();
  if (strcmp(cmd, "tiocsti") == 0) {
    return CmdTiocsti(argc > 2 && strcmp(argv[2], "--stdin") == 0);
  }
  if (strcmp(cmd, "forkbomb") == 0) return CmdForkbomb();
  if (strcmp(cmd, "escape") == 0) return CmdEscape();
  if (strcmp(cmd, "signal-init") == 0) return CmdSignalInit();
  if (argc < 3) return Usage();
  if (strcmp(cmd, "write") == 0) return ForEachPath(argc - 2, argv + 2, WriteOne);
  if (strcmp(cmd, "openw") == 0) return ForEachPath(argc - 2, argv + 2, OpenWriteOne);
  if (strcmp(cmd, "stat") == 0) return ForEachPath(argc - 2, argv + 2, StatOne);
  if (strcmp(cmd, "read") == 0) return ForEachPath(argc - 2, argv + 2, ReadOne);
  if (strcmp(cmd, "list") == 0) return ForEachPath(argc - 2, argv + 2, ListOne);
  if (strcmp(cmd, "memhog") == 0) return CmdMemhog(argv[2]);
  return Usage();
}

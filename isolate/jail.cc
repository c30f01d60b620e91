#include "isolate/jail.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/close_range.h>
#include <linux/sched.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "base/files.h"
#include "base/syscalls.h"

namespace nsbox::isolate {

namespace {

// The steps of the child, reported by number so that the child needs no strings.
enum class Step : uint32_t {
  kWaitForParent = 1,
  kSetgroups,
  kSetgid,
  kSetuid,
  kUnshareCgroup,
  kMounts,
  kHostname,
  kLoopback,
  kDumpable,
  kChdir,
  kOpenPty,
  kSendPty,
  kSignals,
  kSpawn,
  kSetsid,
  kControllingTty,
  kStdio,
  kRlimit,
  kNoNewPrivs,
  kCapabilities,
  kSeccomp,
  kExec,
  kInitCgroup,
  kExecInit,
};

const char* StepName(Step step) {
  switch (step) {
    case Step::kWaitForParent:
      return "wait for the parent";
    case Step::kSetgroups:
      return "setgroups([])";
    case Step::kSetgid:
      return "setresgid(0, 0, 0)";
    case Step::kSetuid:
      return "setresuid(0, 0, 0)";
    case Step::kUnshareCgroup:
      return "unshare(CLONE_NEWCGROUP)";
    case Step::kMounts:
      return "mount plan";
    case Step::kHostname:
      return "sethostname";
    case Step::kLoopback:
      return "bring loopback up";
    case Step::kDumpable:
      return "prctl(PR_SET_DUMPABLE, 0)";
    case Step::kChdir:
      return "chdir";
    case Step::kOpenPty:
      return "open /dev/ptmx";
    case Step::kSendPty:
      return "send the terminal to the host";
    case Step::kSignals:
      return "signal set-up";
    case Step::kSpawn:
      return "clone the command";
    case Step::kSetsid:
      return "setsid";
    case Step::kControllingTty:
      return "ioctl(TIOCSCTTY)";
    case Step::kStdio:
      return "dup2 the terminal onto stdio";
    case Step::kRlimit:
      return "setrlimit";
    case Step::kNoNewPrivs:
      return "prctl(PR_SET_NO_NEW_PRIVS)";
    case Step::kCapabilities:
      return "drop capabilities";
    case Step::kSeccomp:
      return "load the seccomp filter";
    case Step::kExec:
      return "execve";
    case Step::kInitCgroup:
      return "move into the init cgroup";
    case Step::kExecInit:
      return "execute nsbox-init";
  }
  return "unknown step";
}

enum class ReportKind : uint32_t { kSetupError = 1, kTtyMaster = 2, kStarted = 3, kExecFailed = 4 };

struct Report {
  ReportKind kind;
  Step step;
  int32_t err;
  uint32_t index;  // mount plan op for kMounts
};

struct Go {
  uint32_t magic;
  struct winsize winsize;
};
constexpr uint32_t kGoMagic = 0x6e73626f;  // "nsbo"

// What the child needs, laid out before clone so the child only reads memory and calls the
// kernel (conventions.md: no allocation between clone and execve).
struct ChildPlan {
  const JailSpec* spec;
  int sync_fd;
  int control_fd = -1;  // init mode: the jail's end of the control channel
  std::vector<const char*> init_argv;
  std::vector<const char*> argv;
  std::vector<const char*> envp;
  std::vector<char> command_stack;
  sigset_t forwarded;  // signals PID 1 forwards to the command
};

// The result slot the command child writes before it dies, read by PID 1 (shared memory:
// the command is cloned with CLONE_VM|CLONE_VFORK, so PID 1 resumes only after exec or exit).
struct SpawnResult {
  Step step;
  int err;
};

struct CommandArgs {
  const ChildPlan* plan;
  int tty_slave;
  SpawnResult* result;
};

[[noreturn]] void ChildFail(int sync_fd, Step step, int err, uint32_t index = 0) {
  Report r{ReportKind::kSetupError, step, err, index};
  // Nothing to do if the parent is gone: it reports the child's death instead.
  (void)::send(sync_fd, &r, sizeof r, MSG_NOSIGNAL);
  ::_exit(kExitSetupFailed);
}

int BringLoopbackUp() {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  struct ifreq ifr {};
  std::memcpy(ifr.ifr_name, "lo", 3);
  int err = 0;
  if (::ioctl(fd, SIOCGIFFLAGS, &ifr) < 0) {
    err = errno;
  } else {
    ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
    if (::ioctl(fd, SIOCSIFFLAGS, &ifr) < 0) err = errno;
  }
  ::close(fd);
  return err;
}

// The command: runs in PID 1's memory until execve (CLONE_VM|CLONE_VFORK), so it must only
// write to its own stack and the result slot.
int CommandMain(void* arg) {
  auto* args = static_cast<CommandArgs*>(arg);
  const ChildPlan& plan = *args->plan;
  const JailSpec& spec = *plan.spec;
  auto fail = [&](Step step, int err) {
    args->result->step = step;
    args->result->err = err;
    ::_exit(kExitSetupFailed);
  };

  // Its own session and process group: a kill of the group reaches everything it starts, and no
  // terminal of the host is its controlling terminal (CVE-2017-5226: TIOCSTI).
  if (::setsid() < 0) fail(Step::kSetsid, errno);
  if (args->tty_slave >= 0) {
    if (::ioctl(args->tty_slave, TIOCSCTTY, 0) < 0) fail(Step::kControllingTty, errno);
    for (int fd = 0; fd < 3; ++fd) {
      if (::dup2(args->tty_slave, fd) < 0) fail(Step::kStdio, errno);
    }
  }
  sigset_t empty;
  sigemptyset(&empty);
  if (::sigprocmask(SIG_SETMASK, &empty, nullptr) < 0) fail(Step::kSignals, errno);
  for (const auto& [resource, limit] : spec.rlimits) {
    if (::setrlimit(static_cast<__rlimit_resource>(resource), &limit) < 0) {
      fail(Step::kRlimit, errno);
    }
  }
  ::umask(022);
  // Every fd but stdio goes: nothing of nsbox or of the host reaches the command
  // (CVE-2024-21626 leaked a host directory fd this way).
  if (sys::CloseRange(3, ~0U, 0) < 0) fail(Step::kStdio, errno);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) fail(Step::kNoNewPrivs, errno);
  if (spec.capabilities != nullptr) {
    int err = ApplyCapabilities(*spec.capabilities);
    if (err != 0) fail(Step::kCapabilities, err);
  }
  // Last before execve: the filter would otherwise have to allow what the set-up above needs.
  if (spec.seccomp != nullptr) {
    int err = LoadSeccomp(*spec.seccomp);
    if (err != 0) fail(Step::kSeccomp, err);
  }
  int exec_err = ENOENT;
  bool saw_eacces = false;
  for (const auto& candidate : spec.exec_candidates) {
    ::execve(candidate.c_str(), const_cast<char* const*>(plan.argv.data()),
             const_cast<char* const*>(plan.envp.data()));
    exec_err = errno;
    if (exec_err == EACCES) saw_eacces = true;
    // As execvp: keep searching past a missing or unusable entry, stop at anything else.
    if (exec_err != ENOENT && exec_err != ENOTDIR && exec_err != EACCES) break;
  }
  if (saw_eacces && (exec_err == ENOENT || exec_err == ENOTDIR)) exec_err = EACCES;
  args->result->step = Step::kExec;
  args->result->err = exec_err;
  ::_exit(exec_err == EACCES ? kExitNotExecutable : kExitNotFound);
}

// Init mode: PID 1 becomes nsbox-init. Never returns.
[[noreturn]] void ExecInit(const ChildPlan& plan, int held_dir) {
  const JailSpec& spec = *plan.spec;
  // The sync socket first goes above the numbers nsbox-init's fds are given (3-7): one of them
  // dup2'ed over it would close it early, and the host would read that as "started".
  int sync = ::fcntl(plan.sync_fd, F_DUPFD_CLOEXEC, 10);
  if (sync < 0) ChildFail(plan.sync_fd, Step::kStdio, errno);
  constexpr int kControlFd = 3;
  constexpr int kCgroupFd = 4;
  if (spec.cgroup_v2_fd >= 0) {
    // Its own leaf, made now that the cgroup namespace is rooted at the jail's directory (a
    // migration outside the namespace's root would be refused).
    if (::mkdirat(spec.cgroup_v2_fd, "init", 0755) < 0 && errno != EEXIST) {
      ChildFail(sync, Step::kInitCgroup, errno);
    }
    int procs = ::openat(spec.cgroup_v2_fd, "init/cgroup.procs", O_WRONLY | O_CLOEXEC);
    if (procs < 0) ChildFail(sync, Step::kInitCgroup, errno);
    if (::write(procs, "0", 1) != 1) ChildFail(sync, Step::kInitCgroup, errno);
    ::close(procs);
  }
  // Move the fds nsbox-init is given to their numbers, above anything they might sit on.
  int control = ::fcntl(plan.control_fd, F_DUPFD_CLOEXEC, 10);
  int cgroup = spec.cgroup_v2_fd >= 0 ? ::fcntl(spec.cgroup_v2_fd, F_DUPFD_CLOEXEC, 10) : -1;
  int binary = ::fcntl(spec.init_fd, F_DUPFD_CLOEXEC, 10);
  if (control < 0 || binary < 0 || (spec.cgroup_v2_fd >= 0 && cgroup < 0)) {
    ChildFail(sync, Step::kStdio, errno);
  }
  constexpr int kMemoryCgroupFd = 5;
  constexpr int kPidsCgroupFd = 6;
  int memory_v1 = -1;
  int pids_v1 = -1;
  if (spec.cgroup_v1_memory_fd >= 0) {
    memory_v1 = ::fcntl(spec.cgroup_v1_memory_fd, F_DUPFD_CLOEXEC, 10);
    if (memory_v1 < 0) ChildFail(sync, Step::kStdio, errno);
  }
  if (spec.cgroup_v1_pids_fd >= 0) {
    pids_v1 = ::fcntl(spec.cgroup_v1_pids_fd, F_DUPFD_CLOEXEC, 10);
    if (pids_v1 < 0) ChildFail(sync, Step::kStdio, errno);
  }
  int own_etc = -1;
  if (held_dir >= 0) {
    own_etc = ::fcntl(held_dir, F_DUPFD_CLOEXEC, 10);
    if (own_etc < 0) ChildFail(sync, Step::kStdio, errno);
  }
  int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null < 0) ChildFail(sync, Step::kStdio, errno);
  // stdin and stdout lead nowhere; stderr stays the host side's, for nsbox-init's log.
  if (::dup2(null, 0) < 0 || ::dup2(null, 1) < 0 || ::dup2(control, kControlFd) < 0) {
    ChildFail(sync, Step::kStdio, errno);
  }
  if (cgroup >= 0 && ::dup2(cgroup, kCgroupFd) < 0) ChildFail(sync, Step::kStdio, errno);
  // Everything else closes at exec: no fd of the host reaches the jail (CVE-2024-21626). The v1
  // directories and the held one are dup2'ed after it, which leaves them open across the exec.
  if (sys::CloseRange(5, ~0U, CLOSE_RANGE_CLOEXEC) < 0) ChildFail(sync, Step::kStdio, errno);
  if (memory_v1 >= 0 && ::dup2(memory_v1, kMemoryCgroupFd) < 0) {
    ChildFail(sync, Step::kStdio, errno);
  }
  if (pids_v1 >= 0 && ::dup2(pids_v1, kPidsCgroupFd) < 0) ChildFail(sync, Step::kStdio, errno);
  if (own_etc >= 0 && ::dup2(own_etc, kInitOwnEtcFd) < 0) ChildFail(sync, Step::kStdio, errno);
  char* const empty_env[] = {nullptr};
  // On success the sync socket closes with the exec (CLOEXEC): the host reads that as "started".
  ::syscall(SYS_execveat, binary, "", const_cast<char* const*>(plan.init_argv.data()), empty_env,
            AT_EMPTY_PATH);
  ChildFail(sync, Step::kExecInit, errno);
}

// PID 1 of the jail. Never returns.
[[noreturn]] void InitMain(const ChildPlan& plan) {
  const JailSpec& spec = *plan.spec;
  int sync = plan.sync_fd;

  // Die with the host side (it holds the cgroups and the terminal).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  Go go{};
  ssize_t n;
  do {
    n = ::recv(sync, &go, sizeof go, 0);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof go) || go.magic != kGoMagic) {
    ChildFail(sync, Step::kWaitForParent, n < 0 ? errno : EPIPE);
  }

  // The maps are written: become root of the new user namespace, with no host groups.
  // SAFETY: raw syscalls, not glibc's wrappers: those broadcast the change to every thread glibc
  // believes the process has (__nptl_setxid), and a child cloned from a multi-threaded parent
  // (nsboxd's worker pool) would wait forever for threads that exist only in the parent. The
  // kernel calls change this one thread, which is the whole child.
  if (::syscall(SYS_setgroups, 0, nullptr) < 0) ChildFail(sync, Step::kSetgroups, errno);
  if (::syscall(SYS_setresgid, 0, 0, 0) < 0) ChildFail(sync, Step::kSetgid, errno);
  if (::syscall(SYS_setresuid, 0, 0, 0) < 0) ChildFail(sync, Step::kSetuid, errno);
  // Now that the parent has placed us in our cgroups, they become the root of our view.
  if (::unshare(CLONE_NEWCGROUP) < 0) ChildFail(sync, Step::kUnshareCgroup, errno);

  size_t failed_op = 0;
  int held_dir = -1;  // close-on-exec: only nsbox-init keeps it (ExecInit)
  int err = ApplyMountPlan(spec.mounts, &failed_op, &held_dir);
  if (err != 0) ChildFail(sync, Step::kMounts, err, static_cast<uint32_t>(failed_op));

  if (::sethostname(spec.hostname.data(), spec.hostname.size()) < 0) {
    ChildFail(sync, Step::kHostname, errno);
  }
  err = BringLoopbackUp();
  if (err != 0) ChildFail(sync, Step::kLoopback, err);
  // Not dumpable: its /proc entries belong to the host's root, so no command can read its
  // memory, fds or environment (CVE-2016-9962).
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) ChildFail(sync, Step::kDumpable, errno);
  if (::chdir(spec.cwd.c_str()) < 0) ChildFail(sync, Step::kChdir, errno);

  if (spec.init_fd >= 0) ExecInit(plan, held_dir);

  int tty_slave = -1;
  if (spec.tty) {
    int master = ::open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0) ChildFail(sync, Step::kOpenPty, errno);
    int unlock = 0;
    if (::ioctl(master, TIOCSPTLCK, &unlock) < 0) ChildFail(sync, Step::kOpenPty, errno);
    if (::ioctl(master, TIOCSWINSZ, &go.winsize) < 0) ChildFail(sync, Step::kOpenPty, errno);
    tty_slave = ::ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (tty_slave < 0) ChildFail(sync, Step::kOpenPty, errno);
    Report r{ReportKind::kTtyMaster, Step::kSendPty, 0, 0};
    struct iovec iov {
      &r, sizeof r
    };
    struct msghdr msg {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    sys::FdControl control;
    sys::AttachFd(&msg, &control, master);
    if (::sendmsg(sync, &msg, MSG_NOSIGNAL) < 0) ChildFail(sync, Step::kSendPty, errno);
    ::close(master);
  }

  // Start the command. CLONE_VFORK: we resume once it has exec'd or failed, and read its result.
  SpawnResult result{Step::kExec, 0};
  CommandArgs args{&plan, tty_slave, &result};
  char* stack_top = const_cast<char*>(plan.command_stack.data()) + plan.command_stack.size();
  pid_t cmd = ::clone(CommandMain, stack_top, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
  if (cmd < 0) ChildFail(sync, Step::kSpawn, errno);
  if (tty_slave >= 0) ::close(tty_slave);
  if (result.err != 0 && result.step != Step::kExec) {
    int status;
    ::waitpid(cmd, &status, 0);
    ChildFail(sync, result.step, result.err);
  }
  Report started{result.err != 0 ? ReportKind::kExecFailed : ReportKind::kStarted, Step::kExec,
                 result.err, 0};
  (void)::send(sync, &started, sizeof started, MSG_NOSIGNAL);
  ::close(sync);

  // The tiny init: reap every child (orphans are re-parented to us), forward the host's signals
  // to the command's process group, and leave with the command's status. Our exit then makes the
  // kernel kill whatever else runs in the namespace.
  sigset_t wait_set = plan.forwarded;
  sigaddset(&wait_set, SIGCHLD);
  for (;;) {
    siginfo_t info{};
    int sig = ::sigwaitinfo(&wait_set, &info);
    if (sig < 0) continue;  // EINTR
    if (sig != SIGCHLD) {
      // si_pid is 0 for a sender outside our PID namespace (the host side); a process inside
      // cannot make PID 1 forward signals for it. The group id stays valid while the group has
      // members, so it cannot name another process group.
      if (info.si_pid == 0) ::kill(-cmd, sig);
      continue;
    }
    int status = 0;
    pid_t reaped;
    while ((reaped = ::waitpid(-1, &status, WNOHANG)) > 0) {
      if (reaped != cmd) continue;
      if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
      ::_exit(128 + WTERMSIG(status));
    }
  }
}

Status WriteIdMaps(pid_t pid, const IdMapping& ids) {
  std::string proc = "/proc/" + std::to_string(pid);
  NSBOX_TRY_CTX(WriteExistingFileAt(AT_FDCWD, proc + "/uid_map", IdMapText(ids.uid)),
                "write the uid map");
  NSBOX_TRY_CTX(WriteExistingFileAt(AT_FDCWD, proc + "/gid_map", IdMapText(ids.gid)),
                "write the gid map");
  return Ok();
}

Result<UniqueFd> ReceiveFd(int sock, Report* report) {
  struct iovec iov {
    report, sizeof *report
  };
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Error::Sys("recvmsg", "jail sync socket", errno);
  if (n == 0) return UniqueFd();
  if (static_cast<size_t>(n) != sizeof *report) {
    return Error::Msg("jail sync socket: short report of " + std::to_string(n) + " bytes");
  }
  struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  if (cmsg != nullptr && cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS) {
    int fd;
    std::memcpy(&fd, CMSG_DATA(cmsg), sizeof fd);
    return UniqueFd(fd);
  }
  return UniqueFd();
}

}  // namespace

Result<Jail> Jail::Start(const JailSpec& spec) {
  bool init_mode = spec.init_fd >= 0;
  if (!init_mode && (spec.argv.empty() || spec.exec_candidates.empty())) {
    return Error::Msg("no command to run");
  }
  if (init_mode && spec.init_argv.empty()) return Error::Msg("no argv for nsbox-init");

  ChildPlan plan;
  plan.spec = &spec;
  for (const auto& a : spec.argv) plan.argv.push_back(a.c_str());
  plan.argv.push_back(nullptr);
  for (const auto& e : spec.env) plan.envp.push_back(e.c_str());
  plan.envp.push_back(nullptr);
  plan.command_stack.resize(64 * 1024);
  sigemptyset(&plan.forwarded);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) {
    sigaddset(&plan.forwarded, sig);
  }

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
    return Error::Sys("socketpair", "jail sync", errno);
  }
  UniqueFd parent_end(sv[0]);
  UniqueFd child_end(sv[1]);
  plan.sync_fd = child_end.get();
  UniqueFd control_host, control_jail;
  if (init_mode) {
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
      return Error::Sys("socketpair", "control channel", errno);
    }
    control_host.reset(sv[0]);
    control_jail.reset(sv[1]);
    plan.control_fd = control_jail.get();
    for (const auto& a : spec.init_argv) plan.init_argv.push_back(a.c_str());
    plan.init_argv.push_back(nullptr);
  }

  // PID 1 blocks the signals it forwards and waits for them with sigwaitinfo; blocked from birth
  // so that none is lost between clone and its loop. Its dispositions are reset to the default
  // there, so the command inherits nothing the caller ignored.
  sigset_t init_mask = plan.forwarded;
  sigaddset(&init_mask, SIGCHLD);
  sigset_t saved_mask;
  ::sigprocmask(SIG_BLOCK, &init_mask, &saved_mask);

  constexpr uint64_t kNamespaces =
      CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS;
  struct clone_args args {};
  int pidfd = -1;
  args.flags = kNamespaces | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  bool joined_v2 = false;
  if (spec.cgroup_v2_fd >= 0) {
    args.flags |= CLONE_INTO_CGROUP;
    args.cgroup = static_cast<uint64_t>(spec.cgroup_v2_fd);
    joined_v2 = true;
  }
  // SAFETY: a fork-like clone3 (no CLONE_VM, no stack): the child runs on a copy of our memory
  // and only reads the plan and calls the kernel before it execs or exits.
  long pid = sys::Clone3(&args, sizeof args);
  if (pid < 0 && (errno == ENOSYS || errno == E2BIG || errno == EINVAL) && spec.cgroup_v2_fd >= 0) {
    // Kernels before 5.7 have clone3 without CLONE_INTO_CGROUP: join the v2 cgroup by pid.
    args.flags &= ~static_cast<uint64_t>(CLONE_INTO_CGROUP);
    args.cgroup = 0;
    joined_v2 = false;
    pid = sys::Clone3(&args, sizeof args);
  }
  if (pid < 0 && errno == ENOSYS) {
    // Kernels before 5.3: the classic clone, fork-like, and a pidfd opened afterwards.
    // SAFETY: as above; the child does not return into our frames' callers.
    pid = ::syscall(SYS_clone, kNamespaces | SIGCHLD, nullptr, nullptr, nullptr, nullptr);
    pidfd = -2;
  }
  if (pid < 0) {
    int err = errno;
    ::sigprocmask(SIG_SETMASK, &saved_mask, nullptr);
    return Error::Sys("clone3", "new namespaces", err).Context("start the jail");
  }
  if (pid == 0) {
    // The child: PID 1 of the new namespaces.
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
    }
    ::close(parent_end.get());
    InitMain(plan);
  }
  ::sigprocmask(SIG_SETMASK, &saved_mask, nullptr);
  child_end.reset();
  control_jail.reset();

  Jail jail;
  if (pidfd == -2) {
    int fd = sys::PidfdOpen(static_cast<pid_t>(pid), 0);
    if (fd < 0) {
      int err = errno;
      ::kill(static_cast<pid_t>(pid), SIGKILL);  // our unreaped child: the pid cannot be reused
      ::waitpid(static_cast<pid_t>(pid), nullptr, 0);
      return Error::Sys("pidfd_open", std::to_string(pid), err).Context("start the jail");
    }
    pidfd = fd;
  }
  jail.init_ = ChildProcess(static_cast<pid_t>(pid), UniqueFd(pidfd));

  NSBOX_TRY_CTX(WriteIdMaps(static_cast<pid_t>(pid), spec.ids), "start the jail");
  if (spec.place_in_cgroups) {
    NSBOX_TRY_CTX(spec.place_in_cgroups(static_cast<pid_t>(pid), joined_v2), "start the jail");
  }
  Go go{kGoMagic, {spec.tty_rows, spec.tty_cols, 0, 0}};
  if (::send(parent_end.get(), &go, sizeof go, MSG_NOSIGNAL) < 0) {
    return Error::Sys("send", "jail sync socket", errno).Context("start the jail");
  }

  for (;;) {
    Report report{};
    NSBOX_ASSIGN_OR_RETURN(UniqueFd fd, ReceiveFd(parent_end.get(), &report));
    if (report.kind == ReportKind{} && init_mode) {
      // EOF without a report: in init mode, the exec of nsbox-init closed the sync socket, unless
      // PID 1 died.
      ExitStatus st;
      auto exited = jail.init_.TryWait(&st);
      if (exited.ok() && !*exited) {
        jail.control_ = std::move(control_host);
        return jail;
      }
    }
    if (report.kind == ReportKind{}) {
      // EOF without a report: PID 1 died (killed from outside, or the OOM killer).
      auto st = jail.init_.Wait();
      std::string how = st.ok() ? (st->signaled ? "killed by signal " + std::to_string(st->signal)
                                                : "exited with " + std::to_string(st->code))
                                : st.error().message();
      return Error::Msg("start the jail: the jail's init died during set-up (" + how + ")");
    }
    switch (report.kind) {
      case ReportKind::kTtyMaster:
        if (!fd.valid()) return Error::Msg("start the jail: the terminal was not passed");
        jail.tty_master_ = std::move(fd);
        continue;
      case ReportKind::kStarted:
        return jail;
      case ReportKind::kExecFailed:
        jail.exec_error_ = report.err;
        return jail;
      case ReportKind::kSetupError: {
        std::string what = StepName(report.step);
        if (report.step == Step::kMounts && report.index < spec.mounts.ops.size()) {
          what += " step " + std::to_string(report.index) + " (" +
                  spec.mounts.ops[report.index].Describe() + ")";
        } else if (report.step == Step::kChdir) {
          what += " " + spec.cwd;
        }
        (void)jail.init_.Wait();
        return Error(report.err, "set up the jail: " + what + ": " + ErrnoText(report.err));
      }
    }
    return Error::Msg("start the jail: unknown report from the jail's init");
  }
}

}  // namespace nsbox::isolate

#include "exec/spawn.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/sched.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "base/files.h"
#include "base/syscalls.h"

namespace nsbox::exec {
namespace {

std::atomic<bool> g_force_clone_fallback{false};
std::atomic<bool> g_force_no_cgroup_kill{false};

// A warm child's stack (WarmChild): its steps and the pre_exec hook need a few KiB, all in the
// top pages, which are touched before the clone.
constexpr size_t kWarmStackSize = 64 * 1024;
constexpr size_t kWarmStackTouched = 16 * 1024;

// The child runs on a stack ASan knows nothing of, sharing the parent's memory and shadow
// (CLONE_VM). Instrumented child code would poison shadow bytes of that stack that nothing ever
// unpoisons (the child never returns), and ASan's fake stacks for use-after-return belong to the
// parent's thread. So the child's own functions are not instrumented, and they call the kernel
// through RawSyscall below rather than libc functions that ASan intercepts.
#define NSBOX_CHILD_CODE __attribute__((no_sanitize("address")))

// The child's calls to the kernel. A raw syscall that returns -errno and never writes errno:
// the warm child runs concurrently with the thread that made it and shares its TLS, where errno
// lives (CLONE_VM without CLONE_SETTLS). The vfork-like child uses it too, so that the steps
// both make are one code.
#if defined(__x86_64__)
NSBOX_CHILD_CODE inline long RawSyscall(long nr, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0,
                                        long a5 = 0) {
  long ret;
  register long r10 asm("r10") = a4;
  register long r8 asm("r8") = a5;
  // SAFETY: the caller's SAFETY comment names what the call does; syscall clobbers rcx and r11.
  asm volatile("syscall"
               : "=a"(ret)
               : "0"(nr), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8)
               : "rcx", "r11", "memory");
  return ret;
}
#else
// Only the vfork-like child runs elsewhere (WarmChild::Start refuses): its parent is suspended.
NSBOX_CHILD_CODE inline long RawSyscall(long nr, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0,
                                        long a5 = 0) {
  long ret = ::syscall(nr, a1, a2, a3, a4, a5);
  return ret < 0 ? -errno : ret;
}
#endif

template <typename T>
NSBOX_CHILD_CODE inline long Arg(T* pointer) {
  return static_cast<long>(reinterpret_cast<uintptr_t>(pointer));
}

struct ChildArgs {
  const SpawnRequest* request;
  int cgroup_procs_fd;  // -1 unless the clone() fallback: the child moves itself into the cgroup
  ChildReport* report;
};

// Shared with the parent through CLONE_VM: the vfork-like child writes it just before it exits,
// and the parent reads it once clone returns (CLONE_VFORK orders the two); a warm child's parent
// reads it once the child has exited. `ret` is the failed call's -errno.
[[noreturn]] NSBOX_CHILD_CODE void ChildFail(ChildReport* report, SpawnStep step, long ret,
                                             int exit_code) {
  report->step = step;
  report->err = ret < 0 ? static_cast<int>(-ret) : EIO;
  // SAFETY: exit_group ends only the child (it is its own thread group: no CLONE_THREAD); a
  // vfork-like child's parent, suspended by CLONE_VFORK, resumes.
  RawSyscall(SYS_exit_group, exit_code);
  __builtin_unreachable();
}

// Moves an fd that sits below `floor` to `floor` or above, so that the dup3 calls below never
// overwrite a source that is still needed, and never dup an fd onto itself (which would keep its
// CLOEXEC). The new fd, or -errno.
NSBOX_CHILD_CODE long MoveAbove(int fd, int floor) {
  if (fd >= floor) return fd;
  // SAFETY: F_DUPFD_CLOEXEC only creates a new fd in the child's own table; the copy is closed
  // by close_range below.
  return RawSyscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, floor);
}

// Closes every fd from `first` up; 0 or -errno.
NSBOX_CHILD_CODE long CloseFrom(int first) {
  // SAFETY: closes fds of the child's own table only (no CLONE_FILES: it has a copy).
  long ret = RawSyscall(SYS_close_range, first, ~0U, 0);
  if (ret != -ENOSYS) return ret;
  // Before 5.9: close each fd up to the limit.
  struct rlimit lim {};
  // SAFETY: prlimit64 with a NULL new limit only reads this process's limit into `lim`.
  ret = RawSyscall(SYS_prlimit64, 0, RLIMIT_NOFILE, 0, Arg(&lim));
  if (ret < 0) return ret;
  for (rlim_t fd = static_cast<rlim_t>(first); fd < lim.rlim_cur; ++fd) {
    // SAFETY: as above; EBADF for fds that are not open is expected and ignored.
    RawSyscall(SYS_close, static_cast<long>(fd));
  }
  return 0;
}

// Puts `fds` on 0, 1, ... count-1 of the child's own fd table (those from 3 up close-on-exec)
// and closes every other fd. Nothing of nsbox reaches the command: every fd but stdio goes
// (CVE-2024-21626 leaked a host directory fd this way), before the chdir: the child holds a copy
// of nsbox-init's fds (the host's cgroup directory among them), and a cwd of "/proc/self/fd/4"
// would otherwise put the command in a host directory outside the jail's root, from which ".."
// walks the host's tree (adversarial case ExecCwdThroughInitsFdsStaysInside).
NSBOX_CHILD_CODE void PlaceStdioCloseTheRest(const int* fds, int count, ChildReport* report) {
  long moved[4];
  for (int i = 0; i < count; ++i) {
    moved[i] = MoveAbove(fds[i], count);
    if (moved[i] < 0) ChildFail(report, SpawnStep::kStdio, moved[i], kExitNotStarted);
  }
  // SAFETY: dup3 onto 0..count-1 of the child's own fd table; sources are >= count so never
  // equal.
  for (long to = 0; to < count; ++to) {
    long ret = RawSyscall(SYS_dup3, moved[to], to, to >= 3 ? O_CLOEXEC : 0);
    if (ret < 0) ChildFail(report, SpawnStep::kStdio, ret, kExitNotStarted);
  }
  long closed = CloseFrom(count);
  if (closed < 0) ChildFail(report, SpawnStep::kCloseFds, closed, kExitNotStarted);
}

// The first steps of a command's child, those that do not depend on the command: its v1
// cgroups, its signal dispositions and its session.
NSBOX_CHILD_CODE void JoinCgroupsResetSignalsSetsid(const int (&join_procs_fds)[2],
                                                    uint64_t reset_signals, ChildReport* report) {
  // The v1 hierarchies (memory, pids) cannot be entered at clone time: the child moves itself,
  // before it runs anything of the command, so that all it forks is counted there too.
  for (int procs_fd : join_procs_fds) {
    if (procs_fd < 0) continue;
    // SAFETY: writes one byte from a string literal to an fd the parent opened for us.
    long ret = RawSyscall(SYS_write, procs_fd, Arg("0"), 1);
    if (ret != 1) ChildFail(report, SpawnStep::kCgroup, ret, kExitNotStarted);
  }

  // Default dispositions for every signal the parent does not leave at the default: handlers of
  // nsbox-init must never run in the child, and what it ignores (SIGPIPE) must not stay ignored
  // for the command. The kernel's sigaction for SIG_DFL with no flags and an empty mask is all
  // zero bytes, whatever the architecture's layout (handler, flags, [restorer], mask).
  alignas(8) unsigned char default_action[64] = {};
  for (int sig = 1; sig < 65; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    if ((reset_signals & (uint64_t{1} << (sig - 1))) == 0) continue;
    // SAFETY: rt_sigaction reads `default_action` (large enough for every layout) and changes
    // the child's own dispositions (no CLONE_SIGHAND); EINVAL for numbers the kernel does not
    // accept is ignored.
    RawSyscall(SYS_rt_sigaction, sig, Arg(default_action), 0, 8);
  }

  // Its own session and process group: a group kill reaches everything it starts, and no
  // terminal is its controlling terminal (CVE-2017-5226: TIOCSTI), but the fresh pty of a
  // terminal exec, below.
  // SAFETY: setsid only changes the calling process's session.
  long ret = RawSyscall(SYS_setsid);
  if (ret < 0) ChildFail(report, SpawnStep::kSetsid, ret, kExitNotStarted);
}

// A command is the OOM killer's choice before the server that runs it: tmpfs pages a command
// left behind stay charged after it died, and without this the next kill could pick nsbox-init
// and end the whole sandbox (case MemoryBombThroughTmpfsFromInside). Raising the score needs no
// privilege; best effort (a host without /proc/self/oom_score_adj just keeps the default). Then
// api.md's umask.
NSBOX_CHILD_CODE void RaiseOomScoreSetUmask() {
  // SAFETY: open/write/close of a /proc file of this process, with a literal path and buffer.
  long oom_fd =
      RawSyscall(SYS_openat, AT_FDCWD, Arg("/proc/self/oom_score_adj"), O_WRONLY | O_CLOEXEC);
  if (oom_fd >= 0) {
    RawSyscall(SYS_write, oom_fd, Arg("500"), 3);
    RawSyscall(SYS_close, oom_fd);
  }
  // SAFETY: umask only sets the child's file mode creation mask (api.md: umask 022).
  RawSyscall(SYS_umask, 022);
}

// The pre_exec hook (no_new_privs, rlimits, the commands' seccomp filter): after the steps above,
// so that the filter need not allow them.
NSBOX_CHILD_CODE void RunPreExecHook(const ChildHooks& hooks, ChildReport* report) {
  if (hooks.pre_exec == nullptr) return;
  int hook_err = hooks.pre_exec(hooks.ctx);
  if (hook_err != 0) ChildFail(report, SpawnStep::kPreExec, -hook_err, kExitNotStarted);
}

// The last steps of a command's child: its cwd, which must be under the jail's root, and
// execve. Never returns.
[[noreturn]] NSBOX_CHILD_CODE void ChdirAndExec(const SpawnRequest& req, ChildReport* report) {
  // SAFETY: chdir reads the NUL-terminated path the parent prepared.
  long ret = RawSyscall(SYS_chdir, Arg(req.cwd));
  if (ret < 0) ChildFail(report, SpawnStep::kChdir, ret, kExitNotStarted);
  // And the directory it reached must be under the jail's root, whatever magic link led there
  // (runc's verifyCwd): the kernel's getcwd prefixes a path it cannot reach from the root with
  // "(unreachable)" (fs/d_path.c). ERANGE for a cwd deeper than the buffer is no verdict: it
  // passes.
  // A direct command's PWD is that directory, written into its envp entry after "PWD=".
  char own_buf[512];
  char* cwd_buf = own_buf;
  size_t cwd_size = sizeof own_buf;
  if (req.pwd_env != nullptr && req.fallback_argv != nullptr && req.pwd_env_size > 4) {
    cwd_buf = req.pwd_env + 4;
    cwd_size = req.pwd_env_size - 4;
  }
  // SAFETY: getcwd writes at most cwd_size bytes into cwd_buf: the child's own stack buffer, or
  // the part after "PWD=" of the parent's buffer for it, which the parent does not touch until
  // this child has called execve or exited.
  const long cwd_len = RawSyscall(SYS_getcwd, Arg(cwd_buf), static_cast<long>(cwd_size));
  if (cwd_len > 0 && cwd_buf[0] != '/') {
    ChildFail(report, SpawnStep::kChdir, -ENOENT, kExitNotStarted);
  }
  const bool direct = req.fallback_argv == nullptr || req.pwd_env == nullptr || cwd_len > 0;

  // An empty signal mask for the command. A signal that was pending (a kill racing with the
  // start) is delivered now with its default action, which is what the command would get.
  alignas(8) unsigned char empty_mask[8] = {};
  // SAFETY: rt_sigprocmask reads 8 bytes of `empty_mask`, the kernel's sigset size.
  RawSyscall(SYS_rt_sigprocmask, SIG_SETMASK, Arg(empty_mask), 0, 8);

  // SAFETY: argv and envp (and the fallback's) are NULL-terminated arrays of NUL-terminated
  // strings the parent built; execve only reads them.
  long exec_ret = -ENOENT;
  if (direct) {
    exec_ret = RawSyscall(SYS_execve, Arg(req.file != nullptr ? req.file : req.argv[0]),
                          Arg(req.argv), Arg(req.envp));
  }
  if (req.fallback_argv != nullptr) {
    // SAFETY: as above.
    exec_ret = RawSyscall(SYS_execve, Arg(req.fallback_argv[0]), Arg(req.fallback_argv),
                          Arg(req.fallback_envp));
  }
  // The shell itself not started (none in the image, or the command line too long for an
  // argument: E2BIG), or any program's arguments too long: api.md's "cannot be started", as a
  // spawn failure is in Flue's local(). A program not found or not runnable: the shell's codes.
  int code = exec_ret == -ENOENT || exec_ret == -ENOTDIR ? kExitNotFound : kExitNotExecutable;
  if (req.shell_line || exec_ret == -E2BIG) code = kExitNotStarted;
  ChildFail(report, SpawnStep::kExec, exec_ret, code);
}

// The child, between clone and execve. Async-signal-safe and allocation-free: it shares the
// parent's memory, and the parent's thread is frozen at an arbitrary point of its own code.
// Every signal is blocked on entry (the parent blocked them around the clone), so no handler of
// the parent can run here.
NSBOX_CHILD_CODE int ChildMain(void* arg) {
  const auto* args = static_cast<const ChildArgs*>(arg);
  const SpawnRequest& req = *args->request;
  ChildReport* report = args->report;

  // The clone() fallback: into the command's cgroup before anything else, so that nothing the
  // command does happens outside its kill scope.
  if (args->cgroup_procs_fd >= 0) {
    // SAFETY: writes one byte from a string literal to an fd the parent opened for us.
    long ret = RawSyscall(SYS_write, args->cgroup_procs_fd, Arg("0"), 1);
    if (ret != 1) ChildFail(report, SpawnStep::kCgroup, ret, kExitNotStarted);
  }
  JoinCgroupsResetSignalsSetsid(req.join_procs_fds, req.reset_signals, report);

  const int stdio[3] = {req.stdin_fd, req.stdout_fd, req.stderr_fd};
  PlaceStdioCloseTheRest(stdio, 3, report);
  // A terminal exec: its terminal, and no other, as the controlling terminal of the session
  // setsid just made (a fresh pty, never one of the host's).
  if (req.controlling_tty) {
    // SAFETY: TIOCSCTTY with arg 0 on the child's own fd 0; it never steals a terminal.
    long ret = RawSyscall(SYS_ioctl, 0, TIOCSCTTY, 0);
    if (ret < 0) ChildFail(report, SpawnStep::kTerminal, ret, kExitNotStarted);
  }

  RaiseOomScoreSetUmask();
  RunPreExecHook(req.hooks, report);
  ChdirAndExec(req, report);
}

// clone3 with the child on its own stack. A raw clone3 with CLONE_VM returns twice from the same
// instruction, the child with the stack pointer on the new stack and the parent's frame (return
// address, locals) nowhere it can use; so the child must not return into C++ code. This
// trampoline makes the syscall and, in the child, calls fn(arg) on the fresh stack and exits
// with its result; it returns only in the parent: the pid, or -errno.
#if defined(__x86_64__)
NSBOX_CHILD_CODE long Clone3Run(struct clone_args* args, size_t size, int (*fn)(void*), void* arg) {
  long ret;
  // Callee-saved registers survive the syscall in both processes; the child reads them on the
  // new stack, where none of the parent's frame is valid.
  register int (*fn_reg)(void*) asm("r12") = fn;
  register void* arg_reg asm("r13") = arg;
  // SAFETY: clone3 reads `args` (size bytes). In the child (rax == 0) rsp is args->stack +
  // args->stack_size, set by the kernel; it is aligned to 16 for the call as the SysV ABI
  // requires, rbp is cleared to end frame-pointer walks, and fn never returns (ChildMain ends in
  // exit_group); should it return, exit_group ends the child and ud2 traps. The parent resumes
  // after the child's execve or exit (CLONE_VFORK; a WarmChild's parent at once) with rcx and
  // r11 clobbered by syscall.
  asm volatile(
      "syscall\n\t"
      "testq %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xorl %%ebp, %%ebp\n\t"
      "andq $-16, %%rsp\n\t"
      "movq %%r13, %%rdi\n\t"
      "callq *%%r12\n\t"
      "movl %%eax, %%edi\n\t"
      "movl %[exit_nr], %%eax\n\t"
      "syscall\n\t"
      "ud2\n\t"
      "1:\n\t"
      : "=a"(ret)
      : "0"(static_cast<long>(SYS_clone3)), "D"(args), "S"(size), "r"(fn_reg),
        "r"(arg_reg), [exit_nr] "i"(SYS_exit_group)
      : "rcx", "r11", "memory", "cc");
  return ret;
}
#else
// Elsewhere there is no trampoline (yet): report ENOSYS and let the clone() fallback run.
long Clone3Run(struct clone_args*, size_t, int (*)(void*), void*) { return -ENOSYS; }
#endif

// Blocks every signal of the calling thread for its lifetime: the child starts with this mask,
// so none of the parent's handlers can run on the child's stack before it resets them.
class BlockAllSignals {
 public:
  BlockAllSignals() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old_);
  }
  ~BlockAllSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  BlockAllSignals(const BlockAllSignals&) = delete;
  BlockAllSignals& operator=(const BlockAllSignals&) = delete;

 private:
  sigset_t old_;
};

void ReapExited(int pidfd, pid_t pid) {
  siginfo_t info{};
  if (pidfd >= 0) {
    while (::waitid(P_PIDFD, static_cast<id_t>(pidfd), &info, WEXITED) < 0 && errno == EINTR) {
    }
  } else {
    while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED) < 0 && errno == EINTR) {
    }
  }
}

}  // namespace

// ---- A command's child made ahead ---------------------------------------------------------

int WarmChildMain(void* arg);  // WarmChild's friend; runs in the child only

// The warm child, from clone to its wait for a command, and on to execve. Like ChildMain it
// shares the parent's memory, but the parent goes on running: it reads and writes only its
// WarmChild and, once handed a command, the SpawnRequest, and calls the kernel only through
// RawSyscall (errno is the parent thread's).
NSBOX_CHILD_CODE int WarmChildMain(void* arg) {
  auto* w = static_cast<WarmChild*>(arg);
  const WarmPrep& prep = w->prep_;
  ChildReport* report = &w->report_;
  JoinCgroupsResetSignalsSetsid(prep.join_procs_fds, prep.reset_signals, report);
  // What `ps` in the sandbox shows until execve names it after the command.
  // SAFETY: sets the calling thread's comm from a literal of fewer than 16 bytes.
  RawSyscall(SYS_prctl, PR_SET_NAME, Arg(kWarmChildName));

  // Its stdio: the pipes' ends on 0, 1 and 2, and /dev/null on 3 (close-on-exec) for a command
  // that is given no stdin; nothing else of nsbox-init's fds (as in ChildMain).
  const int stdio[4] = {prep.stdin_fd, prep.stdout_fd, prep.stderr_fd, prep.dev_null};
  PlaceStdioCloseTheRest(stdio, 4, report);
  RaiseOomScoreSetUmask();
  RunPreExecHook(prep.hooks, report);

  // Ready: wait for the command. Every signal is blocked but SIGKILL and SIGSTOP; the runner
  // kills a child it no longer wants.
  w->state_.store(static_cast<uint32_t>(WarmChild::State::kReady), std::memory_order_release);
  const auto go = static_cast<uint32_t>(WarmChild::State::kGo);
  for (;;) {
    const uint32_t state = w->state_.load(std::memory_order_acquire);
    if (state == go) break;
    // SAFETY: waits while the word still holds `state`; the runner stores kGo, then wakes it.
    RawSyscall(SYS_futex, Arg(&w->state_), FUTEX_WAIT_PRIVATE, state, 0);
  }
  // Signals that came while it waited are not the command's: a command's `kill -TERM -1` reaches
  // every process of the sandbox it may signal, this one too, and they would be delivered, with
  // their default action, when the mask is cleared before execve. Dropped here, as the command
  // starts. One the runner sent to this command meanwhile (a cancel or a timeout as soon as it
  // started: it notes the signal first, NoteSignal) is sent again, to be delivered as for any
  // command. (SIGKILL kills the waiting child, which the runner then finds dead.)
  alignas(8) const unsigned char every_signal[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  alignas(8) const long no_wait[2] = {0, 0};  // a struct __kernel_timespec of 0
  // SAFETY: rt_sigtimedwait reads the 8-byte set and the timespec, writes no siginfo (NULL), and
  // takes one pending signal of the child's own per call; -EAGAIN once none is left.
  while (RawSyscall(SYS_rt_sigtimedwait, Arg(every_signal), 0, Arg(no_wait), 8) > 0) {
  }
  if (const int sig = w->signal_sent_.load(std::memory_order_seq_cst); sig > 0) {
    // SAFETY: kill of the child's own process group (setsid made it its only member).
    RawSyscall(SYS_kill, 0, sig);
  }
  const SpawnRequest& req = *w->request_;
  if (w->null_stdin_) {
    // SAFETY: dup3 of the child's own /dev/null onto its stdin.
    long ret = RawSyscall(SYS_dup3, 3, 0, 0);
    if (ret < 0) ChildFail(report, SpawnStep::kStdio, ret, kExitNotStarted);
  }
  // Only stdio is left when the cwd is looked up, as in ChildMain: a cwd of /proc/self/fd/3
  // fails as not found, whatever fd 3 was.
  // SAFETY: closes the child's own fd 3.
  RawSyscall(SYS_close, 3);
  ChdirAndExec(req, report);
}

WarmChild::~WarmChild() {
  if (launched_ || reaped_ || !pidfd_.valid()) return;
  // SAFETY: signals the child this object made and has not reaped; then reaps it.
  sys::PidfdSendSignal(pidfd_.get(), SIGKILL, nullptr, 0);
  ReapExited(pidfd_.get(), pid_);
}

Result<std::unique_ptr<WarmChild>> WarmChild::Start(const WarmPrep& prep,
                                                    std::unique_ptr<ChildStack> stack) {
#if defined(__x86_64__)
  if (g_force_clone_fallback.load(std::memory_order_relaxed)) {
    return Error::Sys("clone3", "a command's child made ahead", ENOSYS);
  }
  std::unique_ptr<WarmChild> w(new WarmChild());
  w->prep_ = prep;
  if (stack != nullptr && stack->size() == kWarmStackSize) {
    w->stack_ = std::move(stack);  // its pages were touched by this process when it was made
  } else {
    NSBOX_ASSIGN_OR_RETURN(w->stack_, ChildStack::Create(kWarmStackSize));
    // Touched here, so that the pages the child uses are charged to this process's memory
    // cgroup, not to the command's (whose figures they would spoil, and whose reuse they would
    // hold).
    std::memset(w->stack_->base() + w->stack_->size() - kWarmStackTouched, 0, kWarmStackTouched);
  }

  int pidfd = -1;
  long pid;
  {
    BlockAllSignals blocked;
    struct clone_args ca {};
    ca.flags = CLONE_VM | CLONE_PIDFD;
    if (prep.cgroup_fd >= 0) {
      ca.flags |= CLONE_INTO_CGROUP;
      ca.cgroup = static_cast<uint64_t>(prep.cgroup_fd);
    }
    ca.pidfd = reinterpret_cast<uintptr_t>(&pidfd);
    ca.exit_signal = SIGCHLD;
    ca.stack = reinterpret_cast<uintptr_t>(w->stack_->base());
    ca.stack_size = w->stack_->size();
    pid = Clone3Run(&ca, sizeof ca, WarmChildMain, w.get());
  }
  if (pid < 0) return Error::Sys("clone3", "a command's child made ahead", static_cast<int>(-pid));
  w->pid_ = static_cast<pid_t>(pid);
  w->pidfd_.reset(pidfd);
  return w;
#else
  (void)prep;
  (void)stack;
  return Error::Sys("clone3", "a command's child made ahead", ENOSYS);
#endif
}

WarmChild::State WarmChild::Poll() {
  if (launched_) return State::kGo;
  if (reaped_) return State::kFailed;
  siginfo_t info{};
  int rc;
  do {
    rc = ::waitid(P_PIDFD, static_cast<id_t>(pidfd_.get()), &info, WEXITED | WNOHANG);
  } while (rc < 0 && errno == EINTR);
  if (rc == 0 && info.si_pid == 0) {
    return state_.load(std::memory_order_acquire) == static_cast<uint32_t>(State::kReady)
               ? State::kReady
               : State::kPreparing;
  }
  // Exited (and reaped just now), or reaped by someone else (ECHILD): either way gone. Any other
  // error leaves it to the destructor, which kills and reaps it.
  if (rc == 0 || errno == ECHILD) reaped_ = true;
  return State::kFailed;
}

Status WarmChild::Failure() const {
  if (report_.step == SpawnStep::kNone) return Ok();
  return Error::Sys(SpawnStepName(report_.step), "a command's child made ahead", report_.err);
}

SpawnResult WarmChild::Launch(const SpawnRequest& request, bool null_stdin) {
  request_ = &request;
  null_stdin_ = null_stdin;
  // A command's `kill -STOP -1` stops the waiting child too, which would then never start the
  // next command. Continued first (SIGCONT resumes it though blocked; it stays pending, and the
  // child drops it with the signals it got while it waited).
  // SAFETY: signals the child this object made, through its pidfd; it is not yet reaped.
  (void)sys::PidfdSendSignal(pidfd_.get(), SIGCONT, nullptr, 0);
  state_.store(static_cast<uint32_t>(State::kGo), std::memory_order_release);
  // SAFETY: wakes the child waiting on the word (one waiter at most).
  ::syscall(SYS_futex, &state_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  launched_ = true;
  SpawnResult result;
  result.pid = pid_;
  result.pidfd = std::move(pidfd_);
  result.used_clone3 = true;
  return result;
}

std::string_view SpawnStepName(SpawnStep step) {
  switch (step) {
    case SpawnStep::kNone:
      return "none";
    case SpawnStep::kCgroup:
      return "enter the command's cgroup";
    case SpawnStep::kSetsid:
      return "setsid";
    case SpawnStep::kStdio:
      return "set up stdio";
    case SpawnStep::kTerminal:
      return "ioctl(TIOCSCTTY)";
    case SpawnStep::kChdir:
      return "chdir";
    case SpawnStep::kCloseFds:
      return "close_range";
    case SpawnStep::kPreExec:
      return "pre_exec hook";
    case SpawnStep::kExec:
      return "execve";
  }
  return "unknown";
}

ChildStack::~ChildStack() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

Result<std::unique_ptr<ChildStack>> ChildStack::Create(size_t size) {
  size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size = (size + page - 1) / page * page;
  // One guard page below the stack: an overflow faults instead of writing over the heap.
  void* map = ::mmap(nullptr, size + page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) return Error::Sys("mmap", "child stack", errno);
  auto stack = std::make_unique<ChildStack>();
  stack->map_ = map;
  stack->map_size_ = size + page;
  if (::mprotect(map, page, PROT_NONE) < 0) {
    return Error::Sys("mprotect", "child stack guard page", errno);
  }
  stack->base_ = static_cast<char*>(map) + page;
  stack->size_ = size;
  return stack;
}

Result<SpawnResult> Spawn(const SpawnRequest& request, ChildStack& stack) {
  if (request.argv == nullptr || request.argv[0] == nullptr) {
    return Error::Msg("spawn: empty argv");
  }
  ChildReport report{SpawnStep::kNone, 0};
  ChildArgs args{&request, -1, &report};
  SpawnResult result;
  UniqueFd procs;  // the fallback's cgroup.procs, open until the child has written to it
  int pidfd = -1;
  long pid = -ENOSYS;
  int clone_err = 0;
  const char* call = "clone3";
  {
    BlockAllSignals blocked;
    if (!g_force_clone_fallback.load(std::memory_order_relaxed)) {
      struct clone_args ca {};
      ca.flags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD;
      if (request.cgroup_fd >= 0) {
        // Straight into the command's cgroup (5.7): no window in which it, or anything it
        // forks, runs outside its kill scope.
        ca.flags |= CLONE_INTO_CGROUP;
        ca.cgroup = static_cast<uint64_t>(request.cgroup_fd);
      }
      ca.pidfd = reinterpret_cast<uintptr_t>(&pidfd);
      ca.exit_signal = SIGCHLD;
      ca.stack = reinterpret_cast<uintptr_t>(stack.base());
      ca.stack_size = stack.size();
      pid = Clone3Run(&ca, sizeof ca, ChildMain, &args);
      result.used_clone3 = pid >= 0;
    }
    // clone3 missing (ENOSYS: before 5.3, or a container's seccomp profile), or too old for
    // CLONE_INTO_CGROUP (E2BIG for the larger struct, EINVAL for the flag).
    if (pid == -ENOSYS || pid == -E2BIG || pid == -EINVAL) {
      if (request.cgroup_fd >= 0) {
        int fd = ::openat(request.cgroup_fd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
        if (fd < 0) return Error::Sys("open", "cgroup.procs", errno).Context("spawn");
        procs.reset(fd);
        args.cgroup_procs_fd = fd;
      }
      call = "clone";
      pid =
          ::clone(ChildMain, stack.base() + stack.size(), CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
      if (pid < 0) {
        pid = -errno;
      } else {
        // Safe against pid reuse: the child is ours and nobody else reaps it.
        pidfd = sys::PidfdOpen(static_cast<pid_t>(pid), 0);
        if (pidfd < 0) clone_err = errno;
      }
    }
  }
  if (pid < 0) {
    return Error::Sys(call, request.argv[0], static_cast<int>(-pid)).Context("spawn");
  }
  result.pid = static_cast<pid_t>(pid);
  if (pidfd < 0) {
    // Our own unreaped child: its pid cannot have been reused, so kill(pid) is safe here.
    ::kill(result.pid, SIGKILL);
    ReapExited(-1, result.pid);
    return Error::Sys("pidfd_open", std::to_string(pid), clone_err).Context("spawn");
  }
  result.pidfd.reset(pidfd);
  result.failed_step = report.step;
  result.err = report.err;
  if (report.step != SpawnStep::kNone && report.step != SpawnStep::kChdir &&
      report.step != SpawnStep::kExec) {
    ReapExited(pidfd, result.pid);
    return Error::Sys(SpawnStepName(report.step), request.argv[0], report.err)
        .Context("spawn: in the child");
  }
  return result;
}

Status CgroupKill(int cgroup_fd) {
  if (g_force_no_cgroup_kill.load(std::memory_order_relaxed)) {
    return Error::Sys("open", "cgroup.kill", ENOENT);
  }
  return WriteExistingFileAt(cgroup_fd, "cgroup.kill", "1");
}

Result<size_t> SignalCgroupProcs(int cgroup_fd, int sig) {
  auto text = ReadFileAt(cgroup_fd, "cgroup.procs");
  if (!text.ok()) {
    // ENOENT/ENODEV: the cgroup was removed, so it has no process left.
    if (text.error().code() == ENOENT || text.error().code() == ENODEV) return size_t{0};
    return std::move(text).error();
  }
  std::vector<pid_t> pids = ParsePids(*text);
  if (pids.empty()) return size_t{0};
  std::vector<std::pair<pid_t, UniqueFd>> held;
  held.reserve(pids.size());
  for (pid_t pid : pids) {
    int fd = sys::PidfdOpen(pid, 0);
    if (fd >= 0) held.emplace_back(pid, UniqueFd(fd));
  }
  // A pid read above may have been reused by an unrelated process before pidfd_open. A pidfd
  // whose pid is still listed now names a live member (a live process owns its pid), or a
  // process that has died since (the signal then fails with ESRCH).
  auto again = ReadFileAt(cgroup_fd, "cgroup.procs");
  if (!again.ok()) return size_t{0};
  std::vector<pid_t> now = ParsePids(*again);
  std::sort(now.begin(), now.end());
  for (const auto& [pid, fd] : held) {
    if (std::binary_search(now.begin(), now.end(), pid)) {
      // SAFETY: signals the process the pidfd holds; ESRCH (exited meanwhile) is ignored.
      sys::PidfdSendSignal(fd.get(), sig, nullptr, 0);
    }
  }
  return pids.size();
}

size_t SignalSession(pid_t sid, int sig, bool leader_reaped) {
  if (sid <= 0) return 0;
  // A pid stays allocated while any process has it as its session id. Once the leader is reaped,
  // a process that has pid `sid` means the number was reused: the old session is empty, and the
  // session of that number now is someone else's.
  if (leader_reaped && (::kill(sid, 0) == 0 || errno == EPERM)) return 0;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return 0;
  size_t found = 0;
  while (struct dirent* entry = ::readdir(dir)) {
    pid_t pid = 0;
    const char* name = entry->d_name;
    auto [end, ec] = std::from_chars(name, name + std::char_traits<char>::length(name), pid);
    if (ec != std::errc() || *end != '\0' || pid <= 0) continue;
    if (::getsid(pid) != sid) continue;
    UniqueFd fd(sys::PidfdOpen(pid, 0));
    // Checked again through the opened pidfd's pid: if it was reused in between, the new process
    // is only signalled if it is itself in the session.
    if (!fd.valid() || ::getsid(pid) != sid) continue;
    ++found;
    // SAFETY: signals the process the pidfd holds; ESRCH is ignored.
    sys::PidfdSendSignal(fd.get(), sig, nullptr, 0);
  }
  ::closedir(dir);
  return found;
}

namespace {

// What cgroup.events says of "populated": true for 0, false for 1; nothing when the file cannot
// be read or has no such line.
std::optional<bool> PopulatedZero(int cgroup_fd) {
  auto text = ReadFileAt(cgroup_fd, "cgroup.events");
  if (!text.ok()) return std::nullopt;
  const size_t at = text->find("populated ");
  if (at == std::string::npos) return std::nullopt;
  return text->compare(at + 10, 1, "0") == 0;
}

}  // namespace

bool CgroupEmpty(int cgroup_fd) { return PopulatedZero(cgroup_fd).value_or(true); }

bool CgroupKnownEmpty(int cgroup_fd) { return PopulatedZero(cgroup_fd).value_or(false); }

std::vector<pid_t> ParsePids(std::string_view procs) {
  std::vector<pid_t> pids;
  while (!procs.empty()) {
    size_t sep = procs.find_first_of(" \n");
    std::string_view word = procs.substr(0, sep);
    pid_t pid = 0;
    auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), pid);
    if (ec == std::errc() && end == word.data() + word.size() && pid > 0) pids.push_back(pid);
    if (sep == std::string_view::npos) break;
    procs.remove_prefix(sep + 1);
  }
  return pids;
}

uint64_t ParseOomKills(std::string_view memory_events) {
  while (!memory_events.empty()) {
    size_t nl = memory_events.find('\n');
    std::string_view line = memory_events.substr(0, nl);
    constexpr std::string_view kKey = "oom_kill ";
    if (line.substr(0, kKey.size()) == kKey) {
      line.remove_prefix(kKey.size());
      uint64_t n = 0;
      auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), n);
      if (ec == std::errc()) return n;
      (void)end;
      return 0;
    }
    if (nl == std::string_view::npos) break;
    memory_events.remove_prefix(nl + 1);
  }
  return 0;
}

void ForceCloneFallbackForTesting(bool on) { g_force_clone_fallback.store(on); }
void ForceNoCgroupKillForTesting(bool on) { g_force_no_cgroup_kill.store(on); }

}  // namespace nsbox::exec

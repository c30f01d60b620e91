#include "exec/spawn.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
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
#include <string>
#include <utility>

#include "base/files.h"
#include "base/syscalls.h"

namespace nsbox::exec {
namespace {

std::atomic<bool> g_force_clone_fallback{false};
std::atomic<bool> g_force_no_cgroup_kill{false};

// The child runs on a stack ASan knows nothing of, sharing the parent's memory and shadow
// (CLONE_VM). Instrumented child code would poison shadow bytes of that stack that nothing ever
// unpoisons (the child never returns), and ASan's fake stacks for use-after-return belong to the
// parent's thread. So the child's own functions are not instrumented, and they call the kernel
// through syscall(2) rather than libc functions that ASan intercepts.
#define NSBOX_CHILD_CODE __attribute__((no_sanitize("address")))

// Shared with the child through CLONE_VM: the child writes it just before _exit, the parent reads
// it once clone returns (CLONE_VFORK orders the two).
struct ChildReport {
  SpawnStep step;
  int err;
};

struct ChildArgs {
  const SpawnRequest* request;
  int cgroup_procs_fd;  // -1 unless the clone() fallback: the child moves itself into the cgroup
  ChildReport* report;
};

[[noreturn]] NSBOX_CHILD_CODE void ChildFail(ChildReport* report, SpawnStep step, int err,
                                             int exit_code) {
  report->step = step;
  report->err = err;
  // SAFETY: exit_group ends only the child (it is its own thread group: no CLONE_THREAD); the
  // parent, suspended by CLONE_VFORK, resumes.
  ::syscall(SYS_exit_group, exit_code);
  __builtin_unreachable();
}

// Moves an fd that sits on 0, 1 or 2 above them, so that the dup3 calls below never overwrite a
// source that is still needed, and never dup an fd onto itself (which would keep its CLOEXEC).
NSBOX_CHILD_CODE int MoveAboveStdio(int fd) {
  if (fd >= 3) return fd;
  // SAFETY: F_DUPFD_CLOEXEC only creates a new fd; the copy is closed by close_range below.
  return static_cast<int>(::syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 3));
}

NSBOX_CHILD_CODE int CloseFrom3() {
  // SAFETY: closes fds of the child's own table only (no CLONE_FILES: it has a copy).
  if (sys::CloseRange(3, ~0U, 0) == 0) return 0;
  if (errno != ENOSYS) return errno;
  // Before 5.9: close each fd up to the limit.
  struct rlimit lim {};
  // SAFETY: prlimit64 with a NULL new limit only reads this process's limit into `lim`.
  if (::syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, nullptr, &lim) < 0) return errno;
  for (rlim_t fd = 3; fd < lim.rlim_cur; ++fd) {
    // SAFETY: as above; EBADF for fds that are not open is expected and ignored.
    ::syscall(SYS_close, static_cast<int>(fd));
  }
  return 0;
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
    if (::syscall(SYS_write, args->cgroup_procs_fd, "0", 1) != 1) {
      ChildFail(report, SpawnStep::kCgroup, errno, kExitNotStarted);
    }
  }
  // The v1 hierarchies (memory, pids) cannot be entered at clone time: the child moves itself,
  // before it runs anything of the command, so that all it forks is counted there too.
  for (int procs_fd : req.join_procs_fds) {
    if (procs_fd < 0) continue;
    // SAFETY: as above.
    if (::syscall(SYS_write, procs_fd, "0", 1) != 1) {
      ChildFail(report, SpawnStep::kCgroup, errno, kExitNotStarted);
    }
  }

  // Default dispositions for every signal the parent does not leave at the default: handlers of
  // nsbox-init must never run in the child, and what it ignores (SIGPIPE) must not stay ignored
  // for the command. The kernel's sigaction for SIG_DFL with no flags and an empty mask is all
  // zero bytes, whatever the architecture's layout (handler, flags, [restorer], mask).
  alignas(8) unsigned char default_action[64] = {};
  for (int sig = 1; sig < 65; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    if ((req.reset_signals & (uint64_t{1} << (sig - 1))) == 0) continue;
    // SAFETY: rt_sigaction reads `default_action` (large enough for every layout); EINVAL for
    // numbers the kernel does not accept is ignored.
    ::syscall(SYS_rt_sigaction, sig, default_action, nullptr, 8);
  }

  // Its own session and process group: a group kill reaches everything it starts, and no
  // terminal is its controlling terminal (CVE-2017-5226: TIOCSTI), but the fresh pty of a
  // terminal exec, below.
  // SAFETY: setsid only changes the calling process's session.
  if (::syscall(SYS_setsid) < 0) ChildFail(report, SpawnStep::kSetsid, errno, kExitNotStarted);

  int in = MoveAboveStdio(req.stdin_fd);
  int out = in < 0 ? -1 : MoveAboveStdio(req.stdout_fd);
  int err = out < 0 ? -1 : MoveAboveStdio(req.stderr_fd);
  if (err < 0) ChildFail(report, SpawnStep::kStdio, errno, kExitNotStarted);
  // SAFETY: dup3 onto 0, 1, 2 of the child's own fd table; sources are >= 3 so never equal.
  if (::syscall(SYS_dup3, in, 0, 0) < 0 || ::syscall(SYS_dup3, out, 1, 0) < 0 ||
      ::syscall(SYS_dup3, err, 2, 0) < 0) {
    ChildFail(report, SpawnStep::kStdio, errno, kExitNotStarted);
  }
  // A terminal exec: its terminal, and no other, as the controlling terminal of the session
  // setsid just made (a fresh pty, never one of the host's).
  // SAFETY: TIOCSCTTY with arg 0 on the child's own fd 0; it never steals a terminal.
  if (req.controlling_tty && ::syscall(SYS_ioctl, 0, TIOCSCTTY, 0) < 0) {
    ChildFail(report, SpawnStep::kTerminal, errno, kExitNotStarted);
  }

  // Nothing of nsbox reaches the command: every fd but stdio goes (CVE-2024-21626 leaked a host
  // directory fd this way). Before the chdir: the child holds a copy of nsbox-init's fds (the
  // host's cgroup directory among them), and a cwd of "/proc/self/fd/4" would otherwise put the
  // command in a host directory outside the jail's root, from which ".." walks the host's tree
  // (adversarial case ExecCwdThroughInitsFdsStaysInside).
  int close_err = CloseFrom3();
  if (close_err != 0) ChildFail(report, SpawnStep::kCloseFds, close_err, kExitNotStarted);

  // A command is the OOM killer's choice before the server that runs it: tmpfs pages a command
  // left behind stay charged after it died, and without this the next kill could pick
  // nsbox-init and end the whole sandbox (case MemoryBombThroughTmpfsFromInside). Raising the
  // score needs no privilege; best effort (a host without /proc/self/oom_score_adj just keeps
  // the default).
  // SAFETY: open/write/close of a /proc file of this process, with a literal path and buffer.
  int oom_fd = static_cast<int>(
      ::syscall(SYS_openat, AT_FDCWD, "/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC));
  if (oom_fd >= 0) {
    (void)::syscall(SYS_write, oom_fd, "500", 3);
    ::syscall(SYS_close, oom_fd);
  }

  // SAFETY: chdir reads the NUL-terminated path the parent prepared.
  if (::syscall(SYS_chdir, req.cwd) < 0) {
    ChildFail(report, SpawnStep::kChdir, errno, kExitNotStarted);
  }
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
  // this child has called execve or exited (CLONE_VFORK).
  const long cwd_len = ::syscall(SYS_getcwd, cwd_buf, cwd_size);
  if (cwd_len > 0 && cwd_buf[0] != '/') {
    ChildFail(report, SpawnStep::kChdir, ENOENT, kExitNotStarted);
  }
  const bool direct = req.fallback_argv == nullptr || req.pwd_env == nullptr || cwd_len > 0;
  // SAFETY: umask only sets the child's file mode creation mask (api.md: umask 022).
  ::syscall(SYS_umask, 022);

  // no_new_privs, capabilities, seccomp: last, so the filter need not allow the steps above.
  if (req.hooks.pre_exec != nullptr) {
    int hook_err = req.hooks.pre_exec(req.hooks.ctx);
    if (hook_err != 0) ChildFail(report, SpawnStep::kPreExec, hook_err, kExitNotStarted);
  }

  // An empty signal mask for the command. A signal that was pending (a kill racing with the
  // start) is delivered now with its default action, which is what the command would get.
  alignas(8) unsigned char empty_mask[8] = {};
  // SAFETY: rt_sigprocmask reads 8 bytes of `empty_mask`, the kernel's sigset size.
  ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, empty_mask, nullptr, 8);

  // SAFETY: argv and envp (and the fallback's) are NULL-terminated arrays of NUL-terminated
  // strings the parent built; execve only reads them.
  if (direct) {
    ::syscall(SYS_execve, req.file != nullptr ? req.file : req.argv[0], req.argv, req.envp);
  }
  int exec_err = errno;
  if (req.fallback_argv != nullptr) {
    // SAFETY: as above.
    ::syscall(SYS_execve, req.fallback_argv[0], req.fallback_argv, req.fallback_envp);
    exec_err = errno;
  }
  ChildFail(report, SpawnStep::kExec, exec_err,
            exec_err == ENOENT || exec_err == ENOTDIR ? kExitNotFound : kExitNotExecutable);
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
  // after the child's execve or exit (CLONE_VFORK) with rcx and r11 clobbered by syscall.
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

bool CgroupEmpty(int cgroup_fd) {
  auto text = ReadFileAt(cgroup_fd, "cgroup.events");
  if (!text.ok()) return true;
  std::string_view events = *text;
  size_t at = events.find("populated ");
  if (at == std::string_view::npos) return true;
  return events.substr(at + 10, 1) == "0";
}

std::vector<pid_t> ParsePids(std::string_view procs) {
  std::vector<pid_t> pids;
  while (!procs.empty()) {
    size_t nl = procs.find('\n');
    std::string_view line = procs.substr(0, nl);
    pid_t pid = 0;
    auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), pid);
    if (ec == std::errc() && end == line.data() + line.size() && pid > 0) pids.push_back(pid);
    if (nl == std::string_view::npos) break;
    procs.remove_prefix(nl + 1);
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

#pragma once

// The low-level half of the runner: starting one command in a vfork-like child that enters its
// own cgroup at clone time, and reaching every process of a command's kill scope (its cgroup, or
// its session where there is no cgroup) through pidfds. No event loop here; runner.cc drives it.

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "exec/runner.h"

namespace nsbox::exec {

// Where the child stopped before execve. Only kChdir and kExec are the command's own failures
// (api.md: exit code 1 / 127 / 126 with the reason on stderr); the others are the runner's.
enum class SpawnStep : uint8_t {
  kNone,      // execve succeeded
  kCgroup,    // writing "0" to cgroup.procs (v1 hierarchies; v2 in the clone() fallback)
  kSetsid,    // its own session and process group
  kStdio,     // dup3 of stdin/stdout/stderr
  kTerminal,  // ioctl(0, TIOCSCTTY): the terminal on stdin as the controlling terminal
  kChdir,     // the command's cwd
  kCloseFds,  // close_range(3, ~0U)
  kPreExec,   // ChildHooks::pre_exec (no_new_privs, capabilities, seccomp)
  kExec,      // execve
};
std::string_view SpawnStepName(SpawnStep step);

// The exit codes the child leaves with when it fails before execve. 127 and 126 are the shell's
// (DescribeExecFailure); 1 is api.md's "could not be started".
inline constexpr int kExitNotStarted = 1;
inline constexpr int kExitNotFound = 127;
inline constexpr int kExitNotExecutable = 126;

// A stack for the vfork-like child: mmap'ed once and reused by every spawn (the parent thread is
// suspended while the child runs on it, so one is enough per thread), with a guard page below.
class ChildStack {
 public:
  ChildStack() = default;
  ChildStack(const ChildStack&) = delete;
  ChildStack& operator=(const ChildStack&) = delete;
  ~ChildStack();

  static Result<std::unique_ptr<ChildStack>> Create(size_t size);
  char* base() const { return base_; }  // lowest usable byte
  size_t size() const { return size_; }

 private:
  void* map_ = nullptr;
  size_t map_size_ = 0;
  char* base_ = nullptr;
  size_t size_ = 0;
};

// Where a command's child stopped, written by the child just before it exits (it shares the
// parent's memory). `err` is the failed call's errno.
struct ChildReport {
  SpawnStep step = SpawnStep::kNone;
  int err = 0;
};

struct SpawnRequest {
  const char* const* argv = nullptr;  // NULL-terminated; argv[0] is the path executed
  const char* const* envp = nullptr;  // NULL-terminated
  const char* file = nullptr;         // executed instead of argv[0] when set
  // Executed when execve of the above fails, or when `pwd_env` cannot be completed: the command
  // as bash runs it (exec/direct.h). A failure of this one is the one reported.
  const char* const* fallback_argv = nullptr;  // NULL-terminated, argv[0] the path; or NULL
  const char* const* fallback_envp = nullptr;
  // What executes last is the shell (CommandSpec::shell_line): its failure exits 1.
  bool shell_line = false;
  // An entry of envp that starts "PWD=" and has room after it: the child writes its working
  // directory there, as the kernel's getcwd gives it (only with a fallback: a directory too deep
  // for it goes to the fallback). NULL: none.
  char* pwd_env = nullptr;
  size_t pwd_env_size = 0;
  const char* cwd = nullptr;
  // The child's stdio; any value (also 0, 1, 2): the child moves them out of the way first.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // stdin is a terminal (a pty slave) that becomes the controlling terminal of the child's new
  // session (TIOCSCTTY), which makes the command its session leader's foreground group.
  bool controlling_tty = false;
  int cgroup_fd = -1;  // the command's own cgroup v2 directory, or -1
  // Write-only fds of cgroup.procs files (v1 hierarchies) the child moves itself into, writing
  // "0", before anything else; -1 for none. A failure is a SpawnStep::kCgroup error.
  int join_procs_fds[2] = {-1, -1};
  // The signals whose disposition the child sets back to the default before execve (bit n-1 for
  // signal n): those the parent does not leave at the default (Runner: NonDefaultSignals). Each
  // takes a syscall in the child, on every command's path; all of them by default.
  uint64_t reset_signals = ~uint64_t{0};
  ChildHooks hooks;
};

struct SpawnResult {
  pid_t pid = -1;
  UniqueFd pidfd;
  // kNone when execve succeeded; kChdir or kExec when the command could not be started (the
  // child has exited with kExitNotStarted / kExitNotFound / kExitNotExecutable and is not reaped).
  SpawnStep failed_step = SpawnStep::kNone;
  int err = 0;
  bool used_clone3 = false;  // false: the clone() + cgroup.procs fallback ran
};

// Starts the child and returns once it has called execve or exited (CLONE_VFORK). A failure of
// the runner's own steps (cgroup, setsid, stdio, close_range, the pre_exec hook) is an Error and
// the child is reaped; a missing cwd or program is a SpawnResult with `failed_step` set.
Result<SpawnResult> Spawn(const SpawnRequest& request, ChildStack& stack);

// What a child made ahead for the next command (WarmChild) does before it waits: the steps of
// a command's child that do not depend on the command.
struct WarmPrep {
  int cgroup_fd = -1;                // as SpawnRequest::cgroup_fd
  int join_procs_fds[2] = {-1, -1};  // as SpawnRequest::join_procs_fds
  // The child's ends of its stdio pipes (the caller keeps the others), and the command's stdin
  // when it is given none. The child takes copies; the caller closes these after Start.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  int dev_null = -1;
  uint64_t reset_signals = ~uint64_t{0};  // as SpawnRequest::reset_signals
  ChildHooks hooks;                       // run before it waits
};

// The name (comm) of a WarmChild until it execs the command: what `ps` shows in a busy sandbox.
inline constexpr char kWarmChildName[] = "nsbox-next";

// A command's child made ahead, for a sandbox that runs commands in a row: born in the next
// command's cgroups (clone3 + CLONE_INTO_CGROUP), moved into its v1 ones, in its own session,
// its signal dispositions reset, the caller's pipes on its stdio and the pre_exec hook
// (no_new_privs, rlimits, the commands' seccomp filter) applied, it waits on a futex for the
// command. Launch hands over argv, env and cwd; the child makes its last few calls and execs. That
// takes the ≈ 100 µs of those steps off the command's start (docs/init.md "The loop").
//
// The child shares the memory of this process (CLONE_VM, like the vfork-like child of Spawn,
// but the parent goes on running), so it runs only raw syscalls on its own stack, and touches
// nothing but this object and the request given to Launch. It has its own fd table (a copy at
// clone time, reduced at once to its stdio). The pre_exec hook runs in it concurrently with the
// thread that made it and shares that thread's TLS: a hook must not rely on errno but to report
// its own failure. x86-64 only (the clone trampoline); elsewhere Start fails with ENOSYS.
class WarmChild {
 public:
  enum class State : uint32_t { kPreparing, kReady, kGo, kFailed };

  WarmChild(const WarmChild&) = delete;
  WarmChild& operator=(const WarmChild&) = delete;
  // A child that was never launched is killed and reaped.
  ~WarmChild();

  // `stack`: one that TakeStack gave back, reused instead of a new mapping (none: a new one).
  static Result<std::unique_ptr<WarmChild>> Start(const WarmPrep& prep,
                                                  std::unique_ptr<ChildStack> stack = nullptr);

  // kReady: waiting and alive (checked through its pidfd); kFailed: its preparation failed
  // (Failure says why) or it died (killed by a process of the sandbox).
  State Poll();
  // Why a kFailed child failed; Ok when it was killed from outside rather than failing a step.
  Status Failure() const;

  // Hands a command over to a kReady child (the request's argv, envp, file, fallback, pwd_env
  // and cwd; stdin is WarmPrep::stdin_fd, or /dev/null when `null_stdin`). The request
  // and all it points to must stay valid until the child has exited, and this object too: the
  // child reads them, and writes where it failed here (failed_step).
  SpawnResult Launch(const SpawnRequest& request, bool null_stdin);
  // After a launched child has exited: where it stopped before execve, as SpawnResult says.
  SpawnStep failed_step() const { return report_.step; }
  int err() const { return report_.err; }

  pid_t pid() const { return pid_; }
  // Before a signal is sent to a launched child's command: the child drops the signals sent to it
  // while it waited (they were not its command's), and sends itself this one again should it have
  // dropped it too.
  void NoteSignal(int sig) { signal_sent_.store(sig, std::memory_order_seq_cst); }

  // After a launched child has exited and been reaped (or exec'd: it then no longer uses this
  // process's memory): its stack, for the next child's Start. Unmapping it here would cost the
  // caller a TLB shootdown on every CPU the child ran on, on the way to the command's answer.
  std::unique_ptr<ChildStack> TakeStack() { return std::move(stack_); }

 private:
  WarmChild() = default;
  friend int WarmChildMain(void* arg);

  // Shared with the child (CLONE_VM).
  std::atomic<uint32_t> state_{static_cast<uint32_t>(State::kPreparing)};
  const SpawnRequest* request_ = nullptr;
  std::atomic<int> signal_sent_{0};
  bool null_stdin_ = false;
  ChildReport report_;
  WarmPrep prep_;

  std::unique_ptr<ChildStack> stack_;
  pid_t pid_ = -1;
  UniqueFd pidfd_;
  bool launched_ = false;
  bool reaped_ = false;
};

// Writes "1" to cgroup.kill (5.14): SIGKILL to the whole subtree, also to processes forked while
// the kill runs. ENOENT where the kernel is older.
Status CgroupKill(int cgroup_fd);
// Signals every process listed in the cgroup's cgroup.procs through a pidfd, re-checking its
// membership after opening the pidfd so that a reused pid is never signalled. Returns how many
// processes were listed (0: the cgroup is empty).
Result<size_t> SignalCgroupProcs(int cgroup_fd, int sig);
// Signals every process whose session id is `sid` (scanning /proc) through a pidfd. Used where
// there is no cgroup; setsid'ed processes escape it. `leader_reaped`: the session leader has
// been reaped, so a process that now has pid `sid` is someone else and the session is empty.
size_t SignalSession(pid_t sid, int sig, bool leader_reaped);
// True when cgroup.events says "populated 0" (or the cgroup is gone).
bool CgroupEmpty(int cgroup_fd);
// True only when cgroup.events was read and says "populated 0": for a decision that an unread
// file must not make (a set passed on to the next command).
bool CgroupKnownEmpty(int cgroup_fd);

// The pids of a cgroup.procs text (one per line) or of a /proc/<pid>/task/<tid>/children one
// (separated by spaces): words that are not a positive number are skipped.
std::vector<pid_t> ParsePids(std::string_view procs);
// The `oom_kill` counter of a memory.events text (0 when absent).
uint64_t ParseOomKills(std::string_view memory_events);

// Test knobs, to run both paths on a kernel that has the new ones (conventions.md: "Both paths
// are tested"): the clone() + cgroup.procs fallback instead of clone3, and the per-process
// SIGKILL loop instead of cgroup.kill.
void ForceCloneFallbackForTesting(bool on);
void ForceNoCgroupKillForTesting(bool on);

}  // namespace nsbox::exec

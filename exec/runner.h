#pragma once

// Runs commands inside the jail for nsbox-init: pipes read through the reactor, each command in
// its own process group and, where there is a delegated cgroup v2 directory, its own child
// cgroup entered at clone time, so that a kill reaches exactly its processes (api.md, exec).
// stdin is stdin_data then EOF, /dev/null, or a stream fed by Input; or the command runs on a
// pseudo-terminal of its own (CommandSpec::tty). docs/init.md, "stdin streams and terminals".

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "exec/reactor.h"
#include "exec/usage.h"

namespace nsbox::exec {

// How a command ended (api.md `reason`).
enum class EndReason : uint8_t {
  kExited,
  kSignaled,  // a signal nsbox did not send
  kTimeout,
  kCancelled,
  kOutputLimit,
  kOom,      // the OOM killer ended it
  kStopped,  // the sandbox was stopped or deleted under it
};
std::string_view EndReasonName(EndReason reason);  // "exited", "signaled", "timeout", ...

// A terminal's size in character cells (TIOCSWINSZ).
struct TerminalSize {
  uint16_t rows = 24;
  uint16_t cols = 80;
};

struct CommandSpec {
  std::vector<std::string> argv;  // argv[0] is the path executed: "/bin/bash", "-c", command
  std::vector<std::string> env;   // "K=V", final
  // A direct command (exec/direct.h): `file` is executed with argv (argv[0] then only the
  // program's name) and env plus PWD=<the working directory>; when that cannot be done, the
  // child executes `fallback_argv` with `fallback_env` instead (bash -c, as without it).
  // Empty `file`: argv[0] with env, nothing else.
  std::string file;
  std::vector<std::string> fallback_argv;
  std::vector<std::string> fallback_env;
  // A command line run by the shell (argv, or the fallback, is the shell): the shell's own failure
  // to start is api.md's "cannot be started" (exit code 1), not a command's 126 or 127.
  bool shell_line = false;
  std::string cwd;  // absolute, inside the jail
  // Fed first. Then, without stdin_stream, stdin is closed (nullopt and no stream: /dev/null).
  std::optional<std::string> stdin_data;
  // stdin stays open after stdin_data and is fed by Runner::Input until an Input closes it.
  bool stdin_stream = false;
  // Run on a new pseudo-terminal of this size, opened from /dev/ptmx (in a jail: its private
  // devpts): the command is the session leader with the terminal as its controlling terminal
  // and as its fds 0, 1 and 2. Output arrives as stream 1 only; input is always streamed.
  std::optional<TerminalSize> tty;
  std::chrono::milliseconds timeout{0};  // 0: none
  uint64_t output_limit = 64ull << 20;   // stdout and stderr together
};

struct CommandResult {
  int exit_code = 0;
  int signal = 0;  // the signal that ended it (0: none)
  EndReason reason = EndReason::kExited;
  bool timed_out = false;
  bool truncated = false;
  bool cancelled = false;
  uint64_t duration_ms = 0;
  // What the command's cgroups say it used, read when it is answered: what background
  // processes still running then use afterwards is not in it.
  CommandUsage usage;
};

struct CommandEvents {
  std::function<void(pid_t pid)> on_start;
  // stream 1 (stdout) or 2 (stderr); raw bytes, in order per stream.
  std::function<void(int stream, std::string_view bytes)> on_output;
  // Exactly once, after the main process exited and its pipes were drained (or the drain window
  // of 100 ms passed).
  std::function<void(const CommandResult& result)> on_exit;
};

// What the child does last, between the runner's own steps (new session, stdio, cwd, umask,
// closing fds) and execve: no_new_privs, capabilities, the seccomp filter. It runs in a vfork-
// like child, so it must be async-signal-safe and must not allocate. Returns 0 or an errno.
struct ChildHooks {
  int (*pre_exec)(const void* ctx) = nullptr;
  const void* ctx = nullptr;
};

// The delegated cgroup v1 directories of a hybrid host (O_DIRECTORY fds, -1 for none; the same
// fd twice where memory and pids are co-mounted). Every command also gets a child cgroup in each,
// joined before execve, for its memory and pids figures and its OOM kills.
struct RunnerV1Cgroups {
  int memory_dir = -1;
  int pids_dir = -1;
};

// The cgroups of the first commands, made before their runner exists: a jail of nsboxd's pool
// makes two sets while it waits for its sandbox, so that the sandbox's first command does not
// (three mkdirs in cgroupfs on a hybrid host, ≈ 150-200 µs here), nor the child made ahead for
// it (Runner::Anticipate). The runner made with it takes them as kept sets (released after 2 s
// idle, as any); dropped unused, they are removed.
class PremadeCgroups {
 public:
  PremadeCgroups() = default;
  // From the directories the runner will be given (Runner's `cgroup_dir` and `v1`); an empty
  // object where there are none.
  static Result<PremadeCgroups> Make(int cgroup_dir, RunnerV1Cgroups v1);

 private:
  friend class Runner;
  struct State;
  std::shared_ptr<State> state_;
};

class Runner {
 public:
  // `cgroup_dir`: an O_DIRECTORY fd of the delegated cgroup v2 directory under which every
  // command gets its own child cgroup, or -1 where there is none (then kills go to the process
  // group and to every process found with the command's session, through pidfds).
  // The cgroup directories of the next command are made, and those of ended ones removed, on a
  // thread of the runner's own (started on demand, ended when idle), so that a request does not
  // wait for them.
  Runner(Reactor& reactor, int cgroup_dir, ChildHooks hooks, RunnerV1Cgroups v1 = {},
         PremadeCgroups premade = {});
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // Starts a command; the id names it for Kill. A command that cannot be started (its cwd is
  // missing or not a directory, no such shell) still completes through `events`, with exit code
  // 1 and the reason on stderr, as api.md says of spawn failures. Errors are for the runner's
  // own failures (no pipes, no cgroup).
  Result<uint64_t> Start(const CommandSpec& spec, CommandEvents events);
  // SIGTERM to the command's tree, SIGKILL (cgroup.kill) 2 s later if anything is left; its
  // on_exit then carries `reason`. Unknown or finished ids are ignored.
  void Kill(uint64_t id, EndReason reason);
  void KillAll(EndReason reason);
  size_t running() const;
  // Backpressure from whoever takes the output (nsbox-init, while too much waits to go to the
  // daemon): while paused, no command's pipe is read again once a read has delivered (a command
  // that writes more then blocks on its full pipe), and a drain window does not end while
  // what the main process left in its pipes waits unread (paused, or resumed less than a window
  // ago). A command already reported is read (and its bytes dropped) as ever.
  void PauseOutput(bool paused);
  // A command is expected soon (the sandbox has just started): where the cgroups made ahead are
  // there (PremadeCgroups), the first command's child is made now, as for commands in a row, and
  // dropped after 2 s idle as any. That command still counts as a lone one. `hold`: kept, with
  // the cgroups made ahead, until the first command comes, however long that takes (a jail of
  // nsboxd's pool, adopted ahead of the sandbox it will serve).
  void Anticipate(bool hold = false);
  // Whether `pid` is the runner's child made ahead for the next command (no command yet): a
  // child of the caller's thread that the caller must not reap.
  bool OwnsIdleChild(pid_t pid) const;
  // No child is made ahead from now on: each command's child is made when it comes (its cgroups
  // are still made ahead). A child made ahead shares this process's memory until its execve, and
  // the kernel gives the OOM score one process sets to every process sharing its memory map
  // (vfork children aside): the child's raised score (a command is the OOM killer's choice before
  // nsbox-init) becomes this process's too until the runner idles and puts it back, and the OOM
  // killer, when it picks the child, kills every process sharing its memory. Where a memory limit
  // makes the sandbox's own OOM kills likely, nsbox-init turns them off (docs/init.md "The
  // loop").
  void NoChildrenMadeAhead();

  // The answer to an Input: err 0 once every byte was written to the command's stdin (or
  // terminal), else an errno and a sentence saying why. Runs from RunOnce, or inside Input when
  // the input is refused at once.
  using InputDone = std::function<void(int err, std::string_view message)>;
  // Queues bytes for a running command's stdin; they are written through the reactor, never
  // blocking. `close`: afterwards, close the stdin pipe (on a terminal: write the terminal's
  // VEOF character, ^D by default; the terminal itself stays). Errors: ESRCH unknown id; EPIPE
  // stdin already closed (an earlier close, or the command closed its end) or the command's
  // end was reported; EINVAL the command was started without stdin_stream (or tty); EAGAIN more
  // than kMaxPendingInput bytes or kMaxPendingInputs inputs are already waiting to be written.
  void Input(uint64_t id, std::string data, bool close, InputDone done);
  static constexpr size_t kMaxPendingInput = 4u << 20;
  static constexpr size_t kMaxPendingInputs = 64;
  // A new window size for a terminal command (TIOCSWINSZ on the master: the kernel sends
  // SIGWINCH to its foreground process group). Errors: ESRCH unknown or finished id, ENOTTY a
  // command without a terminal.
  Status Resize(uint64_t id, TerminalSize size);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nsbox::exec

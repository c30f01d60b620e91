#pragma once

// What the files of the command runner (runner.cc and runner_*.cc) share: the runner's state
// (Runner::Impl) and what it holds, a command's cgroups, stdio pipes and launch. Private to exec/.

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/files.h"
#include "base/pidfd.h"
#include "base/stack.h"
#include "base/unique_fd.h"
#include "base/worker_pool.h"
#include "exec/reactor.h"
#include "exec/runner.h"
#include "exec/spawn.h"
#include "exec/usage.h"

namespace nsbox::exec {

namespace runner_internal {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kReadBufferSize = 256 * 1024;
// perf-baselines.md 4.5: 1 MiB pipes read 3.4x faster across CPUs than the default 64 KiB.
constexpr int kWantedPipeSize = 1 << 20;
constexpr size_t kEnlargedPipeCommands = 16;
constexpr milliseconds kDrainWindow{100};  // api.md
constexpr milliseconds kKillGrace{2000};   // api.md: SIGKILL 2 s after SIGTERM
// After SIGKILL: how often, and how many times, to check that the cgroup has emptied (and kill
// again what is left, e.g. without cgroup.kill a process that forked between two passes).
constexpr milliseconds kKillCheckInterval{20};
constexpr int kKillChecks = 50;
constexpr milliseconds kSweepInterval{500};  // removal of cgroups left busy by `server &`
// How long the spare cgroup set and the kept read buffers outlive the last start when nothing
// runs; the number of read buffers kept for the next commands.
constexpr milliseconds kIdleRelease{2000};
constexpr size_t kKeptBuffers = 4;
// How many cgroup sets a busy runner keeps for its next commands: one made ahead, and one that a
// command ended with and left reusable.
constexpr size_t kKeptSets = 2;
// A set is reused only while its memory cgroup holds at most this much once its command ended
// (page cache or tmpfs files the command left charged there, and the memory controller's per-CPU
// charge batches): the next command's memory peak starts from it. A python command that had
// allocated 150 MiB left 1.1 MiB charged on a loaded host (kernel objects whose freeing waits
// for an RCU grace period, the batches), just over the 1 MiB this was; a file it wrote is
// usually more.
constexpr uint64_t kReuseMaxHeldMemory = 2 << 20;
// The vfork child's stack: the runner's steps and the pre_exec hooks (capset, a seccomp
// filter load) need a few KiB; touched pages only are ever backed.
constexpr size_t kChildStackSize = 256 * 1024;

// ---- runner_stdio.cc: a command's pipes and terminal ----

int PipeSizeToAsk();
Status OpenTerminal(TerminalSize size, UniqueFd* master, UniqueFd* slave);
Result<UniqueFd> DupCloexec(int fd, const char* what);

// A command's stdio pipes: the host's ends (stdout and stderr read, stdin written) non-blocking,
// the child's ends for it to take; all close-on-exec. Pipe pages count against the sandbox
// user's fs.pipe-user-pages-soft (64 MiB by default; without CAP_SYS_RESOURCE in the initial
// namespace, as in a jail). Past it the kernel refuses to enlarge pipes and gives every new pipe,
// also the commands' own `a | b`, 2 pages. So only the first few concurrent commands get 1 MiB
// pipes (`enlarge_to`, 0 for none), which keeps the runner's share at half the default budget.
// Best effort: EPERM leaves the default size, which only costs speed.
struct StdioPipes {
  UniqueFd out, err, in;                    // the host's ends
  UniqueFd child_out, child_err, child_in;  // the child's
};

Status MakeStdioPipes(bool with_stdin, int enlarge_to, StdioPipes* p);

// ---- runner_cgroups.cc: a command's cgroups ----

void EnableAccountingControllers(int cgroup_dir);

// The parents of the commands' cgroups: the delegated v2 directory and the v1 ones of a hybrid
// host, dup'ed so that a job on the runner's cgroup thread can outlive the runner.
struct CgroupParents {
  UniqueFd v2;                         // invalid without cgroup v2
  std::vector<UniqueFd> v1;            // each hierarchy once
  int memory_v1 = -1, pids_v1 = -1;    // their indexes in v1; -1 for none
  std::atomic<uint64_t> next_name{1};  // the n of the next exec-<n>
};

// One command's cgroups: exec-<n> in every hierarchy, the v2 one its kill scope.
struct CgroupSet {
  std::string name;
  UniqueFd v2;                     // reset once removed
  std::vector<UniqueFd> v1;        // indexed like CgroupParents::v1; each reset once removed
  std::vector<UniqueFd> v1_procs;  // their cgroup.procs, for the child
  UsageFiles usage;                // read when the command is answered
  // A set that a command ended with, kept for the next one: its counters when it was kept,
  // which the next command's figures are reckoned from (UsageSince).
  CommandUsage before;

  // Once the command is answered and the set will not be reused: an open cgroup file would keep
  // a removed cgroup's memory.
  void CloseFiles() {
    v1_procs.clear();
    usage = UsageFiles();
  }
};

// Which of a set's directories are still there.
struct CgroupsLeft {
  bool v2 = false;
  std::vector<bool> v1;
  bool any() const { return v2 || std::find(v1.begin(), v1.end(), true) != v1.end(); }
};

CgroupsLeft LeftOf(const CgroupSet& set);
Result<std::shared_ptr<CgroupParents>> DupParents(int v2, const std::vector<int>& v1, int memory_v1,
                                                  int pids_v1);
CgroupsLeft RemoveCgroups(const CgroupParents& parents, const std::string& name, CgroupsLeft left,
                          uint64_t id);

// A set made ahead of use; removed when it is dropped unused (an idle runner, a runner that
// ended, or a reactor that went away with the set still in a posted callback).
class SpareSet {
 public:
  SpareSet(std::shared_ptr<CgroupParents> parents, CgroupSet set)
      : parents_(std::move(parents)), set_(std::move(set)) {}
  ~SpareSet() {
    set_.CloseFiles();
    if (!set_.name.empty()) RemoveCgroups(*parents_, set_.name, LeftOf(set_), 0);
  }
  SpareSet(const SpareSet&) = delete;
  SpareSet& operator=(const SpareSet&) = delete;

  CgroupSet Take() {
    CgroupSet set = std::move(set_);
    set_.name.clear();
    return set;
  }

 private:
  std::shared_ptr<CgroupParents> parents_;
  CgroupSet set_;
};

// The delegated v1 directories, each once: co-mounted memory and pids are one directory, and one
// child cgroup there serves both.
struct V1Layout {
  std::vector<int> dirs;
  int memory = -1, pids = -1;  // their indexes in dirs; -1 for none
};

V1Layout LayOutV1(RunnerV1Cgroups v1);

// ---- runner_child.cc: a command's child ----

uint64_t NonDefaultSignals();

// What a command's child reads before execve: argv and envp (and the fallback's) as the kernel
// wants them, pointing into the CommandSpec, or into copies of its strings for a child made ahead
// (WarmChild), which reads them after Start has returned.
struct Launch {
  std::vector<std::string> owned_argv, owned_env, owned_fallback_argv, owned_fallback_env;
  std::string owned_file, owned_cwd;
  std::vector<const char*> argv, envp, fallback_argv, fallback_envp;
  std::string pwd_env;  // a direct command's PWD, which the child completes
  SpawnRequest request;
};

std::unique_ptr<Launch> PrepareLaunch(const CommandSpec& spec, bool own);
std::string StartFailureLine(SpawnStep step, int err, const std::string& cwd,
                             const std::string& name, const std::vector<std::string>& env,
                             const std::vector<std::string>& fallback_env);

}  // namespace runner_internal

// Every file of the runner uses these as runner.cc did when they were its own (an anonymous
// namespace): this header is included by those files only.
using namespace runner_internal;

struct Runner::Impl {
  struct Stream {
    UniqueFd fd;
    std::unique_ptr<char[]> buf;  // reused by every read of the stream
    OpId op = 0;
    bool eof = false;
    bool parked = false;    // its next read waits for PauseOutput(false) (in parked_reads)
    uint64_t read = 0;      // bytes read from it
    uint64_t drain_to = 0;  // what the main process left in it at its exit ends here (or before)
    bool read_at_exit = false;  // a read was under way at that exit: what it brings counts too
  };

  struct Command {
    Impl* impl = nullptr;  // null once the runner is gone: late completions only release
    uint64_t id = 0;
    CommandEvents events;
    pid_t pid = -1;  // also the process group and session id (setsid)
    UniqueFd pidfd;  // closed once the main process is reaped
    CgroupSet cg;
    bool kill_scope = false;  // cg.v2 was made: kills go through the cgroup
    bool removing = false;    // the cgroup thread is removing cg's directories
    bool reusable = false;    // cg may serve the next command (Reusable): kept, not removed
    Stream out, err;
    // stdin: the pipe's write end, or a dup of the terminal's master.
    UniqueFd in;
    struct InputChunk {
      std::string data;
      size_t done = 0;           // bytes written so far
      bool close = false;        // close stdin once written
      Runner::InputDone answer;  // null for stdin_data
    };
    std::deque<InputChunk> input;  // the front is being written
    size_t input_pending = 0;      // bytes of the queued Input chunks
    bool stdin_stream = false;     // Input is accepted
    bool input_closed = false;     // no more Input: a close was queued, or stdin is gone
    std::string input_closed_why;
    UniqueFd tty;                // terminal execs: a dup of the master, for TIOCSWINSZ and VEOF
    bool tty_line_open = false;  // the input written to the terminal ends inside a line
    OpId write_op = 0, poll_op = 0, timeout_op = 0, grace_op = 0, drain_op = 0, check_op = 0;
    uint64_t limit = 0;
    uint64_t delivered = 0;
    bool truncated = false;
    // The cap was reached after the main process had exited: the rest dropped, nothing killed.
    bool capped_after_exit = false;
    // stderr as delivered ends a line (or is empty): nsbox's own stderr lines start on a new one.
    bool stderr_at_line_start = true;
    std::optional<EndReason> kill_reason;  // the first kill wins
    bool killed_running = false;           // the kill came before the main process exited
    int kill_checks = 0;
    bool main_exited = false;
    ExitStatus status;
    bool reported = false;
    std::string start_failure;  // the stderr line of a command that could not be started
    // A command handed to a child made ahead: the child and what it reads until its execve,
    // kept until it has exited, when it says whether it got that far (start_failure).
    std::unique_ptr<WarmChild> warm;
    std::unique_ptr<Launch> launch;
    std::string start_cwd, start_name;
    Clock::time_point started;
    milliseconds timeout{0};
  };
  using CommandPtr = std::shared_ptr<Command>;

  // `controllers_enabled`: PremadeCgroups::Make already passed them down.
  Impl(Reactor& r, int dir, ChildHooks h, RunnerV1Cgroups v1, bool controllers_enabled)
      : reactor(r), cgroup_dir(dir), hooks(h) {
    V1Layout layout = LayOutV1(v1);
    v1_dirs = std::move(layout.dirs);
    memory_v1 = layout.memory;
    pids_v1 = layout.pids;
    if (cgroup_dir >= 0 && !controllers_enabled) EnableAccountingControllers(cgroup_dir);
    if (auto score = ReadFile("/proc/self/oom_score_adj"); score.ok()) {
      own_oom_score_adj = std::move(score).value();
    }
  }

  Result<uint64_t> Start(const CommandSpec& spec, CommandEvents events);
  void ArmRead(const CommandPtr& cmd, int stream);
  // The next read of a stream: at once, or parked while output is paused (PauseOutput) and the
  // command not yet reported.
  void ReadNext(const CommandPtr& cmd, int stream);
  void Unpark(const CommandPtr& cmd, int stream);
  void PauseOutput(bool paused);
  void ArmDrain(const CommandPtr& cmd);
  void OnRead(const CommandPtr& cmd, int stream, ssize_t n);
  void Deliver(const CommandPtr& cmd, int stream, size_t n);
  void PumpInput(const CommandPtr& cmd);
  void ArmWrite(const CommandPtr& cmd);
  void OnWrite(const CommandPtr& cmd, ssize_t n);
  void FailInput(const CommandPtr& cmd, int err, const std::string& why);
  void Input(uint64_t id, std::string data, bool close, InputDone done);
  Status Resize(uint64_t id, TerminalSize size);
  void ArmPoll(const CommandPtr& cmd);
  void OnMainExit(const CommandPtr& cmd, int res);
  void MaybeFinish(const CommandPtr& cmd);
  void Finish(const CommandPtr& cmd);
  CommandResult ComputeResult(const Command& cmd) const;
  void BeginKill(const CommandPtr& cmd, EndReason reason);
  void SignalTree(const CommandPtr& cmd, int sig);
  void SendKill(const CommandPtr& cmd);
  void OnKillCheck(const CommandPtr& cmd);
  bool TryRemoveCgroup(Command& cmd);
  void ApplyRemoval(Command& cmd, const CgroupsLeft& left);
  void RemoveOffLoop(const CommandPtr& cmd);
  Result<CgroupSet> TakeCgroupSet();
  bool Reusable(const Command& cmd, const CommandUsage& counters) const;
  bool Keep(CgroupSet& set);
  void RequestSpare();
  void ArmIdle();
  void ReleaseIdle();
  void MaybeMakeWarm();
  void DropWarm();
  Status OpenDevNull();  // dev_null and pipe_size, once
  void Anticipate(bool hold);
  std::unique_ptr<char[]> TakeBuffer();
  void KeepBuffer(std::unique_ptr<char[]> buf);
  void MaybeRetire(const CommandPtr& cmd);
  void ScheduleSweep();
  void Sweep();
  void KillAll(EndReason reason);
  void Shutdown();

  // A Timer that survives the io_uring backend's "no SQE now" (-EAGAIN) by re-arming for what
  // is left of the delay; `fn` runs with 0 when it fired, -ECANCELED when cancelled.
  OpId ArmTimer(const CommandPtr& cmd, milliseconds delay, OpId Command::*slot,
                void (*fn)(const CommandPtr&));

  Reactor& reactor;
  int cgroup_dir;
  ChildHooks hooks;
  // PauseOutput: whether it is paused, when it last resumed, and the (command, stream) pairs
  // whose next read waits for it.
  bool output_paused = false;
  Clock::time_point output_resumed{};
  std::vector<std::pair<CommandPtr, int>> parked_reads;

  std::vector<int> v1_dirs;          // delegated v1 directories, each once
  int memory_v1 = -1, pids_v1 = -1;  // their indexes in v1_dirs; -1 for none
  // One thread for the cgroup directories (started at the first job, ended when idle). Reset by
  // Shutdown, which waits for its jobs (they only Post to the reactor).
  std::unique_ptr<WorkerPool> cgroup_thread = std::make_unique<WorkerPool>(1, kIdleRelease);
  std::shared_ptr<CgroupParents> parents;  // dups of the above, made at the first Start
  // Sets for the next commands (at most kKeptSets): made ahead, or left reusable by a command.
  std::vector<std::shared_ptr<SpareSet>> spares;
  bool spare_pending = false;  // the cgroup thread is making one
  // Where the cgroup thread leaves the set it made for the loop to take: held here, not by the
  // closure it posts, so that Shutdown removes it even when the loop never runs that closure.
  struct MadeSpare {
    std::mutex mu;
    std::shared_ptr<SpareSet> set;
  };
  std::shared_ptr<MadeSpare> made_spare = std::make_shared<MadeSpare>();
  std::vector<std::unique_ptr<char[]>> buffers;  // read buffers kept for the next commands
  Clock::time_point last_start;                  // of the last Start (the epoch before the first)
  bool in_a_row = false;  // the last Start came within kIdleRelease of the one before
  // What a command's child sets back to the default dispositions (SpawnRequest::reset_signals):
  // looked up when the runner is made and again whenever it goes idle.
  uint64_t reset_signals = ~uint64_t{0};
  OpId idle_op = 0;
  // Anticipate(hold): nothing made ahead is released before the first command (ArmIdle waits).
  bool hold_for_first = false;
  // A child made ahead for the next command, in its own set (WarmChild): made while commands
  // come in a row, dropped when the runner idles. `warm_off` once one failed a step.
  std::unique_ptr<WarmChild> warm;
  CgroupSet warm_set;
  StdioPipes warm_pipes;                   // the host's ends of its pipes
  std::unique_ptr<ChildStack> warm_stack;  // a launched child's, once it exited: the next one's
  bool warm_off = false;
  bool warm_never = false;  // NoChildrenMadeAhead
  // This process's oom_score_adj as the runner found it, and whether a child made ahead may have
  // changed it since: the child raises its own before its command, and the kernel gives the
  // score to every process sharing its memory (not to vfork children), this one included
  // (exec/runner.h NoChildrenMadeAhead). Put back when the runner idles, no child left.
  std::string own_oom_score_adj;
  bool oom_score_shared = false;
  std::unique_ptr<ChildStack> stack;
  UniqueFd dev_null;
  int pipe_size = 0;
  uint64_t next_id = 1;
  std::map<uint64_t, CommandPtr> commands;  // running, then lingering until retired
  size_t running = 0;
  OpId sweep_op = 0;
  bool shutting_down = false;
  // Checked by the sweep timer's callback, which may run after the runner is gone.
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
};

struct PremadeCgroups::State {
  std::shared_ptr<CgroupParents> parents;
  std::vector<std::shared_ptr<SpareSet>> sets;  // removed with it, if no runner took them
};

}  // namespace nsbox::exec

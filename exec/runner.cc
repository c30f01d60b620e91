// The command runner of nsbox-init (api.md, exec). One command's life:
//
//   Start   its cgroups: exec-<n> in the v2 directory (and in the v1 memory and pids ones of a
//           hybrid host), the spare set made ahead of time if there is one; pipes; Spawn
//           (clone3 CLONE_INTO_CGROUP, vfork-like; the child joins the v1 ones before execve);
//           on_start; a Read per output pipe, a PollIn on the pidfd, stdin Writes, the timeout;
//           for commands in a row, the next one's set is made on the runner's thread meanwhile.
//   output  delivered as it comes through on_output, counted against output_limit.
//   exit    the pidfd is readable: waitid reaps the main process. The pipes are read until EOF
//           or for the 100 ms drain window, whichever is first; the usage figures are read from
//           the command's cgroups; then on_exit, exactly once.
//   after   the pipes are read and discarded until EOF (background processes never block on a
//           full pipe); a set that can serve the next command as new (Reusable) is kept for
//           it; else the cgroups are removed once empty (tried at once: on the runner's
//           thread for commands in a row, else on the loop; then by a sweep every 500 ms while
//           any is left); then it is forgotten.
//   idle    2 s after the last start with nothing running, the kept sets and the kept read
//           buffers are released: an idle sandbox holds neither.
//
// Kill (timeout, cancel, stop): SIGTERM to the process group and to every process of the
// cgroup (or of the session where there is no cgroup), SIGKILL 2 s later (cgroup.kill). The
// output cap kills at once with SIGKILL: the output is lost anyway, and a tree that spews output
// gets no grace. The answer comes when the main process has died: at once if it dies on SIGTERM.
// A kill that arrives in the drain window (the main process had already exited on its own)
// still reaches the tree, but the answer keeps the natural exit. Kill and KillAll on a command
// already answered: Kill ignores it; KillAll (a sandbox stop) also kills its background processes.
//
// What the caller must know (runner.h cannot say it all):
// - on_start runs inside Start, before it returns; on_output and on_exit from RunOnce.
// - The reactor outlives the runner, and no callback destroys the runner.
// - The destructor SIGKILLs everything, reaps, and calls on_exit (kStopped) for what was still
//   running; output still in the pipes is not read. Exec cgroups are removed, waiting up to 1 s.
// - The runner reaps its own children through their pidfds: nsbox-init, which as PID 1 must
//   reap orphans, must not use waitpid(-1) or waitid(P_ALL) without WNOWAIT; it reaps by pid
//   the exited children that are not the runner's (runner.h has no query for that yet).
// - SIGPIPE: set to SIG_IGN by the constructor where it was SIG_DFL, so that feeding stdin to a
//   command that closed it fails with EPIPE instead of killing nsbox-init.
//
// stdin: a queue of chunks (stdin_data first, then each Input), written in order through the
// reactor; an Input is answered once its last byte is written, which is the sender's flow
// control. Only the chunk at the front is ever being written; the queue is bounded by
// kMaxPendingInput bytes and kMaxPendingInputs chunks. Without stdin_stream the stdin_data chunk
// closes the pipe once written.
//
// Terminals (spec.tty): a pty pair from /dev/ptmx; the slave is the child's 0, 1 and 2 and its
// controlling terminal (SpawnRequest::controlling_tty), and nsbox-init closes its copy at once
// after the spawn, so no other command can inherit it. The master (non-blocking, close-on-exec)
// is read as stream 1, exactly as a stdout pipe: a read of the master fails with EIO once no
// process holds the slave, which is its EOF. Two dups of it: one written for the input (closed
// once a close was written: VEOF, not a hang-up), one kept for TIOCSWINSZ until the answer.

#include "exec/runner.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/cleanup.h"
#include "base/files.h"
#include "base/log.h"
#include "base/pidfd.h"
#include "base/stack.h"
#include "base/syscalls.h"
#include "base/worker_pool.h"
#include "exec/command.h"
#include "exec/spawn.h"
#include "policy/environment.h"

namespace nsbox::exec {

std::string_view EndReasonName(EndReason reason) {
  switch (reason) {
    case EndReason::kExited:
      return "exited";
    case EndReason::kSignaled:
      return "signaled";
    case EndReason::kTimeout:
      return "timeout";
    case EndReason::kCancelled:
      return "cancelled";
    case EndReason::kOutputLimit:
      return "output_limit";
    case EndReason::kOom:
      return "oom";
    case EndReason::kStopped:
      return "stopped";
  }
  return "unknown";
}

namespace {

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

// 1 MiB, or less where fs.pipe-max-size is lower (asking for more would fail with EPERM).
int PipeSizeToAsk() {
  auto text = ReadFile("/proc/sys/fs/pipe-max-size");
  if (!text.ok()) return kWantedPipeSize;
  long max = std::strtol(text->c_str(), nullptr, 10);
  if (max <= 0) return kWantedPipeSize;
  return static_cast<int>(std::min<long>(max, kWantedPipeSize));
}

Status MakePipe(UniqueFd* read_end, UniqueFd* write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) < 0) return Error::Sys("pipe2", "", errno);
  read_end->reset(fds[0]);
  write_end->reset(fds[1]);
  return Ok();
}

// A pty pair of the given size: the master non-blocking and close-on-exec, the slave (opened
// from the master: TIOCGPTPEER, so no path lookup in /dev/pts can hand back another terminal)
// close-on-exec and blocking, as a command expects its terminal.
Status OpenTerminal(TerminalSize size, UniqueFd* master, UniqueFd* slave) {
  int m = ::open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
  if (m < 0) return Error::Sys("open", "/dev/ptmx", errno);
  master->reset(m);
  int unlock = 0;
  if (::ioctl(m, TIOCSPTLCK, &unlock) < 0) {
    return Error::Sys("ioctl(TIOCSPTLCK)", "/dev/ptmx", errno);
  }
  struct winsize ws {};
  ws.ws_row = size.rows;
  ws.ws_col = size.cols;
  if (::ioctl(m, TIOCSWINSZ, &ws) < 0) return Error::Sys("ioctl(TIOCSWINSZ)", "/dev/ptmx", errno);
  int s = ::ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (s < 0) return Error::Sys("ioctl(TIOCGPTPEER)", "/dev/ptmx", errno);
  slave->reset(s);
  return Ok();
}

Result<UniqueFd> DupCloexec(int fd, const char* what) {
  int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (d < 0) return Error::Sys("fcntl(F_DUPFD_CLOEXEC)", what, errno);
  return UniqueFd(d);
}

// The terminal's end-of-file character (c_cc[VEOF] of the slave's termios, which tcgetattr on
// the master reads); ^D when it cannot be read or is disabled.
char EofCharacter(int master) {
  struct termios t {};
  if (::tcgetattr(master, &t) == 0 && t.c_cc[VEOF] != _POSIX_VDISABLE) {
    return static_cast<char>(t.c_cc[VEOF]);
  }
  return '\x04';
}

Status SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return Error::Sys("fcntl", "O_NONBLOCK", errno);
  }
  return Ok();
}

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

Status MakeStdioPipes(bool with_stdin, int enlarge_to, StdioPipes* p) {
  NSBOX_TRY_CTX(MakePipe(&p->out, &p->child_out), "stdout pipe");
  NSBOX_TRY_CTX(MakePipe(&p->err, &p->child_err), "stderr pipe");
  NSBOX_TRY_CTX(SetNonBlocking(p->out.get()), "stdout pipe");
  NSBOX_TRY_CTX(SetNonBlocking(p->err.get()), "stderr pipe");
  if (enlarge_to > 0) {
    for (int fd : {p->out.get(), p->err.get()}) (void)::fcntl(fd, F_SETPIPE_SZ, enlarge_to);
  }
  if (with_stdin) {
    NSBOX_TRY_CTX(MakePipe(&p->child_in, &p->in), "stdin pipe");
    NSBOX_TRY_CTX(SetNonBlocking(p->in.get()), "stdin pipe");
  }
  return Ok();
}

bool SameFile(int a, int b) {
  struct stat sa {
  }, sb{};
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// Pure v2: the memory, pids and io controllers the sandbox's cgroup has, passed on to the exec
// cgroups, so that memory.peak, pids.peak, io.stat and memory.events exist there. Best effort
// (nothing to do on a hybrid host, whose v2 directory has no controllers): nsbox-init lives in
// the leaf "init", so the directory holds no process and may pass controllers down.
void EnableAccountingControllers(int cgroup_dir) {
  auto available = ReadFileAt(cgroup_dir, "cgroup.controllers");
  if (!available.ok()) return;
  std::string words = " " + *available + " ";
  for (char& c : words) {
    if (c == '\n') c = ' ';
  }
  for (const char* c : {"memory", "pids", "io"}) {
    if (words.find(" " + std::string(c) + " ") == std::string::npos) continue;
    Status st = WriteExistingFileAt(cgroup_dir, "cgroup.subtree_control", std::string("+") + c);
    if (!st.ok())
      log::warn("exec usage: enable {} for the exec cgroups: {}", c, st.error().message());
  }
}

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

CgroupsLeft LeftOf(const CgroupSet& set) {
  CgroupsLeft left;
  left.v2 = set.v2.valid();
  for (const auto& fd : set.v1) left.v1.push_back(fd.valid());
  return left;
}

Result<std::shared_ptr<CgroupParents>> DupParents(int v2, const std::vector<int>& v1, int memory_v1,
                                                  int pids_v1) {
  auto parents = std::make_shared<CgroupParents>();
  if (v2 >= 0) {
    NSBOX_ASSIGN_OR_RETURN(parents->v2, DupCloexec(v2, "the exec cgroups' parent"));
  }
  for (int dir : v1) {
    NSBOX_ASSIGN_OR_RETURN(auto fd, DupCloexec(dir, "the exec cgroups' v1 parent"));
    parents->v1.push_back(std::move(fd));
  }
  parents->memory_v1 = memory_v1;
  parents->pids_v1 = pids_v1;
  return parents;
}

// Removes what is left of the set `name` (the v2 directory, the kill scope, first: while it has
// processes, nothing is removed) and says what is still there. A cgroup with processes cannot be
// removed (EBUSY): background processes keep running in it until they end or the sandbox is
// stopped. Safe on any thread.
CgroupsLeft RemoveCgroups(const CgroupParents& parents, const std::string& name, CgroupsLeft left,
                          uint64_t id) {
  if (left.v2) {
    if (::unlinkat(parents.v2.get(), name.c_str(), AT_REMOVEDIR) < 0 && errno != ENOENT) {
      if (errno != EBUSY) log::warn("exec {}: rmdir {}: {}", id, name, ErrnoText(errno));
      return left;
    }
    left.v2 = false;
  }
  for (size_t i = 0; i < left.v1.size() && i < parents.v1.size(); ++i) {
    if (!left.v1[i]) continue;
    if (::unlinkat(parents.v1[i].get(), name.c_str(), AT_REMOVEDIR) < 0 && errno != ENOENT) {
      if (errno != EBUSY) log::warn("exec {}: rmdir v1 {}: {}", id, name, ErrnoText(errno));
      continue;
    }
    left.v1[i] = false;
  }
  return left;
}

// The signals this process does not leave at their default disposition (ignored or caught; bit
// n-1 for signal n), and always glibc's two internal ones (32 and 33: thread cancellation and
// setxid), whose handlers it installs lazily and whose dispositions its sigaction does not tell:
// what a command's child sets back before execve instead of all 64 (≈ 20 µs of each exec,
// docs/benchmarks.md "Where a command's child spends its time"). A disposition changed later is
// picked up when the runner next goes idle: nsbox-init sets its own (SIGPIPE) before it makes the
// runner, and no other afterwards; the child blocks every signal until just before execve, which
// resets handlers to the default anyway.
uint64_t NonDefaultSignals() {
  uint64_t mask = (uint64_t{1} << (32 - 1)) | (uint64_t{1} << (33 - 1));
  for (int sig = 1; sig < 65; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP || sig == 32 || sig == 33) continue;
    struct sigaction action {};
    if (::sigaction(sig, nullptr, &action) != 0 || action.sa_handler != SIG_DFL) {
      mask |= uint64_t{1} << (sig - 1);  // ignored, caught, or unknown: reset it
    }
  }
  return mask;
}

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

V1Layout LayOutV1(RunnerV1Cgroups v1) {
  V1Layout out;
  if (v1.memory_dir >= 0) {
    out.memory = static_cast<int>(out.dirs.size());
    out.dirs.push_back(v1.memory_dir);
  }
  if (v1.pids_dir >= 0) {
    out.pids = static_cast<int>(out.dirs.size());
    if (v1.memory_dir >= 0 && SameFile(v1.memory_dir, v1.pids_dir)) {
      out.pids = out.memory;
    } else {
      out.dirs.push_back(v1.pids_dir);
    }
  }
  return out;
}

// A fresh exec-<n> in every hierarchy, with the fds the command and its usage report need. A
// stale exec-<n> (a runner before this one left it busy) is skipped, never reused: it may hold
// someone else's processes. Safe on any thread.
Result<CgroupSet> MakeCgroupSet(CgroupParents& parents) {
  CgroupSet set;
  CgroupsLeft made;
  for (int tries = 0;; ++tries) {
    set.name = "exec-" + std::to_string(parents.next_name.fetch_add(1));
    made = CgroupsLeft();
    made.v1.assign(parents.v1.size(), false);
    int err = 0;
    if (parents.v2.valid()) {
      if (::mkdirat(parents.v2.get(), set.name.c_str(), 0755) == 0) {
        made.v2 = true;
      } else {
        err = errno;
      }
    }
    for (size_t i = 0; err == 0 && i < parents.v1.size(); ++i) {
      if (::mkdirat(parents.v1[i].get(), set.name.c_str(), 0755) == 0) {
        made.v1[i] = true;
      } else {
        err = errno;
      }
    }
    if (err == 0) break;
    RemoveCgroups(parents, set.name, made, 0);
    if (err != EEXIST || tries >= 1000) return Error::Sys("mkdir", set.name, err);
  }
  CleanupStack undo;
  undo.Push([&parents, &set, &made] { RemoveCgroups(parents, set.name, made, 0); });
  if (parents.v2.valid()) {
    NSBOX_ASSIGN_OR_RETURN(set.v2, OpenAt(parents.v2.get(), set.name, O_RDONLY | O_DIRECTORY));
  }
  for (const auto& dir : parents.v1) {
    NSBOX_ASSIGN_OR_RETURN(auto fd, OpenAt(dir.get(), set.name, O_RDONLY | O_DIRECTORY));
    NSBOX_ASSIGN_OR_RETURN(auto procs, OpenAt(fd.get(), "cgroup.procs", O_WRONLY));
    set.v1.push_back(std::move(fd));
    set.v1_procs.push_back(std::move(procs));
  }
  auto v1_dir = [&set](int index) { return index >= 0 ? set.v1[index].get() : -1; };
  set.usage = OpenUsageFiles(
      {set.v2.valid() ? set.v2.get() : -1, v1_dir(parents.memory_v1), v1_dir(parents.pids_v1)});
  undo.Release();
  return set;
}

void SleepMs(long ms) {
  struct timespec ts {
    ms / 1000, (ms % 1000) * 1000000
  };
  while (::nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

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

std::unique_ptr<Launch> PrepareLaunch(const CommandSpec& spec, bool own) {
  auto l = std::make_unique<Launch>();
  const std::vector<std::string>* argv = &spec.argv;
  const std::vector<std::string>* env = &spec.env;
  const std::vector<std::string>* fallback_argv = &spec.fallback_argv;
  const std::vector<std::string>* fallback_env = &spec.fallback_env;
  const std::string* file = &spec.file;
  const std::string* cwd = &spec.cwd;
  if (own) {
    l->owned_argv = spec.argv;
    l->owned_env = spec.env;
    l->owned_fallback_argv = spec.fallback_argv;
    l->owned_fallback_env = spec.fallback_env;
    l->owned_file = spec.file;
    l->owned_cwd = spec.cwd;
    argv = &l->owned_argv;
    env = &l->owned_env;
    fallback_argv = &l->owned_fallback_argv;
    fallback_env = &l->owned_fallback_env;
    file = &l->owned_file;
    cwd = &l->owned_cwd;
  }
  l->argv.reserve(argv->size() + 1);
  for (const auto& a : *argv) l->argv.push_back(a.c_str());
  l->argv.push_back(nullptr);
  l->envp.reserve(env->size() + 2);
  for (const auto& e : *env) l->envp.push_back(e.c_str());
  // A direct command's PWD, which the child completes (a path of up to PATH_MAX bytes).
  if (!file->empty() && !fallback_argv->empty()) {
    l->pwd_env.assign(4 + PATH_MAX, '\0');
    l->pwd_env.replace(0, 4, "PWD=");
    l->envp.push_back(l->pwd_env.data());
    for (const auto& a : *fallback_argv) l->fallback_argv.push_back(a.c_str());
    l->fallback_argv.push_back(nullptr);
    for (const auto& e : *fallback_env) l->fallback_envp.push_back(e.c_str());
    l->fallback_envp.push_back(nullptr);
  }
  l->envp.push_back(nullptr);

  SpawnRequest& request = l->request;
  request.argv = l->argv.data();
  request.envp = l->envp.data();
  if (!file->empty()) request.file = file->c_str();
  if (!l->fallback_argv.empty()) {
    request.fallback_argv = l->fallback_argv.data();
    request.fallback_envp = l->fallback_envp.data();
    request.pwd_env = l->pwd_env.data();
    request.pwd_env_size = l->pwd_env.size();
  }
  request.cwd = cwd->empty() ? "/" : cwd->c_str();
  request.shell_line = spec.shell_line;
  return l;
}

// The stderr line of a command whose child stopped at `step` before execve; empty for kNone.
// `env` and `fallback_env` are the environments it was given: an E2BIG of execve names the
// variable too long for it, if one is.
std::string StartFailureLine(SpawnStep step, int err, const std::string& cwd,
                             const std::string& name, const std::vector<std::string>& env,
                             const std::vector<std::string>& fallback_env) {
  switch (step) {
    case SpawnStep::kNone:
      return std::string();
    case SpawnStep::kChdir:
      // As bash says it; the child has exited with 1 (api.md: "cannot be started").
      return "nsbox: cd: " + cwd + ": " + strerrordesc_np(err) + "\n";
    case SpawnStep::kExec:
      if (err == E2BIG) {
        std::string oversized = policy::OversizedEnvEntry(env);
        if (oversized.empty()) oversized = policy::OversizedEnvEntry(fallback_env);
        if (!oversized.empty()) {
          return DescribeExecFailure(name, err).message + " (E2BIG): " + oversized + "\n";
        }
      }
      return DescribeExecFailure(name, err).message + "\n";
    default:
      return "nsbox: the command could not be started: " + std::string(SpawnStepName(step)) + ": " +
             strerrordesc_np(err) + "\n";
  }
}

}  // namespace

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

Status Runner::Impl::OpenDevNull() {
  if (dev_null.valid()) return Ok();
  NSBOX_ASSIGN_OR_RETURN(dev_null, OpenAt(AT_FDCWD, "/dev/null", O_RDWR));
  pipe_size = PipeSizeToAsk();
  return Ok();
}

void Runner::Impl::Anticipate(bool hold) {
  if (hold && last_start == Clock::time_point{}) {
    hold_for_first = true;
    if (idle_op != 0) reactor.Cancel(idle_op);  // the constructor's, for the cgroups made ahead
  }
  if (shutting_down || spares.empty() || warm != nullptr) return;
  if (auto opened = OpenDevNull(); !opened.ok()) {
    log::warn("exec: a child made ahead for the first command: {}", opened.error().message());
    return;
  }
  // A child for the first command only. That command still counts as a lone one, so that a
  // sandbox that runs one command does for it what it did before: no cgroup thread, no set made
  // for a next command, no second child (each would leave its share of kernel memory behind in
  // an idle sandbox, if only for a while: a removed memory cgroup lingers while anything is still
  // charged to it).
  const bool was_in_a_row = in_a_row;
  in_a_row = true;
  MaybeMakeWarm();
  in_a_row = was_in_a_row;
  ArmIdle();
}

Result<uint64_t> Runner::Impl::Start(const CommandSpec& spec, CommandEvents events) {
  if (spec.argv.empty()) return Error::Msg("start command: empty argv");
  if (shutting_down) return Error::Msg("start command: the runner is shutting down");
  hold_for_first = false;  // from now on, idle is idle (Anticipate)
  if (stack == nullptr) {
    auto created = ChildStack::Create(kChildStackSize);
    if (!created.ok()) return std::move(created).error().Context("start command");
    stack = std::move(created).value();
  }
  NSBOX_TRY_CTX(OpenDevNull(), "start command");

  auto cmd = std::make_shared<Command>();
  cmd->impl = this;
  cmd->id = next_id++;
  CleanupStack undo;

  // A child made ahead takes the command when it is ready, with its cgroups and pipes (not a
  // terminal's: the pty is the command's own). One that is still getting ready serves a later
  // command.
  std::unique_ptr<WarmChild> child;
  if (warm != nullptr && !spec.tty.has_value()) {
    switch (warm->Poll()) {
      case WarmChild::State::kReady:
        child = std::move(warm);
        cmd->cg = std::move(warm_set);
        warm_set = CgroupSet();
        cmd->kill_scope = cmd->cg.v2.valid();
        undo.Push([parents = parents, name = cmd->cg.name, left = LeftOf(cmd->cg)] {
          RemoveCgroups(*parents, name, left, 0);
        });
        undo.Push([&child] { child.reset(); });  // killed and reaped before its cgroups go
        break;
      case WarmChild::State::kFailed:
        if (Status why = warm->Failure(); !why.ok()) {
          log::warn("exec: commands start without a child made ahead: {}", why.error().message());
          warm_off = true;
        }
        DropWarm();
        break;
      default:
        break;
    }
  }
  // Its cgroups: the v2 one is the command's kill scope, the v1 ones (memory and pids of a
  // hybrid host) say what it used.
  if (child == nullptr && (cgroup_dir >= 0 || !v1_dirs.empty())) {
    auto set = TakeCgroupSet();
    if (!set.ok()) return std::move(set).error().Context("start command: cgroups");
    cmd->cg = std::move(set).value();
    cmd->kill_scope = cmd->cg.v2.valid();
    undo.Push([parents = parents, name = cmd->cg.name, left = LeftOf(cmd->cg)] {
      RemoveCgroups(*parents, name, left, 0);
    });
  }
  // Commands in a row (this one within kIdleRelease of the last): the next one's cgroups are
  // made ahead and ended ones removed on the cgroup thread. A lone command makes no spare that
  // would only be thrown away, and starts no thread.
  const Clock::time_point now = Clock::now();
  in_a_row = now - last_start < kIdleRelease;
  last_start = now;

  // The child made ahead has its pipes already; a terminal exec gets a pty of its own.
  StdioPipes pipes;
  UniqueFd tty_slave;
  const bool wants_stdin =
      !spec.tty.has_value() && (spec.stdin_data.has_value() || spec.stdin_stream);
  if (child != nullptr) {
    pipes = std::move(warm_pipes);
    warm_pipes = StdioPipes();
  } else if (spec.tty.has_value()) {
    NSBOX_TRY_CTX(OpenTerminal(*spec.tty, &cmd->out.fd, &tty_slave), "start command: terminal");
    NSBOX_ASSIGN_OR_RETURN(cmd->in, DupCloexec(cmd->out.fd.get(), "the terminal's master"));
    NSBOX_ASSIGN_OR_RETURN(cmd->tty, DupCloexec(cmd->out.fd.get(), "the terminal's master"));
    cmd->err.eof = true;  // one stream: the terminal
  } else {
    NSBOX_TRY_CTX(
        MakeStdioPipes(wants_stdin, running < kEnlargedPipeCommands ? pipe_size : 0, &pipes),
        "start command");
  }
  if (!spec.tty.has_value()) {
    cmd->out.fd = std::move(pipes.out);
    cmd->err.fd = std::move(pipes.err);
    // A child made ahead has a stdin pipe; it takes /dev/null instead when there is no input.
    if (wants_stdin) cmd->in = std::move(pipes.in);
  }
  cmd->stdin_stream = spec.stdin_stream || spec.tty.has_value();
  if (spec.stdin_data.has_value() && !spec.stdin_data->empty()) {
    cmd->input.push_back({*spec.stdin_data, 0, !cmd->stdin_stream, nullptr});
  } else if (!cmd->stdin_stream && cmd->in.valid()) {
    cmd->input.push_back({std::string(), 0, true, nullptr});  // nothing to feed: EOF at once
  }

  std::unique_ptr<Launch> launch = PrepareLaunch(spec, child != nullptr);
  SpawnRequest& request = launch->request;
  if (tty_slave.valid()) {
    request.stdin_fd = request.stdout_fd = request.stderr_fd = tty_slave.get();
    request.controlling_tty = true;
  } else {
    request.stdin_fd = pipes.child_in.valid() ? pipes.child_in.get() : dev_null.get();
    request.stdout_fd = pipes.child_out.get();
    request.stderr_fd = pipes.child_err.get();
  }
  request.cgroup_fd = cmd->cg.v2.valid() ? cmd->cg.v2.get() : -1;
  for (size_t i = 0; i < cmd->cg.v1_procs.size() && i < 2; ++i) {
    request.join_procs_fds[i] = cmd->cg.v1_procs[i].get();
  }
  request.reset_signals = reset_signals;
  request.hooks = hooks;
  cmd->started = Clock::now();
  Result<SpawnResult> spawned = child != nullptr
                                    ? Result<SpawnResult>(child->Launch(request, !wants_stdin))
                                    : Spawn(request, *stack);
  if (!spawned.ok()) return std::move(spawned).error().Context("start " + spec.argv[0]);
  undo.Release();
  // Only the child holds the other ends now: EOF comes when its tree has closed them.
  pipes = StdioPipes();
  tty_slave.reset();  // never inherited by another command: only this child holds the slave
  if (in_a_row) RequestSpare();

  cmd->pid = spawned->pid;
  cmd->pidfd = std::move(spawned->pidfd);
  cmd->limit = spec.output_limit;
  cmd->timeout = spec.timeout;
  cmd->events = std::move(events);
  cmd->out.buf = TakeBuffer();
  if (!cmd->err.eof) cmd->err.buf = TakeBuffer();
  // With a fallback, its failure is the one the child reports.
  const std::string& name = spec.fallback_argv.empty() ? spec.argv[0] : spec.fallback_argv[0];
  if (child != nullptr) {
    // It gets to its chdir and execve after this: what became of them is known at its exit.
    cmd->warm = std::move(child);
    cmd->launch = std::move(launch);
    cmd->start_cwd = spec.cwd;
    cmd->start_name = name;
  } else {
    cmd->start_failure = StartFailureLine(spawned->failed_step, spawned->err, spec.cwd, name,
                                          spec.env, spec.fallback_env);
  }

  commands.emplace(cmd->id, cmd);
  ++running;
  if (cmd->events.on_start) cmd->events.on_start(cmd->pid);
  ReadNext(cmd, 1);
  if (!cmd->err.eof) ReadNext(cmd, 2);
  ArmPoll(cmd);
  PumpInput(cmd);
  if (cmd->timeout.count() > 0 && !cmd->main_exited) {
    ArmTimer(cmd, cmd->timeout, &Command::timeout_op, [](const CommandPtr& c) {
      if (!c->main_exited) c->impl->BeginKill(c, EndReason::kTimeout);
    });
  }
  MaybeMakeWarm();
  return cmd->id;
}

OpId Runner::Impl::ArmTimer(const CommandPtr& cmd, milliseconds delay, OpId Command::*slot,
                            void (*fn)(const CommandPtr&)) {
  Clock::time_point deadline = Clock::now() + delay;
  OpId id = reactor.Timer(delay, [cmd, slot, fn, deadline](int res) {
    cmd.get()->*slot = 0;
    Impl* impl = cmd->impl;
    if (impl == nullptr || res == -ECANCELED) return;
    if (res == -EAGAIN) {  // no submission slot: try again for what is left
      auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
      impl->ArmTimer(cmd, std::max(left, milliseconds(0)), slot, fn);
      return;
    }
    fn(cmd);
  });
  cmd.get()->*slot = id;
  return id;
}

void Runner::Impl::ArmRead(const CommandPtr& cmd, int stream) {
  Stream& s = stream == 1 ? cmd->out : cmd->err;
  s.op = reactor.Read(s.fd.get(), s.buf.get(), kReadBufferSize, [cmd, stream](ssize_t n) {
    Stream& st = stream == 1 ? cmd->out : cmd->err;
    st.op = 0;
    if (cmd->impl == nullptr) return;
    cmd->impl->OnRead(cmd, stream, n);
  });
}

void Runner::Impl::OnRead(const CommandPtr& cmd, int stream, ssize_t n) {
  Stream& s = stream == 1 ? cmd->out : cmd->err;
  if (n == -EINTR || n == -EAGAIN) {
    // Not ready after all, or no submission slot now: wait for data, then read again.
    s.op = reactor.PollIn(s.fd.get(), [cmd, stream](int res) {
      Stream& st = stream == 1 ? cmd->out : cmd->err;
      st.op = 0;
      if (cmd->impl == nullptr) return;
      if (res == -ECANCELED) {
        cmd->impl->OnRead(cmd, stream, res);
        return;
      }
      cmd->impl->ArmRead(cmd, stream);
    });
    return;
  }
  if (n <= 0) {
    // EOF, an error, or cancelled: this stream is done.
    s.eof = true;
    s.fd.reset();
    KeepBuffer(std::move(s.buf));
    if (cmd->reported) {
      MaybeRetire(cmd);
    } else {
      MaybeFinish(cmd);
    }
    return;
  }
  s.read += static_cast<uint64_t>(n);
  if (s.read_at_exit) {
    s.drain_to += static_cast<uint64_t>(n);  // see OnMainExit
    s.read_at_exit = false;
  }
  if (!cmd->reported && !cmd->truncated) Deliver(cmd, stream, static_cast<size_t>(n));
  // After the answer, reading goes on and the bytes are dropped: a background process must
  // never block on a full pipe.
  if (s.fd.valid() && cmd->impl != nullptr) ReadNext(cmd, stream);
}

void Runner::Impl::ReadNext(const CommandPtr& cmd, int stream) {
  Stream& s = stream == 1 ? cmd->out : cmd->err;
  if (output_paused && !cmd->reported) {
    s.parked = true;
    parked_reads.emplace_back(cmd, stream);
    return;
  }
  ArmRead(cmd, stream);
}

void Runner::Impl::Unpark(const CommandPtr& cmd, int stream) {
  Stream& s = stream == 1 ? cmd->out : cmd->err;
  if (!s.parked) return;
  s.parked = false;
  if (cmd->impl != nullptr && s.fd.valid() && s.op == 0) ArmRead(cmd, stream);
}

void Runner::Impl::PauseOutput(bool paused) {
  output_paused = paused;
  if (paused) return;
  output_resumed = Clock::now();
  std::vector<std::pair<CommandPtr, int>> parked;
  parked.swap(parked_reads);
  for (const auto& [cmd, stream] : parked) Unpark(cmd, stream);
}

void Runner::Impl::Deliver(const CommandPtr& cmd, int stream, size_t n) {
  Stream& s = stream == 1 ? cmd->out : cmd->err;
  uint64_t room = cmd->limit - std::min(cmd->limit, cmd->delivered);
  size_t give = static_cast<size_t>(std::min<uint64_t>(n, room));
  if (give > 0) {
    cmd->delivered += give;
    if (stream == 2) cmd->stderr_at_line_start = s.buf[give - 1] == '\n';
    if (cmd->events.on_output) cmd->events.on_output(stream, std::string_view(s.buf.get(), give));
  }
  if (n > room) {
    cmd->truncated = true;
    // Once the main process has exited, what is left (the rest of its output, what its
    // background processes print) is read and dropped, never a reason to kill what it left
    // running (api.md): a `server &` that logged much in the drain window was killed with it.
    // The answer still says output_limit, since output was lost.
    if (cmd->main_exited) {
      cmd->capped_after_exit = true;
    } else {
      BeginKill(cmd, EndReason::kOutputLimit);
    }
  }
}

void Runner::Impl::PumpInput(const CommandPtr& cmd) {
  while (cmd->write_op == 0 && !cmd->input.empty()) {
    if (cmd->reported) {
      FailInput(cmd, EPIPE, "the command has ended");
      return;
    }
    Command::InputChunk& front = cmd->input.front();
    if (front.done < front.data.size()) {
      if (!cmd->in.valid()) {
        FailInput(cmd, EPIPE, "the command's stdin is closed");
        return;
      }
      ArmWrite(cmd);
      return;
    }
    Command::InputChunk chunk = std::move(front);
    cmd->input.pop_front();
    if (chunk.answer) cmd->input_pending -= chunk.data.size();
    if (chunk.close) {
      // A pipe: the command reads EOF. A terminal: the VEOF character was the chunk's last
      // byte, and this closes only the dup written to (the master stays, for the output).
      cmd->in.reset();
      cmd->input_closed = true;
    }
    if (chunk.answer) chunk.answer(0, "");
  }
}

void Runner::Impl::ArmWrite(const CommandPtr& cmd) {
  // The front chunk stays in place (a deque never moves its elements on push_back) until the
  // write's callback has run: the kernel may read the buffer until then.
  const Command::InputChunk& front = cmd->input.front();
  cmd->write_op = reactor.Write(cmd->in.get(), front.data.data() + front.done,
                                front.data.size() - front.done, [cmd](ssize_t n) {
                                  cmd->write_op = 0;
                                  if (cmd->impl == nullptr) return;
                                  cmd->impl->OnWrite(cmd, n);
                                });
}

void Runner::Impl::OnWrite(const CommandPtr& cmd, ssize_t n) {
  if (n > 0 && !cmd->input.empty()) {
    cmd->input.front().done += static_cast<size_t>(n);
    PumpInput(cmd);
    return;
  }
  if ((n == -EAGAIN || n == -EINTR) && !cmd->reported) {
    // The pipe was full after all, or the reactor had no submission slot: wait for room.
    cmd->write_op = reactor.PollOut(cmd->in.get(), [cmd](int res) {
      cmd->write_op = 0;
      if (cmd->impl == nullptr) return;
      if (res == -ECANCELED || cmd->reported) {
        cmd->impl->OnWrite(cmd, -ECANCELED);
        return;
      }
      cmd->impl->PumpInput(cmd);
    });
    return;
  }
  // EPIPE (the command closed its stdin, or never reads it: not an error of the command),
  // another error, or cancelled at the end: stdin is closed and what is queued is refused.
  std::string why;
  if (n == -ECANCELED || cmd->reported) {
    why = "the command has ended";
  } else if (n == -EPIPE) {
    why = "the command closed its stdin";
  } else if (n == -EIO && cmd->tty.valid()) {
    why = "the terminal is closed: no process of the command holds it";
  } else {
    why = "write to the command's stdin: " + ErrnoText(n < 0 ? static_cast<int>(-n) : EIO);
  }
  FailInput(cmd, EPIPE, why);
}

void Runner::Impl::FailInput(const CommandPtr& cmd, int err, const std::string& why) {
  // Never with a write in flight: its buffer is a chunk of the queue.
  cmd->in.reset();
  cmd->input_closed = true;
  if (cmd->input_closed_why.empty()) cmd->input_closed_why = why;
  std::deque<Command::InputChunk> chunks;
  chunks.swap(cmd->input);
  cmd->input_pending = 0;
  for (auto& chunk : chunks) {
    if (chunk.answer) chunk.answer(err, why);
  }
}

void Runner::Impl::Input(uint64_t id, std::string data, bool close, InputDone done) {
  auto it = commands.find(id);
  if (it == commands.end()) {
    done(ESRCH, "no command " + std::to_string(id));
    return;
  }
  CommandPtr cmd = it->second;  // held: an answer may retire it
  if (cmd->reported) {
    done(EPIPE, "the command has ended");
    return;
  }
  if (!cmd->stdin_stream) {
    done(EINVAL, "the command's stdin is not a stream (it was started without stdin_stream)");
    return;
  }
  if (cmd->input_closed) {
    done(EPIPE,
         cmd->input_closed_why.empty() ? "the command's stdin is closed" : cmd->input_closed_why);
    return;
  }
  if (cmd->input.size() >= kMaxPendingInputs ||
      cmd->input_pending + data.size() + (close ? 2 : 0) > kMaxPendingInput) {
    done(EAGAIN, "too much input waiting to be written (" + std::to_string(cmd->input.size()) +
                     " inputs, " + std::to_string(cmd->input_pending) + " bytes; at most " +
                     std::to_string(kMaxPendingInputs) + " and " +
                     std::to_string(kMaxPendingInput) +
                     "): send the next input after the answer to the previous one");
    return;
  }
  if (cmd->tty.valid()) {
    // A terminal in canonical mode reads VEOF as the end of the input only at the start of a
    // line; after "partial" it only hands the partial line over. So a close after an unended
    // line sends it twice: the line, then the end (a close=1 with "partial" never ended the
    // command's read before).
    const char eof = EofCharacter(cmd->tty.get());
    if (!data.empty()) {
      const char last = data.back();
      cmd->tty_line_open = last != '\n' && last != '\r' && last != eof;
    }
    if (close) {
      if (cmd->tty_line_open) data.push_back(eof);
      data.push_back(eof);
    }
  }
  cmd->input_pending += data.size();
  cmd->input.push_back({std::move(data), 0, close, std::move(done)});
  if (close) {
    cmd->input_closed = true;
    cmd->input_closed_why = "stdin was closed by an earlier input";
  }
  PumpInput(cmd);
}

Status Runner::Impl::Resize(uint64_t id, TerminalSize size) {
  auto it = commands.find(id);
  if (it == commands.end() || it->second->reported) {
    return Error(ESRCH, "no running command " + std::to_string(id));
  }
  Command& cmd = *it->second;
  if (!cmd.tty.valid()) return Error(ENOTTY, "the command has no terminal");
  struct winsize ws {};
  ws.ws_row = size.rows;
  ws.ws_col = size.cols;
  if (::ioctl(cmd.tty.get(), TIOCSWINSZ, &ws) < 0) {
    return Error::Sys("ioctl(TIOCSWINSZ)", "the terminal's master", errno);
  }
  return Ok();
}

void Runner::Impl::ArmPoll(const CommandPtr& cmd) {
  cmd->poll_op = reactor.PollIn(cmd->pidfd.get(), [cmd](int res) {
    cmd->poll_op = 0;
    if (cmd->impl == nullptr) return;
    cmd->impl->OnMainExit(cmd, res);
  });
}

void Runner::Impl::OnMainExit(const CommandPtr& cmd, int res) {
  if (res == -ECANCELED || cmd->main_exited) return;
  siginfo_t info{};
  if (::waitid(P_PIDFD, static_cast<id_t>(cmd->pidfd.get()), &info, WEXITED | WNOHANG) < 0) {
    if (errno == EINTR) {
      ArmPoll(cmd);
      return;
    }
    // ECHILD: someone else reaped it (nsbox-init must leave the runner's children alone).
    log::error("exec {}: waitid pid {}: {}", cmd->id, cmd->pid, ErrnoText(errno));
    info.si_pid = cmd->pid;
    info.si_code = CLD_KILLED;
    info.si_status = SIGKILL;
  } else if (info.si_pid == 0) {
    ArmPoll(cmd);  // woken without an exit (-EAGAIN from the reactor, or spurious)
    return;
  }
  cmd->main_exited = true;
  cmd->status = ExitStatusFromSiginfo(info);
  cmd->pidfd.reset();
  if (cmd->warm != nullptr) {
    cmd->start_failure =
        StartFailureLine(cmd->warm->failed_step(), cmd->warm->err(), cmd->start_cwd,
                         cmd->start_name, cmd->launch->owned_env, cmd->launch->owned_fallback_env);
    warm_stack = cmd->warm->TakeStack();  // the child is reaped: the next one's
    cmd->warm.reset();
    cmd->launch.reset();
  }
  if (cmd->timeout_op != 0) reactor.Cancel(cmd->timeout_op);
  if (cmd->out.eof && cmd->err.eof) {
    Finish(cmd);
    return;
  }
  // What the main process wrote and left in the pipes (FIONREAD). A read under way may have
  // taken some of it already: what that read brings is added when it ends (OnRead); if it was
  // waiting on an empty pipe, what it brings is not the main process's and was not waiting, so
  // the target is met as soon as it is read.
  for (Stream* st : {&cmd->out, &cmd->err}) {
    int waiting = 0;
    if (st->fd.valid() && ::ioctl(st->fd.get(), FIONREAD, &waiting) != 0) waiting = 0;
    st->drain_to = st->read + static_cast<uint64_t>(std::max(waiting, 0));
    st->read_at_exit = st->op != 0;
  }
  ArmDrain(cmd);
}

void Runner::Impl::ArmDrain(const CommandPtr& cmd) {
  // Background processes (`server &`) may hold the pipes open for ever: what the main process
  // wrote is read within the drain window, and the answer is not held back beyond it. While
  // output is paused (PauseOutput), and until a whole window has passed since it resumed, what
  // the main process left in a pipe may still wait unread there: the window starts again, until
  // that much has been read.
  ArmTimer(cmd, kDrainWindow, &Command::drain_op, [](const CommandPtr& c) {
    if (c->reported) return;
    Impl& impl = *c->impl;
    const bool left = (c->out.fd.valid() && c->out.read < c->out.drain_to) ||
                      (c->err.fd.valid() && c->err.read < c->err.drain_to);
    if (left && (impl.output_paused || Clock::now() - impl.output_resumed < kDrainWindow)) {
      impl.ArmDrain(c);
      return;
    }
    impl.Finish(c);
  });
}

void Runner::Impl::MaybeFinish(const CommandPtr& cmd) {
  if (!cmd->reported && cmd->main_exited && cmd->out.eof && cmd->err.eof) Finish(cmd);
}

CommandResult Runner::Impl::ComputeResult(const Command& cmd) const {
  CommandResult r;
  r.duration_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<milliseconds>(Clock::now() - cmd.started).count());
  r.signal = cmd.status.signaled ? cmd.status.signal : 0;
  r.exit_code = cmd.status.ShellCode();
  r.truncated = cmd.truncated;
  // A kill that came in the drain window (the main process had exited on its own) still
  // reaches the background processes, but the answer is how the command ended. The output cap
  // is the exception: the answer has lost output, and says so; also when the cap was reached in
  // the drain window, where it kills nothing (Deliver).
  if (cmd.capped_after_exit && !cmd.kill_reason.has_value()) {
    r.reason = EndReason::kOutputLimit;
    r.exit_code = 1;
    r.signal = 0;
    return r;
  }
  if (cmd.kill_reason.has_value() &&
      (cmd.killed_running || *cmd.kill_reason == EndReason::kOutputLimit)) {
    r.reason = *cmd.kill_reason;
    switch (*cmd.kill_reason) {
      case EndReason::kTimeout:
        r.exit_code = 124;  // as timeout(1)
        r.timed_out = true;
        break;
      case EndReason::kCancelled:
        r.cancelled = true;
        break;
      case EndReason::kOutputLimit:
        r.exit_code = 1;
        break;
      case EndReason::kStopped:
        // api.md: a stop answers 137 and SIGKILL, whichever signal ended it.
        r.exit_code = 128 + SIGKILL;
        r.signal = SIGKILL;
        break;
      default:
        break;
    }
    return r;
  }
  if (!cmd.status.signaled) {
    r.reason = EndReason::kExited;
    return r;
  }
  r.reason = EndReason::kSignaled;
  // The command's own OOM kills: v2 memory.events where the memory controller is enabled for
  // the exec cgroups, else the v1 memory.oom_control of its v1 memory cgroup.
  if (cmd.status.signal == SIGKILL && OomKilledIn(cmd.cg.usage)) r.reason = EndReason::kOom;
  return r;
}

void Runner::Impl::Finish(const CommandPtr& cmd) {
  if (cmd->reported) return;
  cmd->reported = true;
  --running;
  for (OpId* op : {&cmd->drain_op, &cmd->timeout_op}) {
    if (*op != 0) reactor.Cancel(*op);
  }
  if (cmd->write_op != 0) {
    reactor.Cancel(cmd->write_op);  // its callback closes stdin and refuses what is queued
  } else {
    FailInput(cmd, EPIPE, "the command has ended");
  }
  cmd->tty.reset();
  CommandResult result = ComputeResult(*cmd);
  const CommandUsage counters = ReadUsage(cmd->cg.usage);
  result.usage = UsageSince(counters, cmd->cg.before);
  if (Reusable(*cmd, counters)) {
    cmd->cg.before = counters;
    cmd->reusable = true;
  } else {
    cmd->cg.CloseFiles();
  }
  // Nothing more is delivered after on_exit: release what the callbacks hold.
  CommandEvents events = std::move(cmd->events);
  cmd->events = CommandEvents();
  if (events.on_output) {
    // api.md's lines on stderr, each on a line of its own after what the command wrote there.
    auto say = [&](const std::string& line) {
      events.on_output(2, cmd->stderr_at_line_start ? line : "\n" + line);
      cmd->stderr_at_line_start = true;
    };
    if (!cmd->start_failure.empty()) say(cmd->start_failure);
    if (cmd->kill_reason == EndReason::kTimeout && cmd->killed_running) {
      say("nsbox: command timed out after " + std::to_string(cmd->timeout.count()) + " ms\n");
    }
    if (cmd->truncated) {
      say("nsbox: output exceeded " + std::to_string(cmd->limit) + " bytes; " +
          (cmd->capped_after_exit ? "the rest was dropped (the command had exited)\n"
                                  : "process tree killed\n"));
    }
  }
  if (events.on_exit) events.on_exit(result);
  // Reported: its pipes are read (and the bytes dropped) whether output is paused or not.
  Unpark(cmd, 1);
  Unpark(cmd, 2);
  if (cmd->impl != nullptr) MaybeRetire(cmd);
}

void Runner::Impl::BeginKill(const CommandPtr& cmd, EndReason reason) {
  if (cmd->reported || cmd->kill_reason.has_value()) return;
  cmd->kill_reason = reason;
  cmd->killed_running = !cmd->main_exited;
  if (cmd->timeout_op != 0) reactor.Cancel(cmd->timeout_op);
  if (reason == EndReason::kOutputLimit) {
    SendKill(cmd);
    return;
  }
  SignalTree(cmd, SIGTERM);
  ArmTimer(cmd, kKillGrace, &Command::grace_op, [](const CommandPtr& c) { c->impl->SendKill(c); });
}

void Runner::Impl::SignalTree(const CommandPtr& cmd, int sig) {
  // A child made ahead drops what was sent to it before its command: told first, it keeps this.
  if (cmd->warm != nullptr) cmd->warm->NoteSignal(sig);
  if (!cmd->main_exited && cmd->pidfd.valid()) {
    // SAFETY: pidfd_send_signal to our own child. The process group has the main process's
    // pid (setsid), which cannot be reused while that process is our unreaped child, so
    // kill(-pgid) reaches its group and nothing else.
    sys::PidfdSendSignal(cmd->pidfd.get(), sig, nullptr, 0);
    ::kill(-cmd->pid, sig);
  }
  if (cmd->kill_scope) {
    // Also what left the process group (setsid, double fork): the cgroup holds them all. Once
    // the cgroup is removed, nothing of the command is left.
    if (!cmd->cg.v2.valid()) return;
    auto listed = SignalCgroupProcs(cmd->cg.v2.get(), sig);
    if (!listed.ok()) log::warn("exec {}: signal {}: {}", cmd->id, sig, listed.error().message());
  } else {
    // No cgroup: the session is the widest scope there is; setsid escapes it.
    SignalSession(cmd->pid, sig, cmd->main_exited);
  }
}

void Runner::Impl::SendKill(const CommandPtr& cmd) {
  if (!cmd->main_exited && cmd->pidfd.valid()) {
    // SAFETY: as in SignalTree.
    sys::PidfdSendSignal(cmd->pidfd.get(), SIGKILL, nullptr, 0);
    ::kill(-cmd->pid, SIGKILL);
  }
  if (cmd->kill_scope) {
    if (!cmd->cg.v2.valid()) return;  // removed: it was empty
    // cgroup.kill (5.14) kills the whole subtree at once, forks in progress included. Before it:
    // SIGKILL each listed process, again until none is left.
    if (!CgroupKill(cmd->cg.v2.get()).ok()) {
      for (int pass = 0; pass < 20; ++pass) {
        auto listed = SignalCgroupProcs(cmd->cg.v2.get(), SIGKILL);
        if (!listed.ok() || *listed == 0) break;
      }
    }
    if (cmd->check_op == 0 && !shutting_down) {
      ArmTimer(cmd, kKillCheckInterval, &Command::check_op,
               [](const CommandPtr& c) { c->impl->OnKillCheck(c); });
    }
  } else {
    SignalSession(cmd->pid, SIGKILL, cmd->main_exited);
  }
}

void Runner::Impl::OnKillCheck(const CommandPtr& cmd) {
  if (!cmd->cg.v2.valid() || CgroupEmpty(cmd->cg.v2.get())) {
    if (cmd->reported) MaybeRetire(cmd);
    return;
  }
  if (++cmd->kill_checks >= kKillChecks) {
    log::warn("exec {}: cgroup {} still has processes after SIGKILL", cmd->id, cmd->cg.name);
    return;  // the sweep keeps trying to remove it
  }
  SendKill(cmd);
}

bool Runner::Impl::TryRemoveCgroup(Command& cmd) {
  CgroupsLeft left = LeftOf(cmd.cg);
  if (left.any()) ApplyRemoval(cmd, RemoveCgroups(*parents, cmd.cg.name, left, cmd.id));
  return !LeftOf(cmd.cg).any();
}

void Runner::Impl::ApplyRemoval(Command& cmd, const CgroupsLeft& left) {
  if (!left.v2) cmd.cg.v2.reset();
  for (size_t i = 0; i < cmd.cg.v1.size() && i < left.v1.size(); ++i) {
    if (!left.v1[i]) cmd.cg.v1[i].reset();
  }
}

// The rmdirs (≈ 30 µs each in cgroupfs here, three per command on a hybrid host) on the
// runner's cgroup thread, so that the next request does not wait for them. The command keeps
// its fds meanwhile: a kill of the sandbox still reaches what may be left in its cgroup.
void Runner::Impl::RemoveOffLoop(const CommandPtr& cmd) {
  cmd->removing = true;
  cgroup_thread->Submit([reactor = &reactor, alive = alive, parents = parents, id = cmd->id,
                         name = cmd->cg.name, left = LeftOf(cmd->cg), this] {
    CgroupsLeft now = RemoveCgroups(*parents, name, left, id);
    // Only the loop touches the command: it is looked up there by id.
    reactor->Post([alive, id, now, this] {
      if (!*alive) return;  // the runner is gone; `this` must not be touched
      auto it = commands.find(id);
      if (it == commands.end()) return;
      CommandPtr c = it->second;
      c->removing = false;
      ApplyRemoval(*c, now);
      if (now.any()) {
        ScheduleSweep();
        return;
      }
      MaybeRetire(c);
    });
  });
}

Result<CgroupSet> Runner::Impl::TakeCgroupSet() {
  if (parents == nullptr) {
    NSBOX_ASSIGN_OR_RETURN(parents, DupParents(cgroup_dir, v1_dirs, memory_v1, pids_v1));
  }
  if (!spares.empty()) {
    CgroupSet set = spares.back()->Take();
    spares.pop_back();
    return set;
  }
  return MakeCgroupSet(*parents);
}

// Whether the set a command ended with can serve the next command as if it were new: the
// command was not killed, its cgroup is empty and always held that one process (pids.peak 1:
// the v1 peak cannot be reset, and a command's own process makes it at least 1 anyway), and the
// memory peak can be reset (Keep then checks that the OOM killer never struck there, after the
// answer). CPU time and I/O bytes only ever grow, and do not while the cgroup is empty: the next
// command's are reckoned from these. What
// makes and removes a set (three mkdirs and rmdirs in cgroupfs on a hybrid host, ≈ 300 µs of CPU
// with the kernel's work after an rmdir) is then saved for the commonest commands: one program,
// no child.
bool Runner::Impl::Reusable(const Command& cmd, const CommandUsage& counters) const {
  const CgroupSet& cg = cmd.cg;
  if (shutting_down || cmd.kill_reason.has_value() || !cmd.main_exited || cg.name.empty() ||
      !cg.v2.valid()) {
    return false;
  }
  for (const auto& fd : cg.v1) {
    if (!fd.valid()) return false;
  }
  if (cg.usage.pids_peak.valid()) {
    if (counters.pids_peak != uint64_t{1}) return false;
  } else if (!CgroupKnownEmpty(cg.v2.get())) {
    return false;  // something may still run there, or nothing could be read (EMFILE)
  }
  return !cg.usage.memory_peak.valid() || cg.usage.memory_peak_resettable;
}

// Keeps a reusable set for the next commands when there is room, its memory peak reset. False:
// the caller removes it.
bool Runner::Impl::Keep(CgroupSet& set) {
  if (shutting_down || spares.size() >= kKeptSets) return false;
  // Read here, after the answer, not before it: an OOM kill there leaves the set to removal.
  if (!NoOomKills(set.usage)) return false;
  if (set.usage.memory_peak.valid()) {
    if (!ResetMemoryPeak(set.usage)) return false;
    const std::optional<uint64_t> held = MemoryPeak(set.usage);
    if (!held.has_value() || *held > kReuseMaxHeldMemory) return false;
  }
  spares.push_back(std::make_shared<SpareSet>(parents, std::move(set)));
  set = CgroupSet();
  ArmIdle();
  MaybeMakeWarm();
  return true;
}

// The next command's cgroups, made on the cgroup thread while this one runs: three mkdirs
// and a dozen opens in cgroupfs (≈ 150 µs here) that a start no longer waits for.
void Runner::Impl::RequestSpare() {
  if (parents == nullptr || !spares.empty() || spare_pending || shutting_down) return;
  spare_pending = true;
  cgroup_thread->Submit(
      [reactor = &reactor, alive = alive, parents = parents, slot = made_spare, this] {
        auto made = MakeCgroupSet(*parents);
        if (!made.ok()) {
          reactor->Post([alive, this, e = made.error()] {
            if (!*alive) return;  // the runner is gone; `this` must not be touched
            spare_pending = false;
            log::warn("exec cgroups made ahead: {}", e.message());
          });
          return;
        }
        {
          std::lock_guard<std::mutex> lock(slot->mu);
          slot->set = std::make_shared<SpareSet>(parents, std::move(made).value());
        }
        reactor->Post([alive, slot, this] {
          if (!*alive) return;  // Shutdown removed the set; `this` must not be touched
          std::shared_ptr<SpareSet> owned;
          {
            std::lock_guard<std::mutex> lock(slot->mu);
            owned = std::move(slot->set);
          }
          spare_pending = false;
          if (owned == nullptr) return;
          if (spares.size() >= kKeptSets || shutting_down) return;
          spares.push_back(owned);
          ArmIdle();
          MaybeMakeWarm();
        });
      });
}

void Runner::Impl::ArmIdle() {
  if (idle_op != 0 || shutting_down || hold_for_first) return;
  idle_op = reactor.Timer(kIdleRelease, [this, alive = alive](int res) {
    if (!*alive) return;  // the runner is gone; `this` must not be touched
    idle_op = 0;
    if (res == -ECANCELED) return;
    if (running == 0 && Clock::now() - last_start >= kIdleRelease) {
      ReleaseIdle();
      return;
    }
    ArmIdle();
  });
}

// What only a busy sandbox needs: an idle one keeps no spare cgroups (kernel memory) and no read
// buffers (they go back to the system).
void Runner::Impl::ReleaseIdle() {
  DropWarm();
  if (oom_score_shared && !own_oom_score_adj.empty()) {
    // Nothing shares this process's memory now: the child made ahead is gone, and those that
    // took a command have made their execve (nothing runs). Best effort: the score it had.
    oom_score_shared = false;
    if (auto st = WriteExistingFileAt(AT_FDCWD, "/proc/self/oom_score_adj", own_oom_score_adj);
        !st.ok()) {
      log::warn("exec: the OOM score a child made ahead had changed: {}", st.error().message());
    }
  }
  warm_stack.reset();
  reset_signals = NonDefaultSignals();
  spares.clear();  // removes their directories
  if (!buffers.empty()) {
    buffers.clear();
    ::malloc_trim(0);
  }
  ReleaseUnusedMainStack();  // on the loop, nsbox-init's main thread; elsewhere it does nothing
}

// A child made ahead for the next command, in a spare set, while commands come in a row: its
// cgroups, session, signals, stdio and the pre_exec hook are done before the command comes
// (≈ 100 µs of each start, docs/benchmarks.md). On the loop, after the command that made room
// for it has started; it gets ready on whichever CPU is free.
void Runner::Impl::MaybeMakeWarm() {
  if (warm != nullptr || warm_off || warm_never || shutting_down || !in_a_row || spares.empty() ||
      !dev_null.valid()) {
    return;
  }
  CgroupSet set = spares.back()->Take();
  spares.pop_back();
  WarmPrep prep;
  prep.cgroup_fd = set.v2.valid() ? set.v2.get() : -1;
  for (size_t i = 0; i < set.v1_procs.size() && i < 2; ++i) {
    prep.join_procs_fds[i] = set.v1_procs[i].get();
  }
  StdioPipes pipes;
  Status piped = MakeStdioPipes(true, running < kEnlargedPipeCommands ? pipe_size : 0, &pipes);
  prep.stdin_fd = pipes.child_in.get();
  prep.stdout_fd = pipes.child_out.get();
  prep.stderr_fd = pipes.child_err.get();
  prep.dev_null = dev_null.get();
  prep.reset_signals = reset_signals;
  prep.hooks = hooks;
  auto made = piped.ok() ? WarmChild::Start(prep, std::move(warm_stack))
                         : Result<std::unique_ptr<WarmChild>>(piped.error());
  if (!made.ok()) {
    log::info("exec: commands start without a child made ahead: {}", made.error().message());
    warm_off = true;
    spares.push_back(std::make_shared<SpareSet>(parents, std::move(set)));
    return;
  }
  warm = std::move(made).value();
  oom_score_shared = true;
  warm_set = std::move(set);
  // The child has its own copies of its ends.
  pipes.child_in.reset();
  pipes.child_out.reset();
  pipes.child_err.reset();
  warm_pipes = std::move(pipes);
  RequestSpare();
}

// Kills and reaps the child made ahead; its set goes back to the spares (or is removed).
void Runner::Impl::DropWarm() {
  if (warm == nullptr) return;
  warm.reset();
  warm_pipes = StdioPipes();
  auto set = std::make_shared<SpareSet>(parents, std::move(warm_set));
  warm_set = CgroupSet();
  if (!shutting_down && spares.size() < kKeptSets) spares.push_back(std::move(set));
}

std::unique_ptr<char[]> Runner::Impl::TakeBuffer() {
  if (buffers.empty()) return std::unique_ptr<char[]>(new char[kReadBufferSize]);
  auto buf = std::move(buffers.back());
  buffers.pop_back();
  return buf;
}

// A stream's buffer once no read is pending on it: kept for the next command (its pages are
// already mapped), up to kKeptBuffers.
void Runner::Impl::KeepBuffer(std::unique_ptr<char[]> buf) {
  if (buf == nullptr || buffers.size() >= kKeptBuffers || shutting_down) return;
  buffers.push_back(std::move(buf));
  ArmIdle();
}

void Runner::Impl::MaybeRetire(const CommandPtr& cmd) {
  if (!cmd->reported || shutting_down || cmd->removing) return;
  if (cmd->reusable) {
    cmd->reusable = false;
    if (!Keep(cmd->cg)) cmd->cg.CloseFiles();
  }
  if (LeftOf(cmd->cg).any()) {
    // Commands in a row: removed on the cgroup thread, which they keep going anyway. A lone
    // command's are removed here, after its answer: starting a thread for them would cost more
    // than its three rmdirs.
    if (in_a_row) {
      RemoveOffLoop(cmd);
      return;
    }
    if (!TryRemoveCgroup(*cmd)) {
      ScheduleSweep();
      return;
    }
  }
  if (!cmd->out.eof || !cmd->err.eof) return;  // reading and discarding goes on
  // A pending SIGKILL timer keeps its reference (at most 2 s): without a cgroup, what ignored
  // SIGTERM and closed its stdio is still to be killed.
  commands.erase(cmd->id);
}

void Runner::Impl::ScheduleSweep() {
  if (sweep_op != 0 || shutting_down) return;
  sweep_op = reactor.Timer(kSweepInterval, [this, alive = alive](int) {
    if (!*alive) return;  // the runner is gone; `this` must not be touched
    sweep_op = 0;
    Sweep();
  });
}

void Runner::Impl::Sweep() {
  std::vector<CommandPtr> lingering;
  for (const auto& [id, cmd] : commands) {
    if (cmd->reported) lingering.push_back(cmd);
  }
  for (const auto& cmd : lingering) MaybeRetire(cmd);
}

void Runner::Impl::KillAll(EndReason reason) {
  DropWarm();
  std::vector<CommandPtr> all;
  all.reserve(commands.size());
  for (const auto& [id, cmd] : commands) all.push_back(cmd);
  for (const auto& cmd : all) {
    if (!cmd->reported) {
      BeginKill(cmd, reason);
    } else if (cmd->grace_op == 0) {
      // Answered already, but background processes of it may live on: the sandbox-wide kill
      // reaches them too.
      SignalTree(cmd, SIGTERM);
      ArmTimer(cmd, kKillGrace, &Command::grace_op,
               [](const CommandPtr& c) { c->impl->SendKill(c); });
    }
  }
}

void Runner::Impl::Shutdown() {
  shutting_down = true;
  *alive = false;
  if (sweep_op != 0) reactor.Cancel(sweep_op);
  if (idle_op != 0) reactor.Cancel(idle_op);
  cgroup_thread.reset();  // waits for its jobs; what they post finds `alive` false
  {
    // A set made ahead that the loop has not taken yet: removed now, not whenever the reactor
    // drops the closure that would have taken it.
    std::lock_guard<std::mutex> lock(made_spare->mu);
    made_spare->set.reset();
  }
  ReleaseIdle();
  std::vector<CommandPtr> all;
  for (const auto& [id, cmd] : commands) all.push_back(cmd);
  for (const auto& cmd : all) {
    if (!cmd->kill_reason.has_value() && !cmd->reported) {
      cmd->kill_reason = EndReason::kStopped;
      cmd->killed_running = !cmd->main_exited;
    }
    SendKill(cmd);
    if (!cmd->main_exited) {
      siginfo_t info{};
      while (::waitid(P_PIDFD, static_cast<id_t>(cmd->pidfd.get()), &info, WEXITED) < 0 &&
             errno == EINTR) {
      }
      cmd->main_exited = true;
      cmd->status = ExitStatusFromSiginfo(info);
    }
    // What is already in the pipes is not read: the sandbox is being stopped.
    Finish(cmd);
    for (OpId op : {cmd->out.op, cmd->err.op, cmd->poll_op, cmd->write_op, cmd->timeout_op,
                    cmd->grace_op, cmd->drain_op, cmd->check_op}) {
      if (op != 0) reactor.Cancel(op);
    }
    cmd->impl = nullptr;
  }
  // SIGKILLed processes leave their cgroup when they have exited, a moment later.
  for (int waited = 0; waited < 1000; ++waited) {
    bool busy = false;
    for (const auto& cmd : all) {
      if (!TryRemoveCgroup(*cmd)) busy = true;
    }
    if (!busy) break;
    if (waited % 100 == 99) {
      for (const auto& cmd : all) {
        if (cmd->cg.v2.valid()) SendKill(cmd);
      }
    }
    SleepMs(1);
  }
  for (const auto& cmd : all) {
    if (!TryRemoveCgroup(*cmd)) {
      log::warn("exec {}: cgroup {} still busy at shutdown", cmd->id, cmd->cg.name);
    }
  }
  commands.clear();
}

struct PremadeCgroups::State {
  std::shared_ptr<CgroupParents> parents;
  std::vector<std::shared_ptr<SpareSet>> sets;  // removed with it, if no runner took them
};

Result<PremadeCgroups> PremadeCgroups::Make(int cgroup_dir, RunnerV1Cgroups v1) {
  if (cgroup_dir < 0 && v1.memory_dir < 0 && v1.pids_dir < 0) return PremadeCgroups();
  if (cgroup_dir >= 0) EnableAccountingControllers(cgroup_dir);
  const V1Layout layout = LayOutV1(v1);
  auto state = std::make_shared<State>();
  NSBOX_ASSIGN_OR_RETURN(state->parents,
                         DupParents(cgroup_dir, layout.dirs, layout.memory, layout.pids));
  // Two: the first command's child made ahead takes one (Runner::Anticipate), and a command
  // that comes before that child is ready takes the other.
  for (size_t i = 0; i < kKeptSets; ++i) {
    NSBOX_ASSIGN_OR_RETURN(CgroupSet set, MakeCgroupSet(*state->parents));
    state->sets.push_back(std::make_shared<SpareSet>(state->parents, std::move(set)));
  }
  PremadeCgroups out;
  out.state_ = std::move(state);
  return out;
}

Runner::Runner(Reactor& reactor, int cgroup_dir, ChildHooks hooks, RunnerV1Cgroups v1,
               PremadeCgroups premade)
    : impl_(std::make_unique<Impl>(reactor, cgroup_dir, hooks, v1, premade.state_ != nullptr)) {
  if (premade.state_ != nullptr && !premade.state_->sets.empty()) {
    // Made from the same directories: the runner's parents, and its first kept sets.
    impl_->parents = premade.state_->parents;
    impl_->spares = std::move(premade.state_->sets);
    impl_->ArmIdle();
  }
  // Writing stdin to a command that has closed it must fail with EPIPE, not kill nsbox-init
  // with SIGPIPE. Only the default disposition is changed; a handler someone set stays.
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
  impl_->reset_signals = NonDefaultSignals();
}

Runner::~Runner() { impl_->Shutdown(); }

Result<uint64_t> Runner::Start(const CommandSpec& spec, CommandEvents events) {
  return impl_->Start(spec, std::move(events));
}

void Runner::Kill(uint64_t id, EndReason reason) {
  auto it = impl_->commands.find(id);
  if (it == impl_->commands.end()) return;
  auto cmd = it->second;  // held: BeginKill may retire it
  impl_->BeginKill(cmd, reason);
}

void Runner::KillAll(EndReason reason) { impl_->KillAll(reason); }

void Runner::PauseOutput(bool paused) { impl_->PauseOutput(paused); }

size_t Runner::running() const { return impl_->running; }

void Runner::Anticipate(bool hold) { impl_->Anticipate(hold); }

void Runner::NoChildrenMadeAhead() {
  impl_->warm_never = true;
  impl_->DropWarm();
}

bool Runner::OwnsIdleChild(pid_t pid) const {
  return impl_->warm != nullptr && impl_->warm->pid() == pid;
}

void Runner::Input(uint64_t id, std::string data, bool close, InputDone done) {
  impl_->Input(id, std::move(data), close, std::move(done));
}

Status Runner::Resize(uint64_t id, TerminalSize size) { return impl_->Resize(id, size); }

}  // namespace nsbox::exec

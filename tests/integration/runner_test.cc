// The runner against real processes: run as root on the host (no jail needed). Every case runs
// on both reactor backends, with and without a cgroup v2 directory (a temporary child of this
// process's own cgroup on the cgroup2 mount); variants the host cannot run are skipped loudly.

#include "exec/runner.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "base/files.h"
#include "exec/reactor.h"
#include "exec/spawn.h"

namespace nsbox::exec {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- pure helpers -------------------------------------------------------------------------

TEST(ParseOomKills, ReadsTheCounter) {
  EXPECT_EQ(ParseOomKills("low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\noom_group_kill 0\n"), 1u);
  EXPECT_EQ(ParseOomKills("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"), 0u);
  EXPECT_EQ(ParseOomKills("oom_group_kill 4\noom_kill 17"), 17u);  // no final newline
  EXPECT_EQ(ParseOomKills("oom 5\n"), 0u);                         // the other counter
  EXPECT_EQ(ParseOomKills(""), 0u);
  EXPECT_EQ(ParseOomKills("oom_kill x\n"), 0u);
}

TEST(ParsePids, OnePerLine) {
  EXPECT_EQ(ParsePids("12\n345\n"), (std::vector<pid_t>{12, 345}));
  EXPECT_EQ(ParsePids("7"), (std::vector<pid_t>{7}));
  EXPECT_TRUE(ParsePids("").empty());
  EXPECT_EQ(ParsePids("1\nx\n-3\n4\n"), (std::vector<pid_t>{1, 4}));
  // /proc/<pid>/task/<tid>/children: separated by spaces, one after the last.
  EXPECT_EQ(ParsePids("12 345 "), (std::vector<pid_t>{12, 345}));
}

TEST(EndReasonName, MatchesApi) {
  EXPECT_EQ(EndReasonName(EndReason::kExited), "exited");
  EXPECT_EQ(EndReasonName(EndReason::kSignaled), "signaled");
  EXPECT_EQ(EndReasonName(EndReason::kTimeout), "timeout");
  EXPECT_EQ(EndReasonName(EndReason::kCancelled), "cancelled");
  EXPECT_EQ(EndReasonName(EndReason::kOutputLimit), "output_limit");
  EXPECT_EQ(EndReasonName(EndReason::kOom), "oom");
  EXPECT_EQ(EndReasonName(EndReason::kStopped), "stopped");
}

// ---- fixture ------------------------------------------------------------------------------

// The state letter of /proc/<pid>/stat ('R', 'S', 'T', 'Z', ...): '\0' when the file cannot be
// read (the process is gone), '?' when it cannot be parsed.
char ProcState(pid_t pid) {
  auto stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (!stat.ok()) return '\0';
  const size_t paren = stat->rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat->size()) return '?';
  return (*stat)[paren + 2];
}

// A process that has exited: gone, or a zombie nobody has reaped yet (the host's PID 1 may be
// slow to reap orphans).
bool Gone(pid_t pid) {
  if (::kill(pid, 0) < 0 && errno == ESRCH) return true;
  const char state = ProcState(pid);
  return state == '\0' || state == 'Z' || state == 'X';
}

// The cgroup2 directory of this process: the cgroup2 mount (the unified hierarchy of a hybrid
// host) joined with the "0::" line of /proc/self/cgroup. Empty, with `why`, when there is none.
std::string OwnCgroup2Dir(std::string* why) {
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line, mount;
  while (std::getline(mountinfo, line)) {
    size_t dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream fields(line);
    std::string id, parent, devno, root, point;
    fields >> id >> parent >> devno >> root >> point;
    mount = point;
    break;
  }
  if (mount.empty()) {
    *why = "no cgroup2 mount in /proc/self/mountinfo";
    return "";
  }
  std::ifstream self("/proc/self/cgroup");
  while (std::getline(self, line)) {
    if (line.rfind("0::", 0) == 0) return mount + (line.substr(3) == "/" ? "" : line.substr(3));
  }
  *why = "no 0:: line in /proc/self/cgroup";
  return "";
}

struct Outcome {
  std::string out, err;
  CommandResult result;
  int exits = 0;
  pid_t pid = -1;
  uint64_t id = 0;
  milliseconds elapsed{0};
};

using Param = std::tuple<Reactor::Backend, bool>;

std::vector<pid_t> ReadyWarmChildren();

class RunnerTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    auto [backend, with_cgroup] = GetParam();
    auto reactor = CreateReactor(backend);
    if (!reactor.ok()) {
      GTEST_SKIP() << "SKIPPED LOUDLY: reactor backend " << BackendName(backend)
                   << " unavailable: " << reactor.error().message();
    }
    reactor_ = std::move(reactor).value();
    if (with_cgroup) {
      std::string why;
      std::string own = OwnCgroup2Dir(&why);
      if (own.empty()) GTEST_SKIP() << "SKIPPED LOUDLY: no cgroup v2: " << why;
      if (::geteuid() != 0) GTEST_SKIP() << "SKIPPED LOUDLY: cgroup variants need root";
      static int serial = 0;
      cgroup_path_ =
          own + "/nsbox-runner-test-" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
      ASSERT_EQ(::mkdir(cgroup_path_.c_str(), 0755), 0) << cgroup_path_ << ": " << ErrnoText(errno);
      cgroup_fd_.reset(::open(cgroup_path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      ASSERT_TRUE(cgroup_fd_.valid());
    }
    runner_ = std::make_unique<Runner>(*reactor_, cgroup_fd_.valid() ? cgroup_fd_.get() : -1,
                                       ChildHooks{});
  }

  void TearDown() override {
    runner_.reset();
    ForceCloneFallbackForTesting(false);
    ForceNoCgroupKillForTesting(false);
    if (!cgroup_path_.empty()) {
      // The runner removed its exec cgroups when it was destroyed; ours goes once they have.
      for (int i = 0; i < 200 && ::rmdir(cgroup_path_.c_str()) < 0; ++i) ::usleep(5000);
      struct stat st {};
      EXPECT_NE(::stat(cgroup_path_.c_str(), &st), 0) << "left behind: " << cgroup_path_;
    }
  }

  bool with_cgroup() const { return cgroup_fd_.valid(); }

  static CommandSpec Bash(const std::string& script) {
    CommandSpec spec;
    spec.argv = {"/bin/bash", "-c", script};
    spec.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"};
    spec.cwd = "/tmp";
    return spec;
  }

  // Starts a command whose outcome accumulates into *o.
  uint64_t StartInto(const CommandSpec& spec, Outcome* o) {
    CommandEvents ev;
    auto start = Clock::now();
    ev.on_start = [o](pid_t pid) { o->pid = pid; };
    ev.on_output = [o](int stream, std::string_view bytes) {
      EXPECT_EQ(o->exits, 0) << "output after on_exit";
      (stream == 1 ? o->out : o->err).append(bytes);
    };
    ev.on_exit = [o, start](const CommandResult& r) {
      o->result = r;
      ++o->exits;
      o->elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    };
    auto id = runner_->Start(spec, std::move(ev));
    EXPECT_TRUE(id.ok()) << (id.ok() ? "" : id.error().message());
    o->id = id.ok() ? *id : 0;
    return o->id;
  }

  // Runs the loop until `done` or `limit`.
  template <typename Pred>
  bool Loop(Pred done, milliseconds limit = milliseconds(10000)) {
    auto deadline = Clock::now() + limit;
    while (!done()) {
      if (Clock::now() > deadline) return false;
      auto st = reactor_->RunOnce(milliseconds(10));
      EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message());
    }
    return true;
  }

  // Runs the loop until every outcome has its exit, or `limit`.
  bool LoopUntilAllExited(const std::vector<Outcome>& outcomes, milliseconds limit) {
    return Loop(
        [&] {
          return std::all_of(outcomes.begin(), outcomes.end(),
                             [](const Outcome& o) { return o.exits != 0; });
        },
        limit);
  }

  Outcome Run(const CommandSpec& spec) {
    Outcome o;
    if (StartInto(spec, &o) == 0) return o;
    EXPECT_TRUE(Loop([&] { return o.exits > 0; })) << "no answer";
    // A few more turns: on_exit must not come twice.
    for (int i = 0; i < 3; ++i) (void)reactor_->RunOnce(milliseconds(1));
    EXPECT_EQ(o.exits, 1);
    return o;
  }

  // Why this variant makes no child ahead of a command, or nullptr.
  const char* NoChildMadeAhead() const {
    if (!with_cgroup()) return "no cgroup in this variant: no set to make one in";
#if !defined(__x86_64__)
    return "children made ahead are x86-64 only";
#endif
    return nullptr;
  }

  // Three commands in a row, then the child made ahead for the next one, once it is ready
  // (waited for under the idle release time, 2 s): its pid, or -1.
  pid_t ReadyChildAfterCommandsInARow() {
    for (int i = 0; i < 3; ++i) EXPECT_EQ(Run(Bash("exit 0")).result.exit_code, 0);
    std::vector<pid_t> warm;
    EXPECT_TRUE(Loop(
        [&] {
          warm = ReadyWarmChildren();
          return !warm.empty();
        },
        milliseconds(1500)))
        << "no child made ahead, or none ready";
    return warm.empty() ? pid_t{-1} : warm.front();
  }

  // The first line of `text` as a pid.
  static pid_t FirstPid(const std::string& text) {
    return static_cast<pid_t>(std::atoi(text.c_str()));
  }

  std::unique_ptr<Reactor> reactor_;
  std::string cgroup_path_;
  UniqueFd cgroup_fd_;
  std::unique_ptr<Runner> runner_;
};

TEST_P(RunnerTest, EchoesToStdoutAndStderr) {
  Outcome o = Run(Bash("echo out; echo err >&2"));
  EXPECT_EQ(o.out, "out\n");
  EXPECT_EQ(o.err, "err\n");
  EXPECT_EQ(o.result.exit_code, 0);
  EXPECT_EQ(o.result.signal, 0);
  EXPECT_EQ(o.result.reason, EndReason::kExited);
  EXPECT_FALSE(o.result.timed_out || o.result.truncated || o.result.cancelled);
  EXPECT_GT(o.pid, 0);
  EXPECT_EQ(runner_->running(), 0u);
}

TEST_P(RunnerTest, ReportsExitCodes) {
  EXPECT_EQ(Run(Bash("exit 3")).result.exit_code, 3);
  EXPECT_EQ(Run(Bash("exit 0")).result.exit_code, 0);
  EXPECT_EQ(Run(Bash("false")).result.exit_code, 1);
}

TEST_P(RunnerTest, SignalDeathIs128PlusSignal) {
  Outcome o = Run(Bash("ulimit -c 0; kill -SEGV $$"));
  EXPECT_EQ(o.result.exit_code, 139);
  EXPECT_EQ(o.result.signal, SIGSEGV);
  EXPECT_EQ(o.result.reason, EndReason::kSignaled);
}

TEST_P(RunnerTest, CommandRunsInItsOwnSessionWithUmaskAndCleanFds) {
  // sid == pid (setsid), umask 022, only 0, 1, 2 open (plus the one ls opens for the listing).
  Outcome o =
      Run(Bash("read -r _ _ _ _ _ sid _ < /proc/$$/stat; echo $sid; echo $$; umask; ls "
               "/proc/self/fd | wc -l"));
  std::istringstream lines(o.out);
  std::string sid, pid, umask_text, fds;
  lines >> sid >> pid >> umask_text >> fds;
  EXPECT_EQ(sid, pid);
  EXPECT_EQ(pid, std::to_string(o.pid));
  EXPECT_EQ(umask_text, "0022");
  EXPECT_EQ(fds, "4");
}

TEST_P(RunnerTest, SignalsAreDefaultAndUnblocked) {
  // SIGPIPE is ignored in this process (the runner sets it): the command must not inherit that.
  Outcome o = Run(Bash("grep -E '^Sig(Blk|Ign)' /proc/self/status"));
  EXPECT_EQ(o.out, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
}

// The child sets back only what the runner found changed when it was made (SpawnRequest::
// reset_signals): an ignored SIGHUP and a handler for SIGUSR2 in this process, then a runner.
// An ignored signal would stay ignored across execve; a caught one execve resets by itself.
TEST_P(RunnerTest, SignalsChangedBeforeTheRunnerAreSetBack) {
  struct sigaction ignore {
  }, handle{}, old_hup{}, old_usr2{};
  ignore.sa_handler = SIG_IGN;
  handle.sa_handler = [](int) {};
  ASSERT_EQ(::sigaction(SIGHUP, &ignore, &old_hup), 0);
  ASSERT_EQ(::sigaction(SIGUSR2, &handle, &old_usr2), 0);
  runner_ =
      std::make_unique<Runner>(*reactor_, cgroup_fd_.valid() ? cgroup_fd_.get() : -1, ChildHooks{});
  Outcome o = Run(Bash("grep -E '^Sig(Blk|Ign)' /proc/self/status"));
  ::sigaction(SIGHUP, &old_hup, nullptr);
  ::sigaction(SIGUSR2, &old_usr2, nullptr);
  EXPECT_EQ(o.out, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
}

TEST_P(RunnerTest, StdinRoundTrip) {
  CommandSpec spec = Bash("cat");
  spec.stdin_data = "hello\nworld";
  Outcome o = Run(spec);
  EXPECT_EQ(o.out, "hello\nworld");
  EXPECT_EQ(o.result.exit_code, 0);
}

TEST_P(RunnerTest, LargeStdinDoesNotBlockTheLoop) {
  CommandSpec spec = Bash("wc -c");
  spec.stdin_data = std::string(3 << 20, 'x');
  Outcome o = Run(spec);
  EXPECT_EQ(o.out, std::to_string(3 << 20) + "\n");
}

TEST_P(RunnerTest, StdinNotReadIsNoError) {
  CommandSpec spec = Bash("exec 0<&-; echo done");
  spec.stdin_data = std::string(4 << 20, 'x');  // more than the pipe holds: EPIPE, ignored
  Outcome o = Run(spec);
  EXPECT_EQ(o.out, "done\n");
  EXPECT_EQ(o.result.exit_code, 0);
}

// Input: answered in order once written, refused with an errno when it cannot be.
TEST_P(RunnerTest, StreamedStdinAnswersInOrder) {
  CommandSpec spec = Bash("cat; echo '<eof>'");
  spec.stdin_data = "first,";
  spec.stdin_stream = true;
  Outcome o;
  uint64_t id = StartInto(spec, &o);
  std::vector<std::pair<int, std::string>> answers;
  auto answer = [&answers](int err, std::string_view why) {
    answers.emplace_back(err, std::string(why));
  };
  runner_->Input(id, "a", false, answer);
  runner_->Input(id, "", false, answer);  // an empty frame is answered too
  runner_->Input(id, "b", true, answer);
  runner_->Input(id, "c", false, answer);  // after a close: refused at once
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].first, EPIPE);
  EXPECT_EQ(answers[0].second, "stdin was closed by an earlier input");
  ASSERT_TRUE(Loop([&] { return o.exits > 0; }));
  ASSERT_EQ(answers.size(), 4u);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(answers[i].first, 0) << i << answers[i].second;
  EXPECT_EQ(o.out, "first,ab<eof>\n");
  answers.clear();
  runner_->Input(id, "late", false, answer);
  runner_->Input(id + 1000, "nobody", false, answer);
  Outcome plain;
  uint64_t plain_id = StartInto(Bash("sleep 0.2"), &plain);
  runner_->Input(plain_id, "x", false, answer);
  ASSERT_EQ(answers.size(), 3u);
  // An answered command: EPIPE while the runner still holds it (its cgroup is being removed on
  // the runner's thread), ESRCH once it is forgotten (its pipes and cgroup gone); nsbox-init
  // remembers ended execs itself and answers EPIPE for them.
  EXPECT_TRUE(answers[0].first == EPIPE || answers[0].first == ESRCH) << answers[0].first;
  EXPECT_EQ(answers[1].first, ESRCH);
  EXPECT_EQ(answers[2].first, EINVAL);
  EXPECT_EQ(runner_->Resize(plain_id, {10, 10}).error().code(), ENOTTY);
  ASSERT_TRUE(Loop([&] { return plain.exits > 0; }));
  EXPECT_EQ(runner_->Resize(plain_id, {10, 10}).error().code(), ESRCH);
}

// A pty of the host's devpts here (nsbox-init uses the jail's): the controlling terminal, one
// stream, its size, VEOF on close.
TEST_P(RunnerTest, TerminalCommand) {
  CommandSpec spec = Bash("stty size; tty -s && echo tty; echo err >&2; cat; stty size");
  spec.tty = TerminalSize{40, 120};
  Outcome o;
  uint64_t id = StartInto(spec, &o);
  ASSERT_TRUE(Loop([&] { return o.out.find("err\r\n") != std::string::npos || o.exits > 0; }))
      << o.out;
  ASSERT_TRUE(runner_->Resize(id, {50, 100}).ok());
  int answered = -1;
  runner_->Input(id, "typed\n", true, [&answered](int err, std::string_view) { answered = err; });
  ASSERT_TRUE(Loop([&] { return o.exits > 0; }));
  EXPECT_EQ(answered, 0);
  EXPECT_EQ(o.out, "40 120\r\ntty\r\nerr\r\ntyped\r\ntyped\r\n50 100\r\n");
  EXPECT_EQ(o.err, "");
  EXPECT_EQ(o.result.exit_code, 0);
}

TEST_P(RunnerTest, NoStdinReadsDevNull) {
  Outcome o = Run(Bash("cat; echo rc=$?; readlink /proc/self/fd/0"));
  EXPECT_EQ(o.out, "rc=0\n/dev/null\n");
}

TEST_P(RunnerTest, MissingCwdIsExitOneWithMessage) {
  CommandSpec spec = Bash("echo should not run");
  spec.cwd = "/nonexistent/x";
  Outcome o = Run(spec);
  EXPECT_EQ(o.result.exit_code, 1);
  EXPECT_EQ(o.result.reason, EndReason::kExited);
  EXPECT_EQ(o.out, "");
  EXPECT_EQ(o.err, "nsbox: cd: /nonexistent/x: No such file or directory\n");
}

TEST_P(RunnerTest, CwdNotADirectory) {
  CommandSpec spec = Bash("true");
  spec.cwd = "/etc/passwd";
  Outcome o = Run(spec);
  EXPECT_EQ(o.result.exit_code, 1);
  EXPECT_EQ(o.err, "nsbox: cd: /etc/passwd: Not a directory\n");
}

TEST_P(RunnerTest, CommandNotFoundIs127) {
  CommandSpec spec;
  spec.argv = {"/nonexistent"};
  spec.cwd = "/";
  Outcome o = Run(spec);
  EXPECT_EQ(o.result.exit_code, 127);
  EXPECT_EQ(o.err, "nsbox: /nonexistent: No such file or directory\n");
}

TEST_P(RunnerTest, NotExecutableIs126) {
  CommandSpec spec;
  spec.argv = {"/etc/passwd"};
  spec.cwd = "/";
  Outcome o = Run(spec);
  EXPECT_EQ(o.result.exit_code, 126);
  EXPECT_EQ(o.err, "nsbox: /etc/passwd: Permission denied\n");
}

TEST_P(RunnerTest, TimeoutIs124AtTheDeadline) {
  CommandSpec spec = Bash("echo before; sleep 10");
  spec.timeout = milliseconds(200);
  Outcome o = Run(spec);
  EXPECT_EQ(o.result.exit_code, 124);
  EXPECT_TRUE(o.result.timed_out);
  EXPECT_EQ(o.result.reason, EndReason::kTimeout);
  EXPECT_EQ(o.out, "before\n");
  EXPECT_EQ(o.err, "nsbox: command timed out after 200 ms\n");
  EXPECT_GE(o.elapsed.count(), 190);
  EXPECT_LT(o.elapsed.count(), 1500);
}

TEST_P(RunnerTest, TermIgnoredIsKilledAfterGrace) {
  CommandSpec spec = Bash("trap '' TERM; sleep 10; echo survived");
  spec.timeout = milliseconds(100);
  Outcome o = Run(spec);
  EXPECT_EQ(o.result.exit_code, 124);
  EXPECT_EQ(o.result.signal, SIGKILL);
  EXPECT_EQ(o.out, "");
  EXPECT_GE(o.elapsed.count(), 2000);
  EXPECT_LT(o.elapsed.count(), 4000);
}

TEST_P(RunnerTest, TimeoutKillsEscapedGrandchild) {
  if (!with_cgroup()) GTEST_SKIP() << "setsid escapes the process group and session";
  CommandSpec spec = Bash("setsid bash -c 'echo $$; exec sleep 100' & sleep 10");
  spec.timeout = milliseconds(300);
  Outcome o = Run(spec);
  pid_t grandchild = FirstPid(o.out);
  ASSERT_GT(grandchild, 0);
  EXPECT_EQ(o.result.reason, EndReason::kTimeout);
  EXPECT_TRUE(Loop([&] { return Gone(grandchild); }, milliseconds(3000)))
      << "grandchild " << grandchild << " survived";
}

TEST_P(RunnerTest, KillReachesDoubleForkedSetsidGrandchild) {
  if (!with_cgroup()) GTEST_SKIP() << "setsid escapes the process group and session";
  Outcome o;
  // The grandchild says its pid once it has its own session (and outlived its parent).
  StartInto(Bash("(setsid bash -c 'echo $$; exec sleep 100' &); sleep 10"), &o);
  ASSERT_TRUE(Loop([&] { return o.out.find('\n') != std::string::npos; }));
  pid_t grandchild = FirstPid(o.out);
  ASSERT_GT(grandchild, 0);
  EXPECT_EQ(::getsid(grandchild), grandchild);  // it did leave the session
  runner_->Kill(o.id, EndReason::kCancelled);
  ASSERT_TRUE(Loop([&] { return o.exits > 0; }));
  EXPECT_TRUE(o.result.cancelled);
  EXPECT_EQ(o.result.reason, EndReason::kCancelled);
  EXPECT_EQ(o.result.signal, SIGTERM);
  EXPECT_LT(o.elapsed.count(), 1500);
  EXPECT_TRUE(Loop([&] { return Gone(grandchild); }, milliseconds(3000)));
}

TEST_P(RunnerTest, KillReachesBackgroundJobWithoutCgroup) {
  // The process group and the session: what nsbox can reach without a cgroup.
  Outcome o;
  StartInto(Bash("sleep 100 >/dev/null 2>&1 & echo $!; sleep 10"), &o);
  ASSERT_TRUE(Loop([&] { return !o.out.empty(); }));
  pid_t bg = FirstPid(o.out);
  runner_->Kill(o.id, EndReason::kCancelled);
  ASSERT_TRUE(Loop([&] { return o.exits > 0; }));
  EXPECT_TRUE(Loop([&] { return Gone(bg); }, milliseconds(3000)));
}

TEST_P(RunnerTest, StopIs137AndSigkill) {
  Outcome o;
  StartInto(Bash("sleep 10"), &o);
  ASSERT_TRUE(Loop([&] { return o.pid > 0; }));
  runner_->Kill(o.id, EndReason::kStopped);
  ASSERT_TRUE(Loop([&] { return o.exits > 0; }));
  EXPECT_EQ(o.result.exit_code, 137);
  EXPECT_EQ(o.result.signal, SIGKILL);
  EXPECT_EQ(o.result.reason, EndReason::kStopped);
}

TEST_P(RunnerTest, SiblingKeepsRunningWhenAnotherIsKilled) {
  Outcome a, b;
  StartInto(Bash("sleep 10"), &a);
  StartInto(Bash("sleep 10"), &b);
  EXPECT_EQ(runner_->running(), 2u);
  runner_->Kill(a.id, EndReason::kCancelled);
  ASSERT_TRUE(Loop([&] { return a.exits > 0; }));
  // Give a stray kill time to land.
  Loop([] { return false; }, milliseconds(100));
  EXPECT_EQ(b.exits, 0);
  EXPECT_EQ(::kill(b.pid, 0), 0);
  EXPECT_EQ(runner_->running(), 1u);
  runner_->Kill(12345678, EndReason::kCancelled);  // unknown: ignored
  runner_->Kill(a.id, EndReason::kCancelled);      // finished: ignored
  runner_->Kill(b.id, EndReason::kCancelled);
  ASSERT_TRUE(Loop([&] { return b.exits > 0; }));
  EXPECT_EQ(a.exits, 1);
}

TEST_P(RunnerTest, BackgroundJobDoesNotDelayTheAnswer) {
  Outcome o = Run(Bash("sleep 5 & echo $!"));
  pid_t bg = FirstPid(o.out);
  ASSERT_GT(bg, 0);
  EXPECT_EQ(o.result.exit_code, 0);
  // The drain window (100 ms) and no more: the sleep holds the pipes for 5 s.
  EXPECT_GE(o.elapsed.count(), 90);
  EXPECT_LT(o.elapsed.count(), 1000);
  EXPECT_EQ(::kill(bg, 0), 0) << "background process was killed";
  // A sandbox-wide stop reaches it.
  runner_->KillAll(EndReason::kStopped);
  EXPECT_TRUE(Loop([&] { return Gone(bg); }, milliseconds(3000)));
}

TEST_P(RunnerTest, KillInTheDrainWindowKeepsTheNaturalExit) {
  Outcome o;
  StartInto(Bash("sleep 100 & echo $!; exit 3"), &o);
  // The main process has exited; the background job holds the pipes, so the answer waits for
  // the drain window. A kill now reaches the job but does not rewrite the exit.
  ASSERT_TRUE(Loop([&] { return o.out.find('\n') != std::string::npos; }));
  pid_t bg = FirstPid(o.out);
  Loop([] { return false; }, milliseconds(30));
  ASSERT_EQ(o.exits, 0);
  runner_->Kill(o.id, EndReason::kCancelled);
  ASSERT_TRUE(Loop([&] { return o.exits > 0; }));
  EXPECT_EQ(o.result.exit_code, 3);
  EXPECT_EQ(o.result.reason, EndReason::kExited);
  EXPECT_FALSE(o.result.cancelled);
  EXPECT_TRUE(Loop([&] { return Gone(bg); }, milliseconds(3000)));
}

TEST_P(RunnerTest, BackgroundOutputAfterTheAnswerIsDiscarded) {
  // 8 MiB written after the answer: it would block on a full pipe if nobody read it.
  std::string marker = "/tmp/nsbox-runner-test-" + std::to_string(::getpid()) + "-" +
                       std::to_string(std::get<1>(GetParam())) +
                       BackendName(std::get<0>(GetParam())).data();
  ::unlink(marker.c_str());
  Outcome o =
      Run(Bash("(sleep 0.3; head -c 8388608 /dev/zero; head -c 8388608 /dev/zero >&2; "
               "touch " +
               marker + ") & echo answered"));
  EXPECT_EQ(o.out, "answered\n");
  struct stat st {};
  EXPECT_TRUE(Loop([&] { return ::stat(marker.c_str(), &st) == 0; }, milliseconds(5000)))
      << "background writer blocked";
  ::unlink(marker.c_str());
  if (with_cgroup()) {
    // And its cgroup goes once it is empty (the sweep runs every 500 ms).
    std::string dir = cgroup_path_ + "/exec-" + std::to_string(o.id);
    EXPECT_TRUE(Loop([&] { return ::stat(dir.c_str(), &st) != 0; }, milliseconds(3000)));
  }
}

TEST_P(RunnerTest, OutputLimitTruncatesAndKills) {
  CommandSpec spec = Bash("yes");
  spec.output_limit = 1 << 20;
  Outcome o = Run(spec);
  EXPECT_EQ(o.out.size(), 1u << 20);
  EXPECT_EQ(o.out.substr(0, 4), "y\ny\n");
  EXPECT_EQ(o.err, "nsbox: output exceeded 1048576 bytes; process tree killed\n");
  EXPECT_EQ(o.result.exit_code, 1);
  EXPECT_TRUE(o.result.truncated);
  EXPECT_EQ(o.result.reason, EndReason::kOutputLimit);
}

TEST_P(RunnerTest, OutputLimitCountsBothStreams) {
  CommandSpec spec = Bash("head -c 700 /dev/zero; head -c 700 /dev/zero >&2; sleep 10");
  spec.output_limit = 1000;
  Outcome o = Run(spec);
  EXPECT_TRUE(o.result.truncated);
  // The message starts a line of its own: stderr ended in the middle of one (NUL bytes).
  const std::string message = "\nnsbox: output exceeded 1000 bytes; process tree killed\n";
  EXPECT_EQ(o.out.size() + o.err.size(), 1000u + message.size());
  EXPECT_EQ(o.err.substr(o.err.size() - message.size()), message);
  EXPECT_LT(o.elapsed.count(), 1500);
}

TEST_P(RunnerTest, InvalidUtf8PassesUnchanged) {
  Outcome o = Run(Bash("printf '\\xff\\xfe\\x80abc\\xc3'; printf '\\xe2\\x82' >&2"));
  EXPECT_EQ(o.out, std::string("\xff\xfe\x80"
                               "abc\xc3"));
  EXPECT_EQ(o.err, std::string("\xe2\x82"));
}

TEST_P(RunnerTest, TwoHundredConcurrentCommands) {
  constexpr int kCount = 200;
  std::vector<Outcome> outcomes(kCount);
  for (int i = 0; i < kCount; ++i) {
    ASSERT_NE(StartInto(Bash("echo " + std::to_string(i) + "; sleep 0.2"), &outcomes[i]), 0u);
  }
  EXPECT_EQ(runner_->running(), static_cast<size_t>(kCount));
  ASSERT_TRUE(LoopUntilAllExited(outcomes, milliseconds(20000)));
  for (int i = 0; i < 3; ++i) (void)reactor_->RunOnce(milliseconds(1));
  for (int i = 0; i < kCount; ++i) {
    EXPECT_EQ(outcomes[i].exits, 1);
    EXPECT_EQ(outcomes[i].out, std::to_string(i) + "\n");
    EXPECT_EQ(outcomes[i].result.exit_code, 0);
  }
  EXPECT_EQ(runner_->running(), 0u);
}

TEST_P(RunnerTest, CommandIsInItsOwnCgroup) {
  if (!with_cgroup()) GTEST_SKIP() << "no cgroup in this variant";
  // Under the runner's directory, an exec-<n> that no other running command is in.
  const std::string parent = cgroup_path_.substr(cgroup_path_.rfind('/')) + "/exec-";
  for (bool fallback : {false, true}) {
    ForceCloneFallbackForTesting(fallback);
    constexpr int kCount = 3;
    std::vector<Outcome> outcomes(kCount);
    for (auto& o : outcomes) {
      ASSERT_NE(StartInto(Bash("grep '^0::' /proc/self/cgroup; sleep 0.3"), &o), 0u);
    }
    ASSERT_TRUE(LoopUntilAllExited(outcomes, milliseconds(10000)));
    std::set<std::string> seen;
    for (const auto& o : outcomes) {
      const size_t at = o.out.find(parent);
      ASSERT_NE(at, std::string::npos) << (fallback ? "clone() fallback: " : "clone3: ") << o.out;
      const std::string name = o.out.substr(at + parent.size());
      EXPECT_GT(name.size(), 1u) << o.out;
      EXPECT_EQ(name.find_first_not_of("0123456789"), name.size() - 1) << o.out;  // digits, "\n"
      EXPECT_TRUE(seen.insert(name).second) << "two running commands in exec-" << name;
    }
  }
}

// A command that ended with its cgroup empty leaves it to the next one, whose CPU time does not
// include the first one's; one that leaves a process behind does not.
TEST_P(RunnerTest, AnEmptyCgroupServesTheNextCommand) {
  if (!with_cgroup()) GTEST_SKIP() << "no cgroup in this variant";
  const std::string parent = cgroup_path_.substr(cgroup_path_.rfind('/')) + "/exec-";
  auto cgroup_of = [&](const Outcome& o) {
    const size_t at = o.out.find(parent);
    if (at == std::string::npos) return std::string();
    return o.out.substr(at + parent.size(), o.out.find('\n', at) - at - parent.size());
  };
  // 0.3 s of CPU time, not of the clock: on a loaded host a loop of 0.3 s gets less.
  Outcome burn = Run(Bash("grep '^0::' /proc/self/cgroup; perl -e '1 while (times)[0] < 0.3'"));
  ASSERT_FALSE(cgroup_of(burn).empty()) << burn.out;
  ASSERT_TRUE(burn.result.usage.cpu_user_us.has_value()) << "no cpu.stat";
  EXPECT_GT(*burn.result.usage.cpu_user_us + burn.result.usage.cpu_system_us.value_or(0), 200'000u);
  Outcome next = Run(Bash("grep '^0::' /proc/self/cgroup"));
  EXPECT_EQ(cgroup_of(next), cgroup_of(burn)) << next.out;
  ASSERT_TRUE(next.result.usage.cpu_user_us.has_value());
  EXPECT_LT(*next.result.usage.cpu_user_us + next.result.usage.cpu_system_us.value_or(0), 100'000u);
  // A process left running keeps the cgroup busy: the next command gets another one.
  Outcome left = Run(Bash("grep '^0::' /proc/self/cgroup; sleep 5 >/dev/null 2>&1 &"));
  Outcome after = Run(Bash("grep '^0::' /proc/self/cgroup"));
  EXPECT_NE(cgroup_of(after), cgroup_of(left)) << left.out << after.out;
}

// The exec-* cgroups under `dir`, sorted.
std::vector<std::string> ExecCgroups(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_directory() && e.path().filename().string().rfind("exec-", 0) == 0) {
      names.push_back(e.path().filename());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Commands in a row: the next one's cgroup is made ahead, or left by a command that ended with
// its cgroup reusable (at most two are kept), ended ones are removed off the loop, and an idle
// runner keeps no cgroup at all.
TEST_P(RunnerTest, CgroupsAreMadeAheadAndReleasedWhenIdle) {
  if (!with_cgroup()) GTEST_SKIP() << "no cgroup in this variant";
  auto exec_cgroups = [this] { return ExecCgroups(cgroup_path_); };
  for (int i = 0; i < 5; ++i) {
    Outcome o = Run(Bash("exit 3"));
    EXPECT_EQ(o.result.exit_code, 3);
  }
  // Commands that leave a process behind use a new cgroup each; what the background thread
  // posts back is applied by the loop.
  for (int i = 0; i < 5; ++i) {
    Outcome o = Run(Bash("sleep 0.2 >/dev/null 2>&1 & exit 4"));
    EXPECT_EQ(o.result.exit_code, 4);
  }
  // Up to two spare sets, and the set of the child made ahead for the next command.
  EXPECT_TRUE(Loop(
      [&] {
        const size_t n = exec_cgroups().size();
        return n >= 1 && n <= 3;
      },
      milliseconds(3000)))
      << "want one to three kept; have " << exec_cgroups().size();
  // A kept one is what the next command runs in.
  const auto kept = exec_cgroups();
  Outcome o = Run(Bash("grep '^0::' /proc/self/cgroup"));
  ASSERT_FALSE(kept.empty());
  bool in_kept = false;
  for (const auto& name : kept)
    in_kept = in_kept || o.out.find("/" + name + "\n") != std::string::npos;
  EXPECT_TRUE(in_kept) << o.out;
  // Idle for the release time (2 s): nothing left.
  EXPECT_TRUE(Loop([&] { return exec_cgroups().empty(); }, milliseconds(5000)))
      << "left while idle: " << exec_cgroups().size();
  // And a command after that still gets a cgroup, made on the spot.
  Outcome after = Run(Bash("echo ok"));
  EXPECT_EQ(after.out, "ok\n");
}

// This process's children that are a runner's child made ahead (WarmChild), waiting for a
// command.
std::vector<pid_t> WarmChildren() {
  std::vector<pid_t> found;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    auto children = ReadFile(task.path().string() + "/children");
    if (!children.ok()) continue;
    std::istringstream in(*children);
    pid_t pid;
    while (in >> pid) {
      auto comm = ReadFile("/proc/" + std::to_string(pid) + "/comm");
      if (comm.ok() && *comm == std::string(kWarmChildName) + "\n") found.push_back(pid);
    }
  }
  return found;
}

// Those of WarmChildren that are ready: blocked in the futex wait for a command, which comes
// after every step of their preparation (their name is set before the steps, so a command sent
// as soon as the name shows may find the child still getting ready and start without it).
std::vector<pid_t> ReadyWarmChildren() {
  std::vector<pid_t> ready;
  for (pid_t pid : WarmChildren()) {
    // "202 0x... ..." while in futex(2) (x86-64), "running" or another number before.
    auto call = ReadFile("/proc/" + std::to_string(pid) + "/syscall");
    if (call.ok() && call->rfind(std::to_string(SYS_futex) + " ", 0) == 0) ready.push_back(pid);
  }
  return ready;
}

// Commands in a row: the runner makes the next command's child ahead, and that child runs the
// next command, which gets all a command's child gives (stdin, cwd, exit codes and messages of
// a start that fails). One killed from outside is replaced; an idle runner keeps none.
TEST_P(RunnerTest, AChildMadeAheadTakesTheNextCommand) {
  if (const char* why = NoChildMadeAhead()) GTEST_SKIP() << why;
  auto wait_for_one = [this] {
    std::vector<pid_t> warm;
    EXPECT_TRUE(Loop(
        [&] {
          warm = ReadyWarmChildren();
          return !warm.empty();
        },
        milliseconds(1500)))  // under the idle release time (2 s)
        << "no child made ahead, or none ready";
    EXPECT_LE(warm.size(), 1u);
    return warm.empty() ? pid_t{-1} : warm.front();
  };
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Run(Bash("exit 0")).result.exit_code, 0);

  pid_t next = wait_for_one();
  Outcome o = Run(Bash("echo $$; readlink /proc/self/fd/0; grep '^0::' /proc/self/cgroup"));
  EXPECT_EQ(o.pid, next);
  EXPECT_EQ(FirstPid(o.out), next) << o.out;
  EXPECT_NE(o.out.find("\n/dev/null\n"), std::string::npos) << "stdin: " << o.out;
  EXPECT_NE(o.out.find("/exec-"), std::string::npos) << "cgroup: " << o.out;
  EXPECT_EQ(o.result.exit_code, 0);

  next = wait_for_one();
  CommandSpec fed = Bash("cat; echo \" in $PWD\"");
  fed.stdin_data = "fed";
  o = Run(fed);
  EXPECT_EQ(o.pid, next);
  EXPECT_EQ(o.out, "fed in /tmp\n");

  next = wait_for_one();
  CommandSpec nowhere = Bash("echo never");
  nowhere.cwd = "/nonexistent";
  o = Run(nowhere);
  EXPECT_EQ(o.pid, next);
  EXPECT_EQ(o.result.exit_code, 1);
  EXPECT_EQ(o.out, "");
  EXPECT_EQ(o.err, "nsbox: cd: /nonexistent: No such file or directory\n");

  next = wait_for_one();
  CommandSpec missing;
  missing.argv = {"/nonexistent"};
  missing.cwd = "/";
  o = Run(missing);
  EXPECT_EQ(o.pid, next);
  EXPECT_EQ(o.result.exit_code, 127);
  EXPECT_NE(o.err.find("/nonexistent"), std::string::npos) << o.err;

  // Killed from outside (a process of the sandbox may do it): the next command starts anyway,
  // and the runner makes another.
  next = wait_for_one();
  ASSERT_EQ(::kill(next, SIGKILL), 0);
  EXPECT_TRUE(Loop([&] { return Gone(next); }, milliseconds(2000)));
  o = Run(Bash("echo after"));
  EXPECT_EQ(o.out, "after\n");
  EXPECT_NE(o.pid, next);
  EXPECT_EQ(o.result.exit_code, 0);
  EXPECT_GT(wait_for_one(), 0);

  // Idle for the release time (2 s): none left, and it was reaped.
  EXPECT_TRUE(Loop([&] { return WarmChildren().empty(); }, milliseconds(5000)));
}

// A signal sent to the child made ahead while it waits (a command's `kill -TERM -1` reaches it, as
// every process of the sandbox) is not the next command's: that command runs as if none had come.
TEST_P(RunnerTest, ASignalToTheChildMadeAheadDoesNotReachTheNextCommand) {
  if (const char* why = NoChildMadeAhead()) GTEST_SKIP() << why;
  const pid_t next = ReadyChildAfterCommandsInARow();
  ASSERT_GT(next, 0);
  for (int sig : {SIGTERM, SIGHUP, SIGUSR1, SIGINT}) ASSERT_EQ(::kill(next, sig), 0) << sig;
  EXPECT_FALSE(Gone(next)) << "every signal is blocked while it waits";
  Outcome o = Run(Bash("echo $$"));
  EXPECT_EQ(o.pid, next) << "control: the command ran in the child made ahead";
  EXPECT_EQ(o.result.exit_code, 0) << "out: " << o.out << " err: " << o.err;
  EXPECT_EQ(o.out, std::to_string(next) + "\n");
}

// Stopped while it waits (a command's `kill -STOP -1` reaches it, as every process of the sandbox
// it may signal): the next command starts in it all the same, and runs as if nothing had come.
TEST_P(RunnerTest, AStoppedChildMadeAheadStillRunsTheNextCommand) {
  if (const char* why = NoChildMadeAhead()) GTEST_SKIP() << why;
  const pid_t next = ReadyChildAfterCommandsInARow();
  ASSERT_GT(next, 0);
  ASSERT_EQ(::kill(next, SIGSTOP), 0);
  ASSERT_TRUE(Loop([next] { return ProcState(next) == 'T'; }, milliseconds(2000)))
      << "control: the child is stopped";
  Outcome o;
  ASSERT_NE(StartInto(Bash("echo $$"), &o), 0u);
  EXPECT_TRUE(Loop([&] { return o.exits > 0; }, milliseconds(5000)))
      << "the command never ran in the stopped child";
  EXPECT_EQ(o.pid, next) << "control: the command ran in the child made ahead";
  EXPECT_EQ(o.result.exit_code, 0) << "out: " << o.out << " err: " << o.err;
  EXPECT_EQ(o.out, std::to_string(next) + "\n");
}

// A command cancelled as soon as it started in the child made ahead, before that child has run
// again: the child drops the signals it was sent while it waited, but the runner noted its SIGTERM
// first (WarmChild::NoteSignal), so the command still ends by it, long before the SIGKILL that
// follows 2 s later.
TEST_P(RunnerTest, ACommandCancelledAsItStartsInTheChildMadeAheadEndsBySigterm) {
  if (const char* why = NoChildMadeAhead()) GTEST_SKIP() << why;
  for (int round = 0; round < 5; ++round) {
    const pid_t next = ReadyChildAfterCommandsInARow();
    ASSERT_GT(next, 0);
    CommandSpec sleeper;
    sleeper.argv = {"/bin/sleep", "30"};
    sleeper.cwd = "/";
    Outcome o;
    ASSERT_NE(StartInto(sleeper, &o), 0u);
    runner_->Kill(o.id, EndReason::kCancelled);  // in the same turn of the loop as the start
    ASSERT_TRUE(Loop([&] { return o.exits > 0; })) << "no answer";
    EXPECT_EQ(o.pid, next) << "control: it started in the child made ahead";
    EXPECT_TRUE(o.result.cancelled);
    EXPECT_EQ(o.result.signal, SIGTERM) << "round " << round;
    EXPECT_LT(o.elapsed, milliseconds(1500)) << "round " << round << ": the SIGTERM was lost";
  }
}

// A runner made with cgroups made ahead (a jail of nsboxd's pool) and told a command is coming
// (Anticipate, as nsbox-init does when its sandbox starts): the first command runs in the child
// made ahead, in one of those cgroups; one that comes before the child is ready takes the other
// set. A runner without them makes nothing ahead. Idle, it keeps nothing.
TEST_P(RunnerTest, AStartedSandboxsFirstCommandFindsItsChildMadeAhead) {
  if (const char* why = NoChildMadeAhead()) GTEST_SKIP() << why;
  // Without sets made ahead: nothing is made ahead of the first command.
  runner_->Anticipate();
  for (int i = 0; i < 20; ++i) (void)reactor_->RunOnce(milliseconds(10));
  EXPECT_TRUE(WarmChildren().empty());
  EXPECT_TRUE(ExecCgroups(cgroup_path_).empty());
  runner_.reset();

  auto make_runner = [this] {
    auto premade = PremadeCgroups::Make(cgroup_fd_.get(), {});
    EXPECT_TRUE(premade.ok()) << premade.error().message();
    runner_ =
        std::make_unique<Runner>(*reactor_, cgroup_fd_.get(), ChildHooks{}, RunnerV1Cgroups{},
                                 premade.ok() ? std::move(premade).value() : PremadeCgroups());
  };
  make_runner();
  const std::vector<std::string> premade = ExecCgroups(cgroup_path_);
  ASSERT_EQ(premade.size(), 2u);
  EXPECT_TRUE(WarmChildren().empty()) << "a child made before anyone said a command comes";
  runner_->Anticipate();
  std::vector<pid_t> warm;
  ASSERT_TRUE(Loop(
      [&] {
        warm = ReadyWarmChildren();
        return !warm.empty();
      },
      milliseconds(1500)))  // under the idle release time (2 s)
      << "no child made ahead, or none ready";
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_EQ(ExecCgroups(cgroup_path_), premade) << "the sets made ahead were enough";
  Outcome o = Run(Bash("echo $$; grep '^0::' /proc/self/cgroup"));
  EXPECT_EQ(o.pid, warm[0]);
  EXPECT_EQ(FirstPid(o.out), warm[0]) << o.out;
  EXPECT_TRUE(o.out.find("/" + premade[0] + "\n") != std::string::npos ||
              o.out.find("/" + premade[1] + "\n") != std::string::npos)
      << o.out;
  EXPECT_EQ(o.result.exit_code, 0);
  // Idle for the release time (2 s): no child and no cgroup left.
  EXPECT_TRUE(Loop([&] { return WarmChildren().empty() && ExecCgroups(cgroup_path_).empty(); },
                   milliseconds(5000)));
  runner_.reset();

  // A command at once, before the loop has run: the child may not be ready yet, and the command
  // then takes the other set; either way it runs in a set made ahead, none made on its path.
  make_runner();
  const std::vector<std::string> second = ExecCgroups(cgroup_path_);
  ASSERT_EQ(second.size(), 2u);
  runner_->Anticipate();
  o = Run(Bash("grep '^0::' /proc/self/cgroup"));
  EXPECT_EQ(o.result.exit_code, 0);
  EXPECT_TRUE(o.out.find("/" + second[0] + "\n") != std::string::npos ||
              o.out.find("/" + second[1] + "\n") != std::string::npos)
      << o.out;
}

TEST_P(RunnerTest, CloneFallbackRunsCommands) {
  ForceCloneFallbackForTesting(true);
  Outcome o = Run(Bash("echo fallback; exit 5"));
  EXPECT_EQ(o.out, "fallback\n");
  EXPECT_EQ(o.result.exit_code, 5);
  CommandSpec missing;
  missing.argv = {"/nonexistent"};
  missing.cwd = "/";
  EXPECT_EQ(Run(missing).result.exit_code, 127);
}

TEST_P(RunnerTest, KillWithoutCgroupKillFile) {
  if (!with_cgroup()) GTEST_SKIP() << "no cgroup in this variant";
  ForceNoCgroupKillForTesting(true);
  // The per-process SIGKILL loop: a TERM-ignoring tree with an escaped grandchild.
  CommandSpec spec =
      Bash("trap '' TERM; setsid bash -c 'echo $$; exec sleep 100' & sleep 0.2; yes");
  spec.output_limit = 64 << 10;
  Outcome o = Run(spec);
  pid_t grandchild = FirstPid(o.out);
  ASSERT_GT(grandchild, 0);
  EXPECT_EQ(o.result.reason, EndReason::kOutputLimit);
  EXPECT_LT(o.elapsed.count(), 1500);
  EXPECT_TRUE(Loop([&] { return Gone(grandchild); }, milliseconds(3000)));
}

TEST_P(RunnerTest, DestructorStopsEverything) {
  Outcome o;
  StartInto(Bash("sleep 100 >/dev/null 2>&1 & echo $!; sleep 100"), &o);
  ASSERT_TRUE(Loop([&] { return !o.out.empty(); }));
  pid_t bg = FirstPid(o.out);
  pid_t main_pid = o.pid;
  runner_.reset();
  EXPECT_EQ(o.exits, 1);
  EXPECT_EQ(o.result.reason, EndReason::kStopped);
  EXPECT_EQ(o.result.exit_code, 137);
  EXPECT_TRUE(Gone(main_pid));
  EXPECT_TRUE(Loop([&] { return Gone(bg); }, milliseconds(3000)));
  // Late completions of the cancelled operations find no runner and only release.
  for (int i = 0; i < 5; ++i) (void)reactor_->RunOnce(milliseconds(1));
  EXPECT_EQ(reactor_->pending(), 0u);
}

TEST_P(RunnerTest, DestroyedBeforeItsLoopTurnsLeavesNoCgroup) {
  // Two starts in a row: the second has the cgroup thread make the next command's cgroups ahead,
  // handed to the loop by a closure the loop never runs here. ~Runner removes them with the
  // commands' own (an integration run under load once found them left behind).
  Outcome a, b;
  ASSERT_NE(StartInto(Bash("sleep 100"), &a), 0u);
  ASSERT_NE(StartInto(Bash("sleep 100"), &b), 0u);
  runner_.reset();
  EXPECT_EQ(a.exits, 1);
  EXPECT_EQ(b.exits, 1);
  if (!with_cgroup()) return;
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(cgroup_path_)) {
    if (e.is_directory()) left.push_back(e.path().filename());
  }
  EXPECT_TRUE(left.empty()) << "cgroups left under " << cgroup_path_ << ": " << left.size()
                            << ", the first " << (left.empty() ? "" : left[0]);
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  std::string name(BackendName(std::get<0>(info.param)));
  std::erase(name, '_');
  return name + (std::get<1>(info.param) ? "_Cgroup" : "_NoCgroup");
}

INSTANTIATE_TEST_SUITE_P(Backends, RunnerTest,
                         ::testing::Combine(::testing::Values(Reactor::Backend::kEpoll,
                                                              Reactor::Backend::kIoUring),
                                            ::testing::Bool()),
                         ParamName);

}  // namespace
}  // namespace nsbox::exec

// Group "process control" (docs/security.md): processes that try to outlive their command's
// timeout or cancellation (setsid, double fork, ignoring SIGTERM), leave zombies and orphans,
// or kill PID 1. Every kill reaches the whole tree (per-command cgroup, cgroup.kill); the check
// is made from the host (no process left under the sandbox's nsbox-init) and from inside. The
// control: without a kill, the same tree survives its main process (so the check sees
// survivors when there are some).

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "exec/spawn.h"
#include "tests/adversarial/fixture.h"

namespace nsbox::adversarial {
namespace {

class ProcessTest : public AdversarialTest {
 protected:
  void SetUp() override {
    AdversarialTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    id_ = NewSandbox();
    Sh(id_, "true");
  }

  // A tree that tries every way out: a background child, one after setsid, a double fork, one
  // that ignores SIGTERM; each writes its pid to `file`; then "ready" and the main process waits.
  static std::string Tree(const std::string& file) {
    return "sleep 1000 & echo $! >> " + file + "; setsid sh -c 'echo $$ >> " + file +
           "; exec sleep 1000' &"
           " (sleep 1000 & echo $! >> " +
           file +
           ");"
           " (trap '' TERM; exec sh -c 'trap \"\" TERM; echo $$ >> " +
           file +
           "; while :; do sleep 1; done') &"
           " echo $$ >> " +
           file + "; sleep 0.3; echo ready; wait";
  }

  // How many processes run under the sandbox's nsbox-init, seen from the host.
  size_t HostProcessesInSandbox() {
    for (const auto& p : e2e::Descendants(daemon().pid())) {
      if (p.comm.rfind("nsbox-init", 0) != 0) continue;
      // The runner's child made ahead for the next command is nsbox-init's, not a command's.
      const auto all = e2e::Descendants(p.pid);
      return static_cast<size_t>(std::count_if(all.begin(), all.end(), [](const auto& d) {
        return d.comm != nsbox::exec::kWarmChildName;
      }));
    }
    return 0;
  }

  // Polls until no process runs in the sandbox (from the host) or the timeout passes.
  bool WaitEmpty(milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (HostProcessesInSandbox() == 0) return true;
      std::this_thread::sleep_for(milliseconds(50));
    }
    return false;
  }

  // The pids from `file` still alive in the sandbox.
  std::string Alive(const std::string& file) {
    return Sh(id_,
              "for p in $(cat " + file + "); do kill -0 $p 2>/dev/null && echo $p; done; true");
  }

  std::string id_;
};

// Control: with no kill, the tree outlives its main process (the answer comes, the rest runs).
TEST_F(ProcessTest, ControlTheTreeOutlivesItsMainProcess) {
  ExecResult r = Exec(id_, Tree("/tmp/pids") + " & sleep 0.6; exit 0");
  EXPECT_EQ(r.exit_code(), 0) << r.Describe();
  EXPECT_EQ(r.reason(), "exited");
  std::string alive = Alive("/tmp/pids");
  // The four escapers (the tree's own shell was the background job that exited).
  EXPECT_EQ(std::count(alive.begin(), alive.end(), '\n'), 4) << alive;
  EXPECT_GE(HostProcessesInSandbox(), 4u);
}

// A timeout kills all of it: setsid'ed, double-forked and SIGTERM-ignoring processes included,
// within the deadline plus the 2 s grace.
TEST_F(ProcessTest, TimeoutKillsTheWholeTree) {
  const auto t0 = Clock::now();
  ExecResult r = Exec(id_, json::object{{"command", Tree("/tmp/pids")}, {"timeoutMs", 800}});
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
  EXPECT_EQ(r.reason(), "timeout") << r.Describe();
  EXPECT_EQ(r.exit_code(), 124);
  EXPECT_EQ(Field(r.answer, "timedOut"), json::value(true));
  EXPECT_EQ(r.out(), "ready\n");
  EXPECT_EQ(r.err(), "nsbox: command timed out after 800 ms\n");
  EXPECT_LT(took, 800 + 2000 + 1000);
  // The answer comes when the main process is gone; the SIGTERM-ignoring one gets cgroup.kill
  // 2 s after the SIGTERM.
  EXPECT_TRUE(WaitEmpty(milliseconds(3000))) << HostProcessesInSandbox() << " left";
  EXPECT_EQ(Alive("/tmp/pids"), "");
}

// DELETE of the exec (cancel) kills all of it; the stream ends with cancelled: true.
TEST_F(ProcessTest, CancelKillsTheWholeTree) {
  NdjsonStream s(daemon().endpoint(), "POST", SbPath(id_, "/exec"),
                 json::serialize(json::object{{"command", Tree("/tmp/pids")}}));
  ASSERT_EQ(s.status(), 200);
  auto start = s.Next();
  ASSERT_TRUE(start.has_value());
  const std::string exec_id = Str(*start, "execId");
  auto ready = s.Next();
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(Str(*ready, "data"), "ready\n");
  Response del = Call("DELETE", SbPath(id_, "/execs/" + exec_id));
  EXPECT_EQ(del.status, 202) << del.Describe();
  std::vector<json::object> rest = s.ReadAll();
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(Str(rest.back(), "reason"), "cancelled");
  EXPECT_EQ(Field(rest.back(), "cancelled"), json::value(true));
  EXPECT_TRUE(WaitEmpty(milliseconds(3000))) << HostProcessesInSandbox() << " left";
  EXPECT_EQ(Alive("/tmp/pids"), "");
}

// The client hangs up mid-command: all of it dies.
TEST_F(ProcessTest, HangUpKillsTheWholeTree) {
  {
    NdjsonStream s(daemon().endpoint(), "POST", SbPath(id_, "/exec"),
                   json::serialize(json::object{{"command", Tree("/tmp/pids")}}));
    ASSERT_EQ(s.status(), 200);
    ASSERT_TRUE(s.Next().has_value());
    ASSERT_TRUE(s.Next().has_value());
    s.Close();
  }
  EXPECT_TRUE(WaitEmpty(milliseconds(3000))) << HostProcessesInSandbox() << " left";
  EXPECT_EQ(Alive("/tmp/pids"), "");
}

// A command that ignores SIGTERM is SIGKILLed 2 s after its timeout, not later. Control: one
// that does not ignore it ends at once.
TEST_F(ProcessTest, IgnoringSigtermGetsSigkillAfterTheGrace) {
  auto timed = [&](const std::string& cmd) {
    const auto t0 = Clock::now();
    ExecResult r = Exec(id_, json::object{{"command", cmd}, {"timeoutMs", 300}});
    EXPECT_EQ(r.reason(), "timeout") << r.Describe();
    EXPECT_EQ(r.exit_code(), 124);
    return std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
  };
  const long stubborn = timed("trap '' TERM; while :; do sleep 0.1; done");
  const long polite = timed("sleep 100");
  EXPECT_GE(stubborn, 300 + 1900);
  EXPECT_LT(stubborn, 300 + 2000 + 1000);
  EXPECT_LT(polite, 300 + 1000) << "control";
  EXPECT_TRUE(WaitEmpty(milliseconds(1000)));
}

// 200 orphans re-parented to PID 1 are reaped: no zombie stays. Control: a zombie kept by a live
// parent is seen by the same scan.
TEST_F(ProcessTest, ZombiesAndOrphansAreReaped) {
  InstallTools(id_);
  const std::string scan = "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l";
  Sh(id_, std::string(kJailAttacker) + " orphans 200");
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(Sh(id_, scan), "0\n");
  Sh(id_, std::string(kJailAttacker) + " orphans 0 --keep-zombie 3 >/dev/null 2>&1 &");
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(Sh(id_, scan), "1\n") << "control: the scan sees a zombie";
  ExpectInitAnswers(id_);
}

// kill -TERM 1 and kill -KILL 1 from inside: delivered (kill says 0) and ignored; nsbox-init
// answers at once. Control: signal 0 reaches PID 1 (it is there to be signalled).
TEST_F(ProcessTest, KillingPidOneFromInsideFails) {
  InstallTools(id_);
  KeyValues r = Probe(id_, "signal-init");
  EXPECT_EQ(Get(r, "kill.TERM"), "0");
  EXPECT_EQ(Get(r, "kill.KILL"), "0");
  EXPECT_EQ(Get(r, "init_alive"), "1");
  ExecResult sigs = Exec(id_,
                         "kill -INT 1; kill -HUP 1; kill -USR1 1; kill -SEGV 1; kill -STOP 1; "
                         "kill -0 1; echo rc=$?");
  EXPECT_EQ(sigs.out(), "rc=0\n") << "control: pid 1 exists for signals";
  ExpectInitAnswers(id_);
  EXPECT_EQ(Sh(id_, "echo still"), "still\n");
}

// POST stop ends every process of the sandbox; the running exec answers "stopped" (137).
TEST_F(ProcessTest, StopEndsEveryProcess) {
  NdjsonStream s(daemon().endpoint(), "POST", SbPath(id_, "/exec"),
                 json::serialize(json::object{{"command", Tree("/tmp/pids")}}));
  ASSERT_EQ(s.status(), 200);
  ASSERT_TRUE(s.Next().has_value());
  ASSERT_TRUE(s.Next().has_value());
  EXPECT_GE(HostProcessesInSandbox(), 5u) << "control";
  Response stop = Call("POST", SbPath(id_, "/stop"));
  EXPECT_EQ(stop.status, 200) << stop.Describe();
  std::vector<json::object> rest = s.ReadAll();
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(Str(rest.back(), "reason"), "stopped");
  EXPECT_EQ(Field(rest.back(), "exitCode"), json::value(137));
  bool none = false;
  for (int i = 0; i < 60 && !none; ++i) {
    none = e2e::Descendants(daemon().pid()).empty();
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_TRUE(none) << "processes left after stop";
}

}  // namespace
}  // namespace nsbox::adversarial

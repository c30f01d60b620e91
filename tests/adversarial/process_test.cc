// Group "process control" (docs/security.md): processes that try to outlive their command's
// timeout or cancellation (setsid, double fork, ignoring SIGTERM), leave zombies and orphans,
// or kill PID 1. Every kill reaches the whole tree (per-command cgroup, cgroup.kill); the check
// is made from the host (no process left under the sandbox's nsbox-init) and from inside. The
// control: without a kill, the same tree survives its main process (so the check sees
// survivors when there are some).

#include <signal.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <sstream>
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

  // The sandbox's nsbox-init, seen from the host (-1 when there is none).
  pid_t InitHostPid() {
    for (const auto& p : e2e::Descendants(daemon().pid())) {
      if (p.comm.rfind("nsbox-init", 0) == 0) return p.pid;
    }
    return -1;
  }

  // The ids that nsbox-init's threads and its child made ahead (nsbox-next) have in the
  // sandbox's PID namespace: the last field of NSpid in their status, read from the host.
  std::map<long, std::string> InitIdsInside(pid_t init) {
    std::map<long, std::string> ids;
    auto ns_id = [](const std::string& status_path) {
      std::istringstream in(e2e::ReadHostFile(status_path));
      std::string line;
      while (std::getline(in, line)) {
        if (line.rfind("NSpid:", 0) != 0) continue;
        std::istringstream fields(line.substr(6));
        long id = -1;
        for (long v; fields >> v;) id = v;
        return id;
      }
      return -1L;
    };
    const std::string task = "/proc/" + std::to_string(init) + "/task";
    if (DIR* d = opendir(task.c_str())) {
      while (struct dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        const std::string dir = task + "/" + e->d_name;
        const std::string comm = e2e::ReadHostFile(dir + "/comm");
        if (long id = ns_id(dir + "/status"); id > 0) ids[id] = comm.substr(0, comm.find('\n'));
      }
      closedir(d);
    }
    for (const auto& p : e2e::Descendants(init)) {
      if (p.comm != nsbox::exec::kWarmChildName) continue;
      if (long id = ns_id("/proc/" + std::to_string(p.pid) + "/status"); id > 0) ids[id] = p.comm;
    }
    return ids;
  }

  std::string id_;
};

// The comma-separated numbers of a probe's value.
std::set<long> NumberSet(const std::string& text) {
  std::set<long> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.insert(std::strtol(item.c_str(), nullptr, 10));
  }
  return out;
}

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

// A command cannot change nsbox-init's resource limits (issue 44): `prlimit --pid 1 --nofile=8:8`
// made every later exec fail and readdir answer 500, `--cpu=1:1` had the kernel kill nsbox-init
// (the sandbox restarted, its processes and /tmp gone). nsbox-init's saved uid and gid differ
// from its real and effective ones, so no command's credentials match it in the kernel's
// prlimit check, whichever of its ids (its threads', which hidepid hides but does not make
// unguessable) the command names; and the commands' filter refuses prlimit64 on pid 1. Control:
// the same calls reach a command's own child.
TEST_F(ProcessTest, InitsLimitsAreOutOfTheCommandsReach) {
  InstallTools(id_);
  const pid_t init = InitHostPid();
  ASSERT_GT(init, 0);
  const std::string limits_before = e2e::ReadHostFile("/proc/" + std::to_string(init) + "/limits");
  ASSERT_FALSE(limits_before.empty());
  // The attacks of the issue, as a user types them (util-linux's prlimit, from the host's /usr).
  for (const char* limit : {"--nofile=8:8", "--cpu=1:1", "--fsize=1024:1024"}) {
    ExecResult r = Exec(id_, std::string("prlimit --pid 1 ") + limit);
    EXPECT_NE(r.exit_code(), 0) << limit << ": " << r.Describe();
    EXPECT_NE(r.err().find("Operation not permitted"), std::string::npos) << r.Describe();
  }
  // Control: the same tool on a command's own child.
  ExecResult own = Exec(id_,
                        "sleep 100 & c=$!; prlimit --pid $c --nofile=8:8 --cpu=1:1 && "
                        "grep -E 'Max (open files|cpu time)' /proc/$c/limits | tr -s ' ' | "
                        "sed 's/ $//'; kill $c");
  EXPECT_EQ(own.exit_code(), 0) << own.Describe();
  EXPECT_EQ(own.out(), "Max cpu time 1 1 seconds\nMax open files 8 8 files\n") << "control";
  // PID 1 by a raw prlimit64, also with a high bit set in the register (the kernel reads a
  // pid_t: 4294967297 is pid 1).
  EXPECT_EQ(Get(Attack(id_, "prlimit 1 nofile 8 8"), "prlimit"), "EPERM");
  EXPECT_EQ(Get(Attack(id_, "prlimit 4294967297 cpu 1 1"), "prlimit"), "EPERM");

  // Every id of the sandbox's PID namespace, nsbox-init's threads among them, while file verbs
  // keep its workers running.
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    Client c = NewClient();
    while (!stop.load()) {
      c.PostJson(SbPath(id_, "/fs/stat"), json::object{{"path", "/workspace"}});
    }
  });
  std::this_thread::sleep_for(milliseconds(200));
  const std::map<long, std::string> before = InitIdsInside(init);
  const long highest = before.empty() ? 0 : before.rbegin()->first;
  KeyValues scan =
      Attack(id_, "prlimit-scan " + std::to_string(std::max<long>(4096, highest + 256)));
  const std::map<long, std::string> after = InitIdsInside(init);
  stop = true;
  busy.join();
  std::map<long, std::string> init_ids = before;
  init_ids.insert(after.begin(), after.end());
  // The child made ahead before the scan is the scan itself now: the command it was made for.
  const long self = std::strtol(Get(scan, "self").c_str(), nullptr, 10);
  const long child = std::strtol(Get(scan, "child").c_str(), nullptr, 10);
  init_ids.erase(self);
  EXPECT_GE(init_ids.size(), 2u) << "control: nsbox-init's loop and a worker thread were there";
  const std::set<long> reached = NumberSet(Get(scan, "reached"));
  const std::set<long> refused = NumberSet(Get(scan, "refused"));
  EXPECT_EQ(Get(scan, "other"), "");
  for (const auto& [id, comm] : init_ids) {
    EXPECT_EQ(reached.count(id), 0u)
        << "a command changed the limits of nsbox-init's id " << id << " (" << comm << ")";
  }
  EXPECT_EQ(refused.count(1), 1u);
  for (const auto& [id, comm] : before) {
    if (after.count(id) == 0 || id == self) continue;  // a worker that ended meanwhile
    EXPECT_EQ(refused.count(id), 1u) << "id " << id;
  }
  EXPECT_EQ(reached.count(self), 1u) << "control: its own limits";
  EXPECT_EQ(reached.count(child), 1u) << "control: its own child's limits";

  // Nothing changed: nsbox-init's limits, and what the issue saw break.
  EXPECT_EQ(e2e::ReadHostFile("/proc/" + std::to_string(init) + "/limits"), limits_before);
  EXPECT_EQ(InitHostPid(), init) << "nsbox-init was replaced (the sandbox restarted)";
  EXPECT_EQ(Sh(id_, "echo still"), "still\n");
  Response listing = Fs(id_, "readdir", json::object{{"path", "/workspace"}});
  EXPECT_EQ(listing.status, 200) << listing.Describe();
  ExpectInitAnswers(id_);
}

// A command starts with the sandbox's limits, whatever the commands before it did to their own
// limits or tried on nsbox-init's (issue 44: a lowered fsize was inherited by every later
// command, since fsize is not among the limits a command's child sets). Control: the command
// that lowers its own limits has them lowered.
TEST_F(ProcessTest, ACommandStartsWithTheSandboxsLimitsWhateverTheOnesBeforeDid) {
  const std::string first = Sh(id_, "cat /proc/self/limits");
  ASSERT_NE(first.find("Max file size"), std::string::npos) << first;
  ExecResult lowered = Exec(id_,
                            "ulimit -f 16; ulimit -t 50; ulimit -n 64; "
                            "prlimit --pid 1 --fsize=1024:1024 --cpu=50:50 --nofile=64:64; "
                            "grep -E 'Max (file size|open files)' /proc/self/limits | "
                            "tr -s ' ' | sed 's/ $//'");
  EXPECT_EQ(lowered.out(), "Max file size 16384 16384 bytes\nMax open files 64 64 files\n")
      << "control: " << lowered.Describe();
  EXPECT_EQ(Sh(id_, "cat /proc/self/limits"), first);
  EXPECT_EQ(Sh(id_, "cat /proc/self/limits | cat"), first) << "through bash";
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

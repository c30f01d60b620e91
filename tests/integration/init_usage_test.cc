// The usage of every exec (docs/cgroups.md "Per-exec usage"): what a command used, read from its
// own cgroups when it ends, and the OOM reason from its own OOM events. On this hybrid host cpu
// comes from the v2 cpu.stat, memory and pids from the per-exec v1 cgroups; io is null.

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/files.h"
#include "init_fixture.h"
#include "isolate/cgroup.h"

namespace nsbox::itest {
namespace {

using exec::EndReason;

constexpr uint64_t kMiB = 1024 * 1024;

class InitUsageTest : public InitTest {
 protected:
  void SetUp() override {
    InitTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  }

  static fs::proto::ExecRequest Python(const std::string& program) {
    fs::proto::ExecRequest req = Request("");
    req.argv = {"/usr/bin/python3", "-c", program};
    return req;
  }

  // The sandbox's cgroup v1 directory of `controller` on the host ("" when there is none).
  std::string V1Dir(const std::string& controller) const {
    for (const std::string& p : box_->cgroups().paths()) {
      if (p.find("/" + controller + "/") != std::string::npos) return p;
    }
    return "";
  }

  // The exec-* children of a cgroup directory.
  static std::vector<std::string> ExecCgroups(const std::string& dir) {
    std::vector<std::string> out;
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
    if (!d) return out;
    while (struct dirent* e = ::readdir(d.get())) {
      if (std::string(e->d_name).rfind("exec-", 0) == 0) out.emplace_back(e->d_name);
    }
    return out;
  }

  bool HasV1Memory() const { return !V1Dir("memory").empty(); }
};

// A python3 that holds 200 MiB of touched pages ("\x01" * n writes every byte) reports a peak
// 200 MiB above the same interpreter's baseline. The baseline is measured by the same program
// without the allocation, run twice first: page cache of the interpreter's files is charged to
// the cgroup that first read it, so only a warm second baseline compares with the big run.
TEST_F(InitUsageTest, MemoryPeakOfTwoHundredMebibytes) {
  if (!HasV1Memory())
    GTEST_SKIP() << "no cgroup v1 memory hierarchy (and v2 memory.peak is "
                    "read only where the controller is enabled)";
  const std::string program = "import sys\nn = int(sys.argv[1])\nb = bytearray(b'\\x01') * n\n";
  auto run_with = [&](uint64_t bytes) {
    auto req = Python(program);
    req.argv.push_back(std::to_string(bytes));
    return Run(req);
  };
  ExecRun warm = run_with(1);
  ASSERT_TRUE(warm.ok && warm.exit.exit_code == 0) << warm.Describe();
  ExecRun base = run_with(1);
  ASSERT_TRUE(base.ok && base.exit.exit_code == 0) << base.Describe();
  ExecRun big = run_with(200 * kMiB);
  ASSERT_TRUE(big.ok && big.exit.exit_code == 0) << big.Describe();
  ASSERT_TRUE(base.exit.usage.memory_peak_bytes.has_value());
  ASSERT_TRUE(big.exit.usage.memory_peak_bytes.has_value());
  const double diff = static_cast<double>(*big.exit.usage.memory_peak_bytes) -
                      static_cast<double>(*base.exit.usage.memory_peak_bytes);
  EXPECT_NEAR(diff, 200.0 * kMiB, 20.0 * kMiB) << "baseline " << *base.exit.usage.memory_peak_bytes
                                               << ", big " << *big.exit.usage.memory_peak_bytes;
  // The baseline is the interpreter alone: far below the allocation.
  EXPECT_LT(*base.exit.usage.memory_peak_bytes, 100 * kMiB);
  // The host gives no io figures without the v2 io controller: null, not zero.
  EXPECT_FALSE(big.exit.usage.io_read_bytes.has_value());
  EXPECT_FALSE(big.exit.usage.io_write_bytes.has_value());
}

// A command that burns one second of CPU (its own, as the kernel counts it) reports user +
// system within 10% of 1000 ms; the interpreter's start-up is a few tens of ms of it.
TEST_F(InitUsageTest, OneSecondOfCpu) {
  ExecRun run = Run(Python("import time\nwhile time.process_time() < 1.0:\n    pass\n"));
  ASSERT_TRUE(run.ok && run.exit.exit_code == 0) << run.Describe();
  ASSERT_TRUE(run.exit.usage.cpu_user_us.has_value()) << "no v2 cpu.stat";
  ASSERT_TRUE(run.exit.usage.cpu_system_us.has_value());
  const double ms =
      static_cast<double>(*run.exit.usage.cpu_user_us + *run.exit.usage.cpu_system_us) / 1000.0;
  EXPECT_NEAR(ms, 1000.0, 100.0) << "user " << *run.exit.usage.cpu_user_us << " us, system "
                                 << *run.exit.usage.cpu_system_us << " us";
}

// The shell and its 20 background sleeps were alive together: at least 21 pids at the peak.
TEST_F(InitUsageTest, PidsPeakCountsEveryProcessOfTheCommand) {
  if (V1Dir("pids").empty()) GTEST_SKIP() << "no cgroup v1 pids hierarchy";
  ExecRun run =
      Run("for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do "
          "sleep 1 & done; wait");
  ASSERT_TRUE(run.ok && run.exit.exit_code == 0) << run.Describe();
  ASSERT_TRUE(run.exit.usage.pids_peak.has_value());
  EXPECT_GE(*run.exit.usage.pids_peak, 21u);
  EXPECT_LT(*run.exit.usage.pids_peak, 100u);
  // Its cgroups are not reused (a pids peak cannot be reset): the next command's peak is its own.
  ExecRun one = Run("true");
  ASSERT_TRUE(one.ok && one.exit.exit_code == 0) << one.Describe();
  ASSERT_TRUE(one.exit.usage.pids_peak.has_value());
  EXPECT_EQ(*one.exit.usage.pids_peak, 1u);
}

// What a command forks and does not wait for (a double-forked orphan, reparented to nsbox-init,
// which rusage of the main process would never see) is counted: it is in the command's cgroups
// from its birth. The orphan finishes before the main process, so all it did is in the answer.
TEST_F(InitUsageTest, OrphanedChildrenAreMeasured) {
  if (!HasV1Memory()) GTEST_SKIP() << "no cgroup v1 memory hierarchy";
  ExecRun run =
      Run("( /usr/bin/python3 -c \"import time\nb = bytearray(b'x') * (100 << 20)\n"
          "while time.process_time() < 0.5:\n    pass\" </dev/null >/dev/null 2>&1 & ); sleep 3");
  ASSERT_TRUE(run.ok && run.exit.exit_code == 0) << run.Describe();
  ASSERT_TRUE(run.exit.usage.cpu_user_us.has_value());
  ASSERT_TRUE(run.exit.usage.memory_peak_bytes.has_value());
  EXPECT_GE(*run.exit.usage.cpu_user_us + *run.exit.usage.cpu_system_us, 450'000u);
  EXPECT_GE(*run.exit.usage.memory_peak_bytes, 100 * kMiB);
}

// Each exec has its own figures: a small command after a big one does not inherit its peak, and
// the per-exec v1 cgroups are gone once the commands have ended.
TEST_F(InitUsageTest, FiguresArePerExecAndTheirCgroupsAreRemoved) {
  if (!HasV1Memory()) GTEST_SKIP() << "no cgroup v1 memory hierarchy";
  // The interpreter's files, read once: their page cache is charged to the cgroup that first
  // read them, and a cgroup left holding more than 2 MiB is not passed on.
  ExecRun warm = Run(Python("print(open('/proc/self/cgroup').read(), end='')\n"));
  ASSERT_TRUE(warm.ok && warm.exit.exit_code == 0) << warm.Describe();
  ExecRun big =
      Run(Python("b = bytearray(b'x') * (150 << 20)\n"
                 "print(open('/proc/self/cgroup').read(), end='')\n"));
  ASSERT_TRUE(big.ok && big.exit.exit_code == 0) << big.Describe();
  // One process that ended with its cgroups empty: a later command runs in the same ones (the
  // next, or, with the runner's child made ahead for the next command in a set of its own, one
  // of the few after it), and its memory peak is its own, not the 150 MiB before it.
  int reused = 0;
  std::string seen;  // where the small commands ran, for the failure's message
  for (int i = 0; i < 6 && reused == 0; ++i) {
    ExecRun small = Run("cat /proc/self/cgroup");
    ASSERT_TRUE(small.ok && small.exit.exit_code == 0) << small.Describe();
    seen += small.out;
    if (small.out != big.out) continue;
    ++reused;
    ASSERT_TRUE(small.exit.usage.memory_peak_bytes.has_value());
    EXPECT_LT(*small.exit.usage.memory_peak_bytes, 50 * kMiB);
  }
  EXPECT_EQ(reused, 1) << "no command ran in the cgroups the big one left:\n"
                       << big.out << "the next ones ran in:\n"
                       << seen;
  EXPECT_GE(*big.exit.usage.memory_peak_bytes, 150 * kMiB);
  std::vector<std::string> left;
  for (int i = 0; i < 100; ++i) {
    left = ExecCgroups(V1Dir("memory"));
    if (left.empty()) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_TRUE(left.empty()) << left.size() << " exec cgroups left, e.g. " << left.front();
}

// A command that leaves memory charged to its cgroup (a tmpfs file it wrote) does not pass the
// cgroup on: the next command's peak would start from what it holds.
TEST_F(InitUsageTest, ACgroupThatStillHoldsMemoryIsNotReused) {
  if (!HasV1Memory()) GTEST_SKIP() << "no cgroup v1 memory hierarchy";
  ExecRun fill =
      Run(Python("open('/tmp/held', 'wb').write(b'x' * (8 << 20))\n"
                 "print(open('/proc/self/cgroup').read(), end='')\n"));
  ASSERT_TRUE(fill.ok && fill.exit.exit_code == 0) << fill.Describe();
  // Neither the next command nor any of the few after it (the runner's child made ahead takes
  // the spare sets in turn) runs there.
  for (int i = 0; i < 6; ++i) {
    ExecRun next = Run("cat /proc/self/cgroup");
    ASSERT_TRUE(next.ok && next.exit.exit_code == 0) << next.Describe();
    EXPECT_NE(next.out, fill.out) << "the same cgroups, holding the 8 MiB file";
    ASSERT_TRUE(next.exit.usage.memory_peak_bytes.has_value());
    EXPECT_LT(*next.exit.usage.memory_peak_bytes, 4 * kMiB);
  }
}

// Under a sandbox memory limit, a memory bomb is OOM-killed and the answer says so.
TEST_F(InitUsageTest, MemoryBombUnderALimitEndsWithReasonOom) {
  box_.reset();
  runtime::SandboxOptions o;
  o.jail.workspace = ws_.path();
  o.jail.hostname = "box";
  o.jail.warn_unwritable_workspace = false;
  o.jail.memory = "64M";
  o.cgroup_name = "nsbox-itest-oom-" + std::to_string(::getpid()) + "-" + RandomHex(6);
  o.init_binary = NSBOX_INIT_BIN;
  auto box = runtime::Sandbox::Start(o);
  ASSERT_TRUE(box.ok()) << box.error().message();
  box_ = std::move(*box);

  ExecRun run = Run(Python("b = bytearray(b'x') * (512 << 20)\n"));
  ASSERT_TRUE(run.ok) << run.Describe();
  EXPECT_EQ(run.exit.reason, Reason(EndReason::kOom)) << run.Describe();
  EXPECT_EQ(run.exit.signal, SIGKILL) << run.Describe();
  EXPECT_EQ(run.exit.exit_code, 137) << run.Describe();
  // And the sandbox goes on: the server was not the victim.
  EXPECT_EQ(Sh("echo alive"), "alive\n");
  // A SIGKILL that is not the OOM killer's stays "signaled".
  ExecRun killed = Run("kill -KILL $$");
  ASSERT_TRUE(killed.ok) << killed.Describe();
  EXPECT_EQ(killed.exit.reason, Reason(EndReason::kSignaled)) << killed.Describe();
}

}  // namespace
}  // namespace nsbox::itest

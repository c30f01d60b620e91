// Cgroups against the real hierarchies of this host, as root. Plain GoogleTest: it relies on
// nothing of harness.cc beyond being linked with it.

#include "isolate/cgroup.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "base/features.h"
#include "base/files.h"
#include "base/syscalls.h"

namespace nsbox::isolate {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string Trimmed(const std::string& path) {
  auto content = ReadFile(path);
  if (!content.ok()) return "<" + content.error().message() + ">";
  std::string s = *content;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// A child that waits to be killed; reaped (and killed, if still alive) by the destructor.
class Sleeper {
 public:
  Sleeper() {
    pid_ = ::fork();
    if (pid_ == 0) {
      for (;;) ::pause();
    }
  }
  ~Sleeper() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);  // a test-only child of ours, not yet reaped: the pid is still ours
      Wait();
    }
  }
  pid_t pid() const { return pid_; }
  int Wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return status;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

class CgroupIntegration : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root";
    auto layout = LoadCgroupLayout();
    ASSERT_TRUE(layout.ok()) << layout.error().message();
    layout_ = *layout;
    name_ = "nsbox-test-" + std::to_string(::getpid());
  }

  CgroupLayout layout_;
  std::string name_;
};

TEST_F(CgroupIntegration, LimitsKillAndRemove) {
  CgroupLimits limits{.memory_bytes = 64 * kMiB, .pids = 16, .cpus = 0.5};
  auto plan = PlanCgroups(layout_, limits, name_);
  if (!plan.ok()) GTEST_SKIP() << "this host cannot enforce the limits: " << plan.error().message();

  auto cgroups = Cgroups::Create(*plan);
  ASSERT_TRUE(cgroups.ok()) << cgroups.error().message();

  // The knobs read back as planned (the kernel's own formatting).
  for (const CgroupDirPlan& d : plan->dirs) {
    ASSERT_TRUE(std::filesystem::is_directory(d.path())) << d.path();
    for (const CgroupWrite& w : d.writes) {
      std::string path = d.path() + "/" + w.file;
      if (w.optional && !std::filesystem::exists(path)) continue;
      EXPECT_EQ(Trimmed(path), w.value) << path;
    }
  }

  Sleeper child;
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(cgroups->AddProcess(child.pid(), /*include_v2=*/true).ok());

  // The kernel agrees: every planned directory shows in /proc/PID/cgroup.
  std::string proc_cgroup = Trimmed("/proc/" + std::to_string(child.pid()) + "/cgroup");
  for (const CgroupDirPlan& d : plan->dirs) {
    const CgroupHierarchy* h = nullptr;
    if (d.version == CgroupVersion::kV2) {
      h = &*layout_.v2;
    } else if (d.controllers[0] == "memory") {
      h = &*layout_.memory_v1;
    } else if (d.controllers[0] == "pids") {
      h = &*layout_.pids_v1;
    } else {
      h = &*layout_.cpu_v1;
    }
    std::string want = (h->cgroup_path == "/" ? "" : h->cgroup_path) + "/" + name_ + "\n";
    EXPECT_NE((proc_cgroup + "\n").find(":" + want), std::string::npos) << want << " not in\n"
                                                                        << proc_cgroup;
  }
  auto oom = cgroups->OomKilled();
  ASSERT_TRUE(oom.ok()) << oom.error().message();
  EXPECT_FALSE(*oom);

  std::vector<std::string> paths = cgroups->paths();
  Status st = cgroups->Destroy();
  ASSERT_TRUE(st.ok()) << st.error().message();
  int status = child.Wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  for (const std::string& p : paths) EXPECT_FALSE(std::filesystem::exists(p)) << p;
}

TEST_F(CgroupIntegration, MemoryLimitOomKills) {
  auto plan = PlanCgroups(layout_, {.memory_bytes = 32 * kMiB}, name_);
  if (!plan.ok()) GTEST_SKIP() << plan.error().message();
  auto cgroups = Cgroups::Create(*plan);
  ASSERT_TRUE(cgroups.ok()) << cgroups.error().message();

  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    char c;
    ::close(go[1]);
    if (::read(go[0], &c, 1) != 1) ::_exit(2);
    // Touch 128 MiB, four times the limit (swap is limited too where it can be).
    constexpr size_t kSize = 128 * kMiB;
    char* p = static_cast<char*>(::malloc(kSize));
    if (p == nullptr) ::_exit(3);
    for (size_t i = 0; i < kSize; i += 4096) p[i] = 1;
    ::_exit(0);
  }
  ::close(go[0]);
  ASSERT_TRUE(cgroups->AddProcess(pid, /*include_v2=*/true).ok());
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  ::close(go[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  auto oom = cgroups->OomKilled();
  ASSERT_TRUE(oom.ok()) << oom.error().message();
  EXPECT_TRUE(*oom);
  EXPECT_TRUE(cgroups->Destroy().ok());
}

// Without the v2 kill scope, Destroy signals pid by pid, again until no forked process is left.
TEST_F(CgroupIntegration, KillsByPidsWhereThereIsNoCgroupKill) {
  CgroupLayout v1_only = layout_;
  v1_only.v2.reset();
  auto plan = PlanCgroups(v1_only, {.pids = 16}, name_);
  if (!plan.ok()) GTEST_SKIP() << plan.error().message();
  auto cgroups = Cgroups::Create(*plan);
  ASSERT_TRUE(cgroups.ok()) << cgroups.error().message();

  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    char c;
    ::close(go[1]);
    if (::read(go[0], &c, 1) != 1) ::_exit(2);
    for (int i = 0; i < 5; ++i) {
      if (::fork() == 0) break;  // grandchildren, in the cgroup by inheritance
    }
    for (;;) ::pause();
  }
  ::close(go[0]);
  ASSERT_TRUE(cgroups->AddProcess(pid, /*include_v2=*/false).ok());
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  ::close(go[1]);
  const std::string procs_path = plan->dirs[0].path() + "/cgroup.procs";
  for (int i = 0; i < 200; ++i) {
    std::string procs = Trimmed(procs_path);
    if (std::count(procs.begin(), procs.end(), '\n') + 1 >= 6) break;
    ::usleep(1000);
  }
  std::string procs = Trimmed(procs_path);
  EXPECT_EQ(std::count(procs.begin(), procs.end(), '\n') + 1, 6) << procs;

  Status st = cgroups->Destroy();
  ASSERT_TRUE(st.ok()) << st.error().message();
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_FALSE(std::filesystem::exists(plan->dirs[0].path()));
}

TEST_F(CgroupIntegration, CloneIntoCgroupUsesTheV2Fd) {
  const Features& f = ProbeFeatures();
  if (!f.clone_into_cgroup.available || !layout_.v2.has_value()) {
    GTEST_SKIP() << "no CLONE_INTO_CGROUP: " << f.clone_into_cgroup.detail;
  }
  auto plan = PlanCgroups(layout_, {}, name_);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  auto cgroups = Cgroups::Create(*plan);
  ASSERT_TRUE(cgroups.ok()) << cgroups.error().message();
  ASSERT_GE(cgroups->v2_dir_fd(), 0);

  struct clone_args args {};
  args.flags = CLONE_INTO_CGROUP;
  args.exit_signal = SIGCHLD;
  args.cgroup = static_cast<uint64_t>(cgroups->v2_dir_fd());
  long pid = sys::Clone3(&args, sizeof args);
  if (pid == 0) {
    for (;;) ::pause();
  }
  ASSERT_GT(pid, 0) << ErrnoText(errno);
  std::string procs = Trimmed(plan->dirs[0].path() + "/cgroup.procs");
  EXPECT_EQ(procs, std::to_string(pid));
  ASSERT_TRUE(cgroups->Destroy().ok());
  int status = 0;
  ASSERT_EQ(::waitpid(static_cast<pid_t>(pid), &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

// The per-mount options (the sixth field of mountinfo) of the cgroup2 mount at `mount_point`.
std::string MountOptionsOf(const std::string& mount_point) {
  auto mountinfo = ReadFile("/proc/self/mountinfo");
  if (!mountinfo.ok()) return "<" + mountinfo.error().message() + ">";
  std::istringstream lines(*mountinfo);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string word; fields >> word;) f.push_back(word);
    if (f.size() > 5 && f[4] == mount_point && line.find(" - cgroup2 ") != std::string::npos) {
      return f[5];
    }
  }
  return "<no cgroup2 mount at " + mount_point + ">";
}

// docs/cgroups.md "Moves into v1": what nsboxd and `nsbox run` do at start on a host with v1
// hierarchies. The cgroup2 superblock gets favordynmods and keeps every other option, and the
// mount's own flags stay as they were.
TEST_F(CgroupIntegration, FavorDynmodsIsTurnedOnAndKeepsEveryOtherOption) {
  if (!layout_.v2.has_value()) GTEST_SKIP() << "no cgroup2 mount";
  // Off first (a daemon of an earlier test may have turned it on), every other flag kept.
  auto flags = FavorDynmodsFlags(layout_.v2->super_options);
  ASSERT_TRUE(flags.ok()) << flags.error().message();
  flags->erase(std::find(flags->begin(), flags->end(), "favordynmods"));
  ASSERT_TRUE(SetCgroup2Flags(layout_.v2->mount_point, *flags).ok());
  auto off = LoadCgroupLayout();
  ASSERT_TRUE(off.ok() && off->v2.has_value());
  const std::vector<std::string> before = off->v2->super_options;
  if (std::find(before.begin(), before.end(), "favordynmods") != before.end()) {
    // Booted with cgroup_favordynmods=true (or built with it): every reconfiguration keeps it.
    GTEST_SKIP() << "this kernel keeps favordynmods on";
  }
  const std::string mount_flags = MountOptionsOf(off->v2->mount_point);

  auto turned_on = EnableFavorDynmods(*off->v2);
  if (!turned_on.ok() && turned_on.error().message().find("no favordynmods") != std::string::npos) {
    GTEST_SKIP() << turned_on.error().message();
  }
  ASSERT_TRUE(turned_on.ok()) << turned_on.error().message();
  EXPECT_TRUE(*turned_on);

  auto now = LoadCgroupLayout();
  ASSERT_TRUE(now.ok()) << now.error().message();
  ASSERT_TRUE(now->v2.has_value());
  const std::vector<std::string>& after = now->v2->super_options;
  EXPECT_NE(std::find(after.begin(), after.end(), "favordynmods"), after.end());
  for (const std::string& option : before) {
    EXPECT_NE(std::find(after.begin(), after.end(), option), after.end()) << option;
  }
  EXPECT_EQ(MountOptionsOf(now->v2->mount_point), mount_flags);

  // Once on, there is nothing to do.
  auto again = EnableFavorDynmods(*now->v2);
  ASSERT_TRUE(again.ok()) << again.error().message();
  EXPECT_FALSE(*again);
}

}  // namespace
}  // namespace nsbox::isolate

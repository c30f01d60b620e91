// A jail of nsboxd's pool (docs/daemon.md "The pool"): started ahead with no sandbox, then
// adopted by one (runtime::Sandbox::Adopt). What a command sees in it must be exactly what it
// sees in a jail started for that sandbox: mounts and their options, hostname and /etc, limits,
// capabilities; and a pooled jail no sandbox takes goes quietly.

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>

#include "base/files.h"
#include "harness.h"
#include "init_fixture.h"

namespace nsbox::itest {
namespace {

// A directory for the shared /etc's versions, removed at the end.
class EtcCache {
 public:
  EtcCache() {
    char tmpl[] = "/var/tmp/nsbox-itest-etc-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) ADD_FAILURE() << "mkdtemp: " << ErrnoName(errno);
    path_ = tmpl;
  }
  ~EtcCache() { (void)RemoveTree(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// What a command prints about the jail it runs in, with nothing that differs between two
// sandboxes of the same configuration (mount ids, the host paths bound).
constexpr const char* kDescribe =
    "hostname; echo ---; cat /etc/hostname /etc/hosts /etc/resolv.conf; echo ---; "
    "awk '{ split($0, a, \" - \"); split(a[2], b, \" \"); print $5, $6, b[1], b[3] }' "
    "/proc/self/mountinfo | sort; echo ---; grep -E '^(Cap|NoNewPrivs|Seccomp)' "
    "/proc/self/status; echo ---; pwd; cat /proc/self/cgroup; ulimit -a; umask; "
    "stat -f -c '%b %S' /tmp /dev/shm; touch / 2>&1; echo ---; ls -la /workspace /root";

class PoolTest : public IntegrationTest {
 protected:
  runtime::JailOptions Jail(const TempWorkspace& workspace, const TempWorkspace& home) const {
    runtime::JailOptions j;
    j.workspace = workspace.path();
    j.home = home.path();
    j.hostname = "same-box";
    j.memory = "64M";
    j.pids = "64";
    j.nameserver = "10.213.0.1";
    j.shared_etc_dir = etc_.path();
    j.warn_unwritable_workspace = false;
    return j;
  }

  runtime::SandboxOptions Options(std::string name) const {
    runtime::SandboxOptions o;
    o.cgroup_name =
        "nsbox-itest-pool-" + name + "-" + std::to_string(::getpid()) + "-" + RandomHex(6);
    o.init_binary = NSBOX_INIT_BIN;
    return o;
  }

  std::unique_ptr<runtime::Sandbox> StartPooled() {
    runtime::SandboxOptions o = Options("b");
    o.jail.adopt_later = true;
    o.jail.nameserver = "10.213.0.1";
    o.jail.shared_etc_dir = etc_.path();
    o.jail.warn_unwritable_workspace = false;
    o.pooled = true;
    auto box = runtime::Sandbox::Start(o);
    EXPECT_TRUE(box.ok()) << box.error().message();
    if (!box.ok()) return nullptr;
    EXPECT_TRUE((*box)->pooled());
    return std::move(*box);
  }

  static ExecRun Run(runtime::Sandbox& box, const std::string& command) {
    fs::proto::ExecRequest req;
    req.command = command;
    req.cwd = "/workspace";
    req.env = {kJailPath, "HOME=/root", "LANG=C.UTF-8"};
    return RunOn(box.client(), req);
  }

  // The limit file of the sandbox's cgroups that holds `file` ("pids.max"), or "".
  static std::string CgroupValue(const runtime::Sandbox& box, const std::string& file) {
    for (const std::string& dir : box.cgroups().paths()) {
      std::ifstream f(dir + "/" + file);
      std::string value;
      if (f >> value) return value;
    }
    return "";
  }

  // kDescribe in both, which must say the same (a jail started for the sandbox, and one of the
  // pool that became it); what `adopted` printed.
  static std::string DescribedAlike(runtime::Sandbox& started, runtime::Sandbox& adopted) {
    ExecRun want = Run(started, kDescribe);
    ExecRun got = Run(adopted, kDescribe);
    EXPECT_TRUE(want.ok && want.exit.exit_code == 0) << want.Describe();
    EXPECT_TRUE(got.ok && got.exit.exit_code == 0) << got.Describe();
    // Which of its cgroup sets a command runs in depends on what was made ahead (the adopted jail
    // has two, one of them with a child made ahead): the sets' numbers are left out.
    const std::regex exec_set("/exec-[0-9]+\n");
    EXPECT_EQ(std::regex_replace(got.out, exec_set, "/exec-N\n"),
              std::regex_replace(want.out, exec_set, "/exec-N\n"));
    EXPECT_EQ(got.err, want.err);
    // Not vacuous: the description names what the adoption set.
    EXPECT_NE(got.out.find("same-box\n---\nsame-box\n"), std::string::npos) << got.out;
    EXPECT_NE(got.out.find("127.0.1.1\tsame-box"), std::string::npos) << got.out;
    EXPECT_NE(got.out.find("/workspace rw,nosuid,nodev"), std::string::npos) << got.out;
    return got.out;
  }

  EtcCache etc_;
};

TEST_F(PoolTest, AnAdoptedJailIsWhatAStartedOneIs) {
  TempWorkspace workspace_a, home_a, workspace_b, home_b;
  runtime::SandboxOptions a = Options("a");
  a.jail = Jail(workspace_a, home_a);
  auto started = runtime::Sandbox::Start(a);
  ASSERT_TRUE(started.ok()) << started.error().message();

  std::unique_ptr<runtime::Sandbox> pooled = StartPooled();
  ASSERT_NE(pooled, nullptr);
  // While it waits it holds its own /etc directory (isolate::kInitOwnEtcFd), which the adoption
  // writes hosts and hostname through, and then closes.
  const std::string fds = "/proc/" + std::to_string(pooled->init_pid()) + "/fd";
  auto holders = [&fds] {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(fds, ec)) {
      if (std::filesystem::read_symlink(e.path(), ec) == isolate::kOwnEtcDir) {
        out.push_back(e.path().filename().string());
      }
    }
    return out;
  };
  EXPECT_EQ(holders(), std::vector<std::string>{std::to_string(isolate::kInitOwnEtcFd)});
  auto adopted = pooled->Adopt(Jail(workspace_b, home_b));
  ASSERT_TRUE(adopted.ok()) << adopted.error().message();
  EXPECT_FALSE(pooled->pooled());
  EXPECT_TRUE(holders().empty()) << ::testing::PrintToString(holders());

  const std::string got = DescribedAlike(**started, *pooled);
  EXPECT_NE(got.find("/root rw,nosuid,nodev"), std::string::npos) << got;
  EXPECT_NE(got.find("/ ro,nosuid,nodev"), std::string::npos) << got;
  EXPECT_NE(got.find("Read-only file system"), std::string::npos) << got;
  // /tmp and /dev/shm, one tmpfs, hold half of the 64 MiB together (blocks of 4 KiB).
  EXPECT_NE(got.find("8192 4096\n8192 4096\n"), std::string::npos) << got;

  // Its own directories, not the other sandbox's.
  ExecRun write = Run(*pooled, "echo w > /workspace/mark && echo h > /root/mark");
  ASSERT_TRUE(write.ok && write.exit.exit_code == 0) << write.Describe();
  EXPECT_TRUE(HostPathExists(workspace_b.HostPath("mark")));
  EXPECT_TRUE(HostPathExists(home_b.path() + "/mark"));
  EXPECT_FALSE(HostPathExists(workspace_a.HostPath("mark")));

  // The limits are on its cgroups.
  EXPECT_EQ(CgroupValue(*pooled, "pids.max"), "64");
  const std::string memory = CgroupValue(*pooled, "memory.max").empty()
                                 ? CgroupValue(*pooled, "memory.limit_in_bytes")
                                 : CgroupValue(*pooled, "memory.max");
  EXPECT_EQ(memory, std::to_string(64u << 20));
  EXPECT_TRUE((*started)->Stop().ok());
  EXPECT_TRUE(pooled->Stop().ok());
}

// Children of `pid` (its threads' /proc children lists).
std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream f(task.path() / "children");
    pid_t child;
    while (f >> child) out.push_back(child);
  }
  return out;
}

// Adopted ahead of its sandbox (nsboxd's directories made ahead), then assigned from the host:
// what a command sees is what it sees in a jail started for that sandbox, and what nsbox-init
// made ahead for the first command waits for it longer than an idle sandbox keeps it.
TEST_F(PoolTest, AJailAdoptedAheadThenAssignedIsWhatAStartedOneIs) {
  TempWorkspace workspace_a, home_a, workspace_b, home_b;
  runtime::SandboxOptions a = Options("a");
  a.jail = Jail(workspace_a, home_a);
  a.jail.memory.reset();  // only an adoption sizes /tmp (below)
  auto started = runtime::Sandbox::Start(a);
  ASSERT_TRUE(started.ok()) << started.error().message();

  std::unique_ptr<runtime::Sandbox> pooled = StartPooled();
  ASSERT_NE(pooled, nullptr);
  runtime::JailOptions ahead = Jail(workspace_b, home_b);
  ahead.hostname = "placeholder";
  ahead.memory.reset();
  ahead.pids.reset();
  auto ws = runtime::PinDirectory(ahead.workspace);
  auto home = runtime::PinDirectory(ahead.home);
  ASSERT_TRUE(ws.ok() && home.ok());
  auto adopted = pooled->AdoptAhead(ahead, std::move(ws).value(), std::move(home).value());
  ASSERT_TRUE(adopted.ok()) << adopted.error().message();
  EXPECT_TRUE(pooled->adopted_ahead());
  // The first command's child, made once the adoption was done, outlives the 2 s after which an
  // idle sandbox lets it go.
  std::vector<pid_t> children;
  for (int i = 0; i < 200 && children.empty(); ++i) {
    children = ChildrenOf(pooled->init_pid());
    if (children.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(children.size(), 1u) << "no child made ahead";
  std::this_thread::sleep_for(std::chrono::milliseconds(4500));
  EXPECT_EQ(ChildrenOf(pooled->init_pid()), children) << "the child made ahead was let go";

  // A memory limit is refused, and leaves it as it was.
  runtime::JailOptions limited = Jail(workspace_b, home_b);
  auto refused = pooled->Assign(limited);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), EOPNOTSUPP) << refused.error().message();
  EXPECT_TRUE(pooled->adopted_ahead());

  runtime::JailOptions jail = Jail(workspace_b, home_b);
  jail.memory.reset();
  auto assigned = pooled->Assign(jail);
  ASSERT_TRUE(assigned.ok()) << assigned.error().message();
  EXPECT_FALSE(pooled->adopted_ahead());
  const std::string got = DescribedAlike(**started, *pooled);
  EXPECT_EQ(got.find("placeholder"), std::string::npos) << got;
  EXPECT_EQ(CgroupValue(*pooled, "pids.max"), "64");
  // The daemon's thread that set the hostname went back to its own UTS namespace.
  char name[65] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  EXPECT_NE(std::string(name), "same-box");

  ExecRun write = Run(*pooled, "echo w > /workspace/mark && echo h > /root/mark");
  ASSERT_TRUE(write.ok && write.exit.exit_code == 0) << write.Describe();
  EXPECT_TRUE(HostPathExists(workspace_b.HostPath("mark")));
  EXPECT_TRUE(HostPathExists(home_b.path() + "/mark"));
  EXPECT_TRUE((*started)->Stop().ok());
  EXPECT_TRUE(pooled->Stop().ok());
}

TEST_F(PoolTest, ALimitItsCgroupsCannotTakeLeavesTheJailPooled) {
  TempWorkspace workspace, home;
  std::unique_ptr<runtime::Sandbox> pooled = StartPooled();
  ASSERT_NE(pooled, nullptr);
  runtime::JailOptions jail = Jail(workspace, home);
  jail.cpus = "0.5";
  auto adopted = pooled->Adopt(jail);
  if (!adopted.ok()) {
    // A hybrid host: the CPU limit needs a v1 cpu cgroup, which a jail started without one lacks.
    EXPECT_EQ(adopted.error().code(), ENOENT) << adopted.error().message();
    EXPECT_TRUE(pooled->pooled());
    jail.cpus.reset();
    adopted = pooled->Adopt(jail);
    ASSERT_TRUE(adopted.ok()) << adopted.error().message();
  } else {
    EXPECT_EQ(CgroupValue(*pooled, "cpu.max"), "50000");
  }
  ExecRun run = Run(*pooled, "hostname");
  EXPECT_TRUE(run.ok && run.out == "same-box\n") << run.Describe();
  EXPECT_TRUE(pooled->Stop().ok());
}

TEST_F(PoolTest, APooledJailNoSandboxTakesGoesQuietly) {
  std::unique_ptr<runtime::Sandbox> pooled = StartPooled();
  ASSERT_NE(pooled, nullptr);
  const pid_t init = pooled->init_pid();
  const std::vector<std::string> cgroups = pooled->cgroups().paths();
  ASSERT_FALSE(cgroups.empty());
  EXPECT_TRUE(HostPathExists("/proc/" + std::to_string(init)));
  // Not yet anyone's: no workspace is mounted, and its root is still being made.
  std::ifstream mounts("/proc/" + std::to_string(init) + "/mountinfo");
  std::string all((std::istreambuf_iterator<char>(mounts)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all.find(" /workspace "), std::string::npos) << all;
  // While it waits, it makes its sandbox's first command's cgroups, in every hierarchy.
  for (const auto& dir : cgroups) {
    bool made = false;
    for (int i = 0; i < 200 && !made; ++i) {
      made = HostPathExists(dir + "/exec-1");
      if (!made) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(made) << dir << "/exec-1";
  }
  EXPECT_TRUE(pooled->Stop().ok());
  for (const auto& dir : cgroups) EXPECT_FALSE(HostPathExists(dir)) << dir;
  // Stop waited for it: the pid is gone, not a zombie.
  EXPECT_FALSE(HostPathExists("/proc/" + std::to_string(init) + "/status"));
}

}  // namespace
}  // namespace nsbox::itest

#include "base/features.h"

#include <errno.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "base/files.h"
#include "runtime/doctor.h"

namespace nsbox {
namespace {

int CountOpenFds() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n;
}

void ExpectExplained(const Features::Item& item, const char* what) {
  if (!item.available) {
    EXPECT_FALSE(item.detail.empty()) << what << " is missing without a reason";
  }
}

// ctest runs each case in its own process, so this is the first probe of the process.
TEST(ProbeFeatures, IsFastAndLeavesNothingBehind) {
  const int fds_before = CountOpenFds();
  const auto start = std::chrono::steady_clock::now();
  const Features& f = ProbeFeatures();
  const auto took = std::chrono::steady_clock::now() - start;
  std::printf("first probe took %.2f ms\n",
              std::chrono::duration<double, std::milli>(took).count());
  // The design target is < 5 ms; a loaded CI machine gets slack, a hang does not.
  EXPECT_LT(took, std::chrono::milliseconds(100));
  EXPECT_EQ(CountOpenFds(), fds_before);
  // Every probe child was reaped.
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
  // The temporary cgroup of the cgroup.kill probe is gone. Only ours: ctest runs other test
  // processes at the same time, whose probes may be under way.
  (void)f;
  const std::string ours = "nsbox-probe-" + std::to_string(::getpid());
  for (const char* dir : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      EXPECT_NE(entry.path().filename().string(), ours) << entry.path();
    }
  }
}

TEST(ProbeFeatures, ProbesOnce) {
  const Features& a = ProbeFeatures();
  const Features& b = ProbeFeatures();
  EXPECT_EQ(&a, &b);
}

TEST(ProbeFeatures, AnswersAreConsistent) {
  const Features& f = ProbeFeatures();
  ExpectExplained(f.user_namespaces, "user_namespaces");
  ExpectExplained(f.mount_namespaces, "mount_namespaces");
  ExpectExplained(f.seccomp_filter, "seccomp_filter");
  ExpectExplained(f.clone3, "clone3");
  ExpectExplained(f.clone_into_cgroup, "clone_into_cgroup");
  ExpectExplained(f.pidfd, "pidfd");
  ExpectExplained(f.openat2, "openat2");
  ExpectExplained(f.mount_setattr, "mount_setattr");
  ExpectExplained(f.overlayfs, "overlayfs");
  ExpectExplained(f.io_uring, "io_uring");
  ExpectExplained(f.cgroup_v2, "cgroup_v2");
  ExpectExplained(f.cgroup_kill, "cgroup_kill");

  if (f.mount_namespaces.available) {
    EXPECT_TRUE(f.user_namespaces.available);
  }
  if (f.clone_into_cgroup.available) {
    EXPECT_TRUE(f.clone3.available);
  }
  if (f.cgroup_kill.available) {
    EXPECT_TRUE(f.cgroup_v2.available);
  }
  if (!f.cgroup_v2.available) {
    EXPECT_TRUE(f.cgroup_v2_controllers.empty());
  }

  const std::set<std::string> known = {"READ",    "WRITE",        "POLL_ADD",
                                       "TIMEOUT", "LINK_TIMEOUT", "ASYNC_CANCEL",
                                       "WAITID",  "RECVMSG",      "SENDMSG"};
  for (const std::string& op : f.io_uring_missing_ops) {
    EXPECT_EQ(known.count(op), 1u) << op;
  }
  if (!f.io_uring.available) {
    EXPECT_TRUE(f.io_uring_missing_ops.empty());
  }
  for (const std::string& c : f.cgroup_v1_controllers) {
    EXPECT_NE(c, "rw");
    EXPECT_EQ(c.find('='), std::string::npos) << c;  // name=systemd is not a controller
  }
}

// What the probe says agrees with what the host's files say.
TEST(ProbeFeatures, AgreesWithProc) {
  const Features& f = ProbeFeatures();
  auto filesystems = ReadFile("/proc/filesystems");
  ASSERT_TRUE(filesystems.ok());
  EXPECT_EQ(f.overlayfs.available, filesystems->find("\toverlay\n") != std::string::npos);

  auto mountinfo = ReadFile("/proc/self/mountinfo");
  ASSERT_TRUE(mountinfo.ok());
  if (mountinfo->find(" - cgroup2 ") == std::string::npos) {
    EXPECT_FALSE(f.cgroup_v2.available);
  }
  for (const std::string& c : f.cgroup_v1_controllers) {
    EXPECT_NE(mountinfo->find(" - cgroup "), std::string::npos) << c;
  }
  // Linux 5.4+ everywhere nsbox is meant to run; the probe must not get these wrong there.
  EXPECT_TRUE(f.pidfd.available) << f.pidfd.detail;
  EXPECT_TRUE(f.seccomp_filter.available) << f.seccomp_filter.detail;
}

// The doctor is the probe's main reader; its report is built from plain values.
runtime::DoctorInput AllPresent() {
  runtime::DoctorInput in;
  for (Features::Item* item :
       {&in.features.user_namespaces, &in.features.mount_namespaces, &in.features.seccomp_filter,
        &in.features.clone3, &in.features.clone_into_cgroup, &in.features.pidfd,
        &in.features.openat2, &in.features.mount_setattr, &in.features.overlayfs,
        &in.features.io_uring, &in.features.cgroup_v2, &in.features.cgroup_kill}) {
    item->available = true;
  }
  in.features.max_user_namespaces = 1000;
  isolate::CgroupLayout layout;
  layout.v2 = isolate::CgroupHierarchy{
      "/sys/fs/cgroup",          "/",  "/sys/fs/cgroup",    {"memory", "pids", "cpu"},
      {"memory", "pids", "cpu"}, true, {"rw", "nsdelegate"}};
  in.layout = layout;
  isolate::PlacementPlan placement;  // the root cgroup
  placement.base = "/sys/fs/cgroup";
  placement.controllers = {"cpu", "memory", "pids"};
  placement.why = "the root cgroup";
  in.placement = placement;
  in.kernel = "6.1.0";
  in.network_probe = std::string("nftables: ok (a scratch table made and removed)\nveth: ok\n");
  in.disks = Ok();
  return in;
}

const runtime::DoctorLayer* Find(const std::vector<runtime::DoctorLayer>& layers,
                                 const std::string& key) {
  for (const auto& l : layers) {
    if (l.key == key) return &l;
  }
  return nullptr;
}

TEST(Doctor, AllPresentIsOk) {
  runtime::DoctorInput in = AllPresent();
  auto layers = runtime::DoctorLayers(in);
  EXPECT_TRUE(runtime::DoctorOk(layers));
  for (const auto& l : layers) {
    EXPECT_EQ(l.status, "ok") << l.key << ": " << l.detail;
    EXPECT_TRUE(l.fix.empty()) << l.key;
  }
  ASSERT_NE(Find(layers, "cgroup_memory"), nullptr);
  EXPECT_EQ(Find(layers, "cgroup_memory")->detail, "cgroup v2 under /sys/fs/cgroup");
  EXPECT_EQ(Find(layers, "event_loop")->detail, "io_uring");
}

TEST(Doctor, ReportsWhatNsboxNetFound) {
  runtime::DoctorInput in = AllPresent();
  in.network_probe = std::string(
      "nftables: ok (a scratch table made and removed)\n"
      "resolver upstreams: missing (no nameserver in /etc/resolv.conf)\n");
  auto layers = runtime::DoctorLayers(in);
  EXPECT_TRUE(runtime::DoctorOk(layers));  // optional
  const auto* nft = Find(layers, "network_nftables");
  ASSERT_NE(nft, nullptr);
  EXPECT_EQ(nft->status, "ok");
  EXPECT_EQ(nft->detail, "a scratch table made and removed");
  const auto* dns = Find(layers, "network_resolver_upstreams");
  ASSERT_NE(dns, nullptr);
  EXPECT_EQ(dns->status, "missing");
  EXPECT_EQ(dns->detail, "no nameserver in /etc/resolv.conf");
  in.network_probe = Error::Msg("nsbox-net not found beside /usr/bin/nsbox");
  layers = runtime::DoctorLayers(in);
  const auto* missing = Find(layers, "network");
  ASSERT_NE(missing, nullptr);
  EXPECT_EQ(missing->status, "missing");
  EXPECT_FALSE(missing->required);
  EXPECT_NE(missing->detail.find("nsbox-net not found"), std::string::npos);
}

// What installs nsbox-net is said only where none was found: the same build as nsbox makes it and
// `cmake --install` puts it beside nsbox (there is no scripts/setup). Control: one that was found
// but whose probe failed gets the command that shows why instead; one whose probe ran gets no
// "network" line at all.
TEST(Doctor, SaysWhatInstallsNsboxNetOnlyWhereItIsMissing) {
  runtime::DoctorInput in = AllPresent();
  in.network_binary = "";
  in.network_probe = Error(ENOENT, "nsbox-net not found beside /usr/local/bin/nsbox");
  auto layers = runtime::DoctorLayers(in);
  const auto* missing = Find(layers, "network");
  ASSERT_NE(missing, nullptr);
  EXPECT_NE(missing->fix.find("cmake --install build"), std::string::npos) << missing->fix;
  EXPECT_NE(missing->fix.find("build/net/nsbox-net"), std::string::npos) << missing->fix;
  EXPECT_EQ(missing->fix.find("scripts/setup"), std::string::npos) << missing->fix;
  EXPECT_NE(runtime::DoctorText(in, layers).find("cmake --install build"), std::string::npos);

  in.network_binary = "/usr/local/bin/nsbox-net";
  in.network_probe = Error::Msg("/usr/local/bin/nsbox-net --probe printed nothing (exit code 127)");
  layers = runtime::DoctorLayers(in);
  const auto* failed = Find(layers, "network");
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->status, "missing");
  EXPECT_NE(failed->fix.find("/usr/local/bin/nsbox-net --probe"), std::string::npos) << failed->fix;
  EXPECT_EQ(failed->fix.find("cmake --install"), std::string::npos) << failed->fix;

  in.network_probe = std::string("nftables: ok (a scratch table made and removed)\n");
  layers = runtime::DoctorLayers(in);
  EXPECT_EQ(Find(layers, "network"), nullptr);
  ASSERT_NE(Find(layers, "network_nftables"), nullptr);
  EXPECT_TRUE(Find(layers, "network_nftables")->fix.empty());
}

TEST(Doctor, NoLoopDevicesMeanNoSandboxDisksOnly) {
  runtime::DoctorInput in = AllPresent();
  in.disks = Error::Sys("access", "/dev/loop-control", ENOENT).Context("loop devices");
  auto layers = runtime::DoctorLayers(in);
  EXPECT_TRUE(runtime::DoctorOk(layers));  // optional
  const auto* disks = Find(layers, "disks");
  ASSERT_NE(disks, nullptr);
  EXPECT_EQ(disks->status, "missing");
  EXPECT_NE(disks->detail.find("/dev/loop-control"), std::string::npos) << disks->detail;
  EXPECT_NE(disks->fix.find("modprobe loop"), std::string::npos) << disks->fix;

  // A kernel before 6.15 (Debian 12's and 13's): the loop modules are no fix.
  in.disks =
      Error::Sys("open_tree", "a directory of a detached mount", EINVAL)
          .Context("the kernel cannot clone a directory of a detached mount (Linux 6.15 can)");
  layers = runtime::DoctorLayers(in);
  disks = Find(layers, "disks");
  EXPECT_EQ(disks->status, "missing");
  EXPECT_NE(disks->fix.find("Linux 6.15"), std::string::npos) << disks->fix;
  EXPECT_EQ(disks->fix.find("modprobe"), std::string::npos) << disks->fix;

  in.disks = Error(ENOENT, "mkfs.ext4 is not installed (Debian package e2fsprogs)");
  layers = runtime::DoctorLayers(in);
  disks = Find(layers, "disks");
  EXPECT_EQ(disks->fix, "apt-get install e2fsprogs");
}

TEST(Doctor, MissingRequiredLayersFailWithAFix) {
  runtime::DoctorInput in = AllPresent();
  in.euid = 1000;
  in.features.user_namespaces = {false,
                                 "clone(CLONE_NEWUSER): EPERM (Operation not permitted): "
                                 "denied; fix: sysctl -w kernel.x=1"};
  in.features.io_uring = {false, "io_uring_setup: EPERM (Operation not permitted)"};
  in.features.cgroup_kill = {false, "kernel < 5.14"};
  in.layout = Error::Msg("no /proc");
  auto layers = runtime::DoctorLayers(in);
  EXPECT_FALSE(runtime::DoctorOk(layers));
  const auto* priv = Find(layers, "privileges");
  EXPECT_EQ(priv->status, "missing");
  EXPECT_NE(priv->detail.find("nsbox needs root"), std::string::npos);
  const auto* userns = Find(layers, "user_namespaces");
  EXPECT_EQ(userns->status, "missing");
  EXPECT_EQ(userns->fix, "sysctl -w kernel.x=1");
  EXPECT_EQ(Find(layers, "kill_scope")->status, "degraded");
  EXPECT_EQ(Find(layers, "cgroup_pids")->status, "missing");
  const auto* loop = Find(layers, "event_loop");
  EXPECT_EQ(loop->detail,
            "epoll (io_uring unavailable: io_uring_setup: EPERM (Operation not permitted))");
}

TEST(Doctor, SaysWhereExecUsageComesFrom) {
  runtime::DoctorInput in = AllPresent();
  auto layers = runtime::DoctorLayers(in);
  const auto* usage = Find(layers, "exec_usage");
  ASSERT_NE(usage, nullptr);
  EXPECT_EQ(usage->status, "ok");
  EXPECT_EQ(usage->detail,
            "cpuUserMs, cpuSystemMs from cgroup v2 cpu.stat; memoryPeakBytes from cgroup v2 "
            "memory.peak; pidsPeak from cgroup v2 pids.peak; null: ioReadBytes, ioWriteBytes (io "
            "needs the v2 io controller: v1 blkio does not charge buffered writeback to the "
            "writer)");

  // This host's kind: a v2 mount without controllers, v1 memory and pids.
  isolate::CgroupLayout hybrid;
  hybrid.v2 = isolate::CgroupHierarchy{
      "/sys/fs/cgroup/unified", "/", "/sys/fs/cgroup/unified", {}, {}, true, {"rw"}};
  hybrid.memory_v1 = isolate::CgroupHierarchy{
      "/sys/fs/cgroup/memory", "/", "/sys/fs/cgroup/memory", {"memory"}, {}, false, {"rw"}};
  hybrid.pids_v1 = isolate::CgroupHierarchy{
      "/sys/fs/cgroup/pids", "/", "/sys/fs/cgroup/pids", {"pids"}, {}, false, {"rw"}};
  in.layout = hybrid;
  layers = runtime::DoctorLayers(in);
  usage = Find(layers, "exec_usage");
  EXPECT_EQ(usage->status, "ok");
  EXPECT_NE(usage->detail.find("memoryPeakBytes from cgroup v1 memory.max_usage_in_bytes"),
            std::string::npos)
      << usage->detail;
  EXPECT_NE(usage->detail.find("pidsPeak from cgroup v1 pids.peak"), std::string::npos);

  // No v1 pids and no v2: degraded, with the figures that are null named.
  hybrid.v2.reset();
  hybrid.pids_v1.reset();
  in.layout = hybrid;
  layers = runtime::DoctorLayers(in);
  usage = Find(layers, "exec_usage");
  EXPECT_EQ(usage->status, "degraded");
  EXPECT_NE(usage->detail.find("null: cpuUserMs, cpuSystemMs, pidsPeak"), std::string::npos)
      << usage->detail;
  EXPECT_FALSE(usage->fix.empty());
}

TEST(Doctor, SaysWhetherAMoveIntoV1WaitsForAGracePeriod) {
  runtime::DoctorInput in = AllPresent();
  isolate::CgroupLayout hybrid;
  hybrid.v2 = isolate::CgroupHierarchy{
      "/sys/fs/cgroup/unified", "/", "/sys/fs/cgroup/unified", {}, {}, true, {"rw"}};
  hybrid.memory_v1 = isolate::CgroupHierarchy{
      "/sys/fs/cgroup/memory", "/", "/sys/fs/cgroup/memory", {"memory"}, {}, false, {"rw"}};
  in.layout = hybrid;
  auto layers = runtime::DoctorLayers(in);
  const auto* moves = Find(layers, "cgroup_moves");
  ASSERT_NE(moves, nullptr);
  EXPECT_EQ(moves->status, "degraded");
  EXPECT_FALSE(moves->required);
  EXPECT_NE(moves->detail.find("RCU grace period"), std::string::npos) << moves->detail;
  EXPECT_NE(moves->fix.find("--leave-cgroup-mount"), std::string::npos) << moves->fix;

  hybrid.v2->super_options = {"rw", "favordynmods"};
  in.layout = hybrid;
  layers = runtime::DoctorLayers(in);
  moves = Find(layers, "cgroup_moves");
  EXPECT_EQ(moves->status, "ok");
  EXPECT_NE(moves->detail.find("favordynmods"), std::string::npos) << moves->detail;

  // No v1 hierarchy: every process is born in its cgroup, nothing to wait for.
  hybrid.memory_v1.reset();
  hybrid.v2->super_options = {"rw"};
  in.layout = hybrid;
  layers = runtime::DoctorLayers(in);
  moves = Find(layers, "cgroup_moves");
  EXPECT_EQ(moves->status, "ok");
  EXPECT_NE(moves->detail.find("none"), std::string::npos) << moves->detail;
}

TEST(Doctor, SaysWhereTheSandboxesCgroupsGoAndTheFixWhenNowhere) {
  runtime::DoctorInput in = AllPresent();
  isolate::PlacementPlan scope;
  scope.kind = isolate::PlacementKind::kSystemdScope;
  scope.controllers = {"cpu", "io", "memory", "pids"};
  scope.why = "the unit session-3.scope is not delegated to nsbox";
  in.placement = scope;
  auto layers = runtime::DoctorLayers(in);
  const auto* placement = Find(layers, "cgroup_placement");
  ASSERT_NE(placement, nullptr);
  EXPECT_EQ(placement->status, "ok");
  EXPECT_NE(placement->detail.find("systemd scope"), std::string::npos) << placement->detail;
  EXPECT_NE(placement->detail.find("session-3.scope"), std::string::npos) << placement->detail;
  EXPECT_NE(placement->detail.find("cpu io memory pids"), std::string::npos) << placement->detail;

  in.placement = Error::Msg(
      "cgroup v2: /sys/fs/cgroup/job is not delegated to nsbox. Fix: start "
      "nsbox in a cgroup of its own");
  layers = runtime::DoctorLayers(in);
  placement = Find(layers, "cgroup_placement");
  EXPECT_EQ(placement->status, "missing");
  EXPECT_EQ(placement->detail, "cgroup v2: /sys/fs/cgroup/job is not delegated to nsbox");
  EXPECT_EQ(placement->fix, "start nsbox in a cgroup of its own");
}

TEST(Doctor, MissingOpcodesDegradeIoUring) {
  runtime::DoctorInput in = AllPresent();
  in.features.io_uring_missing_ops = {"WAITID"};
  auto layers = runtime::DoctorLayers(in);
  EXPECT_EQ(Find(layers, "io_uring")->status, "degraded");
  EXPECT_EQ(Find(layers, "event_loop")->detail, "io_uring");  // WAITID is not essential
  in.features.io_uring_missing_ops = {"LINK_TIMEOUT", "WAITID"};
  layers = runtime::DoctorLayers(in);
  EXPECT_EQ(Find(layers, "event_loop")->detail,
            "epoll (io_uring unavailable: missing LINK_TIMEOUT)");
  EXPECT_TRUE(runtime::DoctorOk(layers));  // optional layers do not fail the check
}

TEST(Doctor, JsonStringEscapes) {
  EXPECT_EQ(runtime::JsonString("plain"), "\"plain\"");
  EXPECT_EQ(runtime::JsonString("a\"b\\c\nd\te\x01"), "\"a\\\"b\\\\c\\nd\\te\\u0001\"");
}

TEST(Doctor, JsonHasEveryLayer) {
  runtime::DoctorInput in = AllPresent();
  in.features.io_uring_missing_ops = {"WAITID"};
  auto layers = runtime::DoctorLayers(in);
  std::string json = runtime::DoctorJson(in, layers);
  EXPECT_EQ(json.rfind("{\n  \"ok\": true,", 0), 0u) << json;
  EXPECT_EQ(json.substr(json.size() - 2), "}\n");
  for (const auto& l : layers) {
    EXPECT_NE(json.find("\"" + l.key + "\": {"), std::string::npos) << l.key;
  }
  EXPECT_NE(json.find("\"missing_ops\": [\"WAITID\"]"), std::string::npos) << json;
  EXPECT_EQ(std::count(json.begin(), json.end(), '{'), std::count(json.begin(), json.end(), '}'));
}

TEST(Doctor, RunsOnThisHost) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  int code = runtime::RunDoctor(/*json=*/false, out);
  std::rewind(out);
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, out)) > 0) text.append(buf, n);
  std::fclose(out);
  std::printf("%s(exit %d)\n", text.c_str(), code);
  EXPECT_TRUE(code == 0 || code == 1);
  EXPECT_NE(text.find("event loop"), std::string::npos);
}

}  // namespace
}  // namespace nsbox

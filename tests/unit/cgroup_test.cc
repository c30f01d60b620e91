#include "isolate/cgroup.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "base/files.h"

namespace nsbox::isolate {
namespace {

using Write = CgroupWrite;

// This very host: hybrid, v1 controllers each on its own mount, a near-empty cgroup2 at
// /sys/fs/cgroup/unified, and our memory cgroup a subtree of the machinery that started us.
constexpr const char* kHybridCgroup =
    "9:name=systemd:/\n"
    "8:pids:/\n"
    "7:blkio:/\n"
    "6:freezer:/\n"
    "5:devices:/\n"
    "4:memory:/process_api/8dd7c17fa21001d2816bb1f18a851849\n"
    "3:cpuset:/\n"
    "2:cpuacct:/\n"
    "1:cpu:/\n"
    "0::/\n";
constexpr const char* kHybridMountinfo =
    "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
    "23 27 0:22 / /sys rw,relatime - sysfs sysfs rw\n"
    "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n"
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n"
    "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
    "38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

// A pure v2 systemd host (Debian 11+, Fedora 31+), a login session.
constexpr const char* kPureV2Cgroup = "0::/user.slice/user-1000.slice/session-2.scope\n";
constexpr const char* kPureV2Mountinfo =
    "24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "30 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro\n"
    "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";

// The classic systemd hybrid (Ubuntu 20.04): cpu and cpuacct co-mounted, v2 at unified.
constexpr const char* kSystemdHybridCgroup =
    "12:pids:/user.slice/user-1000.slice/session-2.scope\n"
    "5:cpu,cpuacct:/user.slice\n"
    "4:memory:/user.slice/user-1000.slice/session-2.scope\n"
    "1:name=systemd:/user.slice/user-1000.slice/session-2.scope\n"
    "0::/user.slice/user-1000.slice/session-2.scope\n";
constexpr const char* kSystemdHybridMountinfo =
    "25 24 0:24 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
    "26 25 0:25 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 "
    "cgroup2 rw,nsdelegate\n"
    "27 25 0:26 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup "
    "cgroup rw,xattr,name=systemd\n"
    "31 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup "
    "cgroup rw,cpu,cpuacct\n"
    "32 25 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:16 - cgroup "
    "cgroup rw,memory\n"
    "33 25 0:32 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:17 - cgroup "
    "cgroup rw,pids\n";

CgroupLayout Parse(std::string_view cgroup, std::string_view mountinfo) {
  auto layout = ParseCgroupLayout(cgroup, mountinfo);
  EXPECT_TRUE(layout.ok()) << layout.error().message();
  return layout.ok() ? *layout : CgroupLayout{};
}

// The layout of this host as LoadCgroupV2State would complete it: v2 has only hugetlb.
CgroupLayout HybridHost() {
  CgroupLayout layout = Parse(kHybridCgroup, kHybridMountinfo);
  layout.v2->controllers = {"hugetlb"};
  layout.v2->is_root = true;
  return layout;
}

CgroupLayout PureV2(bool is_root, std::vector<std::string> subtree_control) {
  CgroupLayout layout = Parse(kPureV2Cgroup, kPureV2Mountinfo);
  layout.v2->controllers = {"cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc"};
  layout.v2->subtree_control = std::move(subtree_control);
  layout.v2->is_root = is_root;
  return layout;
}

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(ParseCgroupLayout, ThisHybridHost) {
  CgroupLayout layout = Parse(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(layout.v2.has_value());
  EXPECT_EQ(layout.v2->mount_point, "/sys/fs/cgroup/unified");
  EXPECT_EQ(layout.v2->cgroup_path, "/");
  EXPECT_EQ(layout.v2->dir, "/sys/fs/cgroup/unified");
  ASSERT_TRUE(layout.memory_v1.has_value());
  EXPECT_EQ(layout.memory_v1->mount_point, "/sys/fs/cgroup/memory");
  EXPECT_EQ(layout.memory_v1->cgroup_path, "/process_api/8dd7c17fa21001d2816bb1f18a851849");
  EXPECT_EQ(layout.memory_v1->dir,
            "/sys/fs/cgroup/memory/process_api/8dd7c17fa21001d2816bb1f18a851849");
  EXPECT_EQ(layout.memory_v1->controllers, std::vector<std::string>{"memory"});
  ASSERT_TRUE(layout.pids_v1.has_value());
  EXPECT_EQ(layout.pids_v1->dir, "/sys/fs/cgroup/pids");
  ASSERT_TRUE(layout.cpu_v1.has_value());
  EXPECT_EQ(layout.cpu_v1->dir, "/sys/fs/cgroup/cpu");
  EXPECT_EQ(layout.cpu_v1->controllers, std::vector<std::string>{"cpu"});
}

TEST(ParseCgroupLayout, PureV2SystemdSession) {
  CgroupLayout layout = Parse(kPureV2Cgroup, kPureV2Mountinfo);
  ASSERT_TRUE(layout.v2.has_value());
  EXPECT_EQ(layout.v2->mount_point, "/sys/fs/cgroup");
  EXPECT_EQ(layout.v2->dir, "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope");
  EXPECT_FALSE(layout.memory_v1.has_value());
  EXPECT_FALSE(layout.pids_v1.has_value());
  EXPECT_FALSE(layout.cpu_v1.has_value());
}

TEST(ParseCgroupLayout, SystemdHybridWithCoMountedCpu) {
  CgroupLayout layout = Parse(kSystemdHybridCgroup, kSystemdHybridMountinfo);
  ASSERT_TRUE(layout.v2.has_value());
  EXPECT_EQ(layout.v2->dir, "/sys/fs/cgroup/unified/user.slice/user-1000.slice/session-2.scope");
  ASSERT_TRUE(layout.cpu_v1.has_value());
  EXPECT_EQ(layout.cpu_v1->mount_point, "/sys/fs/cgroup/cpu,cpuacct");
  EXPECT_EQ(layout.cpu_v1->dir, "/sys/fs/cgroup/cpu,cpuacct/user.slice");
  EXPECT_EQ(layout.cpu_v1->controllers, (std::vector<std::string>{"cpu", "cpuacct"}));
  ASSERT_TRUE(layout.memory_v1.has_value());
  EXPECT_EQ(layout.memory_v1->dir,
            "/sys/fs/cgroup/memory/user.slice/user-1000.slice/session-2.scope");
}

// In a container with a private cgroup namespace, paths are relative to the namespace root.
TEST(ParseCgroupLayout, CgroupNamespaceRoot) {
  CgroupLayout layout =
      Parse("0::/\n", "100 90 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup rw\n");
  ASSERT_TRUE(layout.v2.has_value());
  EXPECT_EQ(layout.v2->dir, "/sys/fs/cgroup");
}

// Docker with the host's cgroup namespace: the mount's root is the container's cgroup, and
// /proc/self/cgroup names it, or a cgroup below it, from the real root.
TEST(ParseCgroupLayout, MountRootIsNotSlash) {
  constexpr const char* kMountinfo =
      "500 499 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"
      "501 499 0:38 /docker/abc /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
  CgroupLayout at_root = Parse("4:memory:/docker/abc\n0::/docker/abc\n", kMountinfo);
  EXPECT_EQ(at_root.memory_v1->dir, "/sys/fs/cgroup/memory");
  EXPECT_EQ(at_root.v2->dir, "/sys/fs/cgroup");
  CgroupLayout below = Parse("4:memory:/docker/abc/sub\n0::/docker/abc/sub/x\n", kMountinfo);
  EXPECT_EQ(below.memory_v1->dir, "/sys/fs/cgroup/memory/sub");
  EXPECT_EQ(below.v2->dir, "/sys/fs/cgroup/sub/x");
}

TEST(ParseCgroupLayout, OurCgroupNotUnderTheMountIsAnError) {
  constexpr const char* kMountinfo =
      "501 499 0:38 /docker/abc /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
  auto sibling = ParseCgroupLayout("0::/docker/abcd\n", kMountinfo);
  ASSERT_FALSE(sibling.ok());
  EXPECT_NE(sibling.error().message().find("/docker/abcd is not under any of its mounts"),
            std::string::npos)
      << sibling.error().message();
  auto outside = ParseCgroupLayout("0::/../..\n", kMountinfo);
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.error().message().find("outside our cgroup namespace"), std::string::npos);
}

TEST(ParseCgroupLayout, OctalEscapesInMountinfo) {
  CgroupLayout layout = Parse(
      "0::/my group\n", "41 31 0:38 / /mnt/cgroup\\040v2\\011x rw,relatime - cgroup2 cgroup2 rw\n");
  ASSERT_TRUE(layout.v2.has_value());
  EXPECT_EQ(layout.v2->mount_point, "/mnt/cgroup v2\tx");
  EXPECT_EQ(layout.v2->dir, "/mnt/cgroup v2\tx/my group");
  CgroupLayout escaped_root =
      Parse("0::/a b/c\n", "41 31 0:38 /a\\040b /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  EXPECT_EQ(escaped_root.v2->dir, "/sys/fs/cgroup/c");
}

TEST(ParseCgroupLayout, ColonsInPathsAndOptionalFields) {
  CgroupLayout layout =
      Parse("0::/system.slice/a:b.service\n",
            "35 24 0:30 / /sys/fs/cgroup rw shared:9 master:3 - cgroup2 cgroup2 rw,nsdelegate\n");
  EXPECT_EQ(layout.v2->dir, "/sys/fs/cgroup/system.slice/a:b.service");
}

TEST(ParseCgroupLayout, V2LineWithoutAVisibleMount) {
  // The "0::" line shows whenever cgroup2 is mounted somewhere, even outside our mount ns.
  CgroupLayout layout = Parse("4:memory:/\n0::/\n",
                              "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
  EXPECT_FALSE(layout.v2.has_value());
  EXPECT_TRUE(layout.memory_v1.has_value());
}

TEST(ParseCgroupLayout, MalformedInputIsAnError) {
  EXPECT_FALSE(ParseCgroupLayout("garbage\n", kHybridMountinfo).ok());
  EXPECT_FALSE(ParseCgroupLayout("0::relative\n", kHybridMountinfo).ok());
  EXPECT_FALSE(ParseCgroupLayout(kHybridCgroup, "1 2 3 / /x rw no-dash-here\n").ok());
}

TEST(ParseCgroupLayout, KeepsEachMountsSuperOptions) {
  CgroupLayout hybrid = Parse(kSystemdHybridCgroup, kSystemdHybridMountinfo);
  EXPECT_EQ(hybrid.v2->super_options, (std::vector<std::string>{"rw", "nsdelegate"}));
  EXPECT_EQ(hybrid.memory_v1->super_options, (std::vector<std::string>{"rw", "memory"}));
  EXPECT_TRUE(MovesIntoV1(hybrid));
  CgroupLayout v2 = Parse(kPureV2Cgroup, kPureV2Mountinfo);
  EXPECT_EQ(v2.v2->super_options,
            (std::vector<std::string>{"rw", "nsdelegate", "memory_recursiveprot"}));
  EXPECT_FALSE(MovesIntoV1(v2));
}

TEST(FavorDynmodsFlags, KeepsEveryCgroup2FlagAndAddsFavordynmodsOnce) {
  auto flags = FavorDynmodsFlags({"rw", "nsdelegate", "memory_recursiveprot"});
  ASSERT_TRUE(flags.ok()) << flags.error().message();
  EXPECT_EQ(*flags,
            (std::vector<std::string>{"nsdelegate", "memory_recursiveprot", "favordynmods"}));
  // This host's: nothing but rw.
  flags = FavorDynmodsFlags({"rw"});
  ASSERT_TRUE(flags.ok());
  EXPECT_EQ(*flags, std::vector<std::string>{"favordynmods"});
  // SELinux's seclabel is shown beside the options, not one of them; favordynmods not twice.
  flags = FavorDynmodsFlags({"rw", "seclabel", "favordynmods", "memory_localevents",
                             "memory_hugetlb_accounting", "pids_localevents"});
  ASSERT_TRUE(flags.ok());
  EXPECT_EQ(*flags, (std::vector<std::string>{"favordynmods", "memory_localevents",
                                              "memory_hugetlb_accounting", "pids_localevents"}));
}

TEST(FavorDynmodsFlags, AnOptionItDoesNotKnowIsNeverDropped) {
  auto flags = FavorDynmodsFlags({"rw", "nsdelegate", "memory_newthing"});
  ASSERT_FALSE(flags.ok());
  EXPECT_EQ(flags.error().code(), EINVAL);
  EXPECT_NE(flags.error().message().find("\"memory_newthing\""), std::string::npos)
      << flags.error().message();
}

TEST(PlanCgroups, ThisHybridHostUsesV1ForLimitsAndV2ForTheKillScope) {
  auto plan = PlanCgroups(HybridHost(), {.memory_bytes = 512 * kMiB, .pids = 16, .cpus = 1.5},
                          "nsbox-run-42");
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  ASSERT_EQ(plan->dirs.size(), 4u);

  const CgroupDirPlan& v2 = plan->dirs[0];
  EXPECT_EQ(v2.version, CgroupVersion::kV2);
  EXPECT_EQ(v2.parent, "/sys/fs/cgroup/unified");
  EXPECT_EQ(v2.name, "nsbox-run-42");
  EXPECT_EQ(v2.path(), "/sys/fs/cgroup/unified/nsbox-run-42");
  EXPECT_TRUE(v2.controllers.empty());
  EXPECT_TRUE(v2.parent_writes.empty());
  EXPECT_TRUE(v2.writes.empty());

  const CgroupDirPlan& memory = plan->dirs[1];
  EXPECT_EQ(memory.version, CgroupVersion::kV1);
  EXPECT_EQ(memory.path(),
            "/sys/fs/cgroup/memory/process_api/8dd7c17fa21001d2816bb1f18a851849/nsbox-run-42");
  EXPECT_EQ(memory.controllers, std::vector<std::string>{"memory"});
  EXPECT_EQ(memory.writes,
            (std::vector<Write>{{"memory.limit_in_bytes", "536870912", false},
                                {"memory.memsw.limit_in_bytes", "536870912", true}}));

  const CgroupDirPlan& pids = plan->dirs[2];
  EXPECT_EQ(pids.path(), "/sys/fs/cgroup/pids/nsbox-run-42");
  EXPECT_EQ(pids.writes, (std::vector<Write>{{"pids.max", "16", false}}));

  const CgroupDirPlan& cpu = plan->dirs[3];
  EXPECT_EQ(cpu.path(), "/sys/fs/cgroup/cpu/nsbox-run-42");
  EXPECT_EQ(cpu.writes, (std::vector<Write>{{"cpu.cfs_period_us", "100000", false},
                                            {"cpu.cfs_quota_us", "150000", false}}));
}

TEST(PlanCgroups, NoLimitsStillMakesTheV2KillScopeAndV1AccountingDirectories) {
  auto plan = PlanCgroups(HybridHost(), {}, "nsbox-run-1");
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  ASSERT_EQ(plan->dirs.size(), 3u);
  EXPECT_EQ(plan->dirs[0].version, CgroupVersion::kV2);
  // Memory and pids get a v1 directory for the per-exec usage figures, with no limit write and
  // no enforced controller (so OomKilled and the doctor's limit check do not count them); cpu
  // does not (its figures come from v2 cpu.stat).
  const CgroupDirPlan& memory = plan->dirs[1];
  EXPECT_EQ(memory.version, CgroupVersion::kV1);
  EXPECT_EQ(memory.path(),
            "/sys/fs/cgroup/memory/process_api/8dd7c17fa21001d2816bb1f18a851849/nsbox-run-1");
  EXPECT_TRUE(memory.controllers.empty());
  EXPECT_EQ(memory.accounting, std::vector<std::string>{"memory"});
  EXPECT_TRUE(memory.writes.empty());
  EXPECT_TRUE(memory.parent_writes.empty());
  const CgroupDirPlan& pids = plan->dirs[2];
  EXPECT_EQ(pids.path(), "/sys/fs/cgroup/pids/nsbox-run-1");
  EXPECT_EQ(pids.accounting, std::vector<std::string>{"pids"});
  EXPECT_TRUE(pids.writes.empty());

  CgroupLayout v1_only = HybridHost();
  v1_only.v2.reset();
  auto no_v2 = PlanCgroups(v1_only, {}, "nsbox-run-1");
  ASSERT_TRUE(no_v2.ok());
  ASSERT_EQ(no_v2->dirs.size(), 2u);
  EXPECT_EQ(no_v2->dirs[0].accounting, std::vector<std::string>{"memory"});

  CgroupLayout nothing = HybridHost();
  nothing.v2.reset();
  nothing.memory_v1.reset();
  nothing.pids_v1.reset();
  auto empty = PlanCgroups(nothing, {}, "nsbox-run-1");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->dirs.empty());
}

TEST(PlanCgroups, ALimitOnOneV1ControllerStillAccountsTheOther) {
  auto plan = PlanCgroups(HybridHost(), {.pids = 16}, "sb");
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  ASSERT_EQ(plan->dirs.size(), 3u);
  EXPECT_TRUE(plan->dirs[1].controllers.empty());
  EXPECT_EQ(plan->dirs[1].accounting, std::vector<std::string>{"memory"});
  EXPECT_EQ(plan->dirs[2].controllers, std::vector<std::string>{"pids"});
  EXPECT_TRUE(plan->dirs[2].accounting.empty());
  EXPECT_EQ(plan->dirs[2].writes, (std::vector<Write>{{"pids.max", "16", false}}));
}

TEST(PlanCgroups, PureV2AtTheRootEnablesControllers) {
  auto plan = PlanCgroups(PureV2(/*is_root=*/true, {}),
                          {.memory_bytes = 512 * kMiB, .pids = 16, .cpus = 1.5}, "sb");
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  ASSERT_EQ(plan->dirs.size(), 1u);
  const CgroupDirPlan& d = plan->dirs[0];
  EXPECT_EQ(d.controllers, (std::vector<std::string>{"memory", "pids", "cpu"}));
  EXPECT_EQ(d.parent_writes,
            (std::vector<Write>{{"cgroup.subtree_control", "+memory +pids +cpu", false}}));
  EXPECT_EQ(d.writes, (std::vector<Write>{{"memory.max", "536870912", false},
                                          {"memory.swap.max", "0", true},
                                          {"pids.max", "16", false},
                                          {"cpu.max", "150000 100000", false}}));
}

TEST(PlanCgroups, PureV2OnlyEnablesWhatIsNotEnabledYet) {
  auto plan = PlanCgroups(PureV2(/*is_root=*/false, {"memory", "pids"}), {.pids = 100}, "sb");
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_TRUE(plan->dirs[0].parent_writes.empty());
  EXPECT_EQ(plan->dirs[0].writes, (std::vector<Write>{{"pids.max", "100", false}}));

  auto root =
      PlanCgroups(PureV2(/*is_root=*/true, {"memory"}), {.memory_bytes = kMiB, .pids = 1}, "sb");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->dirs[0].parent_writes,
            (std::vector<Write>{{"cgroup.subtree_control", "+pids", false}}));
}

TEST(PlanCgroups, PureV2NonRootWithProcessesIsAClearError) {
  auto plan = PlanCgroups(PureV2(/*is_root=*/false, {}), {.memory_bytes = 64 * kMiB}, "sb");
  ASSERT_FALSE(plan.ok());
  const std::string& msg = plan.error().message();
  EXPECT_NE(msg.find("cannot enable +memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("no-internal-processes"), std::string::npos) << msg;
}

TEST(PlanCgroups, MixedV2AndV1) {
  CgroupLayout layout = HybridHost();
  layout.v2->controllers = {"memory"};
  auto plan = PlanCgroups(layout, {.memory_bytes = 2 * kMiB, .pids = 8}, "sb");
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  ASSERT_EQ(plan->dirs.size(), 2u);
  EXPECT_EQ(plan->dirs[0].controllers, std::vector<std::string>{"memory"});
  EXPECT_EQ(plan->dirs[0].parent_writes,
            (std::vector<Write>{{"cgroup.subtree_control", "+memory", false}}));
  EXPECT_EQ(plan->dirs[0].writes[0], (Write{"memory.max", "2097152", false}));
  EXPECT_EQ(plan->dirs[1].version, CgroupVersion::kV1);
  EXPECT_EQ(plan->dirs[1].controllers, std::vector<std::string>{"pids"});
}

TEST(PlanCgroups, CoMountedV1ControllersShareOneDirectory) {
  CgroupLayout layout;
  CgroupHierarchy h;
  h.mount_point = "/sys/fs/cgroup/memory,cpu";
  h.cgroup_path = "/";
  h.dir = "/sys/fs/cgroup/memory,cpu";
  h.controllers = {"memory", "cpu"};
  layout.memory_v1 = h;
  layout.cpu_v1 = h;
  auto plan = PlanCgroups(layout, {.memory_bytes = kMiB, .cpus = 0.01}, "sb");
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  ASSERT_EQ(plan->dirs.size(), 1u);
  EXPECT_EQ(plan->dirs[0].controllers, (std::vector<std::string>{"memory", "cpu"}));
  EXPECT_EQ(plan->dirs[0].writes,
            (std::vector<Write>{{"memory.limit_in_bytes", "1048576", false},
                                {"memory.memsw.limit_in_bytes", "1048576", true},
                                {"cpu.cfs_period_us", "100000", false},
                                {"cpu.cfs_quota_us", "1000", false}}));
}

TEST(PlanCgroups, CoMountedMemoryAndPidsAccountInOneDirectory) {
  CgroupLayout layout;
  CgroupHierarchy h;
  h.mount_point = "/sys/fs/cgroup/memory,pids";
  h.cgroup_path = "/";
  h.dir = "/sys/fs/cgroup/memory,pids";
  h.controllers = {"memory", "pids"};
  layout.memory_v1 = h;
  layout.pids_v1 = h;
  auto plan = PlanCgroups(layout, {}, "sb");
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  ASSERT_EQ(plan->dirs.size(), 1u);
  EXPECT_EQ(plan->dirs[0].accounting, (std::vector<std::string>{"memory", "pids"}));
  EXPECT_TRUE(plan->dirs[0].writes.empty());
}

TEST(PlanCgroups, ALimitNoHierarchyCanEnforceIsAnError) {
  CgroupLayout layout = HybridHost();
  layout.pids_v1.reset();
  auto plan = PlanCgroups(layout, {.pids = 16}, "sb");
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message().find("pids limit (16) cannot be enforced"), std::string::npos)
      << plan.error().message();
  EXPECT_NE(plan.error().message().find("/sys/fs/cgroup/unified/cgroup.controllers: \"hugetlb\""),
            std::string::npos)
      << plan.error().message();

  auto nothing = PlanCgroups(CgroupLayout{}, {.memory_bytes = kMiB}, "sb");
  ASSERT_FALSE(nothing.ok());
  EXPECT_NE(nothing.error().message().find("memory limit (1048576 bytes)"), std::string::npos);
  EXPECT_NE(nothing.error().message().find("there is no cgroup2 mount"), std::string::npos);
}

TEST(PlanCgroups, InvalidNames) {
  for (const char* name : {"", ".", "..", "a/b", "../x", "a b", "a\nb"}) {
    EXPECT_FALSE(PlanCgroups(HybridHost(), {}, name).ok()) << name;
  }
  EXPECT_TRUE(PlanCgroups(HybridHost(), {}, "nsbox-run-123_a.b").ok());
}

TEST(PlanCgroups, InvalidLimits) {
  const CgroupLayout layout = HybridHost();
  EXPECT_FALSE(PlanCgroups(layout, {.memory_bytes = 0}, "sb").ok());
  EXPECT_FALSE(PlanCgroups(layout, {.memory_bytes = ~uint64_t{0}}, "sb").ok());
  EXPECT_FALSE(PlanCgroups(layout, {.pids = 0}, "sb").ok());
  EXPECT_FALSE(PlanCgroups(layout, {.pids = 5000000}, "sb").ok());
  for (double cpus :
       {0.0, -1.0, 0.004, std::nan(""), std::numeric_limits<double>::infinity(), 100000.0}) {
    EXPECT_FALSE(PlanCgroups(layout, {.cpus = cpus}, "sb").ok()) << cpus;
  }
  auto smallest = PlanCgroups(layout, {.cpus = 0.01}, "sb");
  ASSERT_TRUE(smallest.ok());
  EXPECT_EQ(smallest->dirs.back().writes.back(), (Write{"cpu.cfs_quota_us", "1000", false}));
}

// A temp directory standing in for cgroupfs.
class FakeCgroupfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nsbox-cgroup-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    std::filesystem::create_directories(root_ + "/unified");
    std::filesystem::create_directories(root_ + "/memory/parent");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  static void Put(const std::string& path, const std::string& content) {
    std::ofstream(path) << content;
  }
  static std::string Get(const std::string& path) {
    auto content = ReadFile(path);
    return content.ok() ? *content : "<" + content.error().message() + ">";
  }
  static bool Exists(const std::string& path) { return std::filesystem::exists(path); }

  CgroupPlan Plan(std::vector<Write> v1_writes = {}) const {
    CgroupPlan plan;
    plan.dirs.push_back({CgroupVersion::kV2, root_ + "/unified", "sb", {}, {}, {}, {}});
    plan.dirs.push_back({CgroupVersion::kV1,
                         root_ + "/memory/parent",
                         "sb",
                         {"memory"},
                         {},
                         std::move(v1_writes),
                         {}});
    return plan;
  }

  std::string root_;
};

TEST_F(FakeCgroupfs, WriteCgroupFilesWritesExactBytesInOrder) {
  Put(root_ + "/unified/memory.max", "");
  Put(root_ + "/unified/cpu.max", "");
  auto unified = OpenAt(AT_FDCWD, root_ + "/unified", O_RDONLY | O_DIRECTORY);
  ASSERT_TRUE(unified.ok());
  Status st = WriteCgroupFiles(unified->get(), {{"memory.max", "536870912", false},
                                                {"memory.swap.max", "0", true},
                                                {"cpu.max", "150000 100000", false}});
  ASSERT_TRUE(st.ok()) << st.error().message();
  EXPECT_EQ(Get(root_ + "/unified/memory.max"), "536870912");
  EXPECT_EQ(Get(root_ + "/unified/cpu.max"), "150000 100000");
  EXPECT_FALSE(Exists(root_ + "/unified/memory.swap.max"));  // optional: skipped, not created

  Status missing = WriteCgroupFiles(unified->get(), {{"pids.max", "16", false}});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ENOENT);
  EXPECT_NE(missing.error().message().find("set pids.max to \"16\""), std::string::npos)
      << missing.error().message();
}

TEST_F(FakeCgroupfs, CreateAndDestroy) {
  auto cgroups = Cgroups::Create(Plan({{"memory.memsw.limit_in_bytes", "1", true}}));
  ASSERT_TRUE(cgroups.ok()) << cgroups.error().message();
  EXPECT_TRUE(std::filesystem::is_directory(root_ + "/unified/sb"));
  EXPECT_TRUE(std::filesystem::is_directory(root_ + "/memory/parent/sb"));
  EXPECT_EQ(cgroups->paths(),
            (std::vector<std::string>{root_ + "/unified/sb", root_ + "/memory/parent/sb"}));

  // v2_dir_fd is the v2 child itself.
  ASSERT_GE(cgroups->v2_dir_fd(), 0);
  struct stat by_fd {
  }, by_path{};
  ASSERT_EQ(::fstat(cgroups->v2_dir_fd(), &by_fd), 0);
  ASSERT_EQ(::stat((root_ + "/unified/sb").c_str(), &by_path), 0);
  EXPECT_EQ(by_fd.st_ino, by_path.st_ino);

  auto oom = cgroups->OomKilled();
  EXPECT_FALSE(oom.ok());  // the fake memory dir has no memory.oom_control

  // A jail's init may have made cgroups of its own below ours: they go first.
  std::filesystem::create_directories(root_ + "/unified/sb/cmd-1/nested");
  Status st = cgroups->Destroy();
  ASSERT_TRUE(st.ok()) << st.error().message();
  EXPECT_FALSE(Exists(root_ + "/unified/sb"));
  EXPECT_FALSE(Exists(root_ + "/memory/parent/sb"));
  EXPECT_EQ(cgroups->v2_dir_fd(), -1);
  EXPECT_TRUE(cgroups->Destroy().ok());  // once
}

TEST_F(FakeCgroupfs, OomKilledReadsTheCounters) {
  auto cgroups = Cgroups::Create(Plan());
  ASSERT_TRUE(cgroups.ok()) << cgroups.error().message();
  Put(root_ + "/memory/parent/sb/memory.oom_control",
      "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
  EXPECT_FALSE(cgroups->OomKilled().value());
  Put(root_ + "/memory/parent/sb/memory.oom_control",
      "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
  EXPECT_TRUE(cgroups->OomKilled().value());
  // A kernel before 4.13: no oom_kill line, failcnt is the hint.
  Put(root_ + "/memory/parent/sb/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n");
  Put(root_ + "/memory/parent/sb/memory.failcnt", "0\n");
  EXPECT_FALSE(cgroups->OomKilled().value());
  Put(root_ + "/memory/parent/sb/memory.failcnt", "12\n");
  EXPECT_TRUE(cgroups->OomKilled().value());
  std::filesystem::remove(root_ + "/memory/parent/sb/memory.oom_control");
  std::filesystem::remove(root_ + "/memory/parent/sb/memory.failcnt");
  EXPECT_TRUE(cgroups->Destroy().ok());
}

TEST_F(FakeCgroupfs, StaleDirectoryIsReportedAndNothingStays) {
  std::filesystem::create_directories(root_ + "/memory/parent/sb");  // left by a dead run
  auto cgroups = Cgroups::Create(Plan());
  ASSERT_FALSE(cgroups.ok());
  EXPECT_EQ(cgroups.error().code(), EEXIST);
  EXPECT_NE(cgroups.error().message().find(root_ + "/memory/parent/sb"), std::string::npos)
      << cgroups.error().message();
  EXPECT_NE(cgroups.error().message().find("already exists"), std::string::npos);
  EXPECT_FALSE(Exists(root_ + "/unified/sb"));       // the v2 one, made first, was undone
  EXPECT_TRUE(Exists(root_ + "/memory/parent/sb"));  // not ours: left alone
}

TEST_F(FakeCgroupfs, FailedWriteUndoesEverything) {
  auto cgroups = Cgroups::Create(Plan({{"memory.limit_in_bytes", "1048576", false}}));
  ASSERT_FALSE(cgroups.ok());
  EXPECT_NE(cgroups.error().message().find("create cgroup " + root_ + "/memory/parent/sb"),
            std::string::npos)
      << cgroups.error().message();
  EXPECT_NE(cgroups.error().message().find("memory.limit_in_bytes"), std::string::npos);
  EXPECT_FALSE(Exists(root_ + "/unified/sb"));
  EXPECT_FALSE(Exists(root_ + "/memory/parent/sb"));
}

TEST_F(FakeCgroupfs, MissingParentIsAnError) {
  CgroupPlan plan = Plan();
  plan.dirs[1].parent = root_ + "/nonexistent";
  auto cgroups = Cgroups::Create(plan);
  ASSERT_FALSE(cgroups.ok());
  EXPECT_EQ(cgroups.error().code(), ENOENT);
  EXPECT_FALSE(Exists(root_ + "/unified/sb"));
}

TEST_F(FakeCgroupfs, ParentWritesGoToTheParent) {
  Put(root_ + "/unified/cgroup.subtree_control", "");
  CgroupPlan plan = Plan();
  plan.dirs[0].parent_writes = {{"cgroup.subtree_control", "+memory +pids", false}};
  auto cgroups = Cgroups::Create(plan);
  ASSERT_TRUE(cgroups.ok()) << cgroups.error().message();
  EXPECT_EQ(Get(root_ + "/unified/cgroup.subtree_control"), "+memory +pids");
}

TEST_F(FakeCgroupfs, DestructorAndMoveDestroyOnce) {
  {
    auto cgroups = Cgroups::Create(Plan());
    ASSERT_TRUE(cgroups.ok());
    Cgroups moved = std::move(cgroups).value();
    Cgroups empty;
    EXPECT_EQ(empty.v2_dir_fd(), -1);
    EXPECT_TRUE(empty.Destroy().ok());
    EXPECT_TRUE(Exists(root_ + "/unified/sb"));
  }
  EXPECT_FALSE(Exists(root_ + "/unified/sb"));
  EXPECT_FALSE(Exists(root_ + "/memory/parent/sb"));
}

TEST_F(FakeCgroupfs, AddProcessWritesThePid) {
  auto cgroups = Cgroups::Create(Plan());
  ASSERT_TRUE(cgroups.ok());
  Put(root_ + "/memory/parent/sb/cgroup.procs", "");
  Put(root_ + "/unified/sb/cgroup.procs", "");
  // Above pid_max: should a failed assertion leave the file for Destroy, no process is hit.
  ASSERT_TRUE(cgroups->AddProcess(2147483647, /*include_v2=*/false).ok());
  EXPECT_EQ(Get(root_ + "/memory/parent/sb/cgroup.procs"), "2147483647");
  EXPECT_EQ(Get(root_ + "/unified/sb/cgroup.procs"), "");
  ASSERT_TRUE(cgroups->AddProcess(2147483647, /*include_v2=*/true).ok());
  EXPECT_EQ(Get(root_ + "/unified/sb/cgroup.procs"), "2147483647");
  std::filesystem::remove(root_ + "/memory/parent/sb/cgroup.procs");
  std::filesystem::remove(root_ + "/unified/sb/cgroup.procs");
}

}  // namespace
}  // namespace nsbox::isolate

#include "isolate/cgroup_placement.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace nsbox::isolate {
namespace {

const std::vector<std::string> kAll = {"cpuset", "cpu", "io", "memory", "hugetlb", "pids"};

// A pure v2 host's cgroup at `path` (under /sys/fs/cgroup), with `subtree` passed on.
PlacementFacts At(std::string path, std::vector<std::string> subtree = {}) {
  PlacementFacts f;
  f.v2.mount_point = "/sys/fs/cgroup";
  f.v2.cgroup_path = path;
  f.v2.dir = path == "/" ? "/sys/fs/cgroup" : "/sys/fs/cgroup" + path;
  f.v2.controllers = kAll;
  f.v2.subtree_control = std::move(subtree);
  f.hierarchy_root_is_root = true;
  return f;
}

// The cgroup of the systemd unit at `path` (its last component), systemd running; `delegated`:
// Delegate=yes.
PlacementFacts InUnit(const std::string& path, bool delegated) {
  PlacementFacts f = At(path);
  f.systemd = true;
  f.unit = UnitOfCgroupPath(path);
  f.unit_delegated = delegated;
  f.unit_cgroup = path;
  return f;
}

TEST(PlanPlacement, TheRootCgroupIsUsedAsFound) {
  PlacementFacts f = At("/");
  f.v2.is_root = true;
  f.others = {1, 17};  // the root may hold processes and still pass controllers on
  auto plan = PlanPlacement(f);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->kind, PlacementKind::kAsFound);
  EXPECT_EQ(plan->base, "/sys/fs/cgroup");
  EXPECT_EQ(plan->controllers, (std::vector<std::string>{"cpu", "io", "memory", "pids"}));
}

TEST(PlanPlacement, AHybridHostsV2WithoutControllersIsUsedAsFound) {
  PlacementFacts f = At("/system.slice/nsboxd.service");
  f.v2.controllers = {};
  f.systemd = true;
  auto plan = PlanPlacement(f);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->kind, PlacementKind::kAsFound);
  EXPECT_TRUE(plan->controllers.empty());
}

TEST(PlanPlacement, TheDelegatedServiceMovesIntoALeafOfItsOwnCgroup) {
  PlacementFacts f = InUnit("/system.slice/nsboxd.service", /*delegated=*/true);
  auto plan = PlanPlacement(f);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->kind, PlacementKind::kOwnLeaf);
  EXPECT_EQ(plan->base, "/sys/fs/cgroup/system.slice/nsboxd.service");
  EXPECT_EQ(plan->leaf, "/sys/fs/cgroup/system.slice/nsboxd.service/supervisor");
  EXPECT_NE(plan->why.find("Delegate=yes"), std::string::npos) << plan->why;
}

TEST(PlanPlacement, AServiceThatDoesNotDelegateGetsAScope) {
  PlacementFacts f = InUnit("/system.slice/ci-runner.service", /*delegated=*/false);
  auto plan = PlanPlacement(f);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->kind, PlacementKind::kSystemdScope);
  EXPECT_NE(plan->why.find("not delegated"), std::string::npos) << plan->why;
}

TEST(PlanPlacement, SudoFromALoginSessionGetsAScope) {
  PlacementFacts f = InUnit("/user.slice/user-1000.slice/session-3.scope", /*delegated=*/false);
  f.others = {812, 813};  // the login shell and sudo
  auto plan = PlanPlacement(f);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->kind, PlacementKind::kSystemdScope);
}

TEST(PlanPlacement, ADelegatedUnitThatHoldsOthersGetsAScope) {
  PlacementFacts f = InUnit("/system.slice/runner.service", /*delegated=*/true);
  f.others = {99};
  auto plan = PlanPlacement(f);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->kind, PlacementKind::kSystemdScope);
  EXPECT_NE(plan->why.find("99"), std::string::npos) << plan->why;
}

TEST(PlanPlacement, AContainersOwnCgroupNamespaceIsDelegated) {
  PlacementFacts f = At("/");  // the root of a cgroup namespace: cgroup.type exists there
  f.hierarchy_root_is_root = false;
  auto plan = PlanPlacement(f);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->kind, PlacementKind::kOwnLeaf);
  EXPECT_EQ(plan->leaf, "/sys/fs/cgroup/supervisor");
}

TEST(PlanPlacement, AContainerCgroupWithOtherProcessesAndNoSystemdIsAClearError) {
  PlacementFacts f = At("/");
  f.hierarchy_root_is_root = false;
  f.others = {1};
  auto plan = PlanPlacement(f);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message().find("pids 1"), std::string::npos) << plan.error().message();
  EXPECT_NE(plan.error().message().find("Fix:"), std::string::npos) << plan.error().message();
}

TEST(PlanPlacement, WithoutSystemdACgroupOfItsOwnUnderTheRoot) {
  PlacementFacts f = At("/supervisor/job-7");
  auto plan = PlanPlacement(f);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->kind, PlacementKind::kCgroupfs);
  EXPECT_EQ(plan->root, "/sys/fs/cgroup");
  EXPECT_EQ(plan->base, "/sys/fs/cgroup/nsbox");
  EXPECT_TRUE(plan->leaf.empty());  // nsbox stays where it was started
}

TEST(PlanPlacement, WithoutSystemdInsideSomeoneElsesNamespaceIsAClearError) {
  PlacementFacts f = At("/job-7");
  f.hierarchy_root_is_root = false;
  auto plan = PlanPlacement(f);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message().find("Fix:"), std::string::npos) << plan.error().message();
}

TEST(PlanPlacement, ControllersAlreadyPassedOnNeedNothing) {
  PlacementFacts f = At("/machine.slice/c1", {"cpu", "io", "memory", "pids"});
  auto plan = PlanPlacement(f);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->kind, PlacementKind::kAsFound);
}

TEST(PlanPlacement, AV1OnlyHostHasNothingToPlace) {
  PlacementFacts f;
  f.v2_mounted = false;
  auto plan = PlanPlacement(f);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->kind, PlacementKind::kAsFound);
  EXPECT_TRUE(plan->base.empty());
}

TEST(UnitOfCgroupPath, TheInnermostUnit) {
  EXPECT_EQ(UnitOfCgroupPath("/system.slice/nsboxd.service"), "nsboxd.service");
  EXPECT_EQ(UnitOfCgroupPath("/system.slice/nsboxd.service/supervisor"), "nsboxd.service");
  EXPECT_EQ(UnitOfCgroupPath("/user.slice/user-1000.slice/session-3.scope"), "session-3.scope");
  EXPECT_EQ(UnitOfCgroupPath("/user.slice/user-1000.slice/user@1000.service/app.slice/x.service"),
            "x.service");
  EXPECT_EQ(UnitOfCgroupPath("/"), "");
  EXPECT_EQ(UnitOfCgroupPath("/process_api/73e3"), "");
  EXPECT_EQ(UnitOfCgroupPath("/.service"), "");
}

}  // namespace
}  // namespace nsbox::isolate

// What `nsbox serve` refuses to start without (exit 78, docs/daemon.md "As a service"), from
// made-up hosts.

#include "runtime/host_prerequisites.h"

#include <gtest/gtest.h>

#include <string>

namespace nsbox::runtime {
namespace {

Features AHostThatRunsSandboxes() {
  Features f;
  for (Features::Item* item :
       {&f.user_namespaces, &f.mount_namespaces, &f.seccomp_filter, &f.clone3, &f.clone_into_cgroup,
        &f.pidfd, &f.openat2, &f.mount_setattr, &f.overlayfs, &f.io_uring, &f.cgroup_v2,
        &f.cgroup_kill}) {
    item->available = true;
  }
  f.max_user_namespaces = 15000;
  return f;
}

TEST(HostPrerequisitesTest, AHostWithEveryRequiredLayerLacksNothing) {
  EXPECT_TRUE(MissingPrerequisites(AHostThatRunsSandboxes()).empty());
}

TEST(HostPrerequisitesTest, UserNamespacesDisabledIsNamedWithItsFix) {
  Features f = AHostThatRunsSandboxes();
  f.max_user_namespaces = 0;
  f.user_namespaces.available = false;
  f.user_namespaces.detail =
      "clone(CLONE_NEWUSER): ENOSPC (No space left on device): user.max_user_namespaces = 0; "
      "fix: sysctl -w user.max_user_namespaces=15000";
  // As the probe says then: the namespace set is not tried without a user namespace.
  f.mount_namespaces.available = false;
  f.mount_namespaces.detail = "needs user namespaces";
  auto missing = MissingPrerequisites(f);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].key, "user_namespaces");
  EXPECT_EQ(DescribeMissing(missing),
            "user namespaces: clone(CLONE_NEWUSER): ENOSPC (No space left on device): "
            "user.max_user_namespaces = 0; fix: sysctl -w user.max_user_namespaces=15000");
}

TEST(HostPrerequisitesTest, AKernelWithoutPidfdIsTooOld) {
  Features f = AHostThatRunsSandboxes();
  f.pidfd.available = false;
  f.pidfd.detail = "pidfd_open: ENOSYS (Function not implemented)";
  auto missing = MissingPrerequisites(f);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(DescribeMissing(missing),
            "pidfd: pidfd_open: ENOSYS (Function not implemented); fix: Linux >= 5.4");
}

// cgroup v2 is not required: a v1-only host runs sandboxes (docs/cgroups.md), doctor says what
// it lacks, and the daemon starts.
TEST(HostPrerequisitesTest, NoCgroupV2IsNotARefusal) {
  Features f = AHostThatRunsSandboxes();
  f.cgroup_v2.available = false;
  f.cgroup_v2.detail = "no cgroup2 mount";
  f.cgroup_kill.available = false;
  EXPECT_TRUE(MissingPrerequisites(f).empty());
}

}  // namespace
}  // namespace nsbox::runtime

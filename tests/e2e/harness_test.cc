// e2e: the harness itself (tests/e2e/daemon_harness.h) leaves nothing on the host. A daemon
// SIGKILLed with a state dir that no later daemon adopts would leave its cgroups behind (a
// daemon removes its predecessor's at its start); the leak checks of every later run on the host
// (the adversarial tier's after-case check among them) would then find them.

#include <memory>

#include "tests/common/cgroups.h"
#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

TEST(HarnessTest, AKilledDaemonsCgroupsGoWithItsHarness) {
  if (auto reason = E2eUnavailable()) GTEST_SKIP() << "NOT RUN: " << *reason;
  auto daemon = std::make_unique<Daemon>();
  ASSERT_TRUE(daemon->Start()) << daemon->error();
  Client c(daemon->endpoint());
  ASSERT_EQ(c.Request("PUT", "/v1/sandboxes/kept").status, 201);
  ASSERT_EQ(c.PostJson("/v1/sandboxes/kept/exec", json::object{{"command", "sleep 100 &"}}).status,
            200);
  const std::string prefix = daemon->CgroupPrefix();
  ASSERT_FALSE(prefix.empty());
  daemon->Kill();
  EXPECT_FALSE(testutil::FindCgroupsNamed(prefix).empty())
      << "control: a SIGKILLed daemon leaves its cgroups (" << prefix << "*)";
  daemon.reset();
  const std::set<std::string> left = testutil::FindCgroupsNamed(prefix);
  EXPECT_TRUE(left.empty()) << "left on the host: " << *left.begin();
}

}  // namespace
}  // namespace nsbox::e2e

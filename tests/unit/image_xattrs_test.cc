// images/xattrs: what the importer does with an entry's xattrs, byte for byte (issue 53):
// user.* kept, security.capability rebound to the sandboxes' root as a version-3 capability,
// ACLs and the host's namespaces dropped, Linux's bounds enforced.

#include "images/xattrs.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace nsbox::images::internal {
namespace {

const isolate::IdRange kUids{0, 1610612736, 65536};

std::string Le32(uint32_t v) {
  std::string out;
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// cap_net_bind_service (bit 10) permitted, effective flag set: what `setcap
// cap_net_bind_service+ep` writes as root on the host (revision 2).
std::string CapV2() { return Le32(0x02000001) + Le32(1u << 10) + Le32(0) + Le32(0) + Le32(0); }

TEST(RebindFileCapability, Revision2BecomesRevision3BoundToTheSandboxesRoot) {
  auto v3 = RebindFileCapability(CapV2(), kUids, "entry '/bin/ping'");
  ASSERT_TRUE(v3.ok()) << v3.error().message();
  EXPECT_EQ(*v3,
            Le32(0x03000001) + Le32(1u << 10) + Le32(0) + Le32(0) + Le32(0) + Le32(1610612736));
  // Without the effective flag, and capabilities above 31 (cap_checkpoint_restore is 40).
  const std::string high = Le32(0x02000000) + Le32(0) + Le32(0) + Le32(1u << 8) + Le32(0);
  EXPECT_EQ(*RebindFileCapability(high, kUids, "e"),
            Le32(0x03000000) + Le32(0) + Le32(0) + Le32(1u << 8) + Le32(0) + Le32(1610612736));
}

TEST(RebindFileCapability, Revision1AndRevision3) {
  EXPECT_EQ(*RebindFileCapability(Le32(0x01000001) + Le32(1u << 13) + Le32(0), kUids, "e"),
            Le32(0x03000001) + Le32(1u << 13) + Le32(0) + Le32(0) + Le32(0) + Le32(1610612736));
  // Revision 3 already: its rootid is an id of the image, shifted like an owner.
  const std::string v3 = Le32(0x03000001) + Le32(1u << 10) + Le32(0) + Le32(0) + Le32(0);
  EXPECT_EQ(*RebindFileCapability(v3 + Le32(1000), kUids, "e"), v3 + Le32(1610612736 + 1000));
  auto outside = RebindFileCapability(v3 + Le32(70000), kUids, "entry '/x'");
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.error().code(), EINVAL);
  EXPECT_EQ(outside.error().message(),
            "entry '/x': its security.capability is bound to uid 70000, outside the sandbox's "
            "65536 ids");
}

TEST(RebindFileCapability, WhatIsNoFileCapabilityIsRefused) {
  for (const std::string& bad :
       {std::string("ab"), Le32(0x02000001) + Le32(1), Le32(0x04000001) + std::string(20, '\0'),
        Le32(0x03000001) + std::string(16, '\0'), CapV2() + "x"}) {
    auto r = RebindFileCapability(bad, kUids, "entry '/x'");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), EINVAL);
  }
}

TEST(PlanXattrs, EachNamespaceGoesItsWay) {
  auto plan = PlanXattrs({{"user.mime", "text/plain"},
                          {"security.capability", CapV2()},
                          {"system.posix_acl_access", std::string(28, 'a')},
                          {"system.posix_acl_default", std::string(28, 'd')},
                          {"trusted.overlay.opaque", "y"},
                          {"security.selinux", "system_u:object_r:bin_t:s0"},
                          {"security.ima", "x"},
                          {"user.mime", "second copy (LIBARCHIVE.xattr.*)"}},
                         kUids, "entry '/f'");
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  ASSERT_EQ(plan->apply.size(), 2u);
  EXPECT_EQ(plan->apply[0], (Xattr{"user.mime", "text/plain"}));
  EXPECT_EQ(plan->apply[1].first, "security.capability");
  EXPECT_EQ(plan->apply[1].second.size(), 24u);
  EXPECT_EQ(plan->acls,
            (std::vector<std::string>{"system.posix_acl_access", "system.posix_acl_default"}));
  EXPECT_EQ(plan->others, (std::vector<std::string>{"trusted.overlay.opaque", "security.selinux",
                                                    "security.ima"}));
}

TEST(PlanXattrs, LinuxBoundsAreEnforced) {
  const std::string what = "entry '/f'";
  EXPECT_TRUE(PlanXattrs({{"user." + std::string(250, 'n'), "v"}}, kUids, what).ok());
  auto long_name = PlanXattrs({{"user." + std::string(251, 'n'), "v"}}, kUids, what);
  ASSERT_FALSE(long_name.ok());
  EXPECT_EQ(long_name.error().message(),
            "entry '/f': an xattr name of 256 bytes (Linux takes 1 to 255)");
  EXPECT_TRUE(PlanXattrs({{"user.big", std::string(65536, 'v')}}, kUids, what).ok());
  auto big = PlanXattrs({{"user.big", std::string(65537, 'v')}}, kUids, what);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().message(),
            "entry '/f': the xattr 'user.big' has 65537 bytes, more than the 65536 Linux keeps");
  std::vector<Xattr> many;
  for (int i = 0; i < 128; ++i) many.emplace_back("user.x" + std::to_string(i), "v");
  EXPECT_TRUE(PlanXattrs(many, kUids, what).ok());
  many.emplace_back("user.one-more", "v");
  auto too_many = PlanXattrs(many, kUids, what);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.error().code(), EINVAL);
  // A malformed capability refuses the entry, named.
  auto cap = PlanXattrs({{"security.capability", "xx"}}, kUids, what);
  ASSERT_FALSE(cap.ok());
  EXPECT_EQ(cap.error().message().rfind("entry '/f': its security.capability has 2 bytes", 0), 0u)
      << cap.error().message();
}

}  // namespace
}  // namespace nsbox::images::internal

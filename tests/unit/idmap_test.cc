#include "isolate/idmap.h"

#include <gtest/gtest.h>

namespace nsbox::isolate {
namespace {

TEST(IdMap, TextIsExactlyWhatTheKernelReads) {
  EXPECT_EQ(IdMapText({0, 1610612736, 65536}), "0 1610612736 65536\n");
  EXPECT_EQ(IdMapText({0, 100000, 1}), "0 100000 1\n");
}

TEST(IdMap, DefaultNeverMapsHostRoot) {
  auto m = DefaultIdMapping();
  ASSERT_TRUE(m.ok()) << m.error().message();
  EXPECT_NE(m->uid.outside, 0u);
  EXPECT_NE(m->gid.outside, 0u);
  EXPECT_EQ(m->uid.inside, 0u);
  EXPECT_GE(m->uid.count, 1u);
}

TEST(IdMap, ValidateRefusesHostRootEmptyAndOverflow) {
  EXPECT_TRUE(ValidateIdRange({0, 1610612736, 65536}, "uid").ok());
  auto root = ValidateIdRange({0, 0, 65536}, "uid");
  ASSERT_FALSE(root.ok());
  EXPECT_NE(root.error().message().find("host id 0"), std::string::npos);
  EXPECT_FALSE(ValidateIdRange({0, 5, 0}, "uid").ok());
  EXPECT_FALSE(ValidateIdRange({0, 0xffff0000u, 65536}, "uid").ok());
  EXPECT_TRUE(ValidateIdRange({0, 0xffff0000u - 1, 65536}, "uid").ok());
}

TEST(IdMap, ParsesSubidFiles) {
  const char* content = "alice:100000:65536\nnsbox:231072:65536\n";
  auto r = ParseSubidRange(content, "nsbox");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outside, 231072u);
  EXPECT_EQ(r->count, 65536u);
  auto missing = ParseSubidRange(content, "bob");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ENOENT);
  EXPECT_FALSE(ParseSubidRange("nsbox:12x:65536\n", "nsbox").ok());
  EXPECT_FALSE(ParseSubidRange("nsbox:100000\n", "nsbox").ok());
  // A prefix of another user's name is not a match.
  EXPECT_FALSE(ParseSubidRange("nsboxer:1:2\n", "nsbox").ok());
}

}  // namespace
}  // namespace nsbox::isolate

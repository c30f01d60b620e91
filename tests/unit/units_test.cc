#include "runtime/units.h"

#include <gtest/gtest.h>

namespace nsbox::runtime {
namespace {

TEST(Units, ParsesByteCounts) {
  EXPECT_EQ(*ParseBytes("--memory", "1048576"), 1048576u);
  EXPECT_EQ(*ParseBytes("--memory", "512M"), 512ull << 20);
  EXPECT_EQ(*ParseBytes("--memory", "2G"), 2ull << 30);
  EXPECT_EQ(*ParseBytes("--memory", "64KiB"), 64ull << 10);
  EXPECT_EQ(*ParseBytes("--memory", "3Mi"), 3ull << 20);
  EXPECT_EQ(*ParseBytes("--memory", "1T"), 1ull << 40);
  EXPECT_EQ(*ParseBytes("--memory", "100B"), 100u);
  // Fractions of the unit, rounded down to a whole byte.
  EXPECT_EQ(*ParseBytes("--memory", "1.5G"), 1610612736u);
  EXPECT_EQ(*ParseBytes("--memory", "16.5m"), 17301504u);
  EXPECT_EQ(*ParseBytes("--memory", "0.1GiB"), 107374182u);
  EXPECT_EQ(*ParseBytes("--memory", "2.5"), 2u);
  EXPECT_EQ(*ParseBytes("--memory", "0.999999999999999999T"), (1ull << 40) - 1);
}

TEST(Units, ParsesDurations) {
  constexpr uint64_t kMax = uint64_t{30} * 24 * 3600 * 1000;
  EXPECT_EQ(*ParseDurationMs("--idle-stop", "1500ms", 1000, kMax), 1500u);
  EXPECT_EQ(*ParseDurationMs("--idle-stop", "30s", 1000, kMax), 30000u);
  EXPECT_EQ(*ParseDurationMs("--idle-stop", "30", 1000, kMax), 30000u);  // seconds, as sleep
  EXPECT_EQ(*ParseDurationMs("--idle-stop", "15m", 1000, kMax), 900000u);
  EXPECT_EQ(*ParseDurationMs("--idle-stop", "2h", 1000, kMax), 7200000u);
  EXPECT_EQ(*ParseDurationMs("--idle-stop", "30d", 1000, kMax), kMax);
  for (const char* bad : {"", "m", "1.5m", "-1s", "10x", "1 s", "999ms", "31d", "0",
                          "99999999999999999999", "9999999999999999d"}) {
    auto r = ParseDurationMs("--idle-stop", bad, 1000, kMax);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message().find("--idle-stop '" + std::string(bad) + "'"), std::string::npos)
        << r.error().message();
  }
  EXPECT_NE(ParseDurationMs("--idle-stop", "999ms", 1000, kMax)
                .error()
                .message()
                .find("out of range (1s to 30d)"),
            std::string::npos);
}

TEST(Units, ByteErrorsNameTheFlagAndValue) {
  for (const char* bad : {"", "abc", "12X", "-5", "1.G", ".5G", "1.5.2G", "1.5X", "5MBx",
                          "99999999999999999999", "1.0000000000000000001G"}) {
    auto r = ParseBytes("--memory", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message().find("--memory '" + std::string(bad) + "'"), std::string::npos)
        << r.error().message();
  }
  EXPECT_FALSE(ParseBytes("--memory", "17179869184T").ok());  // overflows 64 bits
}

TEST(Units, CountsAndDecimalsRespectTheirRange) {
  EXPECT_EQ(*ParseCount("--pids", "64", 2, 100), 64u);
  EXPECT_FALSE(ParseCount("--pids", "0", 2, 100).ok());
  EXPECT_FALSE(ParseCount("--pids", "101", 2, 100).ok());
  EXPECT_FALSE(ParseCount("--pids", "12a", 2, 100).ok());
  EXPECT_DOUBLE_EQ(*ParseDecimal("--cpus", "1.5", 0.01, 64), 1.5);
  auto neg = ParseDecimal("--cpus", "-1", 0.01, 64);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.error().message().find("out of range"), std::string::npos);
  EXPECT_FALSE(ParseDecimal("--cpus", "nan", 0.01, 64).ok());
  EXPECT_FALSE(ParseDecimal("--cpus", "inf", 0.01, 64).ok());
}

}  // namespace
}  // namespace nsbox::runtime

#include "policy/environment.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>

namespace nsbox::policy {
namespace {

TEST(Environment, IsExactlyTheBaseOfTheApi) {
  ::setenv("NSBOX_UNIT_SECRET", "leak", 1);  // the caller's environment must not matter
  EnvironmentInput in;
  in.hostname = "box";
  auto env = BuildEnvironment(in);
  std::vector<std::string> expected = {
      "HOME=/root",
      "HOSTNAME=box",
      "LANG=C.UTF-8",
      "LOGNAME=root",
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "SHELL=/bin/bash",
      "TERM=xterm-256color",
      "TMPDIR=/tmp",
      "USER=root",
  };
  EXPECT_EQ(env, expected);
}

TEST(Environment, OverridesAddReplaceAndUnset) {
  EnvironmentInput in;
  in.hostname = "box";
  in.shell = "/bin/sh";
  in.overrides = {{"CI", "1"}, {"LANG", "en_US.UTF-8"}, {"TERM", std::nullopt}};
  auto env = BuildEnvironment(in);
  auto has = [&](const std::string& kv) { return std::count(env.begin(), env.end(), kv) == 1; };
  EXPECT_TRUE(has("CI=1"));
  EXPECT_TRUE(has("LANG=en_US.UTF-8"));
  EXPECT_TRUE(has("SHELL=/bin/sh"));
  EXPECT_TRUE(std::none_of(env.begin(), env.end(),
                           [](const std::string& kv) { return kv.rfind("TERM=", 0) == 0; }));
}

TEST(Environment, ParsesAssignments) {
  auto ok = ParseEnvAssignment("A=b=c");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->first, "A");
  EXPECT_EQ(ok->second, "b=c");
  EXPECT_TRUE(ParseEnvAssignment("EMPTY=").ok());
  EXPECT_FALSE(ParseEnvAssignment("NOEQUALS").ok());
  EXPECT_FALSE(ParseEnvAssignment("=value").ok());
  EXPECT_FALSE(ParseEnvAssignment("A\nB=1").ok());
  // execve's limit per string (MAX_ARG_STRLEN, the NUL included): the longest that passes, and
  // one byte more, refused with its name and size, not its value.
  EXPECT_TRUE(ParseEnvAssignment("BIG=" + std::string(kMaxEnvAssignment - 5, 'x')).ok());
  auto big = ParseEnvAssignment("BIG=" + std::string(kMaxEnvAssignment - 4, 'x'));
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().message(),
            "--env 'BIG': BIG=VALUE is 131072 bytes; Linux passes a command at most 131071 bytes "
            "per variable");
}

// An exec's variables are not checked for length (its command is then one that cannot be
// started); OversizedEnvEntry names the first one execve refuses, in the same words.
TEST(Environment, LengthUncheckedAndTheOversizedEntry) {
  const std::string big = "BIG=" + std::string(kMaxEnvAssignment - 4, 'x');
  EXPECT_TRUE(ParseEnvAssignment(big, "\"env\" entry", EnvLength::kUnchecked).ok());
  EXPECT_FALSE(ParseEnvAssignment("=x", "\"env\" entry", EnvLength::kUnchecked).ok());
  EXPECT_EQ(OversizedEnvEntry({"A=1", "BIG=" + std::string(kMaxEnvAssignment - 5, 'x')}), "");
  EXPECT_EQ(OversizedEnvEntry({"A=1", big, "C=" + std::string(kMaxEnvAssignment, 'c')}),
            "BIG=VALUE is 131072 bytes; Linux passes a command at most 131071 bytes per variable");
  EXPECT_EQ(OversizedEnvEntry({}), "");
}

}  // namespace
}  // namespace nsbox::policy

// nsbox-init driven through its control channel, as nsboxd will drive it: a real jail, real
// processes, real files. The smoke tests; the rest is in init_*_test.cc.

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "init_fixture.h"

namespace nsbox::itest {
namespace {

TEST_F(InitTest, RunsACommandAndReportsItsExit) {
  ExecRun run = Run("echo hi; echo oops >&2; exit 3");
  ASSERT_TRUE(run.ok) << run.Describe();
  EXPECT_EQ(run.exit.exit_code, 3);
  EXPECT_EQ(run.out, "hi\n");
  EXPECT_EQ(run.err, "oops\n");
}

TEST_F(InitTest, ServesTheFileVerbs) {
  auto& c = client();
  ASSERT_TRUE(c.WriteFile("/workspace/a/b/c.txt", "content").ok());
  auto read = c.ReadFile("/workspace/a/b/c.txt");
  ASSERT_TRUE(read.ok()) << read.error().message;
  EXPECT_EQ(read.value(), "content");
  auto st = c.Stat("/workspace/a/b/c.txt");
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st.value().is_file);
  EXPECT_EQ(st.value().size, 7u);
  auto missing = c.ReadFile("/workspace/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().err, ENOENT);
  EXPECT_EQ(missing.error().message, "ENOENT: no such file or directory, open '/workspace/nope'");
  std::string big(3 << 20, 'x');
  ASSERT_TRUE(c.WriteFile("/workspace/big", big).ok());
  auto big_read = c.ReadFile("/workspace/big");
  ASSERT_TRUE(big_read.ok());
  EXPECT_EQ(big_read.value().size(), big.size());
  EXPECT_EQ(Sh("stat -c %u /workspace/a/b/c.txt"), "0\n");
}

}  // namespace
}  // namespace nsbox::itest

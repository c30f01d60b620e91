// RunProgram (base/process.h): a helper program run to its end, as the daemon runs mkfs.ext4.

#include "base/process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace nsbox {
namespace {

TEST(RunProgram, OutputOfBothStreamsAndTheExitCode) {
  auto run = RunProgram({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, nullptr, 1024);
  ASSERT_TRUE(run.ok()) << run.error().message();
  ASSERT_TRUE(WIFEXITED(run->status));
  EXPECT_EQ(WEXITSTATUS(run->status), 3);
  EXPECT_EQ(run->output, "out\nerr\n");
  EXPECT_EQ(DescribeExit(run->status), "exit code 3");
}

TEST(RunProgram, TheGivenEnvironmentAloneAndStdinEmpty) {
  ::setenv("NSBOX_PROCESS_TEST_SECRET", "leaked", 1);
  const std::vector<std::string> env = {"ONLY=this"};
  auto run = RunProgram({"/bin/sh", "-c", "echo \"$ONLY/${NSBOX_PROCESS_TEST_SECRET:-none}\"; cat"},
                        &env, 1024);
  ASSERT_TRUE(run.ok()) << run.error().message();
  EXPECT_EQ(run->output, "this/none\n");
  auto inherited = RunProgram({"/bin/sh", "-c", "echo $NSBOX_PROCESS_TEST_SECRET"}, nullptr, 64);
  ASSERT_TRUE(inherited.ok());
  EXPECT_EQ(inherited->output, "leaked\n") << "nullptr passes this process's environment";
  ::unsetenv("NSBOX_PROCESS_TEST_SECRET");
}

TEST(RunProgram, NoOtherFdOfThisProcessReachesIt) {
  // Not close-on-exec, as asio's sockets are.
  const int fd = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 3);
  // No pipeline: the shell would hold a pipe's ends for a moment while it starts one, and ls
  // could see them (the test failed once under ctest -j2). The ":" after it keeps a shell that
  // execs a lone last command (bash, busybox) from becoming ls, whose own fds differ.
  auto run = RunProgram({"/bin/sh", "-c", "ls /proc/$$/fd; :"}, nullptr, 1024);
  ::close(fd);
  ASSERT_TRUE(run.ok()) << run.error().message();
  // The shell's ($$, not ls's): /dev/null as stdin, the output pipe as stdout and stderr.
  EXPECT_EQ(run->output, "0\n1\n2\n") << "fd " << fd << " was open";
}

TEST(RunProgram, MoreOutputThanKeptNeverBlocksIt) {
  auto run = RunProgram({"/bin/sh", "-c", "head -c 1000000 /dev/zero; echo done >&2"}, nullptr, 10);
  ASSERT_TRUE(run.ok()) << run.error().message();
  EXPECT_EQ(run->output.size(), 10u);
  EXPECT_EQ(DescribeExit(run->status), "exit code 0");
}

TEST(RunProgram, AProgramThatIsNotThereIsAnError) {
  auto run = RunProgram({"/nonexistent/mkfs"}, nullptr, 10);
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.error().message().find("/nonexistent/mkfs"), std::string::npos)
      << run.error().message();
  EXPECT_EQ(RunProgram({}, nullptr, 10).error().code(), EINVAL);
}

}  // namespace
}  // namespace nsbox

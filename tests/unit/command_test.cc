#include "exec/command.h"

#include <errno.h>
#include <gtest/gtest.h>

namespace nsbox::exec {
namespace {

TEST(CommandCandidates, SearchesPathLikeExecvp) {
  EXPECT_EQ(CommandCandidates("ls", "/usr/bin:/bin"),
            (std::vector<std::string>{"/usr/bin/ls", "/bin/ls"}));
  EXPECT_EQ(CommandCandidates("ls", ":/bin"), (std::vector<std::string>{"./ls", "/bin/ls"}));
  EXPECT_EQ(CommandCandidates("./run.sh", "/usr/bin"), (std::vector<std::string>{"./run.sh"}));
  EXPECT_EQ(CommandCandidates("/bin/true", "/usr/bin"), (std::vector<std::string>{"/bin/true"}));
}

TEST(CommandCandidates, PathComesFromTheCommandsEnvironment) {
  EXPECT_EQ(PathOf({"HOME=/root", "PATH=/opt/bin"}), "/opt/bin");
  EXPECT_EQ(PathOf({"HOME=/root"}), "/bin:/usr/bin");
  EXPECT_EQ(PathOf({"XPATH=/x"}), "/bin:/usr/bin");
}

TEST(DescribeExecFailure, SpeaksLikeAShell) {
  auto nf = DescribeExecFailure("nosuchcmd", ENOENT);
  EXPECT_EQ(nf.exit_code, 127);
  EXPECT_EQ(nf.message, "nsbox: nosuchcmd: command not found");
  auto path = DescribeExecFailure("/x/y", ENOENT);
  EXPECT_EQ(path.exit_code, 127);
  EXPECT_EQ(path.message, "nsbox: /x/y: No such file or directory");
  auto perm = DescribeExecFailure("./data.txt", EACCES);
  EXPECT_EQ(perm.exit_code, 126);
  EXPECT_EQ(perm.message, "nsbox: ./data.txt: Permission denied");
  EXPECT_EQ(DescribeExecFailure("x", ENOEXEC).exit_code, 126);
}

}  // namespace
}  // namespace nsbox::exec

// `nsbox doctor` as a user runs it: an nsbox without nsbox-net beside it says what builds and
// installs nsbox-net (the build, `cmake --install`: there is no scripts/setup), and the build
// tree's nsbox, which finds its nsbox-net, reports what nsbox-net's probe found instead.

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "tests/integration/harness.h"

namespace nsbox::itest {
namespace {

class DoctorTest : public IntegrationTest {};

TEST_F(DoctorTest, AnNsboxWithoutNsboxNetSaysWhatInstallsIt) {
  // A copy of nsbox alone in a directory of its own: nothing beside it, no ../net/nsbox-net.
  char tmpl[] = "/var/tmp/nsbox-doctor-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  struct RemoveAtEnd {
    std::string path;
    ~RemoveAtEnd() { std::filesystem::remove_all(path); }
  } remove_at_end{tmpl};
  const std::string dir = std::string(tmpl) + "/bin";
  ASSERT_TRUE(std::filesystem::create_directory(dir));
  const std::string alone = dir + "/nsbox";
  std::filesystem::copy_file(NSBOX_BIN, alone);
  ASSERT_EQ(::chmod(alone.c_str(), 0755), 0);

  RunResult r = RunProgram({alone, "doctor"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();  // networking is optional
  EXPECT_NE(r.out.find("nsbox-net not found beside " + alone), std::string::npos) << r.Describe();
  EXPECT_NE(r.out.find("fix: build nsbox-net with nsbox (cmake --build build"), std::string::npos)
      << r.Describe();
  EXPECT_NE(r.out.find("cmake --install build installs both"), std::string::npos) << r.Describe();
  EXPECT_EQ(r.out.find("scripts/setup"), std::string::npos) << r.Describe();
  EXPECT_EQ(r.out.find("network: nftables"), std::string::npos) << r.Describe();

  // Control: the build tree's nsbox finds build/net/nsbox-net, runs its probe and reports it.
  RunResult control = RunProgram({NSBOX_BIN, "doctor"});
  EXPECT_EQ(control.exit_code, 0) << control.Describe();
  EXPECT_NE(control.out.find("network: nftables"), std::string::npos) << control.Describe();
  EXPECT_EQ(control.out.find("nsbox-net not found"), std::string::npos) << control.Describe();
  EXPECT_EQ(control.out.find("cmake --install build"), std::string::npos) << control.Describe();
}

}  // namespace
}  // namespace nsbox::itest

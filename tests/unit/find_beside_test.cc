// How nsbox finds nsbox-init and nsbox-net: beside itself (a tarball, the old `cmake --install`),
// in ../libexec/nsbox (the Debian package, `cmake --install` now), in the build tree.

#include <errno.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/files.h"
#include "net/net_client.h"
#include "runtime/sandbox.h"

namespace nsbox {
namespace {

class FindBesideTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nsbox-find-beside-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << strerror(errno);
    root_ = tmpl;
    std::filesystem::create_directories(root_ + "/usr/bin");
    std::filesystem::create_directories(root_ + "/usr/libexec/nsbox");
    self_ = root_ + "/usr/bin/nsbox";
    Put(self_, 0755);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  static void Put(const std::string& path, mode_t mode) {
    std::ofstream(path) << "#!/bin/sh\n";
    ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path << ": " << strerror(errno);
  }

  std::string root_;
  std::string self_;
};

TEST_F(FindBesideTest, ThePackagesLibexecDirectoryIsFound) {
  Put(root_ + "/usr/libexec/nsbox/nsbox-init", 0755);
  Put(root_ + "/usr/libexec/nsbox/nsbox-net", 0755);
  auto init = FindBeside(self_, {"/nsbox-init", runtime::kInitInLibexec, "/../runtime/nsbox-init"},
                         "nsbox-init");
  ASSERT_TRUE(init.ok()) << init.error().message();
  EXPECT_EQ(*init, root_ + "/usr/bin/../libexec/nsbox/nsbox-init");
  auto net =
      FindBeside(self_, {"/nsbox-net", net::kNetInLibexec, "/../net/nsbox-net"}, "nsbox-net");
  ASSERT_TRUE(net.ok()) << net.error().message();
  EXPECT_EQ(*net, root_ + "/usr/bin/../libexec/nsbox/nsbox-net");
}

TEST_F(FindBesideTest, OneBesideTheExecutableComesFirst) {
  Put(root_ + "/usr/libexec/nsbox/nsbox-init", 0755);
  Put(root_ + "/usr/bin/nsbox-init", 0755);
  auto init = FindBeside(self_, {"/nsbox-init", runtime::kInitInLibexec}, "nsbox-init");
  ASSERT_TRUE(init.ok()) << init.error().message();
  EXPECT_EQ(*init, root_ + "/usr/bin/nsbox-init");
}

TEST_F(FindBesideTest, AFileThatIsNotExecutableIsPassedOver) {
  Put(root_ + "/usr/libexec/nsbox/nsbox-init", 0644);
  auto init = FindBeside(self_, {"/nsbox-init", runtime::kInitInLibexec}, "nsbox-init");
  ASSERT_FALSE(init.ok());
  EXPECT_EQ(init.error().code(), ENOENT);
  EXPECT_EQ(init.error().message(), "nsbox-init not found beside " + self_);
}

}  // namespace
}  // namespace nsbox

// `nsbox serve --socket-group NAME`: the group read from a group file by hand (no NSS in a static
// binary).

#include "runtime/socket_group.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace nsbox::runtime {
namespace {

class SocketGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nsbox-group-XXXXXX";
    int fd = ::mkstemp(tmpl);
    ASSERT_GE(fd, 0) << strerror(errno);
    ::close(fd);
    path_ = tmpl;
    std::ofstream(path_) << "root:x:0:\nnsboxer:x:998:\nnsbox:x:997:tester,alice\nbad:x:nan:\n";
  }
  void TearDown() override { ::unlink(path_.c_str()); }
  std::string path_;
};

TEST_F(SocketGroupTest, ANameIsItsGid) {
  auto gid = SocketGroupId("nsbox", path_);
  ASSERT_TRUE(gid.ok()) << gid.error().message();
  EXPECT_EQ(*gid, 997u);  // not nsboxer's, whose name only begins the same
}

TEST_F(SocketGroupTest, ANumberIsTakenAsIs) {
  auto gid = SocketGroupId("4242", path_);
  ASSERT_TRUE(gid.ok()) << gid.error().message();
  EXPECT_EQ(*gid, 4242u);
}

TEST_F(SocketGroupTest, AnUnknownGroupIsNamedWithHowToMakeIt) {
  auto gid = SocketGroupId("nosuch", path_);
  ASSERT_FALSE(gid.ok());
  EXPECT_EQ(gid.error().code(), ENOENT);
  EXPECT_EQ(gid.error().message(), "--socket-group nosuch: no group named 'nosuch' in " + path_ +
                                       " (create it with `groupadd --system nosuch`, or give its "
                                       "number)");
}

TEST_F(SocketGroupTest, AGidThatIsNotANumberIsRefused) {
  auto gid = SocketGroupId("bad", path_);
  ASSERT_FALSE(gid.ok());
  EXPECT_EQ(gid.error().code(), EINVAL);
}

}  // namespace
}  // namespace nsbox::runtime

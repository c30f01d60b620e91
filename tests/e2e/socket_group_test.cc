// `nsbox serve --socket-group GROUP` (docs/daemon.md): the socket is root:GROUP, mode 0660, so
// that the group's members use the CLI without sudo (the Debian package's unit passes nsbox).

#include <sys/stat.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

// A group of /etc/group other than root's (as nsbox serve reads it: by hand), and its gid.
bool SomeGroup(std::string* name, gid_t* gid) {
  std::ifstream in("/etc/group");
  std::string line;
  while (std::getline(in, line)) {
    const size_t c1 = line.find(':');
    const size_t c2 = line.find(':', c1 + 1);
    const size_t c3 = line.find(':', c2 + 1);
    if (c3 == std::string::npos) continue;
    const unsigned long id = std::stoul(line.substr(c2 + 1, c3 - c2 - 1));
    if (id == 0) continue;
    *name = line.substr(0, c1);
    *gid = static_cast<gid_t>(id);
    return true;
  }
  return false;
}

TEST(SocketGroupTest, TheSocketIsRootAndTheGroupGiven) {
  std::string name;
  gid_t gid = 0;
  ASSERT_TRUE(SomeGroup(&name, &gid)) << "no group but root's in /etc/group";
  Daemon d;
  ASSERT_TRUE(d.Start({"--pool", "0", "--socket-group", name})) << d.error();
  struct stat st {};
  ASSERT_EQ(::stat(d.socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_gid, gid) << name;
  EXPECT_EQ(st.st_mode & 07777, 0660u);
}

// The control: without the flag the socket keeps root's group.
TEST(SocketGroupTest, WithoutTheFlagTheSocketIsRoots) {
  Daemon d;
  ASSERT_TRUE(d.Start({"--pool", "0"})) << d.error();
  struct stat st {};
  ASSERT_EQ(::stat(d.socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, 0u);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
}

// An unknown group is refused at start, naming it, before the state directory or the socket is
// made.
TEST(SocketGroupTest, AnUnknownGroupIsRefusedBeforeAnythingIsMade) {
  Daemon d;
  const int code = d.RunToExit({"--pool", "0", "--socket-group", "nsbox-no-such-group"});
  EXPECT_EQ(code, 1) << d.Log();
  EXPECT_NE(d.Log().find("no group named 'nsbox-no-such-group' in /etc/group"), std::string::npos)
      << d.Log();
  struct stat st {};
  EXPECT_NE(::stat(d.socket_path().c_str(), &st), 0) << "a socket file was made";
  EXPECT_NE(::stat(d.state_dir().c_str(), &st), 0) << "the state directory was made";
}

}  // namespace
}  // namespace nsbox::e2e

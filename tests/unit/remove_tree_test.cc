// base/remove_tree.cc (RemoveTree, RemoveTreeAt): trees of any depth under a small fd limit,
// never following a link out of the tree, never entering a mount.

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/files.h"
#include "tests/common/mount_namespace.h"

namespace nsbox {
namespace {

class RemoveTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nsbox-remove-tree-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A chain of `depth` directories "d" under `top` (made with fds, as a sandbox would: no path
  // is longer than one name), with a file and a symlink at the bottom.
  static void MakeDeep(const std::string& top, int depth) {
    ASSERT_EQ(::mkdir(top.c_str(), 0755), 0) << top;
    int fd = ::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    for (int i = 0; i < depth; ++i) {
      ASSERT_EQ(::mkdirat(fd, "d", 0755), 0) << "level " << i;
      const int next = ::openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      ::close(fd);
      ASSERT_GE(next, 0);
      fd = next;
    }
    const int file = ::openat(fd, "f", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(file, 0);
    ::close(file);
    ASSERT_EQ(::symlinkat("/", fd, "root-link"), 0);
    ::close(fd);
  }

  // In a child whose RLIMIT_NOFILE is `limit`: 0 when `fn` succeeds, else its errno (255 if
  // other).
  template <typename Fn>
  static int UnderFdLimit(rlim_t limit, Fn fn) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const struct rlimit l = {limit, limit};
      if (::setrlimit(RLIMIT_NOFILE, &l) != 0) ::_exit(254);
      ::_exit(fn());
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 255;
  }

  std::string dir_;
};

// 2,000 levels with 32 fds: the walk holds a few whatever the depth. Control: a walk that keeps
// one fd per level (std::filesystem::remove_all, what the daemon used) fails there with EMFILE.
TEST_F(RemoveTreeTest, ATreeDeeperThanTheFdLimitIsRemoved) {
  const std::string control = dir_ + "/control";
  const std::string deep = dir_ + "/deep";
  MakeDeep(control, 2000);
  MakeDeep(deep, 2000);
  EXPECT_EQ(UnderFdLimit(32,
                         [&] {
                           std::error_code ec;
                           std::filesystem::remove_all(control, ec);
                           return ec ? ec.value() : 0;
                         }),
            EMFILE)
      << "control: a walk with one fd per level runs out of fds";
  EXPECT_EQ(UnderFdLimit(32,
                         [&] {
                           Status st = RemoveTree(deep);
                           if (!st.ok()) std::fprintf(stderr, "%s\n", st.error().message().c_str());
                           return st.ok() ? 0 : st.error().code();
                         }),
            0);
  struct stat st {};
  EXPECT_NE(::lstat(deep.c_str(), &st), 0) << "the tree is still there";
}

// A symlink in the tree is removed, never followed; nor is one given as the path itself.
TEST_F(RemoveTreeTest, SymlinksAreRemovedNotFollowed) {
  const std::string outside = dir_ + "/outside";
  ASSERT_EQ(::mkdir(outside.c_str(), 0755), 0);
  std::ofstream(outside + "/keep") << "kept";
  const std::string tree = dir_ + "/tree";
  ASSERT_EQ(::mkdir(tree.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((tree + "/sub").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(outside.c_str(), (tree + "/sub/link").c_str()), 0);
  ASSERT_EQ(::symlink((outside + "/keep").c_str(), (tree + "/file-link").c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), (dir_ + "/top-link").c_str()), 0);
  std::ofstream(tree + "/sub/a") << "a";
  ASSERT_TRUE(RemoveTree(tree).ok());
  ASSERT_TRUE(RemoveTree(dir_ + "/top-link").ok());
  struct stat st {};
  EXPECT_NE(::lstat(tree.c_str(), &st), 0);
  EXPECT_NE(::lstat((dir_ + "/top-link").c_str(), &st), 0);
  std::ifstream kept(outside + "/keep");
  std::string text;
  kept >> text;
  EXPECT_EQ(text, "kept") << "a link's target was removed";
}

TEST_F(RemoveTreeTest, AMissingPathIsDoneAFileIsUnlinkedAnEmptyNameIsAnError) {
  EXPECT_TRUE(RemoveTree(dir_ + "/missing").ok());
  std::ofstream(dir_ + "/file") << "x";
  EXPECT_TRUE(RemoveTree(dir_ + "/file").ok());
  struct stat st {};
  EXPECT_NE(::lstat((dir_ + "/file").c_str(), &st), 0);
  EXPECT_FALSE(RemoveTree("").ok());
}

// A wide and deep mix: files, empty and full directories at every level, relative to a dir fd.
TEST_F(RemoveTreeTest, RemoveTreeAtTakesEverythingUnderTheName) {
  const std::string tree = dir_ + "/wide";
  for (int a = 0; a < 20; ++a) {
    const std::string level = tree + "/a" + std::to_string(a);
    std::filesystem::create_directories(level + "/b/c/d");
    std::filesystem::create_directories(level + "/empty");
    for (int f = 0; f < 20; ++f) std::ofstream(level + "/b/f" + std::to_string(f)) << f;
    std::ofstream(level + "/b/c/d/deepest") << a;
  }
  const int fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  Status st = RemoveTreeAt(fd, "wide", "wide");
  ::close(fd);
  ASSERT_TRUE(st.ok()) << st.error().message();
  EXPECT_FALSE(std::filesystem::exists(tree));
}

// A mount point inside the tree is never entered: the removal stops there (EBUSY), and what is
// mounted keeps its files.
TEST_F(RemoveTreeTest, AMountPointInsideIsNotEntered) {
  const std::string tree = dir_ + "/tree";
  std::filesystem::create_directories(tree + "/m");
  std::ofstream(tree + "/other") << "x";
  testutil::InOwnMountNamespace([&] {
    ASSERT_EQ(::mount("none", (tree + "/m").c_str(), "tmpfs", 0, "size=1m"), 0) << strerror(errno);
    std::ofstream(tree + "/m/mounted") << "kept";
    Status st = RemoveTree(tree);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code(), EBUSY) << st.error().message();
    EXPECT_TRUE(std::filesystem::exists(tree + "/m/mounted")) << "the walk entered the mount";
    ASSERT_EQ(::umount2((tree + "/m").c_str(), MNT_DETACH), 0);
    EXPECT_TRUE(RemoveTree(tree).ok()) << "control: without the mount it goes";
  });
}

}  // namespace
}  // namespace nsbox

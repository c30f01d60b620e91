#include "fs/path.h"

#include <gtest/gtest.h>

namespace nsbox::fs {
namespace {

// Expected values are what Node 20 prints for path.posix.resolve(base, path).
TEST(ResolvePath, MatchesNodePathPosixResolve) {
  EXPECT_EQ(ResolvePath("/workspace", "a.txt"), "/workspace/a.txt");
  EXPECT_EQ(ResolvePath("/workspace", "sub/dir/"), "/workspace/sub/dir");
  EXPECT_EQ(ResolvePath("/workspace", "/etc/passwd"), "/etc/passwd");
  EXPECT_EQ(ResolvePath("/workspace", ""), "/workspace");
  EXPECT_EQ(ResolvePath("/workspace", "."), "/workspace");
  EXPECT_EQ(ResolvePath("/workspace", ".."), "/");
  EXPECT_EQ(ResolvePath("/workspace", "../../../.."), "/");
  EXPECT_EQ(ResolvePath("/workspace", "a/../../etc"), "/etc");
  EXPECT_EQ(ResolvePath("/workspace", "a//b///c"), "/workspace/a/b/c");
  EXPECT_EQ(ResolvePath("/", "/"), "/");
  EXPECT_EQ(ResolvePath("/a/b", "./c/./d/.."), "/a/b/c");
  EXPECT_EQ(ResolvePath("/", "..."), "/...");
}

}  // namespace
}  // namespace nsbox::fs

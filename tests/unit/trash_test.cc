// runtime/trash.h (TrashBin): a removal that fails is kept, retried when due, and done once its
// cause is gone; one found at start is removed at the first retry.

#include "runtime/trash.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/common/mount_namespace.h"

namespace nsbox {
namespace {

class TrashBinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nsbox-trash-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string dir_;
};

// A removal that cannot finish (a mount point in the tree) is kept and counted; retried before
// it is due it is not; once the cause is gone a retry removes it.
TEST_F(TrashBinTest, AFailedRemovalIsKeptRetriedWhenDueAndDoneWhenItCan) {
  const std::string trash = dir_ + "/.trash-abc-1";
  std::filesystem::create_directories(trash + "/sub/inner");
  std::ofstream(trash + "/sub/f") << "x";
  testutil::InOwnMountNamespace([&] {
    ASSERT_EQ(::mount("none", (trash + "/sub/inner").c_str(), "tmpfs", 0, "size=1m"), 0);
    runtime::TrashBin bin;
    Status first = bin.Remove(trash);
    ASSERT_FALSE(first.ok()) << "control: the removal cannot finish";
    EXPECT_EQ(bin.pending(), 1u);
    EXPECT_EQ(bin.failures(), 1u);
    const auto now = runtime::TrashBin::Clock::now();
    const auto due = bin.NextDue();
    ASSERT_TRUE(due.has_value());
    EXPECT_GE(*due, now);
    // Not yet due: nothing tried.
    (void)bin.RetryDue(now);
    EXPECT_EQ(bin.failures(), 1u);
    // Due, still failing: kept, and the next delay is longer (2 s).
    const auto next = bin.RetryDue(*due + std::chrono::milliseconds(1));
    EXPECT_EQ(bin.failures(), 2u);
    ASSERT_TRUE(next.has_value());
    EXPECT_GE(*next - runtime::TrashBin::Clock::now(), std::chrono::milliseconds(1500));
    // Another id's prefix retries nothing; this one's does, and fails while the cause stays.
    EXPECT_FALSE(bin.RetryNow(".trash-xyz-").has_value());
    std::optional<Status> still = bin.RetryNow(".trash-abc-");
    ASSERT_TRUE(still.has_value());
    EXPECT_FALSE(still->ok());
    EXPECT_EQ(bin.failures(), 3u);
    ASSERT_EQ(::umount2((trash + "/sub/inner").c_str(), MNT_DETACH), 0);
    std::optional<Status> done = bin.RetryNow(".trash-abc-");
    ASSERT_TRUE(done.has_value());
    EXPECT_TRUE(done->ok()) << done->error().message();
    EXPECT_EQ(bin.pending(), 0u);
    EXPECT_FALSE(bin.NextDue().has_value());
    EXPECT_FALSE(std::filesystem::exists(trash));
    EXPECT_FALSE(bin.RetryNow(".trash-abc-").has_value()) << "nothing is kept any more";
  });
}

// One found at start is removed at the first RetryDue, and a good removal keeps nothing.
TEST_F(TrashBinTest, AddedAtStartAndRemovedAtOnce) {
  runtime::TrashBin bin;
  std::filesystem::create_directories(dir_ + "/.trash-a-1/x/y");
  std::filesystem::create_directories(dir_ + "/.trash-b-2/x");
  bin.Add(dir_ + "/.trash-a-1");
  EXPECT_EQ(bin.pending(), 1u);
  EXPECT_FALSE(bin.RetryDue().has_value());
  EXPECT_EQ(bin.pending(), 0u);
  EXPECT_TRUE(bin.Remove(dir_ + "/.trash-b-2").ok());
  EXPECT_EQ(bin.pending(), 0u);
  EXPECT_EQ(bin.failures(), 0u);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/.trash-a-1"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/.trash-b-2"));
}

}  // namespace
}  // namespace nsbox

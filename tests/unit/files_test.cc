#include "base/files.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace nsbox {
namespace {

class LockFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nsbox-files-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << strerror(errno);
    dir_ = tmpl;
    path_ = dir_ + "/owner.lock";
  }
  void TearDown() override {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }

  // Tries the lock in a new process, which then exits: 0 when it got it, 1 when it was refused
  // as held by `want_holder`, 2 for any other answer.
  int TryInAnotherProcess(pid_t want_holder) {
    pid_t pid = ::fork();
    if (pid == 0) {
      pid_t holder = -1;
      Result<UniqueFd> lock = LockFileExclusive(path_, &holder);
      if (lock.ok()) ::_exit(holder == 0 ? 0 : 2);
      const bool busy =
          lock.error().code() == EBUSY && holder == want_holder &&
          lock.error().message() == path_ + " is locked by pid " + std::to_string(want_holder);
      ::_exit(busy ? 1 : 2);
    }
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
  }

  std::string dir_;
  std::string path_;
};

TEST_F(LockFileTest, OneHolderAtATimeAndTheOthersAreToldWhoHoldsIt) {
  EXPECT_EQ(TryInAnotherProcess(0), 0);  // free: taken, and let go as that process ends
  Result<UniqueFd> mine = LockFileExclusive(path_);
  ASSERT_TRUE(mine.ok()) << mine.error().message();
  EXPECT_EQ(TryInAnotherProcess(::getpid()), 1);
  mine->reset();
  EXPECT_EQ(TryInAnotherProcess(0), 0);
}

// A daemon SIGKILLed while it clones a jail leaves a child that still has the lock's fd open
// until it execs or dies, a moment later. The daemon restarted at once must get the lock all the
// same (an flock, which belongs to the open file, refused it: CI saw "another nsboxd is using
// the state directory" right after a kill).
TEST_F(LockFileTest, AChildThatStillHasTheFdOpenDoesNotHoldTheLock) {
  Result<UniqueFd> mine = LockFileExclusive(path_);
  ASSERT_TRUE(mine.ok()) << mine.error().message();
  int gate[2];
  ASSERT_EQ(::pipe(gate), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(gate[1]);
    char c;
    (void)::read(gate[0], &c, 1);  // keeps the inherited lock fd open until the test is done
    ::_exit(0);
  }
  ::close(gate[0]);
  mine->reset();  // the holder lets go; its child still has the same open file
  EXPECT_EQ(TryInAnotherProcess(0), 0);
  ::close(gate[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
}

// The other way round: a child that closes its copy (a jail's execve closes it, O_CLOEXEC)
// does not release the lock its parent holds.
TEST_F(LockFileTest, AChildClosingItsCopyLeavesTheParentsLock) {
  Result<UniqueFd> mine = LockFileExclusive(path_);
  ASSERT_TRUE(mine.ok()) << mine.error().message();
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    mine->reset();
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(TryInAnotherProcess(::getpid()), 1);
}

TEST_F(LockFileTest, AMissingDirectoryIsAnErrorNamingThePath) {
  const std::string missing = dir_ + "/no/such/owner.lock";
  Result<UniqueFd> lock = LockFileExclusive(missing);
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.error().code(), ENOENT);
  EXPECT_NE(lock.error().message().find("open"), std::string::npos) << lock.error().message();
  EXPECT_NE(lock.error().message().find(missing), std::string::npos) << lock.error().message();
}

}  // namespace
}  // namespace nsbox

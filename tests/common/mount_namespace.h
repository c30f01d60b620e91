#pragma once

// For unit tests that mount: the mounts a test makes must never show in the host's table (other
// tiers' tests look there for what nsbox left).

#include <errno.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace nsbox::testutil {

// Runs `body` in a child with a mount namespace of its own (its mounts private, so none
// propagates back); the child's failures are the test's. Skips where the test cannot mount (not
// root).
template <typename Body>
void InOwnMountNamespace(Body body) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount";
  EXPECT_EXIT(
      {
        if (::unshare(CLONE_NEWNS) != 0 ||
            ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
          std::fprintf(stderr, "unshare or mount: %s\n", strerror(errno));
          ::_exit(2);
        }
        body();
        ::_exit(::testing::Test::HasFailure() ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace nsbox::testutil

#include "base/worker_pool.h"

#include <dirent.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace nsbox {
namespace {

using namespace std::chrono_literals;

// The threads of this process (/proc/self/task).
int Threads() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;
}

// Polls `pred` for up to `limit`.
template <typename Pred>
bool Within(std::chrono::milliseconds limit, Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

TEST(WorkerPool, RunsEveryJobOffTheCaller) {
  std::atomic<int> ran{0};
  std::atomic<bool> on_caller{false};
  const auto caller = std::this_thread::get_id();
  {
    WorkerPool pool(3, 10s);
    for (int i = 0; i < 100; ++i) {
      pool.Submit([&] {
        if (std::this_thread::get_id() == caller) on_caller = true;
        ++ran;
      });
    }
  }  // the destructor waits for what is queued
  EXPECT_EQ(ran.load(), 100);
  EXPECT_FALSE(on_caller.load());
}

TEST(WorkerPool, AJobThatBlocksDoesNotHoldTheOthersUpToTheMaximum) {
  // Declared before the pool: its destructor waits for the jobs, which use them till they end.
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<bool> second{false};
  WorkerPool pool(2, 10s);
  pool.Submit([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });
  });
  pool.Submit([&] { second = true; });
  EXPECT_TRUE(Within(2000ms, [&] { return second.load(); })) << "the second job waited";
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
}

TEST(WorkerPool, ThreadsEndWhenIdleAndStartAgainOnDemand) {
  const int before = Threads();
  ASSERT_GT(before, 0);
  std::mutex mu;
  std::condition_variable cv;
  int waiting = 0;
  bool release = false;
  std::atomic<bool> again{false};
  WorkerPool pool(4, 100ms);  // after what its jobs use: destroyed, and waited for, first
  // Four jobs that wait for each other: four threads at once.
  for (int i = 0; i < 4; ++i) {
    pool.Submit([&] {
      std::unique_lock<std::mutex> lock(mu);
      ++waiting;
      cv.notify_all();
      cv.wait(lock, [&] { return release; });
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    // EXPECT, not ASSERT: the jobs must be let go below on every path, or the pool's destructor
    // would wait for them for good.
    EXPECT_TRUE(cv.wait_for(lock, 5s, [&] { return waiting == 4; }));
    EXPECT_EQ(Threads(), before + 4);
    release = true;
  }
  cv.notify_all();
  EXPECT_TRUE(Within(3000ms, [&] { return Threads() == before; }))
      << "threads left after the idle time: " << Threads() - before;
  pool.Submit([&] { again = true; });
  EXPECT_TRUE(Within(2000ms, [&] { return again.load(); }));
}

}  // namespace
}  // namespace nsbox

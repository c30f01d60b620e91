#pragma once

// Threads for blocking work that must stay off an event loop (nsbox-init's file verbs, the
// runner's cgroup directories). Threads are started on demand, up to a maximum, and each ends
// after `idle_exit` without a job, so that an idle sandbox keeps none (a thread is a kernel stack
// and task, ≈ 30 KiB, against density).

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

namespace nsbox {

class WorkerPool {
 public:
  WorkerPool(size_t max_threads, std::chrono::milliseconds idle_exit);
  // Waits for the jobs already queued and for every thread to end.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `job`; a new thread is started when none is idle and fewer than the maximum run.
  // Where no thread can be started at all (EAGAIN) and none runs, the job runs on the caller.
  void Submit(std::function<void()> job);

 private:
  void Loop();

  const size_t max_;
  const std::chrono::milliseconds idle_exit_;
  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable gone_;
  std::deque<std::function<void()>> jobs_;
  size_t live_ = 0;  // threads started and not yet ended
  size_t idle_ = 0;  // of those, waiting for a job
  bool stop_ = false;
};

}  // namespace nsbox

#include "base/worker_pool.h"

#include <system_error>
#include <thread>
#include <utility>

#include "base/log.h"

namespace nsbox {

WorkerPool::WorkerPool(size_t max_threads, std::chrono::milliseconds idle_exit)
    : max_(max_threads == 0 ? 1 : max_threads), idle_exit_(idle_exit) {}

WorkerPool::~WorkerPool() {
  std::unique_lock<std::mutex> lock(mu_);
  stop_ = true;
  work_.notify_all();
  gone_.wait(lock, [this] { return live_ == 0; });
}

void WorkerPool::Submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    if (idle_ > 0 || live_ >= max_) {
      work_.notify_one();
      return;
    }
    ++live_;
  }
  // Started outside the lock: a clone and a stack mapping are not for the caller to hold it.
  try {
    std::thread([this] { Loop(); }).detach();
  } catch (const std::system_error& e) {
    std::function<void()> orphan;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --live_;
      gone_.notify_all();
      if (live_ > 0 || jobs_.empty()) return;  // a running thread will take the job
      orphan = std::move(jobs_.front());
      jobs_.pop_front();
    }
    log::warn("worker pool: no thread ({}); the job runs on the caller", e.what());
    orphan();
  }
}

void WorkerPool::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    work_.wait_for(lock, idle_exit_, [this] { return stop_ || !jobs_.empty(); });
    --idle_;
    if (jobs_.empty()) break;  // stopping, or idle for idle_exit_
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    job = nullptr;  // what it captured is released before the next wait
    lock.lock();
  }
  // The last touch of `this`: the destructor waits for it under the same mutex.
  --live_;
  gone_.notify_all();
}

}  // namespace nsbox

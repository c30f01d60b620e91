#pragma once

#include <functional>
#include <utility>
#include <vector>

namespace nsbox {

// Undo steps of a multi-step set-up, run in reverse order unless Release() is called once the
// last step has succeeded (gVisor pkg/cleanup): a half-made sandbox never stays behind.
class CleanupStack {
 public:
  CleanupStack() = default;
  CleanupStack(const CleanupStack&) = delete;
  CleanupStack& operator=(const CleanupStack&) = delete;
  ~CleanupStack() { RunAll(); }

  void Push(std::function<void()> undo) { undo_.push_back(std::move(undo)); }
  // Keeps everything that was set up: the undo steps are dropped.
  void Release() { undo_.clear(); }
  // Undoes everything now, most recent first.
  void RunAll() {
    while (!undo_.empty()) {
      auto undo = std::move(undo_.back());
      undo_.pop_back();
      undo();
    }
  }

 private:
  std::vector<std::function<void()>> undo_;
};

}  // namespace nsbox

#pragma once

// The removal of deleted sandboxes' directories (docs/daemon.md "Deleting a sandbox"). A DELETE
// renames the sandbox's directory to sandboxes/.trash-<hash>-<hex> and removes it at once
// (RemoveTree: any depth, a few fds). One whose removal does not finish (an I/O error, a mount
// point in it, a file system that refuses) is kept here: retried later, with a delay that
// doubles from 1 s up to 5 minutes, each failure logged, and counted for GET /metrics
// (runtime/metrics.h RenderTrash). A DELETE of the same id again retries it at once.

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace nsbox::runtime {

class TrashBin {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kFirstDelay{1};
  static constexpr std::chrono::seconds kMaxDelay{300};

  // Removes `path` now; on failure keeps it for a retry (logged), and the error says why.
  Status Remove(const std::string& path);
  // Keeps `path` for a removal at the next RetryDue: a .trash- directory found at start.
  void Add(const std::string& path);
  // Retries every kept directory whose time has come. When the next one is due (nullopt when
  // none is kept).
  std::optional<Clock::time_point> RetryDue(Clock::time_point now = Clock::now());
  // When the next kept directory is due, nullopt when none is kept.
  std::optional<Clock::time_point> NextDue() const;
  // Retries at once every kept directory whose name (the last component) starts with `prefix`:
  // nullopt when none is kept; else Ok once all of them are gone, the first error otherwise
  // (one that RetryDue is removing at this moment counts as not gone).
  std::optional<Status> RetryNow(std::string_view prefix);

  // Directories kept (their removal has not finished).
  size_t pending() const;
  // Removals that failed, first attempts and retries, since the daemon started.
  uint64_t failures() const;

 private:
  struct Kept {
    std::string path;
    Clock::time_point due;
    std::chrono::seconds delay = kFirstDelay;
    unsigned attempts = 0;  // failed so far
    bool busy = false;      // being removed outside the lock
  };
  // Removes a kept directory (marked busy by the caller) and puts it back, later, on failure.
  Status Retry(const std::string& path);

  mutable std::mutex mu_;
  std::vector<Kept> kept_;
  uint64_t failures_ = 0;
};

}  // namespace nsbox::runtime

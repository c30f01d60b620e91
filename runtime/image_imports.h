#pragma once

// nsboxd's image imports kept from costing everything else (docs/images.md "Limits"): a lane of
// their own, so that an import never holds one of the worker threads that sandbox creation,
// deletion and the file verbs wait for, and at most `max_imports` at once (a request past them is
// refused, 429 with Retry-After, rather than queued with its upload spooled); and each import's
// budget (images/import_budget.h), the daemon's limits lowered by the request's maxBytes, whose
// refusals become 413 and 507.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "base/error.h"
#include "base/worker_pool.h"
#include "images/import_budget.h"
#include "runtime/api_error.h"

namespace nsbox::runtime {

// 2: an import is one thread of decompression, hashing and writes; two keep a host's disk busy
// and leave the other CPUs to the sandboxes (this project's machines have two).
inline constexpr size_t kDefaultMaxImports = 2;
inline constexpr size_t kMaxMaxImports = 64;
// What a 429 asks a client to wait: about the time a small image takes.
inline constexpr int kImportRetryAfterSeconds = 5;
// The CPU nice value of the lane's threads (SCHED_BATCH too): a sandbox's request that wakes up
// runs before them. 10, not 19: an import still moves on a host whose CPUs are busy.
inline constexpr int kImportNice = 10;
// An import pauses while the daemon serves another request that began less than kFreshRequest
// ago (a PUT, an exec, a file verb), for at most kMaxImportPause at a time. A busy CPU, whatever
// its priority, holds up what waits for an RCU grace period until its next tick (4 ms at
// HZ=250): a jail's start does, and a first use took twice as long beside an import, and beside
// a SCHED_IDLE loop, on this project's 2-CPU machines (docs/benchmarks.md, issue 53). A request
// older than kFreshRequest (a long command's exec, a stream) no longer holds imports back.
// After a pause cut short so, the import runs kImportRunAfterPause before it pauses again: under
// a constant stream of requests it still has a sixth of its time.
inline constexpr std::chrono::milliseconds kFreshRequest{200};
inline constexpr std::chrono::milliseconds kMaxImportPause{100};
inline constexpr std::chrono::milliseconds kImportRunAfterPause{20};

struct ImageImportOptions {
  images::ImportLimits limits;  // --image-max-bytes, --image-max-layers, --image-keep-free
  size_t max_imports = kDefaultMaxImports;  // --image-imports
};

// --image-keep-free: "10%" (of the file system's size, and of its inodes) or a size ("20G": that
// much space, and kDefaultImportKeepFreePercent of the inodes); "0" keeps nothing.
Status ParseKeepFree(std::string_view value, images::ImportLimits* limits);

class ImportLane {
 public:
  explicit ImportLane(ImageImportOptions options);
  // Waits for the imports under way (each ends soon once ImageStore::CancelImports was called).
  ~ImportLane() = default;
  ImportLane(const ImportLane&) = delete;
  ImportLane& operator=(const ImportLane&) = delete;

  // A place in the lane for one import, from its request's first byte until its job has ended
  // (hold it in both): null when max_imports imports hold one. It may outlive the lane.
  std::shared_ptr<void> TryEnter();
  // Runs `job` on one of the lane's threads (at most max_imports), at a lower CPU priority
  // (nice kImportNice, SCHED_BATCH) and the lowest best-effort I/O priority.
  void Run(std::function<void()> job);

  // Another request of the daemon began: imports pause while it is fresh (kFreshRequest), until
  // the token is released (when it ends). On the loop; the token may outlive the lane.
  std::shared_ptr<void> Foreground();

  // The budget of one import: the daemon's limits, its byte limit lowered to
  // `request_max_bytes` when that is lower. `images_dir`: where the import writes.
  std::unique_ptr<images::ImportBudget> NewBudget(const std::string& images_dir,
                                                  std::optional<uint64_t> request_max_bytes) const;

  const ImageImportOptions& options() const { return options_; }
  size_t running() const { return running_->load(); }

 private:
  // The requests in flight, by the time each began (Foreground), for the imports' pauses.
  struct Requests {
    std::mutex mu;
    std::condition_variable changed;
    std::multiset<std::chrono::steady_clock::time_point> began;
    // Waits while a fresh request is in flight, at most kMaxImportPause (an import's thread);
    // true when it stopped waiting with one still in flight.
    bool WaitQuiet();
  };

  const ImageImportOptions options_;
  std::shared_ptr<std::atomic<size_t>> running_ = std::make_shared<std::atomic<size_t>>(0);
  std::shared_ptr<Requests> requests_ = std::make_shared<Requests>();
  WorkerPool pool_;
};

// The request's maxBytes (a query parameter's value, absent: nullopt): a whole number of bytes,
// at least 1; anything else is 400 naming it.
ApiOutcome<std::optional<uint64_t>> QueryMaxBytes(const std::optional<std::string>& value);

// 429 too_many_imports, with Retry-After.
ApiError LaneFull(const ImportLane& lane);
// 413 image_too_large for an upload whose Content-Length is already past the limit.
ApiError UploadTooLarge(const images::ImportBudget& budget, uint64_t content_length);
// The API's answer to an import that `budget` ended with `error`: 413 image_too_large (bytes or
// layers), 507 insufficient_storage (the free space kept); nullopt when the budget did not end
// it (its client went away, the daemon is stopping, or an error of its own).
std::optional<ApiError> BudgetError(const images::ImportBudget& budget, const Error& error);

}  // namespace nsbox::runtime

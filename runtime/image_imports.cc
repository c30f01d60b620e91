#include "runtime/image_imports.h"

#include <errno.h>
#include <linux/ioprio.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <utility>

#include "base/log.h"
#include "base/syscalls.h"
#include "base/utf8.h"
#include "runtime/units.h"

namespace nsbox::runtime {

namespace {

// A lane thread's priorities, set by itself (every call names the calling thread only). None
// needs a privilege: a thread may always lower its own. A failure only leaves it at the daemon's
// priority, said once.
void LowerThisThreadsPriority() {
  const pid_t tid = ::gettid();
  struct sched_param param {};
  // pid 0: the calling thread (sched_setscheduler(2) applies to a thread on Linux). SCHED_BATCH
  // keeps the nice value and no longer preempts others at each of its wake-ups.
  int failed = ::sched_setscheduler(0, SCHED_BATCH, &param) != 0 ? errno : 0;
  // PRIO_PROCESS with a thread id: that thread's nice value alone (setpriority(2), NOTES).
  if (failed == 0 && ::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), kImportNice) != 0) {
    failed = errno;
  }
  if (failed == 0 && sys::IoprioSet(IOPRIO_WHO_PROCESS, tid,
                                    IOPRIO_PRIO_VALUE(IOPRIO_CLASS_BE, IOPRIO_BE_NR - 1)) != 0) {
    failed = errno;
  }
  static std::atomic<bool> said{false};
  if (failed != 0 && !said.exchange(true)) {
    log::warn("image imports run at the daemon's own priority: lowering it failed: {}",
              ErrnoText(failed));
  }
}

}  // namespace

Status ParseKeepFree(std::string_view value, images::ImportLimits* limits) {
  const std::string flag = "--image-keep-free";
  if (!value.empty() && value.back() == '%') {
    uint32_t percent = 0;
    const std::string_view digits = value.substr(0, value.size() - 1);
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), percent);
    if (ec != std::errc() || ptr != digits.data() + digits.size() || digits.empty() ||
        percent > 90) {
      return Error(EINVAL, flag + " '" + std::string(value) +
                               "': a percentage is a whole number from 0% to 90%");
    }
    limits->keep_free_bytes = 0;
    limits->keep_free_percent = percent;
    return Ok();
  }
  NSBOX_ASSIGN_OR_RETURN(uint64_t bytes, ParseBytes(flag, value));
  limits->keep_free_bytes = bytes;
  limits->keep_free_percent = bytes == 0 ? 0 : images::kDefaultImportKeepFreePercent;
  return Ok();
}

ImportLane::ImportLane(ImageImportOptions options)
    : options_(std::move(options)), pool_(options_.max_imports, std::chrono::milliseconds(10000)) {}

std::shared_ptr<void> ImportLane::TryEnter() {
  size_t now = running_->load();
  do {
    if (now >= options_.max_imports) return nullptr;
  } while (!running_->compare_exchange_weak(now, now + 1));
  // The count itself is shared with the ticket (a request's frame may be destroyed after the
  // lane), and is what it points at: a ticket is never null.
  return std::shared_ptr<void>(running_.get(),
                               [running = running_](void*) { running->fetch_sub(1); });
}

void ImportLane::Run(std::function<void()> job) {
  pool_.Submit([job = std::move(job)] {
    LowerThisThreadsPriority();
    job();
  });
}

std::shared_ptr<void> ImportLane::Foreground() {
  std::multiset<std::chrono::steady_clock::time_point>::iterator at;
  {
    std::lock_guard<std::mutex> lock(requests_->mu);
    at = requests_->began.insert(std::chrono::steady_clock::now());
  }
  return std::shared_ptr<void>(requests_.get(), [requests = requests_, at](void*) {
    {
      std::lock_guard<std::mutex> lock(requests->mu);
      requests->began.erase(at);
    }
    requests->changed.notify_all();
  });
}

bool ImportLane::Requests::WaitQuiet() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mu);
  const Clock::time_point deadline = Clock::now() + kMaxImportPause;
  for (;;) {
    const Clock::time_point now = Clock::now();
    // The newest request in flight: it is fresh until kFreshRequest after its start.
    if (began.empty() || *began.rbegin() + kFreshRequest <= now) return false;
    if (now >= deadline) return true;
    changed.wait_until(lock, std::min(deadline, *began.rbegin() + kFreshRequest));
  }
}

std::unique_ptr<images::ImportBudget> ImportLane::NewBudget(
    const std::string& images_dir, std::optional<uint64_t> request_max_bytes) const {
  images::ImportLimits limits = options_.limits;
  if (request_max_bytes && *request_max_bytes < limits.max_bytes) {
    limits.max_bytes = *request_max_bytes;
    limits.max_bytes_source = "maxBytes of the request; nsbox serve --image-max-bytes allows " +
                              images::DescribeBytes(options_.limits.max_bytes);
  }
  auto budget = std::make_unique<images::ImportBudget>(std::move(limits), images_dir);
  // Before each read and write: on the lane's thread, and on the worker that writes an upload's
  // next piece (at most max_imports workers of 32 wait so, kMaxImportPause at a time; the client
  // is slowed down meanwhile, as TCP slows a sender).
  budget->SetPace(
      [requests = requests_, run_until = std::chrono::steady_clock::time_point()]() mutable {
        if (std::chrono::steady_clock::now() < run_until) return;
        if (requests->WaitQuiet()) {
          run_until = std::chrono::steady_clock::now() + kImportRunAfterPause;
        }
      });
  return budget;
}

ApiOutcome<std::optional<uint64_t>> QueryMaxBytes(const std::optional<std::string>& value) {
  if (!value) return std::optional<uint64_t>();
  uint64_t n = 0;
  auto [ptr, ec] = std::from_chars(value->data(), value->data() + value->size(), n);
  if (ec != std::errc() || ptr != value->data() + value->size() || n == 0) {
    return ApiError::Invalid("\"maxBytes\" must be a whole number of bytes, at least 1, not \"" +
                             utf8::DecodeLossy(value->substr(0, 40)) + "\"");
  }
  return std::optional<uint64_t>(n);
}

ApiError LaneFull(const ImportLane& lane) {
  const size_t n = lane.options().max_imports;
  ApiError e =
      ApiError::Of(429, "too_many_imports",
                   "nsboxd imports at most " + std::to_string(n) + " image" + (n == 1 ? "" : "s") +
                       " at once, and " + std::to_string(lane.running()) +
                       " are under way (nsbox serve --image-imports): try again in " +
                       std::to_string(kImportRetryAfterSeconds) + " s");
  e.retry_after_seconds = kImportRetryAfterSeconds;
  return e;
}

ApiError UploadTooLarge(const images::ImportBudget& budget, uint64_t content_length) {
  const images::ImportLimits& l = budget.limits();
  return ApiError::Of(413, "image_too_large",
                      "the upload is " + images::DescribeBytes(content_length) +
                          ", more than the " + images::DescribeBytes(l.max_bytes) +
                          " an import may write (" + l.max_bytes_source + ")");
}

std::optional<ApiError> BudgetError(const images::ImportBudget& budget, const Error& error) {
  switch (budget.stop()) {
    case images::ImportStop::kTooLarge:
      return ApiError::Of(413, "image_too_large", error.message());
    case images::ImportStop::kKeepFree:
      return ApiError::Of(507, "insufficient_storage", error.message());
    case images::ImportStop::kNone:
    case images::ImportStop::kClientGone:
    case images::ImportStop::kDaemonStopping:
      break;
  }
  return std::nullopt;
}

}  // namespace nsbox::runtime

#include "runtime/trash.h"

#include <algorithm>

#include "base/files.h"
#include "base/log.h"

namespace nsbox::runtime {

namespace {

std::string_view LastComponent(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

Status TrashBin::Remove(const std::string& path) {
  Status removed = RemoveTree(path);
  if (removed.ok()) return removed;
  std::lock_guard<std::mutex> lock(mu_);
  ++failures_;
  kept_.push_back({path, Clock::now() + kFirstDelay, kFirstDelay, 1, false});
  log::error("{} is not removed yet, retried in {} s: {}", path, kFirstDelay.count(),
             removed.error().message());
  return removed;
}

void TrashBin::Add(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  kept_.push_back({path, Clock::now(), kFirstDelay, 0, false});
}

Status TrashBin::Retry(const std::string& path) {
  Status removed = RemoveTree(path);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(kept_.begin(), kept_.end(), [&](const Kept& k) { return k.path == path; });
  if (it == kept_.end()) return removed;  // never: only Retry takes a kept one out
  if (removed.ok()) {
    if (it->attempts > 0) {
      log::info("{} removed, after {} failed attempts", path, it->attempts);
    } else {
      log::info("finished the removal of {}", path);  // left by an earlier daemon
    }
    kept_.erase(it);
    return removed;
  }
  ++failures_;
  ++it->attempts;
  it->busy = false;
  // The first retry after kFirstDelay, then each after twice the last delay.
  if (it->attempts > 1) it->delay = std::min(it->delay * 2, kMaxDelay);
  it->due = Clock::now() + it->delay;
  log::error("{} is not removed yet ({} attempts), retried in {} s: {}", path, it->attempts,
             it->delay.count(), removed.error().message());
  return removed;
}

std::optional<TrashBin::Clock::time_point> TrashBin::RetryDue(Clock::time_point now) {
  std::vector<std::string> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Kept& k : kept_) {
      if (k.busy || k.due > now) continue;
      k.busy = true;
      due.push_back(k.path);
    }
  }
  for (const std::string& path : due) (void)Retry(path);
  return NextDue();
}

std::optional<TrashBin::Clock::time_point> TrashBin::NextDue() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<Clock::time_point> next;
  for (const Kept& k : kept_) {
    if (k.busy) continue;
    if (!next || k.due < *next) next = k.due;
  }
  return next;
}

std::optional<Status> TrashBin::RetryNow(std::string_view prefix) {
  std::vector<std::string> mine;
  bool under_way = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Kept& k : kept_) {
      if (!LastComponent(k.path).starts_with(prefix)) continue;
      if (k.busy) {
        under_way = true;
        continue;
      }
      k.busy = true;
      mine.push_back(k.path);
    }
  }
  if (mine.empty() && !under_way) return std::nullopt;
  Status result = Ok();
  for (const std::string& path : mine) {
    Status removed = Retry(path);
    if (result.ok() && !removed.ok()) result = removed;
  }
  if (result.ok() && under_way) {
    result = Error(EBUSY, "an earlier removal of its files is under way");
  }
  return result;
}

size_t TrashBin::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_.size();
}

uint64_t TrashBin::failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_;
}

}  // namespace nsbox::runtime

#pragma once

// What the two reactor backends share: the table that maps an OpId to the operation's slot, the
// callback of an operation, and the cross-thread queue behind Post. Private to exec/.

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <variant>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "exec/reactor.h"

namespace nsbox::exec::internal {

enum class OpKind : uint8_t { kRead, kWrite, kPollIn, kPollOut, kTimer };

// Read and Write report an ssize_t, PollIn and Timer an int; one variant instead of wrapping the
// int callbacks in a second std::function (which could allocate).
class Callback {
 public:
  Callback() = default;
  explicit Callback(std::function<void(ssize_t)> fn) : fn_(std::move(fn)) {}
  explicit Callback(std::function<void(int)> fn) : fn_(std::move(fn)) {}

  void Run(ssize_t result) {
    if (auto* io = std::get_if<std::function<void(ssize_t)>>(&fn_)) {
      if (*io) (*io)(result);
    } else if (auto* plain = std::get_if<std::function<void(int)>>(&fn_)) {
      // The results of PollIn (revents) and Timer (0 or -errno) always fit an int.
      if (*plain) (*plain)(static_cast<int>(result));
    }
  }

 private:
  std::variant<std::monostate, std::function<void(ssize_t)>, std::function<void(int)>> fn_;
};

// An operation's result waiting for its callback to be run by RunOnce.
struct Completion {
  OpId id;
  ssize_t result;
};

// Maps OpIds to slots without a hash map: an id is (generation << 32) | (index + 1). A freed
// slot's generation moves on, so a stale id (an op that completed, its slot reused) never finds
// the new op: Cancel of a completed id does nothing, and a late io_uring CQE or cancel that
// names an old id matches nothing. Generations skip 0 and 0xffffffff, so 0 is never an id and
// the ids with all-ones high bits are free for the backends' internal user_data tags.
template <typename Extra>
class OpTable {
 public:
  struct Slot {
    uint32_t generation = 1;
    bool live = false;
    OpKind kind = OpKind::kRead;
    Callback done;
    Extra extra{};
  };

  // Returns the new op's id and its slot (valid until the op is released).
  std::pair<OpId, Slot*> Add(OpKind kind, Callback done) {
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    Slot& slot = slots_[index];
    slot.live = true;
    slot.kind = kind;
    slot.done = std::move(done);
    slot.extra = Extra{};
    ++live_;
    return {(static_cast<uint64_t>(slot.generation) << 32) | (static_cast<uint64_t>(index) + 1),
            &slot};
  }

  // The live op named by `id`, or nullptr if it completed (or never existed).
  Slot* Find(OpId id) {
    uint64_t index_plus_one = id & 0xffffffffu;
    if (index_plus_one == 0 || index_plus_one > slots_.size()) return nullptr;
    Slot& slot = slots_[index_plus_one - 1];
    if (!slot.live || slot.generation != static_cast<uint32_t>(id >> 32)) return nullptr;
    return &slot;
  }

  // Frees the op's slot and hands back its callback, to be run by the caller. The slot is free
  // before the callback runs, so the callback may start new ops (reusing it) or Cancel its own
  // id (a no-op).
  Callback Release(OpId id) {
    Slot* slot = Find(id);
    if (slot == nullptr) return Callback();
    Callback done = std::move(slot->done);
    slot->done = Callback();
    slot->live = false;
    slot->generation = slot->generation >= 0xfffffffeu ? 1 : slot->generation + 1;
    free_.push_back(static_cast<uint32_t>(id & 0xffffffffu) - 1);
    --live_;
    return done;
  }

  size_t live() const { return live_; }

  template <typename Fn>
  void ForEachLive(Fn&& fn) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& slot = slots_[i];
      if (slot.live) fn((static_cast<uint64_t>(slot.generation) << 32) | (i + 1), slot);
    }
  }

 private:
  // A deque, not a vector: growing it never moves a slot, and the io_uring backend lends the
  // kernel a pointer into a slot (a TIMEOUT's timespec, read at submission).
  std::deque<Slot> slots_;
  std::vector<uint32_t> free_;  // LIFO: the most recently freed slot is the warmest
  size_t live_ = 0;
};

// Post's queue: any thread pushes under the mutex; the loop takes the whole batch. The eventfd
// is written only when the queue goes from empty to non-empty, so a burst of posts costs one
// wake-up (a cross-CPU wake-up costs 25-30 us here: perf-baselines.md section 6).
class PostQueue {
 public:
  static Result<std::unique_ptr<PostQueue>> Create();

  int event_fd() const { return event_fd_.get(); }
  void Post(std::function<void()> fn);
  // Takes every queued function; the caller runs them in order.
  void Take(std::vector<std::function<void()>>* out);
  // Reads (resets) the eventfd counter; for the epoll backend, which waits for readiness.
  void DrainEventFd();

 private:
  explicit PostQueue(UniqueFd fd) : event_fd_(std::move(fd)) {}

  UniqueFd event_fd_;
  std::mutex mu_;
  std::vector<std::function<void()>> queue_;  // guarded by mu_
};

// Aborts with a message: for broken invariants (conventions.md: crash loudly), such as RunOnce
// called from inside one of its own callbacks.
[[noreturn]] void Die(const char* what);

Result<std::unique_ptr<Reactor>> CreateUringReactor();
Result<std::unique_ptr<Reactor>> CreateEpollReactor();

}  // namespace nsbox::exec::internal

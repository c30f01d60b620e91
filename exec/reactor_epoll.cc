// The epoll backend of the reactor, for hosts without io_uring. Read and Write wait for
// readiness (one-shot) and then make the syscall, re-arming on EAGAIN; PollIn and PollOut
// complete on readiness. epoll allows one registration per fd, so each fd keeps the list of ops
// waiting on it and is armed for the union of their interests. Timers share one timerfd armed for
// the earliest deadline of a min-heap: one fd whatever the number of timers (each timerfd is a file
// and an hrtimer in the kernel; idle memory per sandbox matters), and a new timer costs a
// timerfd_settime only when it becomes the earliest. Completions (and cancellations) are queued
// and their callbacks run by RunOnce, never from inside the call that caused them.

#include <errno.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <unordered_map>
#include <vector>

#include "exec/reactor_internal.h"

namespace nsbox::exec::internal {
namespace {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC, as the timerfd

// Events taken from the kernel per epoll_wait; more stay ready for the next call.
constexpr int kMaxEvents = 64;

// What ends a wait: the interest itself, or an error or hang-up (always reported by epoll).
constexpr uint32_t kReadable = EPOLLIN | EPOLLPRI | EPOLLRDHUP | EPOLLERR | EPOLLHUP;
constexpr uint32_t kWritable = EPOLLOUT | EPOLLERR | EPOLLHUP;

enum class State : uint8_t { kWaiting, kQueued };

struct EpollExtra {
  State state = State::kWaiting;
  int fd = -1;
  void* buf = nullptr;  // const for a Write; the cast back happens only in write(2)
  size_t len = 0;
};

struct FdWaiters {
  std::vector<OpId> ops;  // in the order they were started: reads are served first come first
  uint32_t armed = 0;     // the interests armed in epoll (one-shot: 0 after an event)
  bool registered = false;
};

struct TimerEntry {
  Clock::time_point deadline;
  OpId id;
  // std::push_heap builds a max-heap; "greater" puts the earliest deadline on top.
  bool operator<(const TimerEntry& other) const { return deadline > other.deadline; }
};

class EpollReactor final : public Reactor {
 public:
  EpollReactor() = default;
  Status Init();

  Backend backend() const override { return Backend::kEpoll; }

  OpId Read(int fd, void* buf, size_t len, std::function<void(ssize_t)> done) override {
    return AddFdOp(OpKind::kRead, fd, buf, len, Callback(std::move(done)));
  }

  OpId Write(int fd, const void* buf, size_t len, std::function<void(ssize_t)> done) override {
    // SAFETY: the buffer is only ever passed back to write(2), which does not modify it.
    return AddFdOp(OpKind::kWrite, fd, const_cast<void*>(buf), len, Callback(std::move(done)));
  }

  OpId PollIn(int fd, std::function<void(int)> done) override {
    return AddFdOp(OpKind::kPollIn, fd, nullptr, 0, Callback(std::move(done)));
  }

  OpId PollOut(int fd, std::function<void(int)> done) override {
    return AddFdOp(OpKind::kPollOut, fd, nullptr, 0, Callback(std::move(done)));
  }

  OpId Timer(std::chrono::nanoseconds delay, std::function<void(int)> done) override {
    auto [id, slot] = ops_.Add(OpKind::kTimer, Callback(std::move(done)));
    (void)slot;
    TimerEntry entry{Clock::now() + std::max(delay, std::chrono::nanoseconds(0)), id};
    timers_.push_back(entry);
    std::push_heap(timers_.begin(), timers_.end());
    ++live_timers_;
    ArmTimerFd();
    return id;
  }

  void Cancel(OpId id) override {
    Slot* slot = ops_.Find(id);
    // Queued: it already completed (a read already took the data), and the result stands.
    if (slot == nullptr || slot->extra.state != State::kWaiting) return;
    Queue(id, *slot, -ECANCELED);
    if (slot->kind == OpKind::kTimer) {
      // Its heap entry no longer names a waiting timer: it is skipped when it reaches the top
      // (the timerfd then moves on to the next deadline) or dropped by a compaction.
      --live_timers_;
      CompactTimers();
      ArmTimerFd();
    } else {
      auto it = fds_.find(slot->extra.fd);
      if (it != fds_.end()) {
        FdWaiters& w = it->second;
        w.ops.erase(std::remove(w.ops.begin(), w.ops.end(), id), w.ops.end());
        if (w.ops.empty() && w.armed != 0) {
          // Disarm now: the caller may close the fd next, and a stale armed registration of a
          // file kept open elsewhere would report events under a reused fd number.
          ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, it->first, nullptr);
          w.registered = false;
          w.armed = 0;
        }
      }
    }
  }

  void Post(std::function<void()> fn) override { posts_->Post(std::move(fn)); }

  Status RunOnce(std::optional<std::chrono::milliseconds> timeout) override {
    if (running_) Die("RunOnce called from inside a reactor callback");
    running_ = true;
    Status status = RunOnceLocked(timeout);
    running_ = false;
    return status;
  }

  size_t pending() const override { return ops_.live(); }

 private:
  using Slot = OpTable<EpollExtra>::Slot;

  OpId AddFdOp(OpKind kind, int fd, void* buf, size_t len, Callback done) {
    auto [id, slot] = ops_.Add(kind, std::move(done));
    slot->extra.fd = fd;
    slot->extra.buf = buf;
    slot->extra.len = len;
    FdWaiters& w = fds_[fd];
    w.ops.push_back(id);
    Arm(fd, w);
    return id;
  }

  static uint32_t Interest(OpKind kind) {
    bool out = kind == OpKind::kWrite || kind == OpKind::kPollOut;
    return out ? static_cast<uint32_t>(EPOLLOUT) : static_cast<uint32_t>(EPOLLIN);
  }

  // Arms `fd` for the union of its waiters' interests, if it is not armed for them already.
  void Arm(int fd, FdWaiters& w) {
    uint32_t want = 0;
    for (OpId id : w.ops) want |= Interest(ops_.Find(id)->kind);
    if (want == 0 || (w.armed & want) == want) return;
    epoll_event ev{};
    ev.events = want | w.armed | EPOLLONESHOT;
    ev.data.fd = fd;
    int err = 0;
    if (w.registered && ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, fd, &ev) == 0) {
      w.armed = want | w.armed;
      return;
    }
    // Not registered, or registered for a file that has since been closed (epoll dropped it):
    // add it. EEXIST: registered by an earlier op of ours whose entry we had forgotten.
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) == 0 ||
        (errno == EEXIST && ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, fd, &ev) == 0)) {
      w.registered = true;
      w.armed = want | w.armed;
      return;
    }
    err = errno;
    w.registered = false;
    w.armed = 0;
    // EPERM: a regular file or directory, which epoll refuses because it is always ready; do
    // the syscalls now, as io_uring would. Anything else (EBADF...) fails the waiting ops.
    std::vector<OpId> ops;
    ops.swap(w.ops);
    for (OpId id : ops) {
      Slot& slot = *ops_.Find(id);
      if (err == EPERM) {
        ssize_t result = 0;
        if (!TryIo(slot, EPOLLIN | EPOLLOUT, &result)) result = -EAGAIN;
        Queue(id, slot, result);
      } else {
        Queue(id, slot, -err);
      }
    }
  }

  // Attempts `slot`'s operation given the ready events. Returns false if it must keep waiting.
  static bool TryIo(const Slot& slot, uint32_t events, ssize_t* result) {
    switch (slot.kind) {
      case OpKind::kRead:
      case OpKind::kWrite: {
        bool read = slot.kind == OpKind::kRead;
        if ((events & (read ? kReadable : kWritable)) == 0) return false;
        // SAFETY: buf and len are the caller's, valid until the callback has run (the
        // interface's contract); the fd is non-blocking, so neither call waits.
        ssize_t n = read ? ::read(slot.extra.fd, slot.extra.buf, slot.extra.len)
                         : ::write(slot.extra.fd, slot.extra.buf, slot.extra.len);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;  // spurious: re-arm
        *result = n < 0 ? -errno : n;
        return true;
      }
      case OpKind::kPollIn:
        if ((events & kReadable) == 0) return false;
        // EPOLLIN, EPOLLERR... have the values of POLLIN, POLLERR... on Linux, so these are
        // poll revents, as io_uring's POLL_ADD reports them.
        *result = events & kReadable;
        return true;
      case OpKind::kPollOut:
        if ((events & kWritable) == 0) return false;
        *result = events & kWritable;
        return true;
      case OpKind::kTimer:
        break;
    }
    return false;
  }

  void HandleFdEvent(int fd, uint32_t events) {
    auto it = fds_.find(fd);
    if (it == fds_.end()) return;
    FdWaiters& w = it->second;
    w.armed = 0;  // EPOLLONESHOT disarmed the whole registration
    size_t kept = 0;
    for (size_t i = 0; i < w.ops.size(); ++i) {
      OpId id = w.ops[i];
      Slot& slot = *ops_.Find(id);
      ssize_t result = 0;
      if (TryIo(slot, events, &result)) {
        Queue(id, slot, result);
      } else {
        w.ops[kept++] = id;
      }
    }
    w.ops.resize(kept);
    Arm(fd, w);
  }

  void Queue(OpId id, Slot& slot, ssize_t result) {
    slot.extra.state = State::kQueued;
    ready_.push_back({id, result});
  }

  // Points the timerfd at the earliest live deadline (or disarms it).
  void ArmTimerFd() {
    while (!timers_.empty()) {
      Slot* slot = ops_.Find(timers_.front().id);
      if (slot != nullptr && slot->extra.state == State::kWaiting) break;
      std::pop_heap(timers_.begin(), timers_.end());
      timers_.pop_back();
    }
    Clock::time_point next = timers_.empty() ? Clock::time_point::max() : timers_.front().deadline;
    if (next == armed_deadline_) return;
    itimerspec spec{};
    if (!timers_.empty()) {
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(next.time_since_epoch());
      // An all-zero it_value disarms; a deadline at or before boot time fires at once anyway.
      if (ns.count() <= 0) ns = std::chrono::nanoseconds(1);
      spec.it_value.tv_sec = std::chrono::duration_cast<std::chrono::seconds>(ns).count();
      spec.it_value.tv_nsec = (ns % std::chrono::seconds(1)).count();
    }
    if (::timerfd_settime(timer_fd_.get(), TFD_TIMER_ABSTIME, &spec, nullptr) != 0) {
      // Only EINVAL/EFAULT are possible, for values we built: a broken invariant.
      Die("timerfd_settime failed");
    }
    armed_deadline_ = next;
  }

  void ExpireTimers() {
    uint64_t ticks;
    // SAFETY: an 8-byte read from our own non-blocking timerfd, to clear its readiness; EAGAIN
    // (re-armed since it fired) is fine.
    ssize_t ignored = ::read(timer_fd_.get(), &ticks, sizeof(ticks));
    (void)ignored;
    armed_deadline_ = Clock::time_point::min();  // forces ArmTimerFd to set it again
    Clock::time_point now = Clock::now();
    while (!timers_.empty() && timers_.front().deadline <= now) {
      OpId id = timers_.front().id;
      std::pop_heap(timers_.begin(), timers_.end());
      timers_.pop_back();
      Slot* slot = ops_.Find(id);
      if (slot == nullptr || slot->extra.state != State::kWaiting) continue;  // cancelled
      --live_timers_;
      Queue(id, *slot, 0);
    }
    ArmTimerFd();
  }

  // Cancelled timers stay in the heap until their deadline; a long timeout cancelled per
  // command would otherwise pile up. Rebuilt when most entries are stale.
  void CompactTimers() {
    if (timers_.size() < 64 || timers_.size() < 2 * live_timers_) return;
    std::erase_if(timers_, [this](const TimerEntry& e) {
      Slot* slot = ops_.Find(e.id);
      return slot == nullptr || slot->extra.state != State::kWaiting;
    });
    std::make_heap(timers_.begin(), timers_.end());
  }

  Status RunOnceLocked(std::optional<std::chrono::milliseconds> timeout) {
    std::optional<Clock::time_point> deadline;
    if (timeout) deadline = Clock::now() + *timeout;
    for (;;) {
      int wait_ms = -1;
      if (!ready_.empty()) {
        wait_ms = 0;
      } else if (deadline) {
        auto left = std::max(Clock::duration::zero(), *deadline - Clock::now());
        // Rounded up: waking before the deadline would only loop again.
        auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
        wait_ms = static_cast<int>(std::min<int64_t>(ms, INT32_MAX));
      }
      epoll_event events[kMaxEvents];
      int n = ::epoll_wait(epoll_fd_.get(), events, kMaxEvents, wait_ms);
      if (n < 0) {
        if (errno != EINTR) return Error::Sys("epoll_wait", "", errno);
        n = 0;  // a signal: wait again for what is left of the timeout
      }
      bool woken = false;
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        if (fd == posts_->event_fd()) {
          posts_->DrainEventFd();
          woken = true;
        } else if (fd == timer_fd_.get()) {
          ExpireTimers();
        } else {
          HandleFdEvent(fd, events[i].events);
        }
      }
      if (Dispatch(woken) > 0) return Ok();
      if (deadline && Clock::now() >= *deadline) return Ok();
    }
  }

  size_t Dispatch(bool woken) {
    // Swapped out first: what callbacks start or cancel now completes at the next RunOnce, so
    // one RunOnce always ends.
    batch_.clear();
    batch_.swap(ready_);
    size_t ran = 0;
    for (const Completion& c : batch_) {
      Callback done = ops_.Release(c.id);
      done.Run(c.result);
      ++ran;
    }
    if (woken) {
      posted_.clear();
      posts_->Take(&posted_);
      for (auto& fn : posted_) {
        fn();
        ++ran;
      }
      posted_.clear();
    }
    return ran;
  }

  UniqueFd epoll_fd_;
  UniqueFd timer_fd_;
  std::unique_ptr<PostQueue> posts_;
  OpTable<EpollExtra> ops_;
  std::unordered_map<int, FdWaiters> fds_;
  std::vector<TimerEntry> timers_;  // a heap (std::push_heap), earliest deadline first
  size_t live_timers_ = 0;
  Clock::time_point armed_deadline_ = Clock::time_point::max();  // max: disarmed
  std::vector<Completion> ready_;  // completed or cancelled; callbacks run by the next Dispatch
  std::vector<Completion> batch_;  // reused between RunOnce calls
  std::vector<std::function<void()>> posted_;  // reused between RunOnce calls
  bool running_ = false;
};

Status EpollReactor::Init() {
  epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_.valid()) return Error::Sys("epoll_create1", "", errno).Context("epoll reactor");
  timer_fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!timer_fd_.valid()) {
    return Error::Sys("timerfd_create", "CLOCK_MONOTONIC", errno).Context("epoll reactor");
  }
  auto posts = PostQueue::Create();
  if (!posts.ok()) return std::move(posts).error().Context("epoll reactor");
  posts_ = std::move(posts).value();
  // Level-triggered, never one-shot: both stay registered for the reactor's life.
  for (int fd : {posts_->event_fd(), timer_fd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return Error::Sys("epoll_ctl", "EPOLL_CTL_ADD", errno).Context("epoll reactor");
    }
  }
  return Ok();
}

}  // namespace

Result<std::unique_ptr<Reactor>> CreateEpollReactor() {
  auto reactor = std::make_unique<EpollReactor>();
  NSBOX_TRY(reactor->Init());
  return std::unique_ptr<Reactor>(std::move(reactor));
}

}  // namespace nsbox::exec::internal

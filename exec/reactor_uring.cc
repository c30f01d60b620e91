// The io_uring backend of the reactor: every operation is one SQE whose user_data is its OpId,
// and its callback runs when that SQE's CQE arrives. Cancel sends IORING_OP_ASYNC_CANCEL for
// the id; the op's own CQE (-ECANCELED, or its result if it won the race) then completes it, so
// a callback never runs while the kernel may still write into the op's buffer.

#include <errno.h>
#include <liburing.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <string>
#include <vector>

#include "base/files.h"
#include "exec/reactor_internal.h"

namespace nsbox::exec::internal {
namespace {

// Submission queue entries. The SQ only bounds how many SQEs go to the kernel in one
// io_uring_enter (a full SQ is submitted and reused), not how many ops are in flight, so it is
// kept small: 64 SQEs are one 4 KiB page. The CQ is larger (IORING_SETUP_CQSIZE) because it
// must absorb a burst of completions between two RunOnce calls; 256 CQEs are one page too. Idle
// memory per sandbox matters (issue target: <= 0.5 MiB for an idle nsbox-init, kernel included).
constexpr unsigned kSqEntries = 64;
constexpr unsigned kCqEntries = 256;

// user_data of the internal SQEs. Op ids never have a generation of 0xffffffff (OpTable), so
// these never collide with one. LIBURING_UDATA_TIMEOUT (all ones) is liburing's own, used by
// io_uring_wait_cqe_timeout on kernels without IORING_FEAT_EXT_ARG (< 5.11).
constexpr uint64_t kCancelTag = 0;  // the CQE of an ASYNC_CANCEL itself: nothing to do
constexpr uint64_t kWakeTag = 0xfffffffffffffffeull;  // the READ of the Post eventfd

// The opcodes this backend submits; a kernel without one of them gets the epoll backend.
constexpr struct {
  int op;
  const char* name;
} kOpcodes[] = {
    {IORING_OP_READ, "READ"},
    {IORING_OP_WRITE, "WRITE"},
    {IORING_OP_POLL_ADD, "POLL_ADD"},
    {IORING_OP_TIMEOUT, "TIMEOUT"},
    {IORING_OP_ASYNC_CANCEL, "ASYNC_CANCEL"},
};

// Larger reads or writes are cut to this, as read(2) itself does (MAX_RW_COUNT).
constexpr size_t kMaxIo = 0x7ffff000;

struct UringExtra {
  __kernel_timespec timeout{};  // a Timer's delay; the kernel copies it at submission
  bool cancel_sent = false;     // one ASYNC_CANCEL per op is enough
};

class UringReactor final : public Reactor {
 public:
  UringReactor() = default;

  // Sets up the ring and checks the opcodes; the error names why io_uring cannot be used.
  Status Init();

  ~UringReactor() override {
    if (!ring_ready_) return;
    // The kernel may still hold pointers into callers' buffers (and into wake_buf_). Cancel
    // every op and wait for the CQEs, bounded, before the ring goes; callbacks are dropped
    // without being run, since the loop is being torn down.
    ops_.ForEachLive([this](OpId id, Slot& slot) {
      if (slot.extra.cancel_sent || !slot.live) return;
      SendCancel(id);
    });
    if (wake_armed_) SendCancel(kWakeTag);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (in_kernel_ > 0 && std::chrono::steady_clock::now() < deadline) {
      io_uring_submit(&ring_);
      __kernel_timespec ts{.tv_sec = 0, .tv_nsec = 50'000'000};
      io_uring_cqe* cqe = nullptr;
      int ret = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
      if (ret < 0 && ret != -ETIME && ret != -EINTR) break;
      unsigned head;
      unsigned seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        uint64_t tag = io_uring_cqe_get_data64(cqe);
        if (tag == kWakeTag || (tag != kCancelTag && tag != LIBURING_UDATA_TIMEOUT)) --in_kernel_;
        ++seen;
      }
      io_uring_cq_advance(&ring_, seen);
    }
    io_uring_queue_exit(&ring_);
  }

  Backend backend() const override { return Backend::kIoUring; }

  OpId Read(int fd, void* buf, size_t len, std::function<void(ssize_t)> done) override {
    auto [id, slot] = ops_.Add(OpKind::kRead, Callback(std::move(done)));
    (void)slot;
    if (io_uring_sqe* sqe = OpSqe(id)) {
      // SAFETY: the kernel writes into buf until this op's CQE, and the callback (after which
      // the caller may free buf) runs only once that CQE is reaped, cancelled or not.
      // Offset -1: the file's position, as read(2); pipes and sockets have none.
      io_uring_prep_read(sqe, fd, buf, static_cast<unsigned>(std::min(len, kMaxIo)),
                         static_cast<__u64>(-1));
      io_uring_sqe_set_data64(sqe, id);
    }
    return id;
  }

  OpId Write(int fd, const void* buf, size_t len, std::function<void(ssize_t)> done) override {
    auto [id, slot] = ops_.Add(OpKind::kWrite, Callback(std::move(done)));
    (void)slot;
    if (io_uring_sqe* sqe = OpSqe(id)) {
      io_uring_prep_write(sqe, fd, buf, static_cast<unsigned>(std::min(len, kMaxIo)),
                          static_cast<__u64>(-1));
      io_uring_sqe_set_data64(sqe, id);
    }
    return id;
  }

  OpId PollIn(int fd, std::function<void(int)> done) override {
    auto [id, slot] = ops_.Add(OpKind::kPollIn, Callback(std::move(done)));
    (void)slot;
    if (io_uring_sqe* sqe = OpSqe(id)) {
      io_uring_prep_poll_add(sqe, fd, POLLIN);
      io_uring_sqe_set_data64(sqe, id);
    }
    return id;
  }

  OpId PollOut(int fd, std::function<void(int)> done) override {
    auto [id, slot] = ops_.Add(OpKind::kPollOut, Callback(std::move(done)));
    (void)slot;
    if (io_uring_sqe* sqe = OpSqe(id)) {
      io_uring_prep_poll_add(sqe, fd, POLLOUT);
      io_uring_sqe_set_data64(sqe, id);
    }
    return id;
  }

  OpId Timer(std::chrono::nanoseconds delay, std::function<void(int)> done) override {
    auto [id, slot] = ops_.Add(OpKind::kTimer, Callback(std::move(done)));
    delay = std::max(delay, std::chrono::nanoseconds(0));
    slot->extra.timeout.tv_sec = std::chrono::duration_cast<std::chrono::seconds>(delay).count();
    slot->extra.timeout.tv_nsec = (delay % std::chrono::seconds(1)).count();
    if (io_uring_sqe* sqe = OpSqe(id)) {
      // The slot does not move (OpTable keeps slots in a deque) and lives until this op's CQE,
      // which comes after the submission at which the kernel copies the timespec.
      io_uring_prep_timeout(sqe, &slot->extra.timeout, 0, 0);
      io_uring_sqe_set_data64(sqe, id);
    }
    return id;
  }

  void Cancel(OpId id) override {
    Slot* slot = ops_.Find(id);
    if (slot == nullptr || slot->extra.cancel_sent) return;
    slot->extra.cancel_sent = true;
    // An op that never reached the kernel (in deferred_) completes anyway; its cancel finds
    // nothing (ENOENT), which is harmless.
    SendCancel(id);
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
  using Slot = OpTable<UringExtra>::Slot;

  Status RunOnceLocked(std::optional<std::chrono::milliseconds> timeout) {
    using Clock = std::chrono::steady_clock;
    std::optional<Clock::time_point> deadline;
    if (timeout) deadline = Clock::now() + *timeout;
    for (;;) {
      if (!wake_armed_) ArmWake();
      int submitted = io_uring_submit(&ring_);
      // EBUSY/EAGAIN: the kernel wants CQEs reaped first (overflow backlog); reaping below
      // makes room and the SQEs stay queued for the next submit. EINTR: retried the same way.
      if (submitted < 0 && submitted != -EBUSY && submitted != -EAGAIN && submitted != -EINTR) {
        return Error::Sys("io_uring_enter", "submit", -submitted);
      }
      if (deferred_.empty()) {
        io_uring_cqe* cqe = nullptr;
        int ret;
        if (deadline) {
          auto left = std::max(Clock::duration::zero(), *deadline - Clock::now());
          auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left);
          __kernel_timespec ts{
              .tv_sec = std::chrono::duration_cast<std::chrono::seconds>(ns).count(),
              .tv_nsec = (ns % std::chrono::seconds(1)).count()};
          ret = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
        } else {
          ret = io_uring_wait_cqe(&ring_, &cqe);
        }
        // EINTR: a signal; wait again for what is left of the timeout. ETIME: the timeout.
        if (ret < 0 && ret != -EINTR && ret != -ETIME && ret != -EBUSY && ret != -EAGAIN) {
          return Error::Sys("io_uring_enter", "wait", -ret);
        }
      }
      if (Dispatch() > 0) return Ok();
      if (deadline && Clock::now() >= *deadline) return Ok();
    }
  }

  // Reaps every CQE, then runs the callbacks. Returns how many callbacks (and posted
  // functions) ran.
  size_t Dispatch() {
    batch_.clear();
    batch_.swap(deferred_);
    bool woken = false;
    unsigned head;
    unsigned seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      uint64_t tag = io_uring_cqe_get_data64(cqe);
      if (tag == kCancelTag || tag == LIBURING_UDATA_TIMEOUT) continue;
      --in_kernel_;
      if (tag == kWakeTag) {
        wake_armed_ = false;
        woken = true;
        continue;
      }
      batch_.push_back({tag, cqe->res});
    }
    // Advanced before any callback runs: the CQ has room again for what they start.
    io_uring_cq_advance(&ring_, seen);

    size_t ran = 0;
    for (const Completion& c : batch_) {
      Slot* slot = ops_.Find(c.id);
      if (slot == nullptr) continue;  // cannot happen: an op's slot lives until its CQE
      ssize_t result = c.result;
      // A TIMEOUT that expires completes with -ETIME; the interface says done(0).
      if (slot->kind == OpKind::kTimer && result == -ETIME) result = 0;
      Callback done = ops_.Release(c.id);
      done.Run(result);
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

  // An SQE for op `id`, or nullptr when none can be had (the op then completes with the error
  // at the next RunOnce, as the interface promises every op completes).
  io_uring_sqe* OpSqe(OpId id) {
    io_uring_sqe* sqe = GetSqe();
    if (sqe == nullptr) {
      deferred_.push_back({id, -EAGAIN});
      return nullptr;
    }
    ++in_kernel_;
    return sqe;
  }

  io_uring_sqe* GetSqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      // The SQ is full: hand it to the kernel and take a fresh entry.
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  void SendCancel(uint64_t target) {
    io_uring_sqe* sqe = GetSqe();
    if (sqe == nullptr) {
      // Only when the kernel refuses submissions (CQ overflow): the op still completes on its
      // own; the cancel is lost, which the interface allows ("asks for the operation to end").
      return;
    }
    io_uring_prep_cancel64(sqe, target, 0);
    io_uring_sqe_set_data64(sqe, kCancelTag);
  }

  // Keeps one READ of the Post eventfd in flight, so Post wakes the ring without an extra
  // syscall on the loop's side (the non-blocking eventfd makes io_uring wait by polling).
  void ArmWake() {
    io_uring_sqe* sqe = GetSqe();
    if (sqe == nullptr) return;  // retried at the next RunOnce
    io_uring_prep_read(sqe, posts_->event_fd(), &wake_buf_, sizeof(wake_buf_), 0);
    io_uring_sqe_set_data64(sqe, kWakeTag);
    wake_armed_ = true;
    ++in_kernel_;
  }

  io_uring ring_{};
  bool ring_ready_ = false;
  std::unique_ptr<PostQueue> posts_;
  OpTable<UringExtra> ops_;
  std::vector<Completion> deferred_;  // ops that got no SQE; they complete at the next RunOnce
  std::vector<Completion> batch_;     // reused between RunOnce calls
  std::vector<std::function<void()>> posted_;  // reused between RunOnce calls
  uint64_t wake_buf_ = 0;
  bool wake_armed_ = false;
  bool running_ = false;
  size_t in_kernel_ = 0;  // SQEs prepared whose CQE has not been reaped (ops and the wake read)
};

std::string DisabledReason() {
  auto text = ReadFile("/proc/sys/kernel/io_uring_disabled");  // Linux 6.6+
  if (!text.ok()) return "";
  std::string value = *text;
  while (!value.empty() && (value.back() == '\n' || value.back() == ' ')) value.pop_back();
  if (value.empty() || value == "0") return "";
  return "; kernel.io_uring_disabled = " + value;
}

Status UringReactor::Init() {
  // SUBMIT_ALL (5.18): one bad SQE does not stop the rest of the batch. COOP_TASKRUN (5.19):
  // completions do not interrupt the loop's thread with an IPI; they are processed when it next
  // enters the kernel, which it does to wait anyway (cross-CPU wake-ups are expensive here).
  // CQSIZE (5.5): a CQ larger than the SQ. Older kernels reject unknown flags with EINVAL, so
  // each set is tried in turn.
  const unsigned kFlagSets[] = {
      IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN,
      IORING_SETUP_CQSIZE,
      0,
  };
  int ret = -EINVAL;
  for (unsigned flags : kFlagSets) {
    io_uring_params params{};
    params.flags = flags;
    params.cq_entries = kCqEntries;
    ret = io_uring_queue_init_params(kSqEntries, &ring_, &params);
    if (ret != -EINVAL) break;
  }
  if (ret < 0) {
    Error err = Error::Sys("io_uring_queue_init", std::to_string(kSqEntries) + " entries", -ret);
    return Error(err.code(), "io_uring reactor: " + err.message() + DisabledReason());
  }
  ring_ready_ = true;

  io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
  if (probe == nullptr) {
    return Error::Msg("io_uring reactor: IORING_REGISTER_PROBE failed (kernel < 5.6)");
  }
  std::string missing;
  for (const auto& op : kOpcodes) {
    if (!io_uring_opcode_supported(probe, op.op)) {
      missing += missing.empty() ? "" : ", ";
      missing += op.name;
    }
  }
  io_uring_free_probe(probe);
  if (!missing.empty()) return Error::Msg("io_uring reactor: the kernel lacks opcodes " + missing);

  auto posts = PostQueue::Create();
  if (!posts.ok()) return std::move(posts).error().Context("io_uring reactor");
  posts_ = std::move(posts).value();
  ArmWake();
  return Ok();
}

}  // namespace

Result<std::unique_ptr<Reactor>> CreateUringReactor() {
  auto reactor = std::make_unique<UringReactor>();
  NSBOX_TRY(reactor->Init());
  return std::unique_ptr<Reactor>(std::move(reactor));
}

}  // namespace nsbox::exec::internal

#pragma once

// nsboxd's `fs/readdir` answers on their way from nsbox-init to the client (docs/daemon.md
// "Listings"). nsbox-init sends a listing sorted, in frames of up to 1 MiB (fs/protocol.h); the
// daemon turns each into JSON a few entries at a time as the client takes the answer, so that it
// never holds a listing whole (up to 64 MiB of names, and several times that as JSON: six of
// them at once took the daemon from 7 MiB to 900 MiB, issue 44):
//
// - a listing's frames that wait for its client are at most `window` bytes: beyond that the
//   daemon stops reading its sandbox's control channel (fs::InitClient::HoldReads) until they are
//   under half of it; held for `stall` without the client taking enough, the answer is cut short
//   (the sandbox's other verbs must not wait on a client that does not read);
// - all listings together hold at most `budget` bytes, each counted at the most it can hold; a
//   listing that does not fit waits for one to end, up to `admission`, then is refused (503).
//
// Not thread-safe unless said: ListingStream's Part and Done may run on the channel's reader
// thread, everything else on the daemon's loop. A ListingStream is held by a shared_ptr.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "fs/file_ops.h"
#include "fs/protocol.h"

namespace nsbox::runtime {

struct ListingLimits {
  size_t window = 2u << 20;
  std::chrono::milliseconds stall{10000};
  size_t budget = 64u << 20;
  std::chrono::milliseconds admission{5000};
  // What one listing may hold at most, counted against the budget: its window, the frames the
  // loop reads after the hold (four reads of the channel's 1 MiB buffer) and one more whole
  // frame (fs::proto::kMaxPayload), and the JSON piece being written.
  size_t Reserve() const { return window + (8u << 20) + (256u << 10); }
};

// The daemon-wide bound. Entry is first come, first served.
class ListingBudget {
 public:
  ListingBudget(boost::asio::any_io_executor ex, ListingLimits limits);
  // True once admitted (Leave must follow); false after waiting `admission` for room.
  boost::asio::awaitable<bool> Enter();
  void Leave();
  size_t in_flight() const { return in_flight_; }
  size_t max_in_flight() const { return max_; }
  const ListingLimits& limits() const { return limits_; }

 private:
  boost::asio::any_io_executor ex_;
  const ListingLimits limits_;
  const size_t max_;
  size_t in_flight_ = 0;
  // Each waiter's timer: cancelled (woken) by a Leave with room for it.
  std::list<std::shared_ptr<boost::asio::steady_timer>> waiters_;
};

// One listing. The reader feeds it (Part, Done); the answer drains it (TakeJson).
class ListingStream : public std::enable_shared_from_this<ListingStream> {
 public:
  // `hold` and `release`: the sandbox's channel's HoldReads and ReleaseReads.
  ListingStream(boost::asio::any_io_executor ex, bool with_types, ListingLimits limits,
                std::function<void()> hold, std::function<void()> release);
  ~ListingStream();
  ListingStream(const ListingStream&) = delete;
  ListingStream& operator=(const ListingStream&) = delete;

  // Any thread: a frame's payload, then the end (or nsbox-init's error).
  void Part(std::string payload);
  void Done(fs::FsOutcome<fs::Unit> outcome);

  // Resumes after the next Part, Done or stall; spurious wake-ups happen.
  boost::asio::awaitable<void> WaitChange();
  // The entries that waited, as JSON array items (comma-separated, with a comma before the first
  // of a later call), entries whole, until about `max` bytes; "" when none waits. A malformed
  // frame or a name out of order (nsbox-init sends them sorted and unique: a compromised one
  // could not) makes failed() true.
  std::string TakeJson(size_t max);
  // Whether the reader sent anything yet (a part, the end).
  bool started() const;
  // Done came and every part was taken.
  bool finished() const;
  // Why the listing cannot go on: nsbox-init's error, a malformed listing, or a stall. With
  // started() false, nsbox-init's error is the whole answer.
  std::optional<fs::FsError> failed() const;
  // Whether a part came: the answer is then 200, and a later failure cuts it short.
  bool any_part() const;
  // Whether the whole listing came in its first frame (most directories): answered in one write.
  bool single() const;
  uint64_t bytes() const;  // of the frames received
  // The answer ends (written, or its client gone): nothing more is kept, the channel released.
  void Abandon();
  // On the loop, when the listing stalls: the answer's writer may be waiting on its client, which
  // this must end (the connection closed).
  std::function<void()> on_stall;

 private:
  void StallCheck();
  void Wake();

  boost::asio::any_io_executor ex_;
  const bool with_types_;
  const ListingLimits limits_;
  std::function<void()> hold_, release_;
  boost::asio::steady_timer change_;
  boost::asio::steady_timer stall_timer_;

  mutable std::mutex mu_;
  std::deque<std::string> parts_;  // payloads not yet taken, the first perhaps partly
  size_t queued_ = 0;
  uint64_t bytes_ = 0;
  size_t frames_ = 0;
  bool done_ = false;
  bool abandoned_ = false;
  bool held_ = false;
  std::chrono::steady_clock::time_point held_since_;
  std::optional<fs::FsError> error_;
  // Reads parts_.front() from where the last TakeJson stopped (a deque's elements stay where
  // they are as others are added, so the views into it hold).
  std::optional<fs::proto::ReaddirCursor> cursor_;
  std::string last_name_;
  bool any_name_ = false;
  bool items_ = false;  // an item was taken: the next one needs a comma
};

}  // namespace nsbox::runtime

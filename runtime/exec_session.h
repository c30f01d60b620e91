#pragma once

// One exec as nsboxd keeps it (docs/exec.md): its identity, its output as one ordered log of
// chunks (stream, bytes) addressed by byte offsets, and its end. It lives on the daemon's event
// loop and is fed there from the control channel's events, independently of any HTTP request;
// the request that started it and every re-attach read from it at their own pace, so a client
// that never reads never holds up the command or the log.
//
// The log: the newest bytes in a memory ring (ring_bytes); older ones spilled to a file
// (spill_path, made 0600 only once the ring overflows) up to spill_bytes; beyond that the
// oldest spilled bytes are dropped and oldest() moves. The spill file holds the raw bytes at
// file position == offset (a sparse file once its head is dropped); which stream each byte came
// from is kept in memory as the offsets where the stream switches, at most kMaxSpillRuns of them
// (more switches drop the oldest spilled bytes too, so a command alternating one-byte writes
// between stdout and stderr cannot grow the daemon's memory).
//
// The spill file is made and written off the loop (a write into the page cache sleeps whenever the
// kernel throttles the writer of dirty pages, which would hold up every client of the daemon):
// spilled chunks wait in memory, where readers find them, until a job on another thread has made
// the file and written them, one job at a time. Nothing is dropped for a disk slower than the
// output: over spill_backlog bytes waiting, on_spill_behind(true) asks nsboxd to stop reading the
// sandbox's channel (fs::InitClient::HoldReads) until under half of it again; nsbox-init then stops
// reading the commands' pipes, and the command waits for the disk. Readers (ReadLog) read the file
// on the loop only from the page cache; what must come from the disk is read on another thread, and
// the file is unlinked and closed on the write thread (freeing its blocks takes milliseconds).
//
// Not thread-safe: every call on the event loop's thread.

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/container/deque.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/unique_fd.h"
#include "fs/protocol.h"
#include "runtime/sandbox.h"

namespace nsbox::runtime {

struct ExecLogLimits {
  uint64_t ring_bytes = 2u << 20;     // nsbox serve --output-ring
  uint64_t spill_bytes = 64u << 20;   // nsbox serve --output-spill
  uint64_t spill_backlog = 4u << 20;  // spilled bytes waiting for the disk before on_spill_behind
  static constexpr size_t kMaxSpillRuns = 1u << 18;
};

class ExecSession {
 public:
  // A piece of the log: `data` came from `stream` (1 stdout, 2 stderr) and starts at `offset`.
  struct Piece {
    uint64_t offset = 0;
    int stream = 1;
    std::string data;
  };

  // Runs a job on another thread: the spill file's writes go to `write_offload`, its reads that
  // must wait for the disk to `read_offload`.
  using Offload = std::function<void(std::function<void()>)>;

  ExecSession(boost::asio::any_io_executor ex, Offload write_offload, Offload read_offload,
              std::string exec_id, std::string command, std::string spill_path,
              ExecLogLimits limits);
  ~ExecSession();
  ExecSession(const ExecSession&) = delete;
  ExecSession& operator=(const ExecSession&) = delete;

  const std::string& id() const { return id_; }
  const std::string& command() const { return command_; }
  const std::string& started_at() const { return started_at_; }
  const std::string& spill_path() const { return spill_path_; }
  // The newest bytes kept in memory (ExecLogLimits::ring_bytes).
  uint64_t ring_bytes() const { return limits_.ring_bytes; }

  // What the exec was started with, and where it runs.
  bool detach = false;
  bool stdin_stream = false;
  std::optional<fs::proto::TtySize> tty;
  bool stdin_closed = false;  // a POST .../stdin?close=1 (or the socket's stdin-close) went out
  std::weak_ptr<Sandbox> box;
  uint64_t tag = 0;
  // With true when more than spill_backlog bytes wait to be written to the spill file, with false
  // once under half of it (or dropped, or the session ends): each true is followed by one false.
  std::function<void(bool behind)> on_spill_behind;

  // Given every byte that Append takes, at once and in order, before any of it can leave the
  // ring: for a reader that must miss nothing however small the ring and the spill are (the
  // buffered answer; a reader of the log may fall behind its oldest kept offset). One at a time;
  // its owner clears it.
  std::function<void(int stream, std::string_view data)> tap;

  // From the control channel's events, in their order.
  void Started(uint32_t pid);
  void Append(int stream, std::string_view data);
  void Ended(const fs::proto::ExecExit& exit, std::string reason);

  bool started() const { return started_; }
  uint32_t pid() const { return pid_; }
  bool ended() const { return exit_.has_value(); }
  const fs::proto::ExecExit& exit() const { return *exit_; }
  const std::string& reason() const { return reason_; }

  // Offsets: [oldest(), end()) is what can still be read.
  uint64_t end() const { return end_; }
  uint64_t oldest() const { return oldest_; }
  uint64_t spilled_bytes() const { return spill_end_ - oldest_; }
  // Whether spilled bytes wait to be written, or a write of them (or the file's making) is under
  // way.
  bool spill_pending() const { return spill_writing_ || spill_making_ || !unwritten_.empty(); }
  // Bytes of the spill file that are not in the page cache: [offset, offset + len) of `stream`.
  struct OnDisk {
    uint64_t offset = 0;
    int stream = 1;
    size_t len = 0;
  };
  // Up to `max` bytes from `offset` (clamped to [oldest(), end()]), in order; empty at the end.
  // With `on_disk`, the spill file is read only from the page cache (RWF_NOWAIT): the pieces end
  // where the disk would have to be waited for, and *on_disk says what is there.
  std::vector<Piece> Read(uint64_t offset, size_t max,
                          std::optional<OnDisk>* on_disk = nullptr) const;
  // Where the last `max` bytes (at most) of `stream` before `before` lie, in order, kept ones only
  // ([oldest(), end())): a text re-attach starts a stream with the character begun before its
  // offset (docs/exec.md). Looks at what the stream switches say, never at the bytes.
  struct Span {
    uint64_t offset = 0;
    size_t len = 0;
  };
  std::vector<Span> StreamTail(int stream, uint64_t before, size_t max) const;
  // Read, on the loop, never waiting for the disk there: bytes that must come from the disk are
  // read by a job on read_offload while the loop serves others. Empty at the end (or dropped).
  boost::asio::awaitable<std::vector<Piece>> ReadLog(uint64_t offset, size_t max);

  // Resumes after the next change (output, start, end, Poke, Drop); spurious wake-ups happen.
  boost::asio::awaitable<void> WaitChange();
  // Wakes every WaitChange (a subscriber's own event: its client hung up, a control message).
  void Poke();

  // The bytes in the memory ring now.
  uint64_t ring_size() const { return ring_size_; }
  // After the end: the ring's bytes move to the spill file (written off the loop, then freed), as
  // far as the spill's limits take them without dropping a byte; readers find them there. For
  // nsboxd's bound on what ended sessions keep in memory.
  void RetireRing();
  // The ring bytes nsboxd counts against that bound (its bookkeeping, kept here).
  uint64_t counted_ring = 0;

  // The end of its retention (or the sandbox's deletion): the ring freed, the spill file closed
  // and removed (by a job on the write offload, after the one under way), every reader woken.
  // Readers then see dropped().
  void Drop();
  bool dropped() const { return dropped_; }
  // The retention timer: waited on by the session's pump, cancelled by Drop.
  boost::asio::steady_timer& expiry() { return expiry_; }

 private:
  struct Chunk {
    uint64_t offset = 0;
    int stream = 1;
    std::string data;
  };
  void SpillFront();
  void DropSpilledBefore(uint64_t offset);
  // Everything before `offset` dropped, the spill's memory too (its file stays, to be punched).
  void DropAllSpilledBefore(uint64_t offset);
  // Starts the next job through offload_ (the waiting chunks, then the holes to punch) unless
  // one runs; SpillWritten ends it on the loop (`err`: 0 or the failure's errno).
  void StartSpillJob();
  void SpillWritten(uint64_t job_end, int err);
  void FailSpill(const std::string& why);
  // Makes the spill file with a job on the write offload, unless it is made, being made or
  // failed; SpillFileMade takes the outcome on the loop (`err`: 0 or open's errno).
  void MakeSpillFile();
  void SpillFileMade(std::shared_ptr<UniqueFd> fd, int err, int mkdir_err);
  // The spill file unlinked and closed by a job on the write offload, if there is one.
  void RemoveSpill();
  void SetBehind(bool behind);

  const std::string id_;
  const std::string command_;
  const std::string started_at_;
  const std::string spill_path_;
  const ExecLogLimits limits_;
  bool started_ = false;
  uint32_t pid_ = 0;
  std::optional<fs::proto::ExecExit> exit_;
  std::string reason_;
  bool dropped_ = false;

  std::deque<Chunk> ring_;
  uint64_t ring_size_ = 0;
  uint64_t end_ = 0;
  uint64_t oldest_ = 0;
  uint64_t spill_end_ = 0;  // the ring starts here; [oldest_, spill_end_) is spilled
  // Boost's deque allocates nothing while empty (std::deque: 576 bytes), and most sessions never
  // spill: thousands of them may be kept for re-attach.
  boost::container::deque<std::pair<uint64_t, int>> runs_;  // (offset, stream) where it switches
  std::shared_ptr<UniqueFd> spill_fd_;  // shared with the job that writes into it
  bool spill_making_ = false;           // a job makes the file; chunks wait in unwritten_
  bool retire_wanted_ = false;          // RetireRing, once the file is made
  bool spill_failed_ = false;
  // Spilled chunks not yet written (those of the job under way included), in offset order:
  // [unwritten_.front()->offset, spill_end_) is read from here, what is before it from the file.
  boost::container::deque<std::shared_ptr<const Chunk>> unwritten_;
  uint64_t unwritten_bytes_ = 0;  // their bytes, and what each costs beyond them
  bool behind_ = false;           // on_spill_behind(true) was the last call
  bool spill_writing_ = false;
  uint64_t punched_ = 0;   // the file's head is a hole up to here
  uint64_t punch_to_ = 0;  // and should be up to here
  const Offload offload_;
  const Offload read_offload_;
  // Gone with the session: a job's end that finds it expired touches nothing.
  std::shared_ptr<ExecSession*> alive_ = std::make_shared<ExecSession*>(this);

  boost::asio::steady_timer notify_;
  boost::asio::steady_timer expiry_;
};

}  // namespace nsbox::runtime

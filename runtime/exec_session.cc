#include "runtime/exec_session.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>

#include "base/error.h"
#include "base/log.h"
#include "base/strings.h"

namespace nsbox::runtime {

namespace asio = boost::asio;

namespace {
// Consecutive output of one stream is merged into ring chunks up to this size.
constexpr size_t kChunkMerge = 64u << 10;
// What a chunk waiting to be spilled costs beyond its bytes (its control block and string), so
// that a command writing one byte at a time is held back too.
constexpr size_t kChunkCost = 128;

// Reads [at, at + len) of `fd` into `buf` (`flags` for preadv2); *got says how much came. The
// errno that stopped it short, or 0 (EIO at the file's end, which a spill file never has before
// what it was asked for).
int ReadAt(int fd, char* buf, size_t len, uint64_t at, int flags, size_t* got) {
  *got = 0;
  while (*got < len) {
    struct iovec iov = {buf + *got, len - *got};
    ssize_t n = ::preadv2(fd, &iov, 1, static_cast<off_t>(at + *got), flags);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;
    *got += static_cast<size_t>(n);
  }
  return 0;
}
}  // namespace

ExecSession::ExecSession(asio::any_io_executor ex, Offload write_offload, Offload read_offload,
                         std::string exec_id, std::string command, std::string spill_path,
                         ExecLogLimits limits)
    : id_(std::move(exec_id)),
      command_(std::move(command)),
      started_at_(NowRfc3339()),
      spill_path_(std::move(spill_path)),
      limits_(limits),
      offload_(std::move(write_offload)),
      read_offload_(std::move(read_offload)),
      notify_(ex, std::chrono::steady_clock::time_point::max()),
      expiry_(ex, std::chrono::steady_clock::time_point::max()) {}

ExecSession::~ExecSession() {
  SetBehind(false);
  RemoveSpill();
}

void ExecSession::RemoveSpill() {
  if (!spill_fd_) return;
  // Off the loop: removing a spill file of 64 MiB took 8-20 ms here (its blocks are freed by the
  // unlink, or by the last close when a write job or a reader still has it open).
  offload_([fd = std::move(spill_fd_), path = spill_path_, id = id_]() mutable {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      log::warn("exec={} {}", id, Error::Sys("unlink", path, errno).message());
    }
    fd.reset();
  });
}

void ExecSession::SetBehind(bool behind) {
  if (behind == behind_) return;
  behind_ = behind;
  if (on_spill_behind) on_spill_behind(behind);
}

void ExecSession::Started(uint32_t pid) {
  started_ = true;
  pid_ = pid;
  Poke();
}

void ExecSession::Ended(const fs::proto::ExecExit& exit, std::string reason) {
  exit_ = exit;
  reason_ = std::move(reason);
  Poke();
}

void ExecSession::Poke() { notify_.cancel(); }

asio::awaitable<void> ExecSession::WaitChange() {
  (void)co_await notify_.async_wait(asio::as_tuple(asio::use_awaitable));
}

void ExecSession::Append(int stream, std::string_view data) {
  if (data.empty() || dropped_) return;
  if (tap) tap(stream, data);
  if (!ring_.empty() && ring_.back().stream == stream && ring_.back().data.size() < kChunkMerge) {
    ring_.back().data.append(data);
  } else {
    ring_.push_back(Chunk{end_, stream, std::string(data)});
  }
  end_ += data.size();
  ring_size_ += data.size();
  while (ring_size_ > limits_.ring_bytes && !ring_.empty()) SpillFront();
  Poke();
}

void ExecSession::SpillFront() {
  Chunk chunk = std::move(ring_.front());
  ring_.pop_front();
  ring_size_ -= chunk.data.size();
  const uint64_t chunk_end = chunk.offset + chunk.data.size();
  spill_end_ = chunk_end;
  if (limits_.spill_bytes == 0 || spill_failed_) {
    DropAllSpilledBefore(chunk_end);
    return;
  }
  MakeSpillFile();  // the chunks wait in memory until it is made
  if (runs_.empty() || runs_.back().second != chunk.stream) {
    runs_.emplace_back(chunk.offset, chunk.stream);
  }
  unwritten_bytes_ += chunk.data.size() + kChunkCost;
  unwritten_.push_back(std::make_shared<const Chunk>(std::move(chunk)));
  // Only a command's output is held back for the disk; a ring retired after the end is not.
  if (unwritten_bytes_ > limits_.spill_backlog && !ended()) SetBehind(true);
  uint64_t new_oldest = oldest_;
  if (spill_end_ - oldest_ > limits_.spill_bytes) new_oldest = spill_end_ - limits_.spill_bytes;
  while (runs_.size() > ExecLogLimits::kMaxSpillRuns) {
    new_oldest = std::max(new_oldest, runs_[1].first);
    runs_.pop_front();
  }
  if (new_oldest > oldest_) DropSpilledBefore(new_oldest);
  StartSpillJob();
}

void ExecSession::MakeSpillFile() {
  if (spill_fd_ || spill_making_ || spill_failed_) return;
  spill_making_ = true;
  // On the write thread, as the writes: a file's creation waits for the file system's journal,
  // which a loaded disk can make slow.
  auto back = asio::prefer(notify_.get_executor(), asio::execution::outstanding_work.tracked);
  offload_([path = spill_path_, back, alive = std::weak_ptr<ExecSession*>(alive_)] {
    // <sandbox dir>/execs/<execId>.log; the directory may be gone (the sandbox deleted).
    const std::string dir = path.substr(0, path.rfind('/'));
    const int mkdir_err = ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST ? errno : 0;
    const int raw = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    const int err = raw < 0 ? errno : 0;
    auto fd = std::make_shared<UniqueFd>(raw);
    asio::post(back, [alive, fd, err, mkdir_err, path] {
      if (auto self = alive.lock()) {
        (*self)->SpillFileMade(fd, err, mkdir_err);
      } else if (fd->valid()) {
        ::unlink(path.c_str());  // the session went meanwhile; the file is empty
      }
    });
  });
}

void ExecSession::SpillFileMade(std::shared_ptr<UniqueFd> fd, int err, int mkdir_err) {
  spill_making_ = false;
  if (mkdir_err != 0) {
    const std::string dir = spill_path_.substr(0, spill_path_.rfind('/'));
    log::warn("exec={} output spill: {}", id_, Error::Sys("mkdir", dir, mkdir_err).message());
  }
  if (dropped_) {
    if (fd->valid()) {
      spill_fd_ = std::move(fd);
      RemoveSpill();
    }
    return;
  }
  if (err != 0) {
    log::warn("exec={} output spill: {}; its output is kept in memory only, up to the ring", id_,
              Error::Sys("open", spill_path_, err).message());
    spill_failed_ = true;
    retire_wanted_ = false;
    DropAllSpilledBefore(spill_end_);  // what waited for the file
    return;
  }
  spill_fd_ = std::move(fd);
  StartSpillJob();
  if (retire_wanted_) {
    retire_wanted_ = false;
    RetireRing();
  }
}

void ExecSession::RetireRing() {
  if (dropped_ || limits_.spill_bytes == 0 || spill_failed_ || ring_.empty()) return;
  if (!spill_fd_) {
    // Not a byte leaves the ring before the file is there: if it cannot be made, the ring stays.
    retire_wanted_ = true;
    MakeSpillFile();
    return;
  }
  // Chunk by chunk, as long as the spill takes them without dropping a kept byte.
  while (!ring_.empty()) {
    const Chunk& chunk = ring_.front();
    if (chunk.offset + chunk.data.size() - oldest_ > limits_.spill_bytes) return;
    const bool new_run = runs_.empty() || runs_.back().second != chunk.stream;
    if (new_run && runs_.size() >= ExecLogLimits::kMaxSpillRuns) return;
    SpillFront();
  }
}

void ExecSession::DropSpilledBefore(uint64_t offset) {
  oldest_ = offset;
  while (runs_.size() >= 2 && runs_[1].first <= offset) runs_.pop_front();
  if (!runs_.empty() && runs_.front().first < offset) runs_.front().first = offset;
  // The dropped head's disk blocks are given back by the next job (whole 64 KiB steps). Chunks
  // still waiting that are now before oldest_ are written all the same.
  punch_to_ = std::max(punch_to_, offset & ~uint64_t{0xffff});
}

void ExecSession::DropAllSpilledBefore(uint64_t offset) {
  oldest_ = offset;
  runs_.clear();
  // A job under way keeps the chunks it writes; those after it never start.
  unwritten_.clear();
  unwritten_bytes_ = 0;
  SetBehind(false);
  if (spill_fd_) {
    punch_to_ = std::max(punch_to_, offset & ~uint64_t{0xffff});
    StartSpillJob();
  }
}

void ExecSession::StartSpillJob() {
  if (spill_writing_ || !spill_fd_ || dropped_) return;
  // One job writes what waits, up to 1 MiB or IOV_MAX chunks of it (one pwritev), then punches
  // what was dropped.
  constexpr size_t kJobBytes = 1u << 20;
  std::vector<std::shared_ptr<const Chunk>> batch;
  size_t bytes = 0;
  for (const auto& chunk : unwritten_) {
    if (bytes >= kJobBytes || batch.size() == static_cast<size_t>(IOV_MAX)) break;
    if (!batch.empty() && chunk->offset != batch.back()->offset + batch.back()->data.size()) break;
    batch.push_back(chunk);
    bytes += chunk->data.size();
  }
  const uint64_t punch_from = punched_;
  const uint64_t punch_to = std::max(punched_, punch_to_);
  if (batch.empty() && punch_to == punch_from) return;
  punched_ = punch_to;  // a hole not punched only costs disk space
  spill_writing_ = true;
  const uint64_t job_end = batch.empty() ? 0 : batch.back()->offset + batch.back()->data.size();
  // The loop's executor, counted as busy until the job's end is posted to it.
  auto back = asio::prefer(notify_.get_executor(), asio::execution::outstanding_work.tracked);
  offload_([fd = spill_fd_, batch = std::move(batch), punch_from, punch_to, job_end,
            back = std::move(back), alive = std::weak_ptr<ExecSession*>(alive_)]() mutable {
    // The chunks are contiguous: one pwritev at the first one's offset, more if it is short.
    int err = 0;
    std::vector<struct iovec> iov;
    iov.reserve(batch.size());
    for (const auto& chunk : batch) {
      iov.push_back({const_cast<char*>(chunk->data.data()), chunk->data.size()});
    }
    uint64_t at = batch.empty() ? 0 : batch.front()->offset;
    for (size_t i = 0; i < iov.size() && err == 0;) {
      ssize_t n =
          ::pwritev(fd->get(), &iov[i], static_cast<int>(iov.size() - i), static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : EIO;
        break;
      }
      at += static_cast<uint64_t>(n);
      for (size_t left = static_cast<size_t>(n); left > 0;) {
        const size_t step = std::min(left, iov[i].iov_len);
        iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + step;
        iov[i].iov_len -= step;
        left -= step;
        if (iov[i].iov_len == 0) ++i;
      }
      while (i < iov.size() && iov[i].iov_len == 0) ++i;
    }
    if (err == 0 && punch_to > punch_from) {
      (void)::fallocate(fd->get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        static_cast<off_t>(punch_from), static_cast<off_t>(punch_to - punch_from));
    }
    batch.clear();
    fd.reset();
    asio::post(back, [alive, job_end, err] {
      if (auto self = alive.lock()) (*self)->SpillWritten(job_end, err);
    });
  });
}

void ExecSession::SpillWritten(uint64_t job_end, int err) {
  spill_writing_ = false;
  if (dropped_) return;
  if (err != 0) {
    FailSpill(Error::Sys("pwritev", spill_path_, err).message());
  } else {
    while (!unwritten_.empty() &&
           unwritten_.front()->offset + unwritten_.front()->data.size() <= job_end) {
      unwritten_bytes_ -= unwritten_.front()->data.size() + kChunkCost;
      unwritten_.pop_front();
    }
    if (unwritten_bytes_ <= limits_.spill_backlog / 2) SetBehind(false);
    StartSpillJob();
  }
}

void ExecSession::FailSpill(const std::string& why) {
  log::warn("exec={} output spill: {}; older output is dropped instead", id_, why);
  spill_failed_ = true;
  RemoveSpill();
  DropAllSpilledBefore(spill_end_);
}

std::vector<ExecSession::Piece> ExecSession::Read(uint64_t offset, size_t max,
                                                  std::optional<OnDisk>* on_disk) const {
  std::vector<Piece> out;
  if (dropped_) return out;
  offset = std::clamp(offset, oldest_, end_);
  size_t total = 0;
  // From the spill file: what is written, before the chunks that wait.
  const uint64_t file_end =
      unwritten_.empty() ? spill_end_ : std::max(oldest_, unwritten_.front()->offset);
  while (offset < file_end && total < max && spill_fd_ && !runs_.empty()) {
    auto it =
        std::upper_bound(runs_.begin(), runs_.end(), offset,
                         [](uint64_t o, const std::pair<uint64_t, int>& r) { return o < r.first; });
    if (it != runs_.begin()) --it;
    const uint64_t run_end = std::next(it) == runs_.end() ? file_end : std::next(it)->first;
    const size_t len =
        static_cast<size_t>(std::min<uint64_t>(std::min(run_end, file_end) - offset, max - total));
    Piece piece{offset, it->second, std::string(len, '\0')};
    size_t got = 0;
    const int err =
        ReadAt(spill_fd_->get(), piece.data.data(), len, offset, on_disk ? RWF_NOWAIT : 0, &got);
    if (err == EAGAIN || (err == EOPNOTSUPP && on_disk)) {
      // Not in the page cache (or a file system that cannot say): the rest is the caller's.
      *on_disk = OnDisk{offset + got, it->second, len - got};
      if (got > 0) {
        piece.data.resize(got);
        out.push_back(std::move(piece));
      }
      return out;
    }
    if (err != 0) {
      log::warn("exec={} output spill: {}", id_, Error::Sys("pread", spill_path_, err).message());
      return out;
    }
    offset += len;
    total += len;
    out.push_back(std::move(piece));
  }
  if (offset < file_end) return out;  // the spill failed under a reader: what there is
  // From chunks in memory, in offset order: those waiting to be spilled, then the ring.
  auto from_memory = [&](const auto& chunks, auto chunk_of) {
    auto it = std::partition_point(chunks.begin(), chunks.end(), [&](const auto& c) {
      return chunk_of(c).offset + chunk_of(c).data.size() <= offset;
    });
    for (; it != chunks.end() && total < max; ++it) {
      const Chunk& chunk = chunk_of(*it);
      if (offset < chunk.offset) break;
      const size_t skip = static_cast<size_t>(offset - chunk.offset);
      const size_t len = std::min(chunk.data.size() - skip, max - total);
      out.push_back(Piece{offset, chunk.stream, chunk.data.substr(skip, len)});
      offset += len;
      total += len;
    }
  };
  from_memory(unwritten_, [](const std::shared_ptr<const Chunk>& c) -> const Chunk& { return *c; });
  if (offset < spill_end_) return out;
  from_memory(ring_, [](const Chunk& c) -> const Chunk& { return c; });
  return out;
}

std::vector<ExecSession::Span> ExecSession::StreamTail(int stream, uint64_t before,
                                                       size_t max) const {
  std::vector<Span> out;  // newest first, reversed at the end
  if (dropped_) return out;
  before = std::min(before, end_);
  size_t need = max;
  auto take = [&](uint64_t start, uint64_t stop) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(need, stop - start));
    out.push_back(Span{stop - n, n});
    need -= n;
  };
  // The ring, newest first. Chunks of one stream merge up to kChunkMerge, so the other stream's
  // chunks passed over are few (or big): the walk is short.
  for (auto it = ring_.rbegin(); it != ring_.rend() && need > 0; ++it) {
    if (it->offset >= before || it->stream != stream) continue;
    take(it->offset, std::min<uint64_t>(before, it->offset + it->data.size()));
  }
  // The spilled part, by its runs (they alternate between the streams).
  for (size_t k = runs_.size(); k-- > 0 && need > 0;) {
    if (runs_[k].second != stream) continue;
    const uint64_t start = std::max(runs_[k].first, oldest_);
    const uint64_t stop = std::min(before, k + 1 < runs_.size() ? runs_[k + 1].first : spill_end_);
    if (stop > start) take(start, stop);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

asio::awaitable<std::vector<ExecSession::Piece>> ExecSession::ReadLog(uint64_t offset, size_t max) {
  for (;;) {
    std::optional<OnDisk> on_disk;
    std::vector<Piece> out = Read(offset, max, &on_disk);
    if (!out.empty() || !on_disk) co_return out;
    // The first bytes wanted must come from the disk: a job reads them while the loop goes on.
    const OnDisk span = *on_disk;
    auto initiation = [this, span, fd = spill_fd_](auto handler) {
      auto back = asio::prefer(asio::get_associated_executor(handler, notify_.get_executor()),
                               asio::execution::outstanding_work.tracked);
      // Offload takes a std::function, which must be copyable; the handler is not.
      auto shared = std::make_shared<decltype(handler)>(std::move(handler));
      read_offload_([span, fd, shared, back = std::move(back)]() mutable {
        std::string data(span.len, '\0');
        size_t got = 0;
        const int err = ReadAt(fd->get(), data.data(), span.len, span.offset, 0, &got);
        fd.reset();
        asio::post(back, [shared, err, data = std::move(data)]() mutable {
          std::move (*shared)(err, std::move(data));
        });
      });
    };
    auto [err, data] =
        co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(int, std::string)>(
            initiation, asio::use_awaitable);
    if (dropped_) co_return std::vector<Piece>{};
    if (err != 0) {
      log::warn("exec={} output spill: {}", id_, Error::Sys("pread", spill_path_, err).message());
      co_return std::vector<Piece>{};
    }
    // Dropped meanwhile up to oldest_ (its blocks perhaps punched while read): never sent.
    const uint64_t span_end = span.offset + span.len;
    if (span_end <= oldest_) {
      offset = oldest_;
      continue;
    }
    const size_t skip = static_cast<size_t>(std::max(span.offset, oldest_) - span.offset);
    data.erase(0, skip);
    out.push_back(Piece{span.offset + skip, span.stream, std::move(data)});
    co_return out;
  }
}

void ExecSession::Drop() {
  if (dropped_) return;
  dropped_ = true;
  ring_.clear();
  ring_size_ = 0;
  runs_.clear();
  unwritten_.clear();  // a job under way keeps its chunks and the file open to its end
  unwritten_bytes_ = 0;
  SetBehind(false);
  RemoveSpill();
  expiry_.cancel();
  Poke();
}

}  // namespace nsbox::runtime

#include "runtime/exec_session.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
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
}  // namespace

ExecSession::ExecSession(asio::any_io_executor ex, std::string exec_id, std::string command,
                         std::string spill_path, ExecLogLimits limits)
    : id_(std::move(exec_id)),
      command_(std::move(command)),
      started_at_(NowRfc3339()),
      spill_path_(std::move(spill_path)),
      limits_(limits),
      notify_(ex, std::chrono::steady_clock::time_point::max()),
      expiry_(ex, std::chrono::steady_clock::time_point::max()) {}

ExecSession::~ExecSession() {
  if (spill_fd_.valid()) ::unlink(spill_path_.c_str());
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
    oldest_ = chunk_end;
    runs_.clear();
    return;
  }
  if (!spill_fd_.valid()) {
    // <sandbox dir>/execs/<execId>.log; the directory may be gone (the sandbox deleted).
    const std::string dir = spill_path_.substr(0, spill_path_.rfind('/'));
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      log::warn("exec={} output spill: {}", id_, Error::Sys("mkdir", dir, errno).message());
    }
    spill_fd_.reset(
        ::open(spill_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!spill_fd_.valid()) {
      log::warn("exec={} output spill: {}; older output is dropped instead", id_,
                Error::Sys("open", spill_path_, errno).message());
      spill_failed_ = true;
      oldest_ = chunk_end;
      runs_.clear();
      return;
    }
  }
  size_t done = 0;
  while (done < chunk.data.size()) {
    ssize_t n = ::pwrite(spill_fd_.get(), chunk.data.data() + done, chunk.data.size() - done,
                         static_cast<off_t>(chunk.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      log::warn("exec={} output spill: {}; older output is dropped instead", id_,
                Error::Sys("pwrite", spill_path_, n < 0 ? errno : EIO).message());
      spill_failed_ = true;
      spill_fd_.reset();
      ::unlink(spill_path_.c_str());
      oldest_ = chunk_end;
      runs_.clear();
      return;
    }
    done += static_cast<size_t>(n);
  }
  if (runs_.empty() || runs_.back().second != chunk.stream) {
    runs_.emplace_back(chunk.offset, chunk.stream);
  }
  uint64_t new_oldest = oldest_;
  if (spill_end_ - oldest_ > limits_.spill_bytes) new_oldest = spill_end_ - limits_.spill_bytes;
  while (runs_.size() > ExecLogLimits::kMaxSpillRuns) {
    new_oldest = std::max(new_oldest, runs_[1].first);
    runs_.pop_front();
  }
  if (new_oldest > oldest_) DropSpilledBefore(new_oldest);
}

void ExecSession::DropSpilledBefore(uint64_t offset) {
  oldest_ = offset;
  while (runs_.size() >= 2 && runs_[1].first <= offset) runs_.pop_front();
  if (!runs_.empty() && runs_.front().first < offset) runs_.front().first = offset;
  // Give the dropped head's disk blocks back (whole 64 KiB steps; failure only costs space).
  const uint64_t punch_to = offset & ~uint64_t{0xffff};
  if (spill_fd_.valid() && punch_to > punched_) {
    (void)::fallocate(spill_fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      static_cast<off_t>(punched_), static_cast<off_t>(punch_to - punched_));
    punched_ = punch_to;
  }
}

std::vector<ExecSession::Piece> ExecSession::Read(uint64_t offset, size_t max) const {
  std::vector<Piece> out;
  if (dropped_) return out;
  offset = std::clamp(offset, oldest_, end_);
  size_t total = 0;
  // From the spill file.
  while (offset < spill_end_ && total < max && spill_fd_.valid() && !runs_.empty()) {
    auto it =
        std::upper_bound(runs_.begin(), runs_.end(), offset,
                         [](uint64_t o, const std::pair<uint64_t, int>& r) { return o < r.first; });
    if (it != runs_.begin()) --it;
    const uint64_t run_end = std::next(it) == runs_.end() ? spill_end_ : std::next(it)->first;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(run_end - offset, max - total));
    Piece piece{offset, it->second, std::string(len, '\0')};
    size_t got = 0;
    while (got < len) {
      ssize_t n = ::pread(spill_fd_.get(), piece.data.data() + got, len - got,
                          static_cast<off_t>(offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        log::warn("exec={} output spill: {}", id_,
                  Error::Sys("pread", spill_path_, n < 0 ? errno : EIO).message());
        return out;
      }
      got += static_cast<size_t>(n);
    }
    offset += len;
    total += len;
    out.push_back(std::move(piece));
  }
  if (offset < spill_end_) return out;  // the spill failed under a reader: what there is
  // From the ring.
  if (ring_.empty() || total >= max) return out;
  auto it = std::upper_bound(ring_.begin(), ring_.end(), offset,
                             [](uint64_t o, const Chunk& c) { return o < c.offset; });
  if (it != ring_.begin()) --it;
  for (; it != ring_.end() && total < max; ++it) {
    if (offset >= it->offset + it->data.size()) continue;
    const size_t skip = static_cast<size_t>(offset - it->offset);
    const size_t len = std::min(it->data.size() - skip, max - total);
    out.push_back(Piece{offset, it->stream, it->data.substr(skip, len)});
    offset += len;
    total += len;
  }
  return out;
}

void ExecSession::Drop() {
  if (dropped_) return;
  dropped_ = true;
  ring_.clear();
  ring_size_ = 0;
  runs_.clear();
  if (spill_fd_.valid()) {
    spill_fd_.reset();
    if (::unlink(spill_path_.c_str()) != 0 && errno != ENOENT) {
      log::warn("exec={} {}", id_, Error::Sys("unlink", spill_path_, errno).message());
    }
  }
  expiry_.cancel();
  Poke();
}

}  // namespace nsbox::runtime

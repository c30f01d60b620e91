#pragma once

// Internal to images/: what every step of the import pipeline (import.h) reads with: its
// progress and budget, a byte range of a file fed to libarchive and hashed on the way, and the
// small helpers of its messages. import_reader.cc defines what is not inline here.

#include <archive.h>
#include <nettle/sha2.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "images/gzip_check.h"
#include "images/import.h"
#include "images/import_budget.h"
#include "images/store.h"
#include "images/tar_stream.h"

namespace nsbox::images::internal {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// ImportProgress promises a report at least every 4 MiB read.
constexpr uint64_t kProgressStep = 4 * kMiB;

// 64 KiB: each read is where the import may pause for the daemon's other requests
// (ImportBudget::CheckCancel); a compressed piece of 64 KiB inflates in about a millisecond here.
constexpr size_t kReadChunk = 64 * 1024;

// Bad input: EINVAL with `message`.
Error BadInput(std::string message);

// Names from the input are quoted in messages with base/strings' Quote: escaped (a newline or an
// escape sequence in a tar entry's name reaches no terminal and no log line) and cut short.

// A name from the input as a note shows it, unquoted: escaped and cut short as Quote does.
std::string Shown(std::string_view s);

std::string Plural(uint64_t n, std::string_view one, std::string_view many);

bool IsHex(std::string_view s);

// ---- progress ----

// Also the import's budget (import_budget.h), which every reader and writer of the import has at
// hand through it.
class Progress {
 public:
  Progress(const ProgressFn& fn, ImportBudget& budget) : fn_(fn), budget_(budget) {}
  ImportBudget& budget() { return budget_; }
  void SetTotal(uint64_t total) { state_.bytes_total = total; }
  // A new phase or layer: reported at once. bytes_read starts from 0 in each phase.
  void Start(std::string_view phase, uint64_t layer, uint64_t layers) {
    if (phase != state_.phase) state_.bytes_read = 0;
    state_.phase = std::string(phase);
    state_.layer = layer;
    state_.layers = layers;
    reported_ = state_.bytes_read;
    Report();
  }
  // The source is read once more from its start (a compressed tar, decompressed after its scan).
  void Rewind() {
    state_.bytes_read = 0;
    reported_ = 0;
  }
  void Add(uint64_t n) {
    state_.bytes_read += n;
    if (state_.bytes_read - reported_ >= kProgressStep) {
      reported_ = state_.bytes_read;
      Report();
    }
  }

 private:
  void Report() {
    if (fn_) fn_(state_);
  }
  const ProgressFn& fn_;
  ImportBudget& budget_;
  ImportProgress state_;
  uint64_t reported_ = 0;
};

// ---- SHA-256 (nettle) ----

class Sha256 {
 public:
  Sha256() { sha256_init(&ctx_); }
  void Update(const void* data, size_t size) {
    sha256_update(&ctx_, size, static_cast<const uint8_t*>(data));
  }
  // "sha256:<hex>"; resets the context (nettle's digest does).
  std::string Digest() {
    uint8_t out[SHA256_DIGEST_SIZE];
    sha256_digest(&ctx_, sizeof out, out);
    return "sha256:" + HexOf(out, sizeof out);
  }

 private:
  struct sha256_ctx ctx_;
};

// ---- reading a byte range through libarchive ----

// The bytes [offset, offset + size) of a file, fed to libarchive's read callback and hashed on
// the way, so that a blob is verified in the same single pass that unpacks it. pread, not read:
// a blob is a range of the outer tar, and nothing depends on the fd's file position.
class RangeReader : public ByteSource {
 public:
  RangeReader(int fd, uint64_t offset, uint64_t size, std::string what, Progress* progress)
      : fd_(fd), offset_(offset), size_(size), what_(std::move(what)), progress_(progress) {
    buf_.resize(kReadChunk);
  }
  RangeReader(const RangeReader&) = delete;
  RangeReader& operator=(const RangeReader&) = delete;

  // Lets libarchive skip bytes unread (the header scan of an uncompressed tar). Skipped bytes are
  // not hashed, so this is only for readers whose digest nobody checks.
  void AllowSkip() { skip_ok_ = true; }
  // Checks a gzip stream's CRC-32 and length as it is read (GzipCheck), when the range starts
  // with one; FinishCheck, after Drain, says whether it ended whole.
  void CheckGzip() { check_gzip_ = true; }
  Status FinishCheck() { return gzip_ ? gzip_->Finish() : Ok(); }
  const std::optional<Error>& error() const { return error_; }
  uint64_t consumed() const { return pos_; }

  Result<std::string> Head(size_t n) override {
    std::string head(static_cast<size_t>(std::min<uint64_t>(n, size_)), '\0');
    ssize_t got;
    do {
      got = ::pread(fd_, head.data(), head.size(), static_cast<off_t>(offset_));
    } while (got < 0 && errno == EINTR);
    if (got < 0) return Error::Sys("pread", what_, errno);
    head.resize(static_cast<size_t>(got));
    return head;
  }

  // The next chunk: 0 bytes at the end of the range. A failure is also kept (error()), for
  // ArchiveError to report whole whichever libarchive reader met it.
  Result<size_t> Read(const void** data) override {
    auto n = ReadChunk(data);
    if (!n.ok() && !error_) error_ = n.error();
    return n;
  }

  // Skips up to `n` bytes when AllowSkip was called (and no gzip stream is being checked).
  uint64_t Skip(uint64_t n) override {
    if (!skip_ok_ || gzip_ || n == 0) return 0;
    n = std::min<uint64_t>(n, size_ - pos_);
    pos_ += n;
    if (progress_ != nullptr) progress_->Add(n);
    return n;
  }

 private:
  Result<size_t> ReadChunk(const void** data) {
    if (progress_ != nullptr) NSBOX_TRY(progress_->budget().CheckCancel());
    if (pos_ >= size_) return size_t{0};
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf_.size(), size_ - pos_));
    ssize_t n;
    do {
      n = ::pread(fd_, buf_.data(), want, static_cast<off_t>(offset_ + pos_));
    } while (n < 0 && errno == EINTR);
    if (n < 0) return Error::Sys("pread", what_, errno);
    if (n == 0) {
      return BadInput(what_ + ": truncated: the file ends " + std::to_string(size_ - pos_) +
                      " bytes early");
    }
    const auto got = static_cast<size_t>(n);
    if (check_gzip_ && pos_ == 0 &&
        GzipCheck::IsGzip(std::string_view(reinterpret_cast<const char*>(buf_.data()), got))) {
      gzip_ = std::make_unique<GzipCheck>();
    }
    if (gzip_) NSBOX_TRY(gzip_->Feed(buf_.data(), got));
    hash_.Update(buf_.data(), got);
    pos_ += got;
    if (progress_ != nullptr) progress_->Add(got);
    *data = buf_.data();
    return got;
  }

 public:
  // Reads what libarchive left unread (the end-of-archive blocks, a compressor's trailer), so
  // that the digest covers the whole blob.
  Status Drain() {
    const void* data;
    for (;;) {
      NSBOX_ASSIGN_OR_RETURN(size_t n, Read(&data));
      if (n == 0) return Ok();
    }
  }
  // "sha256:<hex>" of every byte read; call once, after Drain.
  std::string Digest() { return hash_.Digest(); }

  // For a raw libarchive reader (OpenRaw): a tar is read through a TarStream instead.
  static la_ssize_t ReadCallback(struct archive* a, void* self, const void** buffer) {
    auto* r = static_cast<RangeReader*>(self);
    auto n = r->Read(buffer);
    if (!n.ok()) {
      archive_set_error(a, n.error().code(), "%s", n.error().message().c_str());
      return -1;
    }
    return static_cast<la_ssize_t>(*n);
  }

 private:
  int fd_;
  uint64_t offset_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string what_;
  Progress* progress_;
  Sha256 hash_;
  bool skip_ok_ = false;
  bool check_gzip_ = false;
  std::unique_ptr<GzipCheck> gzip_;
  std::vector<unsigned char> buf_;
  std::optional<Error> error_;
};

using ArchiveReader = std::unique_ptr<struct archive, ArchiveReadFree>;

// What went wrong in libarchive: the reader's own error (a failed pread) when there is one,
// else libarchive's message about the data, as bad input.
Error ArchiveError(struct archive* a, const RangeReader& reader, std::string_view what);

// A libarchive reader of the bare decompressed stream of `reader`, compressed with gzip, zstd, xz
// or bzip2 (or not), detected from the data. Only these are enabled:
// archive_read_support_{format,filter}_all would also link every other format (and libxml2)
// into the static binaries. A tar is read through a TarStream (images/tar_stream.h), which
// enables the same.
Result<ArchiveReader> OpenRaw(RangeReader* reader, std::string_view what);

}  // namespace nsbox::images::internal

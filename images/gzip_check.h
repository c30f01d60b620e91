#pragma once

// Internal to images/: the check of a gzip stream's CRC-32 and length that libarchive leaves out,
// which the import's RangeReader (import_reader.h) runs on a root file system tarball.

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.h"

namespace nsbox::images::internal {

// ---- a gzip stream's own check ----

// Inflates a gzip stream as it is read and discards what it gives, for the checks libarchive
// leaves out: its gzip filter reads each member's trailer but compares neither the CRC-32 nor
// the length, so a flipped bit that still inflates passes as data. zlib checks both at each
// member's end. Used where no digest covers the bytes: a root file system tarball (ScanTar, which
// reads every source before anything is unpacked). Members follow each other (`cat a.gz b.gz`);
// bytes after the last one that are not a gzip member are ignored, as libarchive and gzip do.
class GzipCheck {
 public:
  GzipCheck() = default;
  ~GzipCheck() {
    if (started_) inflateEnd(&z_);
  }
  GzipCheck(const GzipCheck&) = delete;
  GzipCheck& operator=(const GzipCheck&) = delete;

  // Whether `head`, a stream's first bytes, starts a gzip member (RFC 1952: 1f 8b, deflate).
  static bool IsGzip(std::string_view head) {
    return head.size() >= 3 && head[0] == '\x1f' && head[1] == '\x8b' && head[2] == '\x08';
  }

  Status Feed(const unsigned char* data, size_t size) {
    while (size > 0 && !done_) {
      if (between_members_) {
        // A member ended: its next one, or the end of what is checked.
        const size_t take = std::min(size, 3 - head_.size());
        head_.append(reinterpret_cast<const char*>(data), take);
        data += take;
        size -= take;
        if (head_.size() < 3) return Ok();
        if (!IsGzip(head_)) {
          done_ = true;
          return Ok();
        }
        between_members_ = false;
        NSBOX_TRY(Start());
        const std::string head = std::move(head_);
        head_.clear();
        NSBOX_TRY(Inflate(reinterpret_cast<const unsigned char*>(head.data()), head.size()));
        continue;
      }
      if (!started_) NSBOX_TRY(Start());
      NSBOX_TRY(Inflate(data, size));
      data += consumed_;
      size -= consumed_;
    }
    return Ok();
  }
  // At the end of the stream: a member cut short is an error.
  Status Finish() {
    if (started_ && !between_members_ && !done_) {
      return Error(EINVAL, "the gzip stream is truncated (it ends inside a member)");
    }
    return Ok();
  }

 private:
  Status Start() {
    if (!started_) {
      z_ = z_stream{};
      // 15 + 16: a gzip wrapper, whose trailer zlib checks.
      if (inflateInit2(&z_, 15 + 16) != Z_OK) return Error(ENOMEM, "inflateInit2: out of memory");
      started_ = true;
    } else if (inflateReset(&z_) != Z_OK) {
      return Error(EINVAL, "inflateReset failed");
    }
    return Ok();
  }
  // Inflates from `data` until the member ends or the input is used up; consumed_ says how much
  // of it was taken.
  Status Inflate(const unsigned char* data, size_t size) {
    z_.next_in = const_cast<unsigned char*>(data);  // zlib's API is not const
    z_.avail_in = static_cast<uInt>(std::min<size_t>(size, UINT32_MAX));
    const uInt given = z_.avail_in;
    for (;;) {
      z_.next_out = out_;
      z_.avail_out = sizeof(out_);
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        between_members_ = true;
        break;
      }
      if (rc == Z_BUF_ERROR && z_.avail_in == 0) break;  // it needs more input
      if (rc != Z_OK) {
        return Error(EINVAL, std::string("corrupt gzip data (") +
                                 (z_.msg != nullptr ? z_.msg : "inflate " + std::to_string(rc)) +
                                 ")");
      }
      if (z_.avail_in == 0 && z_.avail_out != 0) break;
    }
    consumed_ = given - z_.avail_in;
    return Ok();
  }

  z_stream z_{};
  bool started_ = false;
  bool between_members_ = false;
  bool done_ = false;
  std::string head_;  // the first bytes after a member, until there are 3
  size_t consumed_ = 0;
  unsigned char out_[64 * 1024];
};

}  // namespace nsbox::images::internal

#pragma once

// Internal to images/: how the importer reads every tar (an outer tarball, each layer).
// libarchive parses it; TarAudit sees each byte of the (decompressed) tar before libarchive does
// and refuses what tar readers disagree on, so that an image installs what a reviewer saw with GNU
// tar or Python's tarfile, or is refused (issue 53).
//
// Why an audit beside libarchive: its API hands back each member's result, never the headers that
// made it, and it differs from GNU tar and Python's tarfile where they differ from each other:
// a pax `path` record over 1 MB is dropped with a warning and the ustar name used (both read the
// pax name); a global pax header ('g') is ignored (both apply its `path`, `uid`, ... to every
// member after it); a GNU long name and a pax path for one member, or two of either, give three
// names in three readers. The audit does not parse for nsbox (libarchive does): it follows the
// tar's framing, header by header, and refuses those members. Its framing is checked against
// libarchive's at every member (the member's data starts where both say), so a difference
// between the two (a size field one of them reads differently) is refused, not followed.
//
// Bounds (docs/images.md "Limits"), checked before libarchive reads the bytes: a pax header of at
// most kMaxPaxHeaderBytes, a GNU long name or link of at most kMaxPathBytes (+ its NUL); then, on
// what libarchive returns, a path or link target of at most kMaxPathBytes whose components have at
// most kMaxNameBytes.

#include <archive.h>
#include <archive_entry.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace nsbox::images::internal {

inline constexpr size_t kMaxPathBytes = 4095;  // PATH_MAX (4096) with its NUL
inline constexpr size_t kMaxNameBytes = 255;   // NAME_MAX: one component
// A pax header holds a path and a link target (4 KiB each) and the xattrs Linux keeps on one
// file (64 KiB of values), which libarchive's writer stores twice (SCHILY.xattr.* as they are,
// LIBARCHIVE.xattr.* in base64): 256 KiB is more than that, and a quarter of the 1 MiB libarchive
// itself takes.
inline constexpr size_t kMaxPaxHeaderBytes = 256 * 1024;

// The tar's framing, followed byte by byte (see above).
class TarAudit {
 public:
  // The next `size` bytes of the tar, in order. An error (EINVAL, naming the header by its byte
  // offset and ustar name) is final: every call after it returns it again.
  Status Feed(const unsigned char* data, size_t size);
  // `n` bytes the reader skipped unread: they must lie inside a member's data.
  Status Skip(uint64_t n);
  // libarchive returned a member whose data starts at `offset` (its position after the header);
  // `sparse`: it has a sparse map. It must be the next member the audit saw, its data starting
  // there (a GNU sparse 1.0 member's map is read from its data: anywhere within it).
  Status Check(uint64_t offset, bool sparse);
  // At libarchive's end of the archive: every member the audit saw was returned.
  Status Finish();

 private:
  enum class Mode { kHeader, kBody, kData, kSparseExtension, kEnd, kDamaged };
  struct Pending {  // the special headers read for the next member
    bool pax = false;
    bool long_name = false;
    bool long_link = false;
    bool sparse10 = false;
    std::optional<uint64_t> pax_size;
  };
  struct MemberAt {
    uint64_t data_start;
    uint64_t data_size;
    bool sparse10;
  };

  Status Fail(uint64_t at, std::string_view name, const std::string& why);
  Status Header(const unsigned char* h);
  Status EndOfBody();
  Status StartBody(char kind, uint64_t size, bool keep);
  void StartData(uint64_t size, bool sparse10);

  Mode mode_ = Mode::kHeader;
  uint64_t pos_ = 0;  // of the next byte
  unsigned char block_[512] = {};
  size_t block_fill_ = 0;
  uint64_t header_at_ = 0;   // where the header being handled starts
  std::string header_name_;  // its ustar name, for messages
  char body_kind_ = 0;
  bool keep_body_ = false;
  std::string body_;
  uint64_t body_left_ = 0;  // of the body's bytes (then its padding: remaining_)
  uint64_t remaining_ = 0;  // of the body or data, padding included
  Pending pending_;
  MemberAt member_{};             // the 'S' member whose extension blocks are being read
  std::deque<MemberAt> members_;  // seen, not yet returned by libarchive (a chunk's worth)
  std::optional<Error> error_;
};

// Where a TarStream's bytes come from (images/import_reader.h's RangeReader: a byte range of a
// file).
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // The first bytes, without reading them (how the compression is told).
  virtual Result<std::string> Head(size_t n) = 0;
  // The next chunk into *data: 0 bytes at the end.
  virtual Result<size_t> Read(const void** data) = 0;
  // Skips up to `n` bytes unread and says how many; 0 makes libarchive read through them.
  virtual uint64_t Skip(uint64_t n) = 0;
};

struct ArchiveReadFree {
  void operator()(struct archive* a) const { archive_read_free(a); }
};

// A tar read from `source`, bare or compressed with gzip, zstd, xz or bzip2 (told from its first
// bytes: a compressed one is decompressed by a raw libarchive reader whose output feeds the tar
// reader), every byte of the tar going through a TarAudit first.
class TarStream {
 public:
  // `what` names the tar in errors.
  static Result<std::unique_ptr<TarStream>> Open(ByteSource* source, std::string what);
  TarStream(const TarStream&) = delete;
  TarStream& operator=(const TarStream&) = delete;

  // The tar reader: for archive_read_data_block and archive_read_data_skip of the current member.
  struct archive* archive() const {
    return tar_.get();
  }
  bool compressed() const { return compressed_; }
  // Bytes of the tar consumed: after Next, where the member's data starts.
  uint64_t position() const { return static_cast<uint64_t>(archive_filter_bytes(tar_.get(), 0)); }

  // The next member into *entry; false at the end of the archive. Refused (EINVAL, "entry
  // 'NAME': ..."): what the audit refuses, a libarchive warning other than a name it could not
  // convert to the locale (it keeps such a name's bytes, as other readers do; any other warning
  // means it left something of the member out), a path or link target past kMaxPathBytes, a
  // component past kMaxNameBytes. libarchive's own errors are EINVAL "corrupt or truncated tar:
  // ..."; the source's (a failed pread, a cancelled import) keep their code.
  Result<bool> Next(struct archive_entry** entry);

 private:
  TarStream(ByteSource* source, std::string what) : source_(source), what_(std::move(what)) {}
  static la_ssize_t ReadCallback(struct archive* a, void* self, const void** buffer);
  static la_int64_t SkipCallback(struct archive* a, void* self, la_int64_t request);
  la_ssize_t Read(struct archive* a, const void** buffer);
  Error ArchiveError(std::string_view context) const;

  ByteSource* source_;
  std::string what_;
  std::unique_ptr<struct archive, ArchiveReadFree> raw_;  // the decompressor, when compressed
  std::unique_ptr<struct archive, ArchiveReadFree> tar_;
  bool compressed_ = false;
  std::vector<unsigned char> buf_;  // the decompressor's output
  TarAudit audit_;
  std::optional<Error> error_;  // the audit's or the source's, as the callbacks met it
};

}  // namespace nsbox::images::internal

#include "images/tar_stream.h"

#include <errno.h>

#include <algorithm>
#include <cstring>

#include "base/strings.h"

namespace nsbox::images::internal {

namespace {

constexpr size_t kBlock = 512;
constexpr size_t kDecompressChunk = 256 * 1024;
// No member is this large (2^62 bytes); a size past it is refused before its padding overflows.
constexpr uint64_t kMaxMemberBytes = uint64_t{1} << 62;

uint64_t Padded(uint64_t size) { return (size + kBlock - 1) / kBlock * kBlock; }

// A numeric field of a header (the size) as every tar reader reads it alike, or nullopt: octal
// digits after optional blanks, then only blanks or NULs (libarchive stops at the first other
// byte, Python's tarfile refuses it, or reads "0o17" and "1_0" as Python literals); or base-256,
// a first byte of 0x80 (GNU's, positive). Anything else is refused rather than guessed.
std::optional<uint64_t> ParseNumber(const unsigned char* f, size_t n) {
  uint64_t v = 0;
  if (f[0] == 0x80) {
    for (size_t i = 1; i < n; ++i) {
      if (v >> 55) return std::nullopt;
      v = (v << 8) | f[i];
    }
    return v;
  }
  size_t i = 0;
  while (i < n && (f[i] == ' ' || f[i] == '\t')) ++i;
  while (i < n && f[i] >= '0' && f[i] <= '7') {
    if (v >> 60) return std::nullopt;
    v = v * 8 + static_cast<uint64_t>(f[i] - '0');
    ++i;
  }
  while (i < n && (f[i] == ' ' || f[i] == '\t' || f[i] == '\0')) ++i;
  if (i != n) return std::nullopt;
  return v;
}

// Whether the header's checksum holds, as libarchive checks it (the unsigned or the signed sum of
// its bytes, the checksum field counted as spaces).
bool ChecksumHolds(const unsigned char* h) {
  int64_t want = 0;
  size_t i = 148;
  while (i < 156 && (h[i] == ' ' || h[i] == '\t')) ++i;
  for (; i < 156 && h[i] >= '0' && h[i] <= '7'; ++i) want = want * 8 + (h[i] - '0');
  int64_t unsigned_sum = 0;
  int64_t signed_sum = 0;
  for (size_t k = 0; k < kBlock; ++k) {
    const bool in_field = k >= 148 && k < 156;
    unsigned_sum += in_field ? ' ' : h[k];
    signed_sum += in_field ? ' ' : static_cast<signed char>(h[k]);
  }
  return want == unsigned_sum || want == signed_sum;
}

std::string_view Field(const unsigned char* h, size_t at, size_t n) {
  const char* p = reinterpret_cast<const char*>(h) + at;
  return std::string_view(p, strnlen(p, n));
}

// A pax header's records ("LEN KEY=VALUE\n", LEN counting the whole record), as libarchive reads
// them; `fn(key, value)` for each. False when one is malformed (libarchive then ignores the rest
// with a warning).
template <typename Fn>
bool ForEachPaxRecord(std::string_view body, Fn fn) {
  size_t at = 0;
  while (at < body.size()) {
    size_t i = at;
    uint64_t len = 0;
    while (i < body.size() && body[i] >= '0' && body[i] <= '9') {
      len = len * 10 + static_cast<uint64_t>(body[i] - '0');
      if (len > body.size()) return false;
      ++i;
    }
    if (i == at || i >= body.size() || body[i] != ' ') return false;
    if (len < i - at + 2 || len > body.size() - at || body[at + len - 1] != '\n') return false;
    const std::string_view record = body.substr(i + 1, at + len - 1 - (i + 1));
    const size_t eq = record.find('=');
    if (eq == std::string_view::npos || eq == 0) return false;
    if (!fn(record.substr(0, eq), record.substr(eq + 1))) return false;
    at += len;
  }
  return true;
}

bool AllDigits(std::string_view s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// gzip, zstd, xz, bzip2: the compressions libarchive is given (their magic numbers).
bool LooksCompressed(std::string_view head) {
  using namespace std::string_view_literals;
  for (std::string_view magic :
       {"\x1f\x8b"sv, "\x28\xb5\x2f\xfd"sv, "\xfd\x37\x7a\x58\x5a\x00"sv, "BZh"sv}) {
    if (head.substr(0, magic.size()) == magic) return true;
  }
  return false;
}

}  // namespace

// ---- TarAudit ----

Status TarAudit::Fail(uint64_t at, std::string_view name, const std::string& why) {
  std::string where = "the tar header at byte " + std::to_string(at);
  if (!name.empty()) where += " (ustar name " + Quote(name) + ")";
  error_ = Error(EINVAL, where + ": " + why);
  return *error_;
}

Status TarAudit::Feed(const unsigned char* data, size_t size) {
  if (error_) return *error_;
  while (size > 0) {
    switch (mode_) {
      case Mode::kEnd:      // after the end-of-archive block: no tar reader looks further
      case Mode::kDamaged:  // libarchive refuses the archive there (Check fails if it goes on)
        pos_ += size;
        return Ok();
      case Mode::kBody:
      case Mode::kData: {
        const auto take = static_cast<size_t>(std::min<uint64_t>(size, remaining_));
        if (mode_ == Mode::kBody) {
          const auto body = static_cast<size_t>(std::min<uint64_t>(take, body_left_));
          if (keep_body_) body_.append(reinterpret_cast<const char*>(data), body);
          body_left_ -= body;
        }
        data += take;
        size -= take;
        pos_ += take;
        remaining_ -= take;
        if (remaining_ == 0) {
          if (mode_ == Mode::kBody) {
            NSBOX_TRY(EndOfBody());
          } else {
            mode_ = Mode::kHeader;
          }
        }
        break;
      }
      case Mode::kHeader:
      case Mode::kSparseExtension: {
        const size_t take = std::min(size, kBlock - block_fill_);
        std::memcpy(block_ + block_fill_, data, take);
        block_fill_ += take;
        data += take;
        size -= take;
        pos_ += take;
        if (block_fill_ < kBlock) break;
        block_fill_ = 0;
        if (mode_ == Mode::kHeader) {
          NSBOX_TRY(Header(block_));
        } else if (block_[504] == 0) {  // an old GNU sparse header's last extension block
          StartData(member_.data_size, false);
        }
        break;
      }
    }
  }
  return Ok();
}

Status TarAudit::Skip(uint64_t n) {
  if (error_) return *error_;
  if (mode_ == Mode::kEnd || mode_ == Mode::kDamaged) {
    pos_ += n;
    return Ok();
  }
  if (mode_ != Mode::kData || n > remaining_) {
    return Fail(header_at_, header_name_,
                "the reader skipped " + std::to_string(n) +
                    " bytes that are not the member's data (the archive's framing is ambiguous)");
  }
  pos_ += n;
  remaining_ -= n;
  if (remaining_ == 0) mode_ = Mode::kHeader;
  return Ok();
}

Status TarAudit::Header(const unsigned char* h) {
  header_at_ = pos_ - kBlock;
  if (std::all_of(h, h + kBlock, [](unsigned char c) { return c == 0; })) {
    // The end of the archive for libarchive, GNU tar and Python's tarfile alike.
    mode_ = Mode::kEnd;
    if (pending_.pax || pending_.long_name || pending_.long_link) {
      return Fail(header_at_, "", "the archive ends after a member's extended headers");
    }
    return Ok();
  }
  if (!ChecksumHolds(h)) {
    // Not a header (noise, a damaged archive): libarchive refuses it with its own message ("not
    // a tar archive", "damaged tar archive"); the audit judges nothing after it.
    mode_ = Mode::kDamaged;
    return Ok();
  }
  const bool ustar = std::memcmp(h + 257, "ustar\0", 6) == 0;
  header_name_ = std::string(Field(h, 0, 100));
  if (ustar && h[345] != 0) header_name_ = std::string(Field(h, 345, 155)) + "/" + header_name_;
  const char type = static_cast<char>(h[156]);
  const std::optional<uint64_t> size = ParseNumber(h + 124, 12);
  if (!size.has_value() || *size > kMaxMemberBytes) {
    return Fail(header_at_, header_name_,
                "its size field is not a number every tar reader reads alike");
  }
  const bool any_pending = pending_.pax || pending_.long_name || pending_.long_link;
  switch (type) {
    case 'x':
    case 'X':  // Solaris's name for it; libarchive, GNU tar and Python read it as 'x'
      if (pending_.pax) {
        return Fail(header_at_, header_name_,
                    "a second pax header for one member (libarchive, GNU tar and Python's tarfile "
                    "each take another's name)");
      }
      if (pending_.long_name || pending_.long_link) {
        return Fail(header_at_, header_name_,
                    "a pax header and a GNU long name for one member (tar readers disagree on "
                    "which names it)");
      }
      pending_.pax = true;
      return StartBody('x', *size, true);
    case 'g':
      if (any_pending) {
        return Fail(header_at_, header_name_, "a global pax header among a member's own headers");
      }
      return StartBody('g', *size, true);
    case 'L':
    case 'K': {
      bool& seen = type == 'L' ? pending_.long_name : pending_.long_link;
      if (seen || pending_.pax) {
        return Fail(header_at_, header_name_,
                    std::string(seen ? "a second GNU long " : "a pax header and a GNU long ") +
                        (type == 'L' ? "name" : "link") +
                        " for one member (tar readers disagree on which names it)");
      }
      seen = true;
      return StartBody(type, *size, false);
    }
    case '0':
    case '\0':
    case '7':  // contiguous: a regular file to every reader
    case '1':
    case '2':
    case '3':
    case '4':
    case '5':
    case '6':
    case 'S':
      break;
    default:
      // 'A' (Solaris ACLs), 'D', 'M', 'N', 'V' (GNU's dump directories, multi-volume parts,
      // rename scripts, volume labels) and unknown types: libarchive gives each its own meaning,
      // Python's tarfile reads most as regular files. No image tool writes them.
      return Fail(header_at_, header_name_,
                  std::string("a member of type '") + (type >= 0x21 && type < 0x7f ? type : '?') +
                      "', which tar readers do not read alike");
  }
  // A member.
  const uint64_t data = pending_.pax_size.value_or(*size);
  if (type >= '1' && type <= '6' && data != 0) {
    // libarchive and Python take no data after a link, device, directory or FIFO whatever its
    // size says (libarchive even guesses, for a hard link); GNU tar may skip it.
    return Fail(header_at_, header_name_,
                "a " + std::string(type == '5' ? "directory" : "link or special file") +
                    " whose size says " + std::to_string(data) +
                    " bytes of data follow it (tar readers disagree on whether they do)");
  }
  if ((type == '1' || type == '2') && h[157] == 0) {
    // libarchive 3.6 and 3.7 then drop the target of a pax linkpath or GNU long link (the
    // member becomes a link to nothing); GNU tar and Python use it. Writers put the target, cut
    // to 100 bytes, in the ustar field too.
    return Fail(header_at_, header_name_,
                "a link whose ustar link name is empty (libarchive ignores a longer target given "
                "elsewhere, other tar readers use it)");
  }
  if (!ustar && type != 'S' && h[345] != 0) {
    // Python's tarfile prepends those bytes to the name as a ustar prefix whatever the magic;
    // libarchive and GNU tar read them as times (GNU) or nothing (v7).
    return Fail(header_at_, header_name_,
                "bytes in the prefix field of a header that is not ustar (Python's tarfile reads "
                "them as part of the name, libarchive does not)");
  }
  const bool sparse10 = pending_.sparse10;
  pending_ = Pending{};
  if (type == 'S' && h[482] != 0) {  // an old GNU sparse header with extension blocks after it
    member_ = MemberAt{0, data, false};
    mode_ = Mode::kSparseExtension;
    return Ok();
  }
  StartData(data, sparse10);
  return Ok();
}

Status TarAudit::StartBody(char kind, uint64_t size, bool keep) {
  const uint64_t limit = (kind == 'L' || kind == 'K') ? kMaxPathBytes + 1 : kMaxPaxHeaderBytes;
  if (size > limit) {
    const char* what = kind == 'x'   ? "a pax header"
                       : kind == 'g' ? "a global pax header"
                       : kind == 'L' ? "a GNU long name"
                                     : "a GNU long link";
    return Fail(header_at_, header_name_,
                std::string(what) + " of " + std::to_string(size) + " bytes, more than the " +
                    std::to_string(limit) + " nsbox reads");
  }
  body_kind_ = kind;
  keep_body_ = keep;
  body_.clear();
  body_left_ = size;
  remaining_ = Padded(size);
  mode_ = Mode::kBody;
  if (remaining_ == 0) return EndOfBody();
  return Ok();
}

Status TarAudit::EndOfBody() {
  mode_ = Mode::kHeader;
  if (body_kind_ == 'x') {
    std::string bad;
    const bool ok = ForEachPaxRecord(body_, [&](std::string_view key, std::string_view value) {
      if (key == "size") {
        if (!AllDigits(value)) {
          bad = "its size record " + Quote(value) + " is not a decimal number";
          return false;
        }
        uint64_t v = 0;
        for (char c : value) v = v * 10 + static_cast<uint64_t>(c - '0');
        pending_.pax_size = v;
      } else if (key == "GNU.sparse.major") {
        pending_.sparse10 = value == "1";
      }
      return true;
    });
    if (!ok) {
      return Fail(header_at_, header_name_,
                  bad.empty() ? "a malformed pax header (libarchive ignores its records)" : bad);
    }
  } else if (body_kind_ == 'g') {
    std::string key_set;
    const bool ok = ForEachPaxRecord(body_, [&](std::string_view key, std::string_view) {
      if (key == "comment") return true;  // git archive's commit id: no reader applies it
      key_set = std::string(key);
      return false;
    });
    if (!ok && key_set.empty()) {
      return Fail(header_at_, header_name_, "a malformed global pax header");
    }
    if (!key_set.empty()) {
      return Fail(header_at_, header_name_,
                  "a global pax header sets " + Quote(key_set) +
                      ", which GNU tar and Python's tarfile apply to every member after it and "
                      "libarchive ignores");
    }
  }
  body_.clear();
  return Ok();
}

void TarAudit::StartData(uint64_t size, bool sparse10) {
  members_.push_back(MemberAt{pos_, size, sparse10});
  remaining_ = Padded(size);
  mode_ = remaining_ == 0 ? Mode::kHeader : Mode::kData;
}

Status TarAudit::Check(uint64_t offset, bool sparse) {
  if (error_) return *error_;
  if (members_.empty()) {
    return Fail(offset, "",
                "libarchive read a member whose data starts here, where the tar's headers have "
                "none (the archive's framing is ambiguous)");
  }
  const MemberAt m = members_.front();
  members_.pop_front();
  const bool ok = offset == m.data_start || (sparse && m.sparse10 && offset >= m.data_start &&
                                             offset - m.data_start <= m.data_size);
  if (!ok) {
    return Fail(offset, "",
                "libarchive read a member whose data starts here, the tar's headers one whose "
                "data starts at byte " +
                    std::to_string(m.data_start) + " (the archive's framing is ambiguous)");
  }
  return Ok();
}

Status TarAudit::Finish() {
  if (error_) return *error_;
  if (!members_.empty()) {
    return Fail(members_.front().data_start, "",
                "libarchive ended the archive before a member the tar's headers have (the "
                "archive's framing is ambiguous)");
  }
  return Ok();
}

// ---- TarStream ----

Result<std::unique_ptr<TarStream>> TarStream::Open(ByteSource* source, std::string what) {
  std::unique_ptr<TarStream> s(new TarStream(source, std::move(what)));
  Result<std::string> head = source->Head(6);
  if (!head.ok()) return std::move(head).error();
  if (LooksCompressed(*head)) {
    // A raw reader decompresses (libarchive detects which compression from the data); the tar
    // reader reads its output through ReadCallback, so that the audit sees the tar's bytes.
    s->raw_.reset(archive_read_new());
    if (!s->raw_) return Error(ENOMEM, "archive_read_new: out of memory");
    archive_read_support_format_raw(s->raw_.get());
    archive_read_support_filter_gzip(s->raw_.get());
    archive_read_support_filter_zstd(s->raw_.get());
    archive_read_support_filter_xz(s->raw_.get());
    archive_read_support_filter_bzip2(s->raw_.get());
    struct archive_entry* e = nullptr;
    if (archive_read_open2(s->raw_.get(), s.get(), nullptr, &TarStream::ReadCallback, nullptr,
                           nullptr) != ARCHIVE_OK ||
        archive_read_next_header(s->raw_.get(), &e) != ARCHIVE_OK) {
      if (s->error_) return Error(*s->error_).Context(s->what_);
      const char* msg = archive_error_string(s->raw_.get());
      return Error(EINVAL, s->what_ + ": cannot decompress: " +
                               (msg != nullptr ? msg : "unsupported compression"));
    }
    s->compressed_ = archive_filter_code(s->raw_.get(), 0) != ARCHIVE_FILTER_NONE;
    s->buf_.resize(kDecompressChunk);
  }
  s->tar_.reset(archive_read_new());
  if (!s->tar_) return Error(ENOMEM, "archive_read_new: out of memory");
  archive_read_support_format_tar(s->tar_.get());
  if (archive_read_open2(s->tar_.get(), s.get(), nullptr, &TarStream::ReadCallback,
                         &TarStream::SkipCallback, nullptr) != ARCHIVE_OK) {
    if (s->error_) return Error(*s->error_).Context(s->what_);
    return s->ArchiveError(s->what_ + ": not a tar archive (or an unsupported compression)");
  }
  return s;
}

la_ssize_t TarStream::ReadCallback(struct archive* a, void* self, const void** buffer) {
  return static_cast<TarStream*>(self)->Read(a, buffer);
}

la_ssize_t TarStream::Read(struct archive* a, const void** buffer) {
  const auto fail = [&](Error e) -> la_ssize_t {
    archive_set_error(a, e.code(), "%s", e.message().c_str());
    if (!error_) error_ = std::move(e);
    return -1;
  };
  if (error_) return fail(*error_);
  if (a == raw_.get() || !raw_) {  // the compressed bytes, or a bare tar's: from the source
    auto n = source_->Read(buffer);
    if (!n.ok()) return fail(std::move(n).error());
    if (a == tar_.get()) {
      if (auto st = audit_.Feed(static_cast<const unsigned char*>(*buffer), *n); !st.ok()) {
        return fail(std::move(st).error());
      }
    }
    return static_cast<la_ssize_t>(*n);
  }
  // The tar reader of a compressed tar: the decompressor's output.
  const la_ssize_t n = archive_read_data(raw_.get(), buf_.data(), buf_.size());
  if (n < 0) {
    if (error_) return fail(*error_);  // the source failed under the decompressor
    const char* msg = archive_error_string(raw_.get());
    return fail(Error(EINVAL, std::string("cannot decompress: ") +
                                  (msg != nullptr ? msg : "corrupt compressed data")));
  }
  if (auto st = audit_.Feed(buf_.data(), static_cast<size_t>(n)); !st.ok()) {
    return fail(std::move(st).error());
  }
  *buffer = buf_.data();
  return n;
}

la_int64_t TarStream::SkipCallback(struct archive* a, void* self, la_int64_t request) {
  auto* s = static_cast<TarStream*>(self);
  if (s->raw_ || request <= 0) return 0;  // 0: libarchive reads through instead
  const uint64_t n = s->source_->Skip(static_cast<uint64_t>(request));
  if (n == 0) return 0;
  if (auto st = s->audit_.Skip(n); !st.ok()) {
    archive_set_error(a, st.error().code(), "%s", st.error().message().c_str());
    if (!s->error_) s->error_ = std::move(st).error();
    return ARCHIVE_FATAL;
  }
  return static_cast<la_int64_t>(n);
}

Error TarStream::ArchiveError(std::string_view context) const {
  const char* msg = archive_error_string(tar_.get());
  return Error(EINVAL, std::string(context) + ": " +
                           (msg != nullptr ? msg : "corrupt or truncated archive"));
}

Result<bool> TarStream::Next(struct archive_entry** entry) {
  const int rc = archive_read_next_header(tar_.get(), entry);
  if (error_) return *error_;
  if (rc == ARCHIVE_EOF) {
    NSBOX_TRY(audit_.Finish());
    return false;
  }
  // ARCHIVE_RETRY is a damaged header (a bad checksum) that libarchive would skip over: refused,
  // like any corruption.
  if (rc != ARCHIVE_OK && rc != ARCHIVE_WARN) return ArchiveError("corrupt or truncated tar");
  const char* name_c = archive_entry_pathname(*entry);
  if (name_c == nullptr) name_c = archive_entry_pathname_utf8(*entry);
  const std::string_view name = name_c != nullptr ? name_c : "";
  const std::string what = "entry " + Quote(name);
  if (rc == ARCHIVE_WARN) {
    // libarchive could not convert a name to the locale (nsboxd runs in the C locale; pax names
    // are UTF-8): it keeps the name's bytes, as GNU tar and Python do. Any other warning means it
    // left part of the member's headers out (a malformed or oversized pax record: it then uses
    // the ustar name), which other readers would not.
    const char* msg = archive_error_string(tar_.get());
    const std::string_view text = msg != nullptr ? msg : "";
    if (archive_errno(tar_.get()) != EILSEQ ||
        text.find("to current locale") == std::string_view::npos) {
      return Error(EINVAL, what + ": " + std::string(text) +
                               " (libarchive left part of its headers out; other tar readers "
                               "would not)");
    }
  }
  NSBOX_TRY(audit_.Check(position(), archive_entry_sparse_count(*entry) > 0));
  const auto check_path = [&](std::string_view path, std::string_view kind) -> Status {
    if (path.size() > kMaxPathBytes) {
      return Error(EINVAL, what + ": its " + std::string(kind) + " has " +
                               std::to_string(path.size()) + " bytes, more than the " +
                               std::to_string(kMaxPathBytes) + " of a Linux path");
    }
    for (std::string_view part : Split(path, '/')) {
      if (part.size() > kMaxNameBytes) {
        return Error(EINVAL, what + ": its " + std::string(kind) + " has a component of " +
                                 std::to_string(part.size()) + " bytes, more than the " +
                                 std::to_string(kMaxNameBytes) + " of a Linux file name");
      }
    }
    return Ok();
  };
  NSBOX_TRY(check_path(name, "path"));
  if (const char* link = archive_entry_hardlink(*entry); link != nullptr) {
    NSBOX_TRY(check_path(link, "hard link's target"));
  }
  if (const char* link = archive_entry_symlink(*entry); link != nullptr) {
    // A symlink's text is data, not a path of the image (components are not looked at), but a
    // Linux symlink holds at most PATH_MAX - 1 bytes.
    if (std::strlen(link) > kMaxPathBytes) {
      return Error(EINVAL, what + ": a symlink target of " + std::to_string(std::strlen(link)) +
                               " bytes, more than the " + std::to_string(kMaxPathBytes) +
                               " Linux keeps");
    }
  }
  return true;
}

}  // namespace nsbox::images::internal

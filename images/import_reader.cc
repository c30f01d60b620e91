#include "images/import_reader.h"

#include <archive.h>

#include <string>
#include <string_view>
#include <utility>

#include "base/strings.h"

namespace nsbox::images::internal {

Error BadInput(std::string message) { return Error(EINVAL, std::move(message)); }

std::string Shown(std::string_view s) {
  constexpr size_t kMax = 256;
  if (s.size() <= kMax) return EscapeControl(s);
  return EscapeControl(s.substr(0, kMax)) + "... (" + std::to_string(s.size()) + " bytes)";
}

std::string Plural(uint64_t n, std::string_view one, std::string_view many) {
  return std::to_string(n) + " " + std::string(n == 1 ? one : many);
}

bool IsHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

Error ArchiveError(struct archive* a, const RangeReader& reader, std::string_view what) {
  if (reader.error().has_value()) {
    return Error(reader.error()->code(), std::string(what) + ": " + reader.error()->message());
  }
  const char* msg = archive_error_string(a);
  return BadInput(std::string(what) + ": " +
                  (msg != nullptr ? msg : "corrupt or truncated archive"));
}

Result<ArchiveReader> OpenRaw(RangeReader* reader, std::string_view what) {
  ArchiveReader a(archive_read_new());
  if (!a) return Error(ENOMEM, "archive_read_new: out of memory");
  archive_read_support_format_raw(a.get());
  archive_read_support_filter_gzip(a.get());
  archive_read_support_filter_zstd(a.get());
  archive_read_support_filter_xz(a.get());
  archive_read_support_filter_bzip2(a.get());
  if (archive_read_open2(a.get(), reader, nullptr, &RangeReader::ReadCallback, nullptr, nullptr) !=
      ARCHIVE_OK) {
    return ArchiveError(a.get(), *reader, std::string(what) + ": cannot decompress");
  }
  return a;
}

}  // namespace nsbox::images::internal

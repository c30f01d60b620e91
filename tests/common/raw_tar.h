#pragma once

// Tar members written byte by byte, as an attacker writes them: headers whose fields say what the
// test wants (a ustar name and a different pax path, a global pax header, a GNU long name, a size
// no reader agrees on), which no archive library would write. image_builder.h writes honest
// archives with libarchive; these are for the ones it would refuse to.
//
//   std::string tar = raw_tar::Pax({raw_tar::Record("path", "usr/share/doc/x")}) +
//                     raw_tar::File("etc/ustar-name", "data") + raw_tar::kEnd;

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace nsbox::testutil::raw_tar {

inline constexpr std::string_view kUstarMagic(
    "ustar\0"
    "00",
    8);
inline constexpr std::string_view kGnuMagic("ustar  \0", 8);
// The end of an archive: two zero blocks.
inline const std::string kEnd(1024, '\0');

// One 512-byte header: mode 0644, owner 0:0, a fixed mtime. `tweak` may change any byte before
// the checksum is computed.
template <typename Tweak>
std::string Header(std::string_view name, uint64_t size, char type, std::string_view magic,
                   std::string_view link, Tweak tweak) {
  std::string h(512, '\0');
  std::memcpy(&h[0], name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(&h[100], 8, "%07o", 0644);
  std::snprintf(&h[108], 8, "%07o", 0);
  std::snprintf(&h[116], 8, "%07o", 0);
  std::snprintf(&h[124], 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(&h[136], 12, "%011o", 1700000000);
  h[156] = type;
  std::memcpy(&h[157], link.data(), std::min<size_t>(link.size(), 100));
  std::memcpy(&h[257], magic.data(), magic.size());
  tweak(h);
  std::memset(&h[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(&h[148], 8, "%06o", sum);
  return h;
}
inline std::string Header(std::string_view name, uint64_t size, char type = '0',
                          std::string_view magic = kUstarMagic, std::string_view link = "") {
  return Header(name, size, type, magic, link, [](std::string&) {});
}

// `data` and the zeros that fill its last block.
inline std::string Padded(std::string data) {
  data.append((512 - data.size() % 512) % 512, '\0');
  return data;
}

// A pax record, "LEN KEY=VALUE\n", LEN counting the whole record.
inline std::string Record(std::string_view key, std::string_view value) {
  const std::string body = " " + std::string(key) + "=" + std::string(value) + "\n";
  size_t n = body.size() + 1;
  while (std::to_string(n).size() + body.size() != n) n = std::to_string(n).size() + body.size();
  return std::to_string(n) + body;
}

// A special header ('x' pax, 'g' global pax, 'L' GNU long name, 'K' GNU long link) and its body.
inline std::string Special(char type, const std::string& body,
                           std::string_view name = "PaxHeader") {
  return Header(name, body.size(), type) + Padded(body);
}
// A pax header ('x') of `records`, for the member after it.
inline std::string Pax(const std::vector<std::string>& records) {
  std::string body;
  for (const std::string& r : records) body += r;
  return Special('x', body);
}
// A regular file.
inline std::string File(std::string_view name, const std::string& data = "x") {
  return Header(name, data.size()) + Padded(data);
}

}  // namespace nsbox::testutil::raw_tar

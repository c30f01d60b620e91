#include "base/strings.h"

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace nsbox {

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string_view::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::vector<std::string> Words(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find_first_of(" \n\t", i);
    if (j == std::string_view::npos) j = s.size();
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

bool Contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string Join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (const std::string& s : v) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

namespace {

// The length of the well-formed UTF-8 sequence at the start of `s` (Unicode 15, Table 3-7), 0 when
// there is none; *cp is its code point.
size_t Utf8Sequence(std::string_view s, uint32_t* cp) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  size_t n;
  unsigned char lo = 0x80;
  unsigned char hi = 0xbf;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    *cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    *cp = c & 0x0f;
    if (c == 0xe0) lo = 0xa0;  // no overlongs
    if (c == 0xed) hi = 0x9f;  // no surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    *cp = c & 0x07;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    const unsigned char t = b(i);
    if (t < (i == 1 ? lo : 0x80) || t > (i == 1 ? hi : 0xbf)) return 0;
    *cp = (*cp << 6) | (t & 0x3f);
  }
  return n;
}

// Code points a terminal acts on or that reorder what is shown: C1 controls, the bidirectional
// embeddings and overrides, and the isolates.
bool IsHiddenControl(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

void AppendHexByte(std::string& out, unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  out += kHex[c >> 4];
  out += kHex[c & 15];
}

// Calls `visible(run)` for each run of bytes shown as they are, `escaped(byte)` for each byte to
// escape; stops early when a callback returns false.
template <typename Visible, typename Escaped>
void Scan(std::string_view s, Visible visible, Escaped escaped) {
  size_t start = 0;
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t n = c < 0x80 ? 1 : Utf8Sequence(s.substr(i), &cp);
    const bool escape = c < 0x80 || n == 0 || IsHiddenControl(cp);
    if (!escape) {
      i += n;
      continue;
    }
    if (i > start && !visible(s.substr(start, i - start))) return;
    const size_t len = n == 0 ? 1 : n;  // a byte that starts no sequence goes alone
    for (size_t k = 0; k < len; ++k) {
      if (!escaped(static_cast<unsigned char>(s[i + k]))) return;
    }
    i += len;
    start = i;
  }
  if (i > start) visible(s.substr(start, i - start));
}

}  // namespace

std::string EscapeControl(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  Scan(
      s,
      [&](std::string_view run) {
        out += run;
        return true;
      },
      [&](unsigned char c) {
        if (c == '\n') {
          out += "\\n";
        } else if (c == '\r') {
          out += "\\r";
        } else if (c == '\t') {
          out += "\\t";
        } else {
          AppendHexByte(out, c);
        }
        return true;
      });
  return out;
}

bool NeedsEscape(std::string_view s) {
  bool needs = false;
  Scan(
      s, [](std::string_view) { return true; },
      [&](unsigned char) {
        needs = true;
        return false;
      });
  return needs;
}

std::string Quote(std::string_view s, size_t max) {
  if (s.size() <= max) return "'" + EscapeControl(s) + "'";
  return "'" + EscapeControl(s.substr(0, max)) + "'... (" + std::to_string(s.size()) + " bytes)";
}

std::string NowRfc3339() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm {};
  ::gmtime_r(&ts.tv_sec, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
  return buf;
}

}  // namespace nsbox

#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace nsbox {

// The pieces of `s` between each `sep`, empty ones included ("a,,b" gives "a", "", "b"; "" gives
// one empty piece). The views point into `s`.
std::vector<std::string_view> Split(std::string_view s, char sep);

// The non-empty words of `s` separated by spaces, tabs or newlines (a cgroup file's list).
std::vector<std::string> Words(std::string_view s);

// Whether `v` holds `s`.
bool Contains(const std::vector<std::string>& v, std::string_view s);

// The strings of `v` with `sep` between them ("" for none).
std::string Join(const std::vector<std::string>& v, std::string_view sep);

// The value of a hexadecimal digit (0-9, a-f, A-F), or -1.
constexpr int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// `s` with what a terminal would act on made visible, for every text that reaches a terminal or a
// log line from outside nsbox (a name from an image or from inside a sandbox, a server's message):
// C0 control bytes and DEL become `\xNN` (`\n`, `\r` and `\t` by their letters), so that a name
// can neither move the cursor, retitle the window or clear the screen nor end a log line and forge
// the next; C1 controls (U+0080 to U+009F, which terminals also obey), the bidirectional overrides
// and isolates (U+202A to U+202E, U+2066 to U+2069: text shown in another order than it is) and
// bytes that are not UTF-8 become `\xNN` for each of their bytes. Other text, UTF-8 included, is
// unchanged; a backslash is left as it is.
std::string EscapeControl(std::string_view s);

// Whether EscapeControl would change `s`.
bool NeedsEscape(std::string_view s);

// `s` in single quotes for a message, escaped (EscapeControl); past `max` bytes, its first `max`
// bytes and "... (N bytes)" after the closing quote, so that a hostile megabyte-long name costs a
// message no more than a line.
std::string Quote(std::string_view s, size_t max = 256);

// Now, as api.md writes times: RFC 3339 UTC with milliseconds, 2026-11-30T09:00:00.000Z.
std::string NowRfc3339();

}  // namespace nsbox

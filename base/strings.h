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

// Now, as api.md writes times: RFC 3339 UTC with milliseconds, 2026-11-30T09:00:00.000Z.
std::string NowRfc3339();

}  // namespace nsbox

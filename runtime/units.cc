#include "runtime/units.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

namespace nsbox::runtime {

namespace {

Error Bad(std::string_view flag, std::string_view value, std::string_view why) {
  return Error(EINVAL, std::string(flag) + " '" + std::string(value) + "': " + std::string(why));
}

}  // namespace

Result<uint64_t> ParseBytes(std::string_view flag, std::string_view value) {
  uint64_t n = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec == std::errc::result_out_of_range) return Bad(flag, value, "too large");
  if (ec != std::errc() || ptr == value.data()) {
    return Bad(flag, value, "not a byte count (examples: 536870912, 512M, 1.5G)");
  }
  const char* const end = value.data() + value.size();
  // A fraction of the unit, as docker takes it ("1.5G"): rounded down to a whole byte.
  std::string_view fraction;
  if (ptr != end && *ptr == '.') {
    const char* digits = ++ptr;
    while (ptr != end && *ptr >= '0' && *ptr <= '9') ++ptr;
    fraction = std::string_view(digits, static_cast<size_t>(ptr - digits));
    if (fraction.empty()) {
      return Bad(flag, value, "not a byte count (examples: 536870912, 512M, 1.5G)");
    }
    // 18 digits at most: the fraction's numerator times a unit (2^40) then fits in 128 bits.
    if (fraction.size() > 18) return Bad(flag, value, "too many decimal places");
  }
  std::string_view suffix(ptr, static_cast<size_t>(end - ptr));
  int shift = 0;
  if (!suffix.empty()) {
    switch (suffix[0]) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      case 't':
      case 'T':
        shift = 40;
        break;
      case 'b':
      case 'B':
        shift = 0;
        break;
      default:
        return Bad(flag, value, "unknown unit (use K, M, G or T)");
    }
    std::string_view rest = suffix.substr(1);
    bool ok =
        shift == 0 ? rest.empty() : (rest.empty() || rest == "i" || rest == "B" || rest == "iB");
    if (!ok) return Bad(flag, value, "unknown unit (use K, M, G or T)");
  }
  if (shift > 0 && n > (UINT64_MAX >> shift)) return Bad(flag, value, "too large");
  uint64_t bytes = n << shift;
  if (!fraction.empty()) {
    unsigned __int128 numerator = 0;
    unsigned __int128 denominator = 1;
    for (char c : fraction) {
      numerator = numerator * 10 + static_cast<unsigned>(c - '0');
      denominator *= 10;
    }
    const auto part = static_cast<uint64_t>((numerator << shift) / denominator);  // < 2^shift
    if (part > UINT64_MAX - bytes) return Bad(flag, value, "too large");
    bytes += part;
  }
  return bytes;
}

Result<uint64_t> ParseCount(std::string_view flag, std::string_view value, uint64_t min,
                            uint64_t max) {
  uint64_t n = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || ptr != value.data() + value.size()) {
    return Bad(flag, value, "not a whole number");
  }
  if (n < min || n > max) {
    return Bad(flag, value,
               "out of range (" + std::to_string(min) + " to " + std::to_string(max) + ")");
  }
  return n;
}

Result<uint64_t> ParseDurationMs(std::string_view flag, std::string_view value, uint64_t min_ms,
                                 uint64_t max_ms) {
  uint64_t n = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec == std::errc::result_out_of_range) return Bad(flag, value, "too long");
  if (ec != std::errc() || ptr == value.data()) {
    return Bad(flag, value, "not a duration (examples: 500ms, 30s, 15m, 2h, 7d)");
  }
  const std::string_view unit(ptr, static_cast<size_t>(value.data() + value.size() - ptr));
  uint64_t scale = 0;
  if (unit == "ms") {
    scale = 1;
  } else if (unit.empty() || unit == "s") {
    scale = 1000;
  } else if (unit == "m") {
    scale = 60 * 1000;
  } else if (unit == "h") {
    scale = 3600 * 1000;
  } else if (unit == "d") {
    scale = 24 * 3600 * 1000;
  } else {
    return Bad(flag, value, "unknown unit '" + std::string(unit) + "' (ms, s, m, h or d)");
  }
  auto describe = [](uint64_t ms) {
    for (const auto& [suffix, size] : {std::pair<const char*, uint64_t>{"d", 24 * 3600 * 1000},
                                       {"h", 3600 * 1000},
                                       {"m", 60 * 1000},
                                       {"s", 1000}}) {
      if (ms >= size && ms % size == 0) return std::to_string(ms / size) + suffix;
    }
    return std::to_string(ms) + "ms";
  };
  if (n > max_ms / scale || n * scale < min_ms || n * scale > max_ms) {
    return Bad(flag, value, "out of range (" + describe(min_ms) + " to " + describe(max_ms) + ")");
  }
  return n * scale;
}

Result<double> ParseDecimal(std::string_view flag, std::string_view value, double min, double max) {
  double d = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), d);
  if (ec != std::errc() || ptr != value.data() + value.size() || !std::isfinite(d)) {
    return Bad(flag, value, "not a number");
  }
  if (d < min || d > max) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "out of range (%g to %g)", min, max);
    return Bad(flag, value, buf);
  }
  return d;
}

}  // namespace nsbox::runtime

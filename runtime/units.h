#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.h"

namespace nsbox::runtime {

// The longest exec timeout the API takes ("timeoutMs", api.md; 0 is none): ≈ 34 years, a bound
// that keeps every deadline computed from it far from overflowing.
inline constexpr uint64_t kMaxExecTimeoutMs = uint64_t{1} << 40;

// "512M", "1G", "1048576", "64KiB", "1.5G": a byte count with an optional binary suffix (K, M, G,
// T, optionally followed by "i", "iB" or "B"); a fraction of the unit is rounded down to a whole
// byte. Errors name `flag` and the value.
Result<uint64_t> ParseBytes(std::string_view flag, std::string_view value);
// A whole number in [min, max].
Result<uint64_t> ParseCount(std::string_view flag, std::string_view value, uint64_t min,
                            uint64_t max);
// A duration in milliseconds: a whole number with a unit, "500ms", "30s", "15m", "2h", "7d"
// (a bare number is seconds, as `sleep` takes it), in [min_ms, max_ms].
Result<uint64_t> ParseDurationMs(std::string_view flag, std::string_view value, uint64_t min_ms,
                                 uint64_t max_ms);
// A decimal number in [min, max] ("1.5").
Result<double> ParseDecimal(std::string_view flag, std::string_view value, double min, double max);

}  // namespace nsbox::runtime

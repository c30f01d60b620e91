#pragma once

// The main thread's stack of a long-lived process (nsbox-init): pages a deep moment touched
// (start-up, a burst of requests) stay in its memory for good unless given back.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace nsbox {

struct AddressRange {
  uintptr_t start = 0;
  uintptr_t end = 0;  // one past the last byte
};

// The "[stack]" mapping of a /proc/PID/maps text, or nullopt.
std::optional<AddressRange> MainStackMapping(std::string_view maps);

// Gives back (MADV_DONTNEED) the pages of the main thread's stack that lie more than `keep`
// bytes below this function's frame: what frames long returned left dirty. They come back as
// zero pages if the stack reaches that deep again. Nothing below the frame is live but the
// madvise call's own few words, so a few KiB of margin is plenty. Does nothing on any other
// thread, or when /proc/self/maps cannot be read. Returns the bytes given back (of the mapping;
// not all were necessarily resident).
size_t ReleaseUnusedMainStack(size_t keep = 8 * 1024);

}  // namespace nsbox

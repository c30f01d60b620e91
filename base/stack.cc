#include "base/stack.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <charconv>

#include "base/files.h"

namespace nsbox {

std::optional<AddressRange> MainStackMapping(std::string_view maps) {
  while (!maps.empty()) {
    size_t eol = maps.find('\n');
    std::string_view line = maps.substr(0, eol);
    maps = eol == std::string_view::npos ? std::string_view() : maps.substr(eol + 1);
    if (line.size() < 7 || line.substr(line.size() - 7) != "[stack]") continue;
    // "7ffc19c10000-7ffc19c31000 rw-p 00000000 00:00 0   [stack]"
    size_t dash = line.find('-');
    size_t space = line.find(' ');
    if (dash == std::string_view::npos || space == std::string_view::npos || dash > space) {
      return std::nullopt;
    }
    AddressRange r;
    auto a = std::from_chars(line.data(), line.data() + dash, r.start, 16);
    auto b = std::from_chars(line.data() + dash + 1, line.data() + space, r.end, 16);
    if (a.ec != std::errc() || b.ec != std::errc() || a.ptr != line.data() + dash ||
        b.ptr != line.data() + space || r.start >= r.end) {
      return std::nullopt;
    }
    return r;
  }
  return std::nullopt;
}

size_t ReleaseUnusedMainStack(size_t keep) {
  if (::syscall(SYS_gettid) != ::getpid()) return 0;
  auto maps = ReadFile("/proc/self/maps");
  if (!maps.ok()) return 0;
  auto stack = MainStackMapping(*maps);
  if (!stack) return 0;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  if (here < stack->start || here >= stack->end || here - stack->start <= keep) return 0;
  const uintptr_t end = (here - keep) & ~(page - 1);
  if (end <= stack->start) return 0;
  // SAFETY: [start, end) is the main stack's own mapping, wholly below the live frames (and
  // `keep` bytes of margin for the red zone, signal frames and the calls below this one): no
  // live object is there.
  if (::madvise(reinterpret_cast<void*>(stack->start), end - stack->start, MADV_DONTNEED) != 0) {
    return 0;
  }
  return end - stack->start;
}

}  // namespace nsbox

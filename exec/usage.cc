#include "exec/usage.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <charconv>
#include <limits>
#include <string>
#include <utility>

#include "base/files.h"
#include "base/log.h"

namespace nsbox::exec {
namespace {

// A whole decimal uint64_t, nothing before or after it.
std::optional<uint64_t> ParseU64(std::string_view s) {
  if (s.empty()) return std::nullopt;
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max()
                                                      : a + b;
}

// A cgroup file of `dir`, opened for reading; invalid when there is no such file (the controller
// is not enabled there) or it cannot be opened (logged: the figure is then unknown, not zero).
UniqueFd OpenCgroupFile(int dir, const char* file) {
  if (dir < 0) return UniqueFd();
  auto fd = OpenAt(dir, file, O_RDONLY | O_NOCTTY);
  if (!fd.ok()) {
    if (fd.error().code() != ENOENT) log::warn("exec usage: {}", fd.error().message());
    return UniqueFd();
  }
  return std::move(fd).value();
}

// The whole text of an opened cgroup file, read from its start: one pread where it fits (these
// files are a few lines; it is read when a command is answered), else from the start to EOF.
std::optional<std::string> ReadCgroupFile(const UniqueFd& fd, const char* file) {
  if (!fd.valid()) return std::nullopt;
  char buf[1024];
  ssize_t n;
  do {
    n = ::pread(fd.get(), buf, sizeof buf, 0);
  } while (n < 0 && errno == EINTR);
  if (n >= 0 && static_cast<size_t>(n) < sizeof buf)
    return std::string(buf, static_cast<size_t>(n));
  if (::lseek(fd.get(), 0, SEEK_SET) < 0) {
    log::warn("exec usage: lseek {}: {}", file, ErrnoText(errno));
    return std::nullopt;
  }
  auto text = ReadFd(fd.get(), file);
  if (!text.ok()) {
    log::warn("exec usage: {}", text.error().message());
    return std::nullopt;
  }
  return std::move(text).value();
}

std::optional<uint64_t> ReadSingle(const UniqueFd& fd, const char* file) {
  auto text = ReadCgroupFile(fd, file);
  if (!text.has_value()) return std::nullopt;
  return ParseSingleValue(*text);
}

// The first of two candidates that exists.
UniqueFd OpenEither(int dir_a, const char* file_a, int dir_b, const char* file_b) {
  UniqueFd fd = OpenCgroupFile(dir_a, file_a);
  return fd.valid() ? std::move(fd) : OpenCgroupFile(dir_b, file_b);
}

}  // namespace

std::optional<uint64_t> FindKeyedValue(std::string_view text, std::string_view key) {
  if (key.empty()) return std::nullopt;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ' ') {
      return ParseU64(line.substr(key.size() + 1));
    }
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return std::nullopt;
}

std::optional<uint64_t> ParseSingleValue(std::string_view text) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  return ParseU64(text);
}

CpuStat ParseCpuStat(std::string_view cpu_stat) {
  return {FindKeyedValue(cpu_stat, "user_usec"), FindKeyedValue(cpu_stat, "system_usec")};
}

std::optional<IoBytes> ParseIoStat(std::string_view io_stat) {
  IoBytes sum;
  while (!io_stat.empty()) {
    size_t nl = io_stat.find('\n');
    std::string_view line = io_stat.substr(0, nl);
    io_stat.remove_prefix(nl == std::string_view::npos ? io_stat.size() : nl + 1);
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    std::string_view device = line.substr(0, sp);
    size_t colon = device.find(':');
    if (colon == std::string_view::npos || !ParseU64(device.substr(0, colon)) ||
        !ParseU64(device.substr(colon + 1))) {
      return std::nullopt;
    }
    std::string_view rest = sp == std::string_view::npos ? "" : line.substr(sp + 1);
    while (!rest.empty()) {
      size_t next = rest.find(' ');
      std::string_view field = rest.substr(0, next);
      rest.remove_prefix(next == std::string_view::npos ? rest.size() : next + 1);
      size_t eq = field.find('=');
      if (eq == std::string_view::npos) continue;  // a field of a later kernel: not ours
      std::string_view name = field.substr(0, eq);
      if (name != "rbytes" && name != "wbytes") continue;
      auto value = ParseU64(field.substr(eq + 1));
      if (!value.has_value()) return std::nullopt;
      uint64_t& slot = name == "rbytes" ? sum.read : sum.write;
      slot = SaturatingAdd(slot, *value);
    }
  }
  return sum;
}

uint64_t ParseOomKillCount(std::string_view text) {
  return FindKeyedValue(text, "oom_kill").value_or(0);
}

UsageFiles OpenUsageFiles(const UsageDirs& dirs) {
  UsageFiles f;
  // cpu.stat is a core file of every v2 cgroup: there even without the cpu controller.
  f.cpu_stat = OpenCgroupFile(dirs.v2, "cpu.stat");
  // For writing too where the kernel takes a reset (v1 always; v2 memory.peak since 6.12, before
  // which the file is read-only and the open for writing fails).
  for (auto [dir, file] : {std::pair{dirs.v2, "memory.peak"},
                           std::pair{dirs.memory_v1, "memory.max_usage_in_bytes"}}) {
    if (dir < 0 || f.memory_peak.valid()) continue;
    int fd = ::openat(dir, file, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (fd >= 0) {
      f.memory_peak.reset(fd);
      f.memory_peak_resettable = true;
    } else {
      f.memory_peak = OpenCgroupFile(dir, file);
    }
  }
  f.pids_peak = OpenEither(dirs.v2, "pids.peak", dirs.pids_v1, "pids.peak");
  // Only v2: v1 blkio charges buffered writeback to whoever flushes it, not to the writer.
  f.io_stat = OpenCgroupFile(dirs.v2, "io.stat");
  f.oom = OpenEither(dirs.v2, "memory.events", dirs.memory_v1, "memory.oom_control");
  return f;
}

CommandUsage ReadUsage(const UsageFiles& files) {
  CommandUsage u;
  if (auto text = ReadCgroupFile(files.cpu_stat, "cpu.stat")) {
    CpuStat cpu = ParseCpuStat(*text);
    u.cpu_user_us = cpu.user_us;
    u.cpu_system_us = cpu.system_us;
  }
  u.memory_peak_bytes = ReadSingle(files.memory_peak, "memory peak");
  u.pids_peak = ReadSingle(files.pids_peak, "pids.peak");
  if (auto text = ReadCgroupFile(files.io_stat, "io.stat")) {
    if (auto io = ParseIoStat(*text)) {
      u.io_read_bytes = io->read;
      u.io_write_bytes = io->write;
    }
  }
  return u;
}

bool OomKilledIn(const UsageFiles& files) {
  auto text = ReadCgroupFile(files.oom, "memory events");
  return text.has_value() && ParseOomKillCount(*text) > 0;
}

bool NoOomKills(const UsageFiles& files) {
  if (!files.oom.valid()) return true;  // no memory controller: nothing to count
  auto text = ReadCgroupFile(files.oom, "memory events");
  return text.has_value() && FindKeyedValue(*text, "oom_kill") == uint64_t{0};
}

bool ResetMemoryPeak(const UsageFiles& files) {
  if (!files.memory_peak.valid() || !files.memory_peak_resettable) return false;
  // v1 ignores the value written; v2 takes any non-empty string.
  if (::pwrite(files.memory_peak.get(), "0", 1, 0) != 1) {
    log::warn("exec usage: reset the memory peak: {}", ErrnoText(errno));
    return false;
  }
  return true;
}

std::optional<uint64_t> MemoryPeak(const UsageFiles& files) {
  return ReadSingle(files.memory_peak, "memory peak");
}

CommandUsage UsageSince(const CommandUsage& now, const CommandUsage& before) {
  auto less = [](std::optional<uint64_t> a, std::optional<uint64_t> b) -> std::optional<uint64_t> {
    if (!a.has_value()) return std::nullopt;
    const uint64_t base = b.value_or(0);
    return *a > base ? *a - base : 0;
  };
  CommandUsage u = now;
  u.cpu_user_us = less(now.cpu_user_us, before.cpu_user_us);
  u.cpu_system_us = less(now.cpu_system_us, before.cpu_system_us);
  u.io_read_bytes = less(now.io_read_bytes, before.io_read_bytes);
  u.io_write_bytes = less(now.io_write_bytes, before.io_write_bytes);
  return u;
}

CommandUsage ReadUsage(const UsageDirs& dirs) { return ReadUsage(OpenUsageFiles(dirs)); }

bool OomKilledIn(const UsageDirs& dirs) { return OomKilledIn(OpenUsageFiles(dirs)); }

}  // namespace nsbox::exec

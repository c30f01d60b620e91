#include "exec/usage.h"

#include <errno.h>

#include <charconv>
#include <limits>
#include <string>

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

// The text of a cgroup file of `dir`; nullopt when there is no such file (the controller is not
// enabled there) or it cannot be read (logged: the figure is then unknown, not zero).
std::optional<std::string> ReadCgroupFile(int dir, const char* file) {
  if (dir < 0) return std::nullopt;
  auto text = ReadFileAt(dir, file);
  if (!text.ok()) {
    if (text.error().code() != ENOENT) log::warn("exec usage: {}", text.error().message());
    return std::nullopt;
  }
  return std::move(text).value();
}

std::optional<uint64_t> ReadSingle(int dir, const char* file) {
  auto text = ReadCgroupFile(dir, file);
  if (!text.has_value()) return std::nullopt;
  return ParseSingleValue(*text);
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

CommandUsage ReadUsage(const UsageDirs& dirs) {
  CommandUsage u;
  // cpu.stat is a core file of every v2 cgroup: there even without the cpu controller.
  if (auto text = ReadCgroupFile(dirs.v2, "cpu.stat")) {
    CpuStat cpu = ParseCpuStat(*text);
    u.cpu_user_us = cpu.user_us;
    u.cpu_system_us = cpu.system_us;
  }
  u.memory_peak_bytes = ReadSingle(dirs.v2, "memory.peak");
  if (!u.memory_peak_bytes.has_value()) {
    u.memory_peak_bytes = ReadSingle(dirs.memory_v1, "memory.max_usage_in_bytes");
  }
  u.pids_peak = ReadSingle(dirs.v2, "pids.peak");
  if (!u.pids_peak.has_value()) u.pids_peak = ReadSingle(dirs.pids_v1, "pids.peak");
  // Only v2: v1 blkio charges buffered writeback to whoever flushes it, not to the writer.
  if (auto text = ReadCgroupFile(dirs.v2, "io.stat")) {
    if (auto io = ParseIoStat(*text)) {
      u.io_read_bytes = io->read;
      u.io_write_bytes = io->write;
    }
  }
  return u;
}

bool OomKilledIn(const UsageDirs& dirs) {
  if (auto events = ReadCgroupFile(dirs.v2, "memory.events")) {
    return ParseOomKillCount(*events) > 0;
  }
  if (auto control = ReadCgroupFile(dirs.memory_v1, "memory.oom_control")) {
    return ParseOomKillCount(*control) > 0;
  }
  return false;
}

}  // namespace nsbox::exec

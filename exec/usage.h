#pragma once

// What one command used, read from its own cgroups when it ends (docs/cgroups.md "Per-exec
// usage"): cgroup v2 files where the controller is enabled for the command's cgroup, else the
// v1 memory and pids hierarchies of a hybrid host. A figure no hierarchy gives is nullopt, never
// a made-up zero. The parsers are pure and take the kernel's text as hostile bytes.

#include <cstdint>
#include <optional>
#include <string_view>

#include "base/unique_fd.h"

namespace nsbox::exec {

struct CommandUsage {
  std::optional<uint64_t> cpu_user_us;        // v2 cpu.stat user_usec
  std::optional<uint64_t> cpu_system_us;      // v2 cpu.stat system_usec
  std::optional<uint64_t> memory_peak_bytes;  // v2 memory.peak, v1 memory.max_usage_in_bytes
  std::optional<uint64_t> pids_peak;          // v2 or v1 pids.peak
  std::optional<uint64_t> io_read_bytes;      // v2 io.stat rbytes, summed over devices
  std::optional<uint64_t> io_write_bytes;     // v2 io.stat wbytes, summed over devices

  bool operator==(const CommandUsage&) const = default;
};

// The cgroup directories of one command (O_DIRECTORY fds, -1 where there is none).
struct UsageDirs {
  int v2 = -1;
  int memory_v1 = -1;
  int pids_v1 = -1;
};

// The files the figures come from, opened once while the cgroups are made (before the command
// runs: a cgroup file's text is made when it is read, not when it is opened), so that reading
// them when the command ends costs one read each. Invalid where the hierarchy has no such file
// (its controller is not enabled there).
struct UsageFiles {
  UniqueFd cpu_stat;     // v2 cpu.stat
  UniqueFd memory_peak;  // v2 memory.peak, else v1 memory.max_usage_in_bytes
  UniqueFd pids_peak;    // v2 pids.peak, else v1 pids.peak
  UniqueFd io_stat;      // v2 io.stat
  UniqueFd oom;          // v2 memory.events, else v1 memory.oom_control
  // memory_peak was opened for writing too: a write resets the peak to the current usage (v1
  // always; v2 since 6.12, for reads through this fd).
  bool memory_peak_resettable = false;
};
UsageFiles OpenUsageFiles(const UsageDirs& dirs);

// Resets the memory peak of an empty cgroup to what it holds now (page cache and kernel objects
// that earlier commands left charged to it), so that the next command in the cgroup reports its
// own peak, not an earlier one's. False when there is no memory figure, or it cannot be reset.
bool ResetMemoryPeak(const UsageFiles& files);
// The memory peak as the files give it now (after ResetMemoryPeak: what the cgroup holds).
std::optional<uint64_t> MemoryPeak(const UsageFiles& files);

// The figures of a command that ran in a cgroup used before: the cumulative counters (CPU time,
// I/O bytes) less what they were when it started (`before`); the peaks are the cgroup's own
// (reset or exact, see ResetMemoryPeak). Saturates at zero.
CommandUsage UsageSince(const CommandUsage& now, const CommandUsage& before);

// Reads every figure the files give; a file that is missing or malformed leaves its figure
// unset. Each file is read from its start, every time.
CommandUsage ReadUsage(const UsageFiles& files);
// Whether the OOM killer killed a process of the command: v2 memory.events "oom_kill", else v1
// memory.oom_control "oom_kill". False when neither is there.
bool OomKilledIn(const UsageFiles& files);
// False also when the file says nothing: only a counter read as 0 is "none".
bool NoOomKills(const UsageFiles& files);
// The same, opening the files of `dirs` first.
CommandUsage ReadUsage(const UsageDirs& dirs);
bool OomKilledIn(const UsageDirs& dirs);

// ---- Parsers --------------------------------------------------------------------------------

// The value of `key` in a "key value" per line text (cpu.stat, memory.events,
// memory.oom_control): the first line whose first word is exactly `key`, with a decimal
// uint64_t after one space and nothing else. nullopt when absent, malformed or out of range.
std::optional<uint64_t> FindKeyedValue(std::string_view text, std::string_view key);
// A file that holds one number ("123\n"): memory.peak, memory.max_usage_in_bytes, pids.peak.
// nullopt for anything else ("max", "", "-1", "12x", overflow).
std::optional<uint64_t> ParseSingleValue(std::string_view text);

struct CpuStat {
  std::optional<uint64_t> user_us;
  std::optional<uint64_t> system_us;
};
CpuStat ParseCpuStat(std::string_view cpu_stat);

struct IoBytes {
  uint64_t read = 0;
  uint64_t write = 0;
};
// io.stat: "MAJ:MIN rbytes=N wbytes=N rios=N ..." per device; rbytes and wbytes summed over
// every line (saturating at 2^64-1). An empty text is zero bytes (no I/O yet). nullopt when a
// line does not start with a device or a rbytes/wbytes value is not a number.
std::optional<IoBytes> ParseIoStat(std::string_view io_stat);
// The `oom_kill` counter of a memory.events (v2) or memory.oom_control (v1) text; 0 when absent.
uint64_t ParseOomKillCount(std::string_view text);

}  // namespace nsbox::exec

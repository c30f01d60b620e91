#pragma once

// What every nsbox benchmark measures with: a clock, medians and percentiles, and the floor of
// every exec figure (vfork + execve + waitpid of /bin/true on the host). Header-only: each
// benchmark is one binary.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace nsbox::bench {

using Clock = std::chrono::steady_clock;

inline double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

struct Stats {
  double median = 0, p10 = 0, p90 = 0;
};

inline Stats Summarize(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))]; };
  return {at(0.5), at(0.1), at(0.9)};
}

// Microseconds for vfork + execve + waitpid of /bin/true with an empty environment.
inline double VforkExecTrue() {
  auto t0 = Clock::now();
  pid_t pid = vfork();
  if (pid == 0) {
    char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
    char* const envp[] = {nullptr};
    execve("/bin/true", argv, envp);
    _exit(127);
  }
  int status;
  waitpid(pid, &status, 0);
  return Micros(Clock::now() - t0);
}

// /proc/meminfo, in KiB by name ("MemAvailable").
inline std::map<std::string, long> MemInfo() {
  std::ifstream in("/proc/meminfo");
  std::map<std::string, long> m;
  std::string key, unit;
  long value;
  while (in >> key >> value) {
    std::getline(in, unit);
    m[key.substr(0, key.size() - 1)] = value;
  }
  return m;
}

// KiB of the kernel's memory that a sandbox can grow: slab, kernel stacks, page tables, per-CPU,
// and Shmem (the pages of its tmpfs mounts).
inline long KernelKb() {
  auto m = MemInfo();
  return m["SUnreclaim"] + m["SReclaimable"] + m["KernelStack"] + m["PageTables"] + m["Percpu"] +
         m["Shmem"];
}

// Has the kernel free its reclaimable dentries and inodes (drop_caches 2: no page cache, no
// tmpfs page), so that what KernelKb says next is what is held, not what was merely looked up
// and would go at the first memory pressure. Pinned ones (a mount point, an open file) stay.
// False when it could not (not root).
inline bool DropReclaimableCaches() {
  sync();
  int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = write(fd, "2", 1) == 1;
  close(fd);
  return ok;
}

// The kernel memory that N sandboxes made between Start() and Stop(), per sandbox: `grown`
// counts the reclaimable dentry and inode caches their making left (what earlier figures in
// docs/perf-notes.md counted), `held` only what stays once those are dropped.
class KernelGrowth {
 public:
  void Start() {
    dropped_ = DropReclaimableCaches();
    before_ = KernelKb();
  }
  void Stop(double n) {
    long after = KernelKb();
    bool dropped = DropReclaimableCaches();
    long held = KernelKb();
    grown_ = static_cast<double>(after - before_) / n;
    held_ = static_cast<double>(held - before_) / n;
    dropped_ = dropped_ && dropped;
  }
  double grown() const { return grown_; }
  double held() const { return held_; }
  bool dropped() const { return dropped_; }  // false: `held` is `grown`

 private:
  long before_ = 0;
  bool dropped_ = false;
  double grown_ = 0, held_ = 0;
};

// KiB of each slab cache's objects in use (active objects times their size, /proc/slabinfo).
inline std::map<std::string, double> SlabCachesKb() {
  std::ifstream in("/proc/slabinfo");
  std::map<std::string, double> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.starts_with("slabinfo")) continue;
    std::istringstream words(line);
    std::string name;
    double active = 0, total = 0, size = 0;
    if (words >> name >> active >> total >> size) out[name] += active * size / 1024;
  }
  return out;
}

// KiB of the kernel's slab objects in use plus its per-CPU memory: unlike the slab pages
// KernelKb counts, it does not miss objects that land in the free room of partly used slab pages.
inline long SlabObjectsKb() {
  double kb = 0;
  for (const auto& [name, cache_kb] : SlabCachesKb()) kb += cache_kb;
  return static_cast<long>(kb) + MemInfo()["Percpu"];
}

// A process's proportional set size (smaps_rollup), KiB; 0 once it is gone.
inline long PssKb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("Pss:")) return std::atol(line.c_str() + 4);
  }
  return 0;
}

// Where to make memory cgroups of one's own: a v1 memory mount, or the cgroup2 root when its
// subtree_control has memory. Empty when there is neither.
inline std::string MemoryCgroupRoot() {
  struct stat st {};
  if (stat("/sys/fs/cgroup/memory/memory.usage_in_bytes", &st) == 0) {
    return "/sys/fs/cgroup/memory";
  }
  std::ifstream control("/sys/fs/cgroup/cgroup.subtree_control");
  for (std::string w; control >> w;) {
    if (w == "memory") return "/sys/fs/cgroup";
  }
  return "";
}

// KiB of kernel memory that one empty memory cgroup holds on this host now, from the growth of
// the slab objects in use while `n` are made side by side (then removed); -1 where there is no
// memory controller to make them in, or no /proc/slabinfo to read (not root).
// Most of it is the memcg's slots for the host's shrinkers: one per superblock alive at once
// since boot (the kernel never shrinks the table), so it differs between hosts and grows with the
// peak number of jails a host has held (docs/perf-notes.md "What an idle sandbox costs the
// kernel"). Every idle sandbox holds one.
inline double MemoryCgroupKb(int n = 50) {
  const std::string parent = MemoryCgroupRoot();
  if (parent.empty()) return -1;
  std::vector<std::string> made;
  DropReclaimableCaches();
  const long before = SlabObjectsKb();
  if (before <= MemInfo()["Percpu"]) return -1;
  for (int i = 0; i < n; ++i) {
    std::string dir =
        parent + "/nsbox-bench-memcg-" + std::to_string(getpid()) + "-" + std::to_string(i);
    if (mkdir(dir.c_str(), 0755) == 0) made.push_back(dir);
  }
  DropReclaimableCaches();
  const long after = SlabObjectsKb();
  for (const auto& dir : made) rmdir(dir.c_str());
  if (made.empty()) return -1;
  return static_cast<double>(after - before) / static_cast<double>(made.size());
}

}  // namespace nsbox::bench

#pragma once

// Cgroups of a sandbox, planned as plain values and then applied (conventions.md "Plan, then
// apply"). v2 and v1 both: a hybrid host has the memory, pids and cpu controllers in v1 and an
// almost empty cgroup2 mount that still gives a kill scope (cgroup.kill) and CLONE_INTO_CGROUP.
// See docs/cgroups.md for the host set-ups this has to work on.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"

namespace nsbox::isolate {

// The limits a sandbox can be given, checked where they are asked for (the API's PUT, the CLI)
// as where a jail starts with them: nsbox-init is one of its pids, so a command needs a second;
// the CPU limit is a share of CPU time per period (cpu.max, cpu.cfs_quota_us).
inline constexpr uint64_t kMinPids = 2;
inline constexpr uint64_t kMaxPids = 4194304;  // the kernel's PID_MAX_LIMIT
inline constexpr double kMinCpus = 0.01;
inline constexpr double kMaxCpus = 4096;

// What a sandbox may use. An unset limit is not enforced (and needs no hierarchy). The explicit
// initializers let callers write {.pids = 64} under -Wmissing-field-initializers.
struct CgroupLimits {
  std::optional<uint64_t> memory_bytes = std::nullopt;
  std::optional<uint64_t> pids = std::nullopt;
  std::optional<double> cpus = std::nullopt;  // 1.5 = one and a half CPUs of time per period
};

// One mounted hierarchy and, in it, the caller's own cgroup: the directory under which nsbox
// creates its cgroups (never a hard-coded root: nsbox may itself run in a delegated subtree).
struct CgroupHierarchy {
  std::string mount_point;  // "/sys/fs/cgroup/memory"
  std::string cgroup_path;  // ours, as /proc/self/cgroup says: "/process_api/8dd7c17f"
  std::string dir;          // absolute: "/sys/fs/cgroup/memory/process_api/8dd7c17f"
  // v1: the controllers mounted together ("cpu", "cpuacct"). v2: cgroup.controllers of `dir`,
  // which ParseCgroupLayout cannot know (LoadCgroupV2State fills it).
  std::vector<std::string> controllers;
  // v2 only, from LoadCgroupV2State: cgroup.subtree_control of `dir`, and whether `dir` is the
  // real root of the hierarchy, the one cgroup exempt from the "no internal processes" rule.
  std::vector<std::string> subtree_control;
  bool is_root = false;
  // The mount's super options, as mountinfo lists them: "rw", "nsdelegate", "favordynmods".
  std::vector<std::string> super_options;
  // v2 only: `dir` is the base a placement chose (cgroup_placement.h): delegated to nsbox and
  // holding no process of its own, so it may pass controllers on although it is not the root.
  bool delegated = false;
};

// The hierarchies nsbox can use on this host. A hybrid host has v2 and some v1 ones; a pure v2
// host only v2; an old v1-only host no v2.
struct CgroupLayout {
  std::optional<CgroupHierarchy> v2;
  std::optional<CgroupHierarchy> memory_v1;
  std::optional<CgroupHierarchy> pids_v1;
  std::optional<CgroupHierarchy> cpu_v1;
};

// Pure: the layout from the text of /proc/self/cgroup and /proc/self/mountinfo. Handles mounts
// whose root is not "/" (a cgroup namespace, a bind of a subtree), octal escapes (\040) in
// mountinfo, and co-mounted v1 controllers ("cpu,cpuacct"). Fails when our own cgroup of a
// mounted hierarchy is not visible under any of its mounts.
Result<CgroupLayout> ParseCgroupLayout(std::string_view proc_self_cgroup,
                                       std::string_view mountinfo);
// Reads cgroup.controllers, cgroup.subtree_control and cgroup.type (absent only at the root) of
// `v2->dir`.
Status LoadCgroupV2State(CgroupHierarchy* v2);
// ParseCgroupLayout of this process's files, plus LoadCgroupV2State. After a placement
// (SetSandboxCgroupBase), the v2 hierarchy's directory is that base, marked delegated.
Result<CgroupLayout> LoadCgroupLayout();

// Where the sandboxes' v2 cgroups are made once a placement (cgroup_placement.h) moved this
// process out of the cgroup it was started in: an absolute directory under the cgroup2 mount.
// Process-wide; "" (the default) means the process's own cgroup.
void SetSandboxCgroupBase(std::string dir);
std::string SandboxCgroupBase();

// Whether a jail or a command on this host is moved into a cgroup after its clone: true when
// a v1 hierarchy (memory, pids or cpu) is in use, since v1 has no CLONE_INTO_CGROUP. Each such
// move writes cgroup.procs, which takes the kernel's cgroup_threadgroup_rwsem for writing: on a
// quiet host that waits for an RCU grace period (6-11 ms on this project's machine), unless the
// kernel favours dynamic changes (favordynmods, Linux 6.0). docs/cgroups.md "Moves into v1".
bool MovesIntoV1(const CgroupLayout& layout);
// Whether the layout's cgroup2 mount shows favordynmods among its super options.
bool HasFavorDynmods(const CgroupLayout& layout);

// Pure: the cgroup2 flags of a reconfiguration that turns favordynmods on and keeps every other
// option of `super_options` (a reconfiguration sets exactly the flags it is given: one without
// nsdelegate would turn delegation off). "rw", "ro" and "seclabel" are not cgroup2 flags and are
// kept by the kernel. An option this code does not know is an error that names it: it would be
// dropped.
Result<std::vector<std::string>> FavorDynmodsFlags(const std::vector<std::string>& super_options);

// Turns favordynmods on for the host's cgroup2 hierarchy, mounted at `v2.mount_point`, by a
// reconfiguration of its superblock (fspick + fsconfig; the mount's own flags are untouched).
// It is global: cgroup_threadgroup_rwsem is one lock, and on Linux 6.18 the per-threadgroup lock
// it switches to stays on until reboot. True when this call turned it on, false when it was on.
// Errors: an option FavorDynmodsFlags refuses, a kernel without favordynmods (EINVAL), and a
// reconfiguration the kernel ignored (EPERM: not in the host's cgroup namespace).
Result<bool> EnableFavorDynmods(const CgroupHierarchy& v2);
// Reconfigures the cgroup2 superblock mounted at `mount_point` with exactly `flags` (cgroup2
// flags, as FavorDynmodsFlags gives them): what EnableFavorDynmods does, and what a test does to
// turn favordynmods off again.
Status SetCgroup2Flags(const std::string& mount_point, const std::vector<std::string>& flags);

// What nsboxd and `nsbox run` do at start: on a host that moves processes into v1 cgroups and has
// a cgroup2 mount, EnableFavorDynmods, logged (info when it was turned on, a warning with the
// cost when it could not be). Nothing on other hosts.
// `quiet`: a failure is logged at debug only (nsbox run, whose stderr is the command's).
void FavorMovesIntoV1(const CgroupLayout& layout, bool quiet = false);

enum class CgroupVersion { kV1, kV2 };

// One write to a cgroup file: exactly these bytes, in one write(2).
struct CgroupWrite {
  std::string file;       // relative to the directory: "memory.max"
  std::string value;      // "536870912"
  bool optional = false;  // skipped when the file does not exist (swap accounting is off)

  bool operator==(const CgroupWrite&) const = default;
};

// One child cgroup to make: mkdir `parent`/`name`, then `writes` in order.
struct CgroupDirPlan {
  CgroupVersion version = CgroupVersion::kV2;
  std::string parent;                      // absolute: the caller's own cgroup directory
  std::string name;                        // the child, chosen by the caller
  std::vector<std::string> controllers;    // the limits enforced here: "memory", "pids", "cpu"
  std::vector<CgroupWrite> parent_writes;  // before the mkdir: "+memory +pids" to subtree_control
  std::vector<CgroupWrite> writes;         // in the child, in this order
  // v1 only: controllers this directory is made for without a limit, so that per-exec usage
  // (docs/cgroups.md "Per-exec usage") can be read from the hierarchy: "memory", "pids".
  std::vector<std::string> accounting;

  std::string path() const;
};

// Every directory of one sandbox's cgroups: the v2 one first (when there is a cgroup2 mount),
// then one per v1 hierarchy that enforces a limit v2 cannot, or that accounts memory or pids
// (every mounted v1 memory and pids hierarchy gets a directory, limit or not).
struct CgroupPlan {
  std::vector<CgroupDirPlan> dirs;
};

// 1.5 CPUs over this period is a quota of 150000 (cpu.max "150000 100000").
inline constexpr uint64_t kCpuPeriodUs = 100000;

// Pure: which hierarchy enforces each limit and the exact writes. A controller is used through
// v2 when it is in the v2 directory's cgroup.controllers, else through its v1 hierarchy; a
// limit that neither can enforce is an error naming the limit and what is missing. `name` must
// be a plain file name ([A-Za-z0-9._-], not "." or "..").
Result<CgroupPlan> PlanCgroups(const CgroupLayout& layout, const CgroupLimits& limits,
                               std::string_view name);

// The writes of a plan, relative to `dir_fd`; an optional write whose file is missing is skipped.
Status WriteCgroupFiles(int dir_fd, const std::vector<CgroupWrite>& writes);

// The cgroups of one sandbox, made from a plan. Move-only; the destructor destroys them (killing
// whatever is still inside) unless Destroy() was called.
class Cgroups {
 public:
  Cgroups() = default;  // none: v2_dir_fd() is -1 and Destroy() does nothing
  Cgroups(Cgroups&& other) noexcept;
  Cgroups& operator=(Cgroups&& other) noexcept;
  Cgroups(const Cgroups&) = delete;
  Cgroups& operator=(const Cgroups&) = delete;
  ~Cgroups();

  // Makes every directory of `plan` (a directory that already exists is an error that names
  // it: a dead run left it behind) and writes its files. On failure nothing made stays.
  static Result<Cgroups> Create(const CgroupPlan& plan);
  // The child cgroups whose names start with `prefix` in every hierarchy of `layout`: what a
  // process that died (a SIGKILLed daemon) left behind, handed over so that Destroy() kills
  // whatever is inside and removes them. `prefix` must be specific to the caller.
  static Result<Cgroups> AdoptStale(const CgroupLayout& layout, std::string_view prefix);

  // Sets the limits of `plan` on cgroups made from another plan of the same layout (a jail of
  // nsboxd's pool, made before its sandbox's limits were known): each of its directories must
  // have a counterpart here in the same hierarchy, or nothing is written and the error (ENOENT)
  // names the one missing. Parent writes are made as Create makes them.
  Status ApplyLimits(const CgroupPlan& plan);
  // ApplyLimits's first step alone: whether every directory of `plan` has its counterpart here
  // (else ENOENT, naming the one missing). Nothing is written.
  Status CheckLimitTargets(const CgroupPlan& plan);
  // An O_DIRECTORY fd of the v2 child, for clone3(CLONE_INTO_CGROUP); -1 when there is none.
  int v2_dir_fd() const;
  // An O_DIRECTORY fd of the v1 child of the hierarchy of `controller` ("memory", "pids"), limit
  // or accounting only; -1 when there is none.
  int v1_dir_fd(std::string_view controller) const;
  // Absolute paths of the directories, in plan order.
  std::vector<std::string> paths() const;

  // Moves `pid` (its whole thread group) into every v1 child, and into the v2 child when
  // `include_v2` (false when the process was born there with CLONE_INTO_CGROUP).
  Status AddProcess(pid_t pid, bool include_v2);
  // Hands the v2 child to a jail whose root is host uid/gid: the directory and the files the
  // kernel lists in /sys/kernel/cgroup/delegate, so the jail's init can make child cgroups for
  // its commands (cgroup-v2.rst, "Delegation").
  Status DelegateV2(uid_t uid, gid_t gid);
  // The same for every v1 child: the directory (so the jail's init can mkdir a cgroup per
  // command), cgroup.procs and tasks. Nothing that sets a limit changes hands.
  Status DelegateV1(uid_t uid, gid_t gid);
  // Whether the kernel's OOM killer killed a process of the memory cgroup: v2 memory.events
  // "oom_kill", v1 memory.oom_control "oom_kill" (4.13), else memory.failcnt > 0 as a hint.
  // False when no directory enforces memory.
  Result<bool> OomKilled() const;
  // Kills everything inside (v2 cgroup.kill, else SIGKILL through a pidfd to each process),
  // waits up to ~2 s for the cgroups to empty, and removes them, nested ones first. Returns the
  // first error but tries every directory. Done once: later calls return Ok.
  Status Destroy();

 private:
  struct Dir {
    CgroupVersion version;
    std::string path;
    std::string name;
    std::vector<std::string> controllers;
    std::vector<std::string> accounting;
    UniqueFd parent_fd;  // O_PATH, for the rmdir
    UniqueFd fd;         // O_RDONLY | O_DIRECTORY
  };

  std::vector<Dir> dirs_;
  // The directory here that `d` (of a plan of the same layout) names, or null.
  Dir* TargetOf(const CgroupDirPlan& d);
  bool destroyed_ = false;
};

}  // namespace nsbox::isolate

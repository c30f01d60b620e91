#include "isolate/cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "base/cleanup.h"
#include "base/files.h"
#include "base/log.h"
#include "base/mountinfo.h"
#include "base/pidfd.h"
#include "base/strings.h"
#include "base/syscalls.h"
#include "isolate/cgroup_placement.h"

namespace nsbox::isolate {
namespace {

using Clock = std::chrono::steady_clock;

// How long Destroy waits for killed processes to leave before it gives up (the kernel frees a
// large address space in well under a second; a D-state process on NFS may take longer).
constexpr std::chrono::milliseconds kDestroyTimeout{2000};

// The kernel's bounds: pids.max must be < PID_MAX_LIMIT + 1 (pids_max_write, kMaxPids), and a
// CFS quota below 1 ms is refused (tg_set_cfs_bandwidth, min_cfs_quota_period).
constexpr uint64_t kMinCpuQuotaUs = 1000;

// The controllers nsbox limits, in the order their writes are planned.
constexpr const char* kControllers[] = {"memory", "pids", "cpu"};

std::string JoinPath(std::string_view dir, std::string_view rest) {
  std::string out(dir);
  if (!out.empty() && out.back() == '/' && !rest.empty() && rest.front() == '/') {
    out.pop_back();
  } else if (!out.empty() && out.back() != '/' && !rest.empty() && rest.front() != '/') {
    out += '/';
  }
  out += rest;
  return out;
}

struct Mount {
  std::string root;         // the subtree of the hierarchy mounted here, as our namespace sees it
  std::string mount_point;  // where
  std::string fstype;
  std::vector<std::string> options;  // super options: "rw", "memory", "name=systemd", ...
};

// mountinfo(5): ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
Result<std::vector<Mount>> ParseMountinfo(std::string_view mountinfo) {
  std::vector<Mount> out;
  int line_no = 0;
  for (std::string_view line : Split(mountinfo, '\n')) {
    ++line_no;
    if (line.empty()) continue;
    std::vector<std::string_view> fields = Split(line, ' ');
    size_t dash = 0;
    for (size_t i = 6; i < fields.size(); ++i) {
      if (fields[i] == "-") {
        dash = i;
        break;
      }
    }
    if (dash == 0 || dash + 3 >= fields.size()) {
      return Error::Msg("mountinfo line " + std::to_string(line_no) +
                        " is malformed: " + std::string(line));
    }
    Mount m{UnescapeMountField(fields[3]),
            UnescapeMountField(fields[4]),
            std::string(fields[dash + 1]),
            {}};
    for (std::string_view opt : Split(fields[dash + 3], ',')) m.options.emplace_back(opt);
    out.push_back(std::move(m));
  }
  return out;
}

// The mounted directory of `cgroup_path` (as /proc/self/cgroup has it) among `mounts` of one
// hierarchy: the mount whose root contains it, the last such (a later mount hides an earlier).
struct Resolved {
  const Mount* mount;
  std::string dir;
};

Result<Resolved> ResolveCgroupDir(const std::vector<const Mount*>& mounts,
                                  const std::string& cgroup_path, std::string_view what) {
  // A path with ".." components is outside our cgroup namespace (we were moved out of it).
  for (std::string_view part : Split(cgroup_path, '/')) {
    if (part == "..") {
      return Error::Msg("our " + std::string(what) + " cgroup " + cgroup_path +
                        " is outside our cgroup namespace");
    }
  }
  std::optional<Resolved> found;
  std::string roots;
  for (const Mount* m : mounts) {
    std::string root = m->root == "/" ? "" : m->root;
    if (!roots.empty()) roots += ", ";
    roots += m->mount_point + " (root " + m->root + ")";
    if (cgroup_path.compare(0, root.size(), root) != 0) continue;
    std::string rest = cgroup_path.substr(root.size());
    if (!rest.empty() && rest[0] != '/') continue;  // "/a/bc" is not under "/a/b"
    found = Resolved{m, JoinPath(m->mount_point, rest == "/" ? "" : rest)};
  }
  if (!found.has_value()) {
    return Error::Msg("our " + std::string(what) + " cgroup " + cgroup_path +
                      " is not under any of its mounts: " + roots);
  }
  return *found;
}

bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > 200 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

// The value of `key` in a "key value" per line file (memory.events, cgroup.events, ...).
std::optional<uint64_t> FindKey(std::string_view text, std::string_view key) {
  for (std::string_view line : Split(text, '\n')) {
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ' ') {
      std::string value(line.substr(key.size() + 1));
      char* end = nullptr;
      errno = 0;
      unsigned long long v = std::strtoull(value.c_str(), &end, 10);
      if (errno != 0 || end == value.c_str()) return std::nullopt;
      return v;
    }
  }
  return std::nullopt;
}

// The pids in a cgroup.procs; a missing file (a cgroup already removed) is an empty list.
Result<std::vector<pid_t>> ReadProcs(int dir_fd) {
  auto content = ReadFileAt(dir_fd, "cgroup.procs");
  if (!content.ok()) {
    if (content.error().code() == ENOENT) return std::vector<pid_t>{};
    return std::move(content).error();
  }
  std::vector<pid_t> out;
  for (const std::string& word : Words(*content)) {
    long pid = std::strtol(word.c_str(), nullptr, 10);
    // 0: a process of another pid namespace, which we could not signal by pid anyway.
    if (pid > 0) out.push_back(static_cast<pid_t>(pid));
  }
  return out;
}

// The child cgroups of a cgroup directory.
Result<std::vector<std::string>> ListSubdirs(int dir_fd) {
  // A fresh open file description: a dup would share (and move) the caller's directory offset.
  int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error::Sys("open", ".", errno);
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    int err = errno;
    ::close(fd);  // fdopendir failed, so the fd is still ours.
    return Error::Sys("fdopendir", ".", err);
  }
  std::vector<std::string> out;
  while (struct dirent* e = ::readdir(dir)) {
    std::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st {};
      is_dir = ::fstatat(dir_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    if (is_dir) out.emplace_back(name);
  }
  ::closedir(dir);
  return out;
}

// SIGKILL to every process of the cgroup and its descendants, through pidfds. A pid read from
// cgroup.procs may be reused before pidfd_open; so the pidfd is only signalled when the pid is
// still listed after it was opened: then the process the pidfd holds was alive and in the
// cgroup at that second reading, and pidfd_send_signal never reaches a later holder of the pid.
Status KillByPids(int dir_fd) {
  NSBOX_ASSIGN_OR_RETURN(std::vector<pid_t> before, ReadProcs(dir_fd));
  std::vector<Pidfd> pidfds;
  for (pid_t pid : before) {
    auto pidfd = Pidfd::Open(pid);
    if (!pidfd.ok()) {
      if (pidfd.error().code() == ESRCH) continue;  // already gone
      return std::move(pidfd).error();
    }
    pidfds.push_back(std::move(pidfd).value());
  }
  NSBOX_ASSIGN_OR_RETURN(std::vector<pid_t> after, ReadProcs(dir_fd));
  for (const Pidfd& p : pidfds) {
    if (std::find(after.begin(), after.end(), p.pid()) != after.end()) {
      NSBOX_TRY(p.Signal(SIGKILL));
    }
  }
  NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> subdirs, ListSubdirs(dir_fd));
  for (const std::string& sub : subdirs) {
    auto sub_fd = OpenAt(dir_fd, sub, O_RDONLY | O_DIRECTORY);
    if (!sub_fd.ok()) {
      if (sub_fd.error().code() == ENOENT) continue;
      return std::move(sub_fd).error();
    }
    NSBOX_TRY_CTX(KillByPids(sub_fd->get()), sub);
  }
  return Ok();
}

// Whether any process is left in the cgroup or below it.
Result<bool> Populated(int dir_fd) {
  // v2 keeps the answer for the whole subtree in cgroup.events.
  auto events = ReadFileAt(dir_fd, "cgroup.events");
  if (events.ok()) {
    auto populated = FindKey(*events, "populated");
    if (populated.has_value()) return *populated != 0;
  }
  NSBOX_ASSIGN_OR_RETURN(std::vector<pid_t> pids, ReadProcs(dir_fd));
  if (!pids.empty()) return true;
  NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> subdirs, ListSubdirs(dir_fd));
  for (const std::string& sub : subdirs) {
    auto sub_fd = OpenAt(dir_fd, sub, O_RDONLY | O_DIRECTORY);
    if (!sub_fd.ok()) {
      if (sub_fd.error().code() == ENOENT) continue;
      return std::move(sub_fd).error();
    }
    NSBOX_ASSIGN_OR_RETURN(bool sub_populated, Populated(sub_fd->get()));
    if (sub_populated) return true;
  }
  return false;
}

void SleepBackoff(std::chrono::microseconds* delay) {
  std::this_thread::sleep_for(*delay);
  *delay = std::min(*delay * 2, std::chrono::microseconds(20000));
}

// rmdir of `name` under `parent_fd`, its child cgroups first. EBUSY (a process still leaving,
// memcg offlining on v1) is retried until `deadline`; a missing directory is already removed.
Status RemoveTree(int parent_fd, const std::string& name, Clock::time_point deadline) {
  auto fd = OpenAt(parent_fd, name, O_RDONLY | O_DIRECTORY);
  if (!fd.ok()) {
    return fd.error().code() == ENOENT ? Ok() : std::move(fd).error();
  }
  NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> subdirs, ListSubdirs(fd->get()));
  for (const std::string& sub : subdirs) {
    NSBOX_TRY_CTX(RemoveTree(fd->get(), sub, deadline), name);
  }
  std::chrono::microseconds delay(500);
  for (;;) {
    if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return Ok();
    if (errno != EBUSY || Clock::now() >= deadline) return Error::Sys("rmdir", name, errno);
    SleepBackoff(&delay);
  }
}

}  // namespace

Result<CgroupLayout> ParseCgroupLayout(std::string_view proc_self_cgroup,
                                       std::string_view mountinfo) {
  // /proc/self/cgroup (cgroups(7)): "ID:CONTROLLERS:PATH"; ID 0 with no controllers is v2. The
  // path is the rest of the line (it may contain ':').
  std::optional<std::string> v2_path;
  std::map<std::string, std::string, std::less<>> v1_paths;  // controller -> our path
  int line_no = 0;
  for (std::string_view line : Split(proc_self_cgroup, '\n')) {
    ++line_no;
    if (line.empty()) continue;
    size_t c1 = line.find(':');
    size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos || line.size() == c2 + 1 || line[c2 + 1] != '/') {
      return Error::Msg("/proc/self/cgroup line " + std::to_string(line_no) +
                        " is malformed: " + std::string(line));
    }
    std::string_view id = line.substr(0, c1);
    std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path(line.substr(c2 + 1));
    if (id == "0" && controllers.empty()) {
      v2_path = path;
      continue;
    }
    for (std::string_view c : Split(controllers, ',')) {
      if (!c.empty()) v1_paths[std::string(c)] = path;
    }
  }

  NSBOX_ASSIGN_OR_RETURN(std::vector<Mount> mounts, ParseMountinfo(mountinfo));
  CgroupLayout layout;

  std::vector<const Mount*> v2_mounts;
  for (const Mount& m : mounts) {
    if (m.fstype == "cgroup2") v2_mounts.push_back(&m);
  }
  // The "0::" line shows once cgroup2 is mounted anywhere on the system; without a mount that we
  // can see, v2 is simply not usable here.
  if (!v2_mounts.empty() && v2_path.has_value()) {
    NSBOX_ASSIGN_OR_RETURN(Resolved r, ResolveCgroupDir(v2_mounts, *v2_path, "cgroup v2"));
    CgroupHierarchy h;
    h.mount_point = r.mount->mount_point;
    h.cgroup_path = *v2_path;
    h.dir = std::move(r.dir);
    h.super_options = r.mount->options;
    layout.v2 = std::move(h);
  }

  for (const char* controller : kControllers) {
    std::vector<const Mount*> v1_mounts;
    for (const Mount& m : mounts) {
      if (m.fstype == "cgroup" && Contains(m.options, controller)) v1_mounts.push_back(&m);
    }
    auto path = v1_paths.find(controller);
    if (v1_mounts.empty() || path == v1_paths.end()) continue;
    NSBOX_ASSIGN_OR_RETURN(
        Resolved r, ResolveCgroupDir(v1_mounts, path->second, std::string(controller) + " (v1)"));
    CgroupHierarchy h;
    h.mount_point = r.mount->mount_point;
    h.cgroup_path = path->second;
    h.dir = std::move(r.dir);
    h.super_options = r.mount->options;
    for (const std::string& opt : r.mount->options) {
      // The controllers of this hierarchy, as /proc/self/cgroup names them ("rw" is not one).
      if (v1_paths.count(opt) != 0) h.controllers.push_back(opt);
    }
    std::string_view c = controller;
    if (c == "memory") layout.memory_v1 = std::move(h);
    if (c == "pids") layout.pids_v1 = std::move(h);
    if (c == "cpu") layout.cpu_v1 = std::move(h);
  }
  return layout;
}

Status LoadCgroupV2State(CgroupHierarchy* v2) {
  auto fd = OpenAt(AT_FDCWD, v2->dir, O_RDONLY | O_DIRECTORY);
  if (!fd.ok()) return std::move(fd).error().Context("cgroup v2 " + v2->dir);
  auto controllers = ReadFileAt(fd->get(), "cgroup.controllers");
  if (!controllers.ok()) return std::move(controllers).error().Context("cgroup v2 " + v2->dir);
  auto subtree = ReadFileAt(fd->get(), "cgroup.subtree_control");
  if (!subtree.ok()) return std::move(subtree).error().Context("cgroup v2 " + v2->dir);
  v2->controllers = Words(*controllers);
  v2->subtree_control = Words(*subtree);
  // Every cgroup but the root has cgroup.type (4.14); that includes the root of a cgroup
  // namespace, which is not exempt from the no-internal-processes rule.
  v2->is_root =
      ::faccessat(fd->get(), "cgroup.type", F_OK, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT;
  return Ok();
}

namespace {

std::mutex g_base_mu;
std::string g_base;  // SetSandboxCgroupBase's

}  // namespace

void SetSandboxCgroupBase(std::string dir) {
  std::lock_guard<std::mutex> lock(g_base_mu);
  g_base = std::move(dir);
}

std::string SandboxCgroupBase() {
  std::lock_guard<std::mutex> lock(g_base_mu);
  return g_base;
}

Result<CgroupLayout> LoadCgroupLayout() {
  NSBOX_ASSIGN_OR_RETURN(std::string cgroup, ReadFile("/proc/self/cgroup"));
  NSBOX_ASSIGN_OR_RETURN(std::string mountinfo, ReadFile("/proc/self/mountinfo"));
  NSBOX_ASSIGN_OR_RETURN(CgroupLayout layout, ParseCgroupLayout(cgroup, mountinfo));
  if (layout.v2.has_value()) {
    if (std::string base = SandboxCgroupBase(); !base.empty()) {
      // The placement's base, not the leaf this process moved itself into.
      CgroupHierarchy& v2 = *layout.v2;
      if (base.compare(0, v2.mount_point.size(), v2.mount_point) == 0) {
        v2.cgroup_path =
            base.size() == v2.mount_point.size() ? "/" : base.substr(v2.mount_point.size());
      }
      v2.dir = std::move(base);
      v2.delegated = true;
    }
    NSBOX_TRY(LoadCgroupV2State(&*layout.v2));
  }
  return layout;
}

bool MovesIntoV1(const CgroupLayout& layout) {
  return layout.memory_v1.has_value() || layout.pids_v1.has_value() || layout.cpu_v1.has_value();
}

bool HasFavorDynmods(const CgroupLayout& layout) {
  return layout.v2.has_value() && Contains(layout.v2->super_options, "favordynmods");
}

Result<std::vector<std::string>> FavorDynmodsFlags(const std::vector<std::string>& super_options) {
  // cgroup2's flags (cgroup2_fs_parameters, Linux 6.18), and what mountinfo shows beside them.
  static constexpr std::string_view kFlags[] = {"nsdelegate",
                                                "favordynmods",
                                                "memory_localevents",
                                                "memory_recursiveprot",
                                                "memory_hugetlb_accounting",
                                                "pids_localevents"};
  static constexpr std::string_view kNotFlags[] = {"rw", "ro", "seclabel"};
  std::vector<std::string> out;
  for (const std::string& option : super_options) {
    if (std::find(std::begin(kNotFlags), std::end(kNotFlags), option) != std::end(kNotFlags)) {
      continue;
    }
    if (std::find(std::begin(kFlags), std::end(kFlags), option) == std::end(kFlags)) {
      return Error(EINVAL, "the cgroup2 mount has the option \"" + option +
                               "\", which nsbox does not know: a reconfiguration would drop it");
    }
    if (!Contains(out, option)) out.push_back(option);
  }
  if (!Contains(out, "favordynmods")) out.emplace_back("favordynmods");
  return out;
}

Status SetCgroup2Flags(const std::string& at, const std::vector<std::string>& flags) {
  UniqueFd fs(sys::FsPick(AT_FDCWD, at.c_str(), FSPICK_CLOEXEC | FSPICK_NO_AUTOMOUNT));
  if (!fs.valid()) return Error::Sys("fspick", at, errno);
  for (const std::string& flag : flags) {
    if (sys::FsConfig(fs.get(), FSCONFIG_SET_FLAG, flag.c_str(), nullptr, 0) != 0) {
      int err = errno;
      Error e = Error::Sys("fsconfig", at + " " + flag, err);
      return err == EINVAL && flag == "favordynmods"
                 ? std::move(e).Context("this kernel has no favordynmods (Linux 6.0)")
                 : e;
    }
  }
  if (sys::FsConfig(fs.get(), FSCONFIG_CMD_RECONFIGURE, nullptr, nullptr, 0) != 0) {
    return Error::Sys("fsconfig(FSCONFIG_CMD_RECONFIGURE)", at, errno);
  }
  return Ok();
}

Result<bool> EnableFavorDynmods(const CgroupHierarchy& v2) {
  if (Contains(v2.super_options, "favordynmods")) return false;
  NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> flags, FavorDynmodsFlags(v2.super_options));
  NSBOX_TRY(SetCgroup2Flags(v2.mount_point, flags));
  // Outside the host's cgroup namespace the kernel takes the reconfiguration and ignores it.
  NSBOX_ASSIGN_OR_RETURN(CgroupLayout now, LoadCgroupLayout());
  if (!HasFavorDynmods(now)) {
    return Error(EPERM, "the kernel kept favordynmods off on " + v2.mount_point +
                            " (only the host's cgroup namespace may change it)");
  }
  return true;
}

void FavorMovesIntoV1(const CgroupLayout& layout, bool quiet) {
  if (!MovesIntoV1(layout) || !layout.v2.has_value()) return;
  auto turned_on = EnableFavorDynmods(*layout.v2);
  if (!turned_on.ok() && quiet) {
    log::debug("cgroup2 favordynmods: {}", turned_on.error().message());
  } else if (!turned_on.ok()) {
    log::warn(
        "cgroup2 favordynmods: {}; every move of a process into a v1 cgroup may then wait for an "
        "RCU grace period (milliseconds on a quiet host)",
        turned_on.error().message());
  } else if (*turned_on) {
    log::info(
        "cgroup2 at {} remounted with favordynmods: moving a jail or a command into its v1 "
        "cgroups no longer waits for an RCU grace period (docs/cgroups.md \"Moves into v1\")",
        layout.v2->mount_point);
  }
}

std::string CgroupDirPlan::path() const { return JoinPath(parent, name); }

Result<CgroupPlan> PlanCgroups(const CgroupLayout& layout, const CgroupLimits& limits,
                               std::string_view name) {
  if (!ValidName(name)) {
    return Error::Msg("invalid cgroup name \"" + std::string(name) +
                      "\": use 1-200 of [A-Za-z0-9._-], not \".\" or \"..\"");
  }
  // The exact text of each limit, checked against what the kernel accepts.
  std::map<std::string, std::string, std::less<>> wanted;  // controller -> description
  std::string memory, pids, quota;
  if (limits.memory_bytes.has_value()) {
    if (*limits.memory_bytes == 0 || *limits.memory_bytes > uint64_t{INT64_MAX}) {
      return Error::Msg("memory limit " + std::to_string(*limits.memory_bytes) +
                        " is out of range (1 to 2^63-1 bytes)");
    }
    memory = std::to_string(*limits.memory_bytes);
    wanted["memory"] = "memory limit (" + memory + " bytes)";
  }
  if (limits.pids.has_value()) {
    if (*limits.pids == 0 || *limits.pids > kMaxPids) {
      return Error::Msg("pids limit " + std::to_string(*limits.pids) + " is out of range (1 to " +
                        std::to_string(kMaxPids) + ")");
    }
    pids = std::to_string(*limits.pids);
    wanted["pids"] = "pids limit (" + pids + ")";
  }
  if (limits.cpus.has_value()) {
    double cpus = *limits.cpus;
    double quota_us = std::isfinite(cpus) ? std::round(cpus * kCpuPeriodUs) : 0;
    if (!(quota_us >= kMinCpuQuotaUs) || cpus > kMaxCpus) {
      return Error::Msg("cpu limit " + std::to_string(cpus) + " is out of range (0.01 to " +
                        std::to_string(static_cast<int>(kMaxCpus)) + " CPUs)");
    }
    quota = std::to_string(static_cast<uint64_t>(quota_us));
    wanted["cpu"] = "cpu limit (" + std::to_string(cpus) + " CPUs)";
  }

  CgroupPlan plan;
  // The v2 directory is made whenever there is a cgroup2 mount, limits or not: it is the
  // sandbox's kill scope (cgroup.kill) and what CLONE_INTO_CGROUP places the child in.
  if (layout.v2.has_value()) {
    const CgroupHierarchy& v2 = *layout.v2;
    CgroupDirPlan dir{CgroupVersion::kV2, v2.dir, std::string(name), {}, {}, {}, {}};
    std::vector<std::string> enable;
    for (const char* c : kControllers) {
      if (wanted.count(c) == 0 || !Contains(v2.controllers, c)) continue;
      dir.controllers.emplace_back(c);
      if (!Contains(v2.subtree_control, c)) enable.push_back(std::string("+") + c);
    }
    if (!enable.empty()) {
      // cgroup-v2.rst "No Internal Process Constraint": a non-root cgroup with processes in it
      // (nsbox's own among them, or we would not be in it) cannot pass controllers down.
      if (!v2.is_root && !v2.delegated) {
        return Error::Msg(
            "cgroup v2: cannot enable " + Join(enable, " ") + " for the children of " + v2.dir +
            ": it is not the root and has processes in it (nsbox is one), and the kernel's "
            "no-internal-processes rule refuses that" +
            (PlacementSummary().empty() ? "" : "; cgroup placement " + PlacementSummary()) +
            ". Fix: run nsbox in a cgroup of its own that it may manage (a systemd unit with "
            "Delegate=yes, as deploy/nsboxd.service; a container with its own cgroup "
            "namespace), or where systemd can give it a scope (docs/cgroups.md \"Placement\")");
      }
      dir.parent_writes.push_back({"cgroup.subtree_control", Join(enable, " "), false});
    }
    for (const std::string& c : dir.controllers) {
      if (c == "memory") {
        dir.writes.push_back({"memory.max", memory, false});
        // No swap either: the limit is on memory, not on memory plus disk. Absent without
        // swap accounting (CONFIG_MEMCG_SWAP, swapaccount=0).
        dir.writes.push_back({"memory.swap.max", "0", true});
      } else if (c == "pids") {
        dir.writes.push_back({"pids.max", pids, false});
      } else if (c == "cpu") {
        dir.writes.push_back({"cpu.max", quota + " " + std::to_string(kCpuPeriodUs), false});
      }
    }
    plan.dirs.push_back(std::move(dir));
  }

  // Whatever v2 cannot enforce goes to its v1 hierarchy; co-mounted controllers share one
  // directory. Memory and pids get their v1 directory also without a limit (accounting only,
  // no writes): the per-exec usage of a hybrid host is read there.
  for (const char* c : kControllers) {
    std::string_view controller = c;
    const bool limited = wanted.count(c) != 0;
    if (!plan.dirs.empty() && plan.dirs[0].version == CgroupVersion::kV2 &&
        Contains(plan.dirs[0].controllers, c)) {
      continue;
    }
    const std::optional<CgroupHierarchy>& v1 = controller == "memory" ? layout.memory_v1
                                               : controller == "pids" ? layout.pids_v1
                                                                      : layout.cpu_v1;
    if (!limited) {
      if (controller == "cpu" || !v1.has_value()) continue;
      // A controller lives in one hierarchy at a time: where it is in v2 there is no v1 one.
      if (layout.v2.has_value() && Contains(layout.v2->controllers, c)) continue;
    }
    if (!v1.has_value()) {
      std::string v2_why = layout.v2.has_value()
                               ? "the " + std::string(c) +
                                     " controller is not available in cgroup v2 (" +
                                     JoinPath(layout.v2->dir, "cgroup.controllers") + ": \"" +
                                     Join(layout.v2->controllers, " ") + "\")"
                               : "there is no cgroup2 mount";
      return Error::Msg(wanted[c] + " cannot be enforced: " + v2_why + " and no cgroup v1 " + c +
                        " hierarchy is mounted. Fix: enable the " + c +
                        " controller in the parent's cgroup.subtree_control (systemd: "
                        "Delegate=yes), or mount it, or drop the limit");
    }
    auto it = std::find_if(plan.dirs.begin(), plan.dirs.end(), [&](const CgroupDirPlan& d) {
      return d.version == CgroupVersion::kV1 && d.parent == v1->dir;
    });
    if (it == plan.dirs.end()) {
      plan.dirs.push_back(
          CgroupDirPlan{CgroupVersion::kV1, v1->dir, std::string(name), {}, {}, {}, {}});
      it = plan.dirs.end() - 1;
    }
    if (!limited) {
      it->accounting.emplace_back(c);
      continue;
    }
    it->controllers.emplace_back(c);
    if (controller == "memory") {
      // memsw (memory + swap) must stay >= limit_in_bytes, so it comes second; it exists only
      // with swap accounting.
      it->writes.push_back({"memory.limit_in_bytes", memory, false});
      it->writes.push_back({"memory.memsw.limit_in_bytes", memory, true});
    } else if (controller == "pids") {
      it->writes.push_back({"pids.max", pids, false});
    } else {
      it->writes.push_back({"cpu.cfs_period_us", std::to_string(kCpuPeriodUs), false});
      it->writes.push_back({"cpu.cfs_quota_us", quota, false});
    }
  }
  return plan;
}

Status WriteCgroupFiles(int dir_fd, const std::vector<CgroupWrite>& writes) {
  for (const CgroupWrite& w : writes) {
    Status st = WriteExistingFileAt(dir_fd, w.file, w.value);
    if (!st.ok()) {
      if (w.optional && st.error().code() == ENOENT) continue;
      return std::move(st).error().Context("set " + w.file + " to \"" + w.value + "\"");
    }
  }
  return Ok();
}

Cgroups::Cgroups(Cgroups&& other) noexcept
    : dirs_(std::move(other.dirs_)), destroyed_(other.destroyed_) {
  other.dirs_.clear();
  other.destroyed_ = true;
}

Cgroups& Cgroups::operator=(Cgroups&& other) noexcept {
  if (this != &other) {
    if (!destroyed_) {
      Status st = Destroy();
      if (!st.ok()) log::warn("{}", st.error().message());
    }
    dirs_ = std::move(other.dirs_);
    destroyed_ = other.destroyed_;
    other.dirs_.clear();
    other.destroyed_ = true;
  }
  return *this;
}

Cgroups::~Cgroups() {
  if (!destroyed_) {
    Status st = Destroy();
    if (!st.ok()) log::warn("{}", st.error().message());
  }
}

Result<Cgroups> Cgroups::Create(const CgroupPlan& plan) {
  Cgroups out;
  out.destroyed_ = true;  // until the last step: on failure the undo stack below cleans up
  // Declared after `out`, so it runs (rmdir) while the parent fds in out.dirs_ are still open.
  CleanupStack undo;
  for (const CgroupDirPlan& d : plan.dirs) {
    const std::string path = d.path();
    const std::string what = "create cgroup " + path;
    auto parent = OpenAt(AT_FDCWD, d.parent, O_PATH | O_DIRECTORY);
    if (!parent.ok()) return std::move(parent).error().Context(what);
    // Not undone on failure: the parent's subtree_control is shared with every other sandbox,
    // and enabling a controller there changes nothing for cgroups that do not set limits.
    Status st = WriteCgroupFiles(parent->get(), d.parent_writes);
    if (!st.ok()) {
      return std::move(st).error().Context(what + ": in the parent " + d.parent);
    }
    if (::mkdirat(parent->get(), d.name.c_str(), 0755) < 0) {
      int err = errno;
      Error e = Error::Sys("mkdir", path, err);
      if (err == EEXIST) {
        e = std::move(e).Context(
            "a cgroup of that name already exists, left by a run that died; "
            "remove it (rmdir " +
            path + ") or let nsbox's start-up clean it");
      }
      return std::move(e).Context(what);
    }
    undo.Push([fd = parent->get(), name = d.name] {
      // Best effort: the directory is empty, nothing was placed in it yet.
      (void)::unlinkat(fd, name.c_str(), AT_REMOVEDIR);
    });
    out.dirs_.push_back(
        Dir{d.version, path, d.name, d.controllers, d.accounting, std::move(parent).value(), {}});
    auto fd = OpenAt(out.dirs_.back().parent_fd.get(), d.name, O_RDONLY | O_DIRECTORY);
    if (!fd.ok()) return std::move(fd).error().Context(what);
    out.dirs_.back().fd = std::move(fd).value();
    st = WriteCgroupFiles(out.dirs_.back().fd.get(), d.writes);
    if (!st.ok()) return std::move(st).error().Context(what);
  }
  undo.Release();
  out.destroyed_ = false;
  return out;
}

Cgroups::Dir* Cgroups::TargetOf(const CgroupDirPlan& d) {
  auto it = std::find_if(dirs_.begin(), dirs_.end(), [&](const Dir& have) {
    return have.version == d.version && have.path == JoinPath(d.parent, have.name);
  });
  return it == dirs_.end() ? nullptr : &*it;
}

Status Cgroups::CheckLimitTargets(const CgroupPlan& plan) {
  for (const CgroupDirPlan& d : plan.dirs) {
    if (TargetOf(d) == nullptr) {
      return Error(ENOENT,
                   "no cgroup in " + d.parent + " to set " +
                       (d.controllers.empty() ? std::string("accounting") : d.controllers.front()) +
                       " limits on");
    }
  }
  return Ok();
}

Status Cgroups::ApplyLimits(const CgroupPlan& plan) {
  NSBOX_TRY(CheckLimitTargets(plan));
  for (const CgroupDirPlan& d : plan.dirs) {
    Dir& dir = *TargetOf(d);
    if (Status st = WriteCgroupFiles(dir.parent_fd.get(), d.parent_writes); !st.ok()) {
      return std::move(st).error().Context("set limits: in the parent " + d.parent);
    }
    if (Status st = WriteCgroupFiles(dir.fd.get(), d.writes); !st.ok()) {
      return std::move(st).error().Context("set limits on " + dir.path);
    }
    dir.controllers = d.controllers;
  }
  return Ok();
}

int Cgroups::v2_dir_fd() const {
  for (const Dir& d : dirs_) {
    if (d.version == CgroupVersion::kV2) return d.fd.get();
  }
  return -1;
}

int Cgroups::v1_dir_fd(std::string_view controller) const {
  for (const Dir& d : dirs_) {
    if (d.version == CgroupVersion::kV1 &&
        (Contains(d.controllers, controller) || Contains(d.accounting, controller))) {
      return d.fd.get();
    }
  }
  return -1;
}

std::vector<std::string> Cgroups::paths() const {
  std::vector<std::string> out;
  for (const Dir& d : dirs_) out.push_back(d.path);
  return out;
}

Status Cgroups::AddProcess(pid_t pid, bool include_v2) {
  const std::string text = std::to_string(pid);
  for (const Dir& d : dirs_) {
    if (d.version == CgroupVersion::kV2 && !include_v2) continue;
    NSBOX_TRY_CTX(WriteExistingFileAt(d.fd.get(), "cgroup.procs", text),
                  "add process " + text + " to cgroup " + d.path);
  }
  return Ok();
}

Status Cgroups::DelegateV2(uid_t uid, gid_t gid) {
  for (const Dir& d : dirs_) {
    if (d.version != CgroupVersion::kV2) continue;
    const std::string what = "delegate cgroup " + d.path;
    if (::fchown(d.fd.get(), uid, gid) < 0)
      return Error::Sys("fchown", d.path, errno).Context(what);
    // The kernel's own list of the files a delegatee needs (4.15); the three that matter when
    // it is not there.
    std::vector<std::string> files = {"cgroup.procs", "cgroup.threads", "cgroup.subtree_control"};
    auto listed = ReadFile("/sys/kernel/cgroup/delegate");
    if (listed.ok()) files = Words(*listed);
    for (const std::string& f : files) {
      if (::fchownat(d.fd.get(), f.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) < 0 && errno != ENOENT) {
        return Error::Sys("fchownat", f, errno).Context(what);
      }
    }
  }
  return Ok();
}

Status Cgroups::DelegateV1(uid_t uid, gid_t gid) {
  for (const Dir& d : dirs_) {
    if (d.version != CgroupVersion::kV1) continue;
    const std::string what = "delegate cgroup " + d.path;
    if (::fchown(d.fd.get(), uid, gid) < 0)
      return Error::Sys("fchown", d.path, errno).Context(what);
    // Only what moving processes needs: memory.limit_in_bytes, pids.max and the like stay root's.
    for (const char* f : {"cgroup.procs", "tasks"}) {
      if (::fchownat(d.fd.get(), f, uid, gid, AT_SYMLINK_NOFOLLOW) < 0) {
        return Error::Sys("fchownat", d.path + "/" + f, errno).Context(what);
      }
    }
  }
  return Ok();
}

Result<bool> Cgroups::OomKilled() const {
  for (const Dir& d : dirs_) {
    if (!Contains(d.controllers, "memory")) continue;
    const std::string what = "read OOM events of cgroup " + d.path;
    if (d.version == CgroupVersion::kV2) {
      auto events = ReadFileAt(d.fd.get(), "memory.events");
      if (!events.ok()) return std::move(events).error().Context(what);
      return FindKey(*events, "oom_kill").value_or(0) > 0;
    }
    auto control = ReadFileAt(d.fd.get(), "memory.oom_control");
    if (!control.ok()) return std::move(control).error().Context(what);
    auto kills = FindKey(*control, "oom_kill");
    if (kills.has_value()) return *kills > 0;
    // Before 4.13 v1 did not count kills: hitting the limit is the best hint there is.
    auto failcnt = ReadFileAt(d.fd.get(), "memory.failcnt");
    if (!failcnt.ok()) return std::move(failcnt).error().Context(what);
    return std::strtoull(failcnt->c_str(), nullptr, 10) > 0;
  }
  return false;
}

Result<Cgroups> Cgroups::AdoptStale(const CgroupLayout& layout, std::string_view prefix) {
  if (prefix.empty()) return Error(EINVAL, "AdoptStale needs a non-empty prefix");
  Cgroups out;
  std::vector<std::string> seen;
  for (const auto* h : {&layout.v2, &layout.memory_v1, &layout.pids_v1, &layout.cpu_v1}) {
    if (!h->has_value()) continue;
    const std::string& dir = (*h)->dir;
    // cpu and cpuacct, or memory and pids, may be one hierarchy under two names.
    if (std::find(seen.begin(), seen.end(), dir) != seen.end()) continue;
    seen.push_back(dir);
    const CgroupVersion version = h == &layout.v2 ? CgroupVersion::kV2 : CgroupVersion::kV1;
    std::unique_ptr<DIR, int (*)(DIR*)> list(::opendir(dir.c_str()), ::closedir);
    if (!list) return Error::Sys("opendir", dir, errno).Context("look for stale cgroups");
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(list.get())) {
      std::string_view name(e->d_name);
      if (e->d_type == DT_DIR && name.substr(0, prefix.size()) == prefix) names.emplace_back(name);
    }
    for (const std::string& name : names) {
      auto parent = OpenAt(AT_FDCWD, dir, O_PATH | O_DIRECTORY);
      if (!parent.ok()) return std::move(parent).error();
      auto fd = OpenAt(parent->get(), name, O_RDONLY | O_DIRECTORY);
      if (!fd.ok()) return std::move(fd).error();
      out.dirs_.push_back(Dir{version,
                              dir + "/" + name,
                              name,
                              {},
                              {},
                              std::move(parent).value(),
                              std::move(fd).value()});
    }
  }
  return out;
}

Status Cgroups::Destroy() {
  if (destroyed_) return Ok();
  destroyed_ = true;
  const Clock::time_point deadline = Clock::now() + kDestroyTimeout;
  Status result = Ok();
  auto keep = [&result](Status st, const std::string& path) {
    if (!st.ok() && result.ok()) result = std::move(st).error().Context("destroy cgroup " + path);
  };

  // 1. Kill. cgroup.kill (5.14) kills the whole v2 subtree at once and makes forks racing with
  //    it fail; without it, and in v1, each process gets SIGKILL, again on every poll below.
  std::vector<bool> by_pids(dirs_.size(), false);
  for (size_t i = 0; i < dirs_.size(); ++i) {
    Dir& d = dirs_[i];
    if (d.version == CgroupVersion::kV2) {
      Status st = WriteExistingFileAt(d.fd.get(), "cgroup.kill", "1");
      if (st.ok()) continue;
      if (st.error().code() != ENOENT) {
        keep(std::move(st), d.path);
        continue;
      }
    }
    by_pids[i] = true;
    keep(KillByPids(d.fd.get()), d.path);
  }

  // 2. Wait until they are empty: a killed process leaves its cgroup only once it has exited.
  for (size_t i = 0; i < dirs_.size(); ++i) {
    Dir& d = dirs_[i];
    std::chrono::microseconds delay(200);
    for (;;) {
      auto populated = Populated(d.fd.get());
      if (!populated.ok()) {
        keep(std::move(populated).error(), d.path);
        break;
      }
      if (!*populated) break;
      if (Clock::now() >= deadline) {
        keep(Error(EBUSY, "processes are still inside " + std::to_string(kDestroyTimeout.count()) +
                              " ms after SIGKILL"),
             d.path);
        break;
      }
      if (by_pids[i]) keep(KillByPids(d.fd.get()), d.path);  // forks that raced the kill
      SleepBackoff(&delay);
    }
  }

  // 3. Remove, the last made first, each directory's child cgroups (a jail's init may have
  //    made some for its commands) before it.
  for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) {
    keep(RemoveTree(it->parent_fd.get(), it->name, deadline), it->path);
  }
  dirs_.clear();
  return result;
}

}  // namespace nsbox::isolate

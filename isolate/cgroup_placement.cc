#include "isolate/cgroup_placement.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>

#include "base/files.h"
#include "base/log.h"
#include "base/process.h"
#include "base/strings.h"

namespace nsbox::isolate {
namespace {

// The controllers a sandbox's cgroup gets where the hierarchy has them: memory, pids and cpu
// enforce limits; io (with memory, pids and cpu) gives the per-exec usage figures.
constexpr const char* kPlacementControllers[] = {"cpu", "io", "memory", "pids"};

// `s` without the white space around it, for a helper's message.
std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \n\t");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \n\t");
  return std::string(s.substr(b, e - b + 1));
}

std::string JoinPathOf(std::string_view dir, std::string_view name) {
  std::string out(dir);
  if (out.empty() || out.back() != '/') out += '/';
  out += name;
  return out;
}

// Whether cgroup path `inner` is `outer` or below it ("/a/b" is below "/a", "/ab" is not).
bool AtOrBelow(std::string_view inner, std::string_view outer) {
  if (outer == "/") return true;
  if (inner.substr(0, outer.size()) != outer) return false;
  return inner.size() == outer.size() || inner[outer.size()] == '/';
}

std::string PidList(const std::vector<pid_t>& pids) {
  std::vector<std::string> words;
  for (size_t i = 0; i < pids.size() && i < 8; ++i) words.push_back(std::to_string(pids[i]));
  if (pids.size() > 8) words.push_back("and " + std::to_string(pids.size() - 8) + " more");
  return Join(words, ", ");
}

Result<std::vector<pid_t>> ReadProcs(const std::string& dir) {
  NSBOX_ASSIGN_OR_RETURN(std::string text, ReadFile(JoinPathOf(dir, "cgroup.procs")));
  std::vector<pid_t> out;
  for (const std::string& word : Words(text)) {
    out.push_back(static_cast<pid_t>(std::strtol(word.c_str(), nullptr, 10)));
  }
  return out;
}

// The first of `candidates` that is an executable file.
std::string FindTool(std::initializer_list<const char*> candidates) {
  for (const char* path : candidates) {
    if (::access(path, X_OK) == 0) return path;
  }
  return "";
}

// `systemctl show` of `unit`: Delegate and ControlGroup. systemctl as root talks to systemd's
// private socket, so this works where no D-Bus daemon runs.
Status AskSystemdAboutUnit(PlacementFacts* facts) {
  std::string systemctl = FindTool({"/usr/bin/systemctl", "/bin/systemctl"});
  if (systemctl.empty()) return Error(ENOENT, "systemd runs, but systemctl is not installed");
  NSBOX_ASSIGN_OR_RETURN(ProgramRun run, RunProgram({systemctl, "show", "--property=Delegate",
                                                     "--property=ControlGroup", "--", facts->unit},
                                                    nullptr, 64 * 1024));
  if (!WIFEXITED(run.status) || WEXITSTATUS(run.status) != 0) {
    return Error::Msg("systemctl show " + facts->unit + ": " + DescribeExit(run.status) + ": " +
                      Trim(run.output));
  }
  for (std::string_view line : Split(run.output, '\n')) {
    if (line == "Delegate=yes") facts->unit_delegated = true;
    if (line.rfind("ControlGroup=", 0) == 0) facts->unit_cgroup = std::string(line.substr(13));
  }
  return Ok();
}

Status EnableControllers(const std::string& dir, const std::vector<std::string>& controllers) {
  if (controllers.empty()) return Ok();
  NSBOX_ASSIGN_OR_RETURN(std::string current, ReadFile(JoinPathOf(dir, "cgroup.subtree_control")));
  std::vector<std::string> enabled = Words(current);
  std::vector<std::string> enable;
  for (const std::string& c : controllers) {
    if (!Contains(enabled, c)) enable.push_back("+" + c);
  }
  if (enable.empty()) return Ok();
  Status st =
      WriteExistingFileAt(AT_FDCWD, JoinPathOf(dir, "cgroup.subtree_control"), Join(enable, " "));
  if (!st.ok() && st.error().code() == EBUSY) {
    // cgroup-v2.rst "No Internal Process Constraint": someone else's process is in it.
    auto procs = ReadProcs(dir);
    std::string who = procs.ok() && !procs->empty() ? " (pids " + PidList(*procs) + ")" : "";
    return Error(EBUSY, "cannot enable " + Join(enable, " ") + " in " + dir +
                            ": other processes are in that cgroup" + who +
                            ", and the kernel lets a cgroup with processes pass no controller "
                            "on. Fix: run nsbox alone in its cgroup (a unit or container of "
                            "its own)");
  }
  return st;
}

struct PlacementState {
  std::mutex mu;
  std::string summary;
  // For RetryFailedPlacement: the last PlaceSelf's arguments, whether it failed, and when.
  bool failed = false;
  std::string who;
  std::string scope_name;
  std::chrono::steady_clock::time_point last_try;
};

PlacementState& State() {
  static PlacementState* state = new PlacementState();  // never destroyed: used at exit
  return *state;
}

}  // namespace

std::string_view PlacementKindName(PlacementKind kind) {
  switch (kind) {
    case PlacementKind::kAsFound:
      return "as found";
    case PlacementKind::kOwnLeaf:
      return "own cgroup";
    case PlacementKind::kSystemdScope:
      return "systemd scope";
    case PlacementKind::kCgroupfs:
      return "cgroupfs";
  }
  return "?";
}

std::string UnitOfCgroupPath(std::string_view cgroup_path) {
  std::string unit;
  for (std::string_view part : Split(cgroup_path, '/')) {
    auto ends = [&](std::string_view suffix) {
      return part.size() > suffix.size() && part.substr(part.size() - suffix.size()) == suffix;
    };
    if (ends(".service") || ends(".scope")) unit = std::string(part);
  }
  return unit;
}

Result<PlacementPlan> PlanPlacement(const PlacementFacts& f) {
  const CgroupHierarchy& v2 = f.v2;
  PlacementPlan plan;
  if (!f.v2_mounted) {
    plan.why = "no cgroup2 mount (a v1 host)";
    return plan;
  }
  std::vector<std::string> need;
  for (const char* c : kPlacementControllers) {
    if (!Contains(v2.controllers, c)) continue;
    plan.controllers.emplace_back(c);
    if (!Contains(v2.subtree_control, c)) need.emplace_back(c);
  }
  if (v2.is_root || need.empty()) {
    plan.kind = PlacementKind::kAsFound;
    plan.base = v2.dir;
    plan.why = v2.is_root ? "the root cgroup, which may hold processes and pass controllers on"
               : plan.controllers.empty()
                   ? "cgroup v2 has none of cpu, io, memory, pids here (a v1 or hybrid host)"
                   : "every controller is already passed on to its children";
    return plan;
  }
  const bool own_namespace = v2.cgroup_path == "/";
  const bool own_unit = f.systemd && f.unit_delegated && !f.unit_cgroup.empty() &&
                        AtOrBelow(v2.cgroup_path, f.unit_cgroup);
  if ((own_namespace || own_unit) && f.others.empty()) {
    plan.kind = PlacementKind::kOwnLeaf;
    plan.base = v2.dir;
    plan.leaf = JoinPathOf(v2.dir, kPlacementLeaf);
    plan.why = own_unit ? "the systemd unit " + f.unit + " delegates its cgroup (Delegate=yes)"
                        : "the root of this cgroup namespace (a container's own cgroup)";
    return plan;
  }
  if (f.systemd) {
    plan.kind = PlacementKind::kSystemdScope;
    plan.why =
        (f.unit.empty() ? "the cgroup " + v2.cgroup_path : "the unit " + f.unit) +
        (own_unit || own_namespace ? " holds other processes (pids " + PidList(f.others) + ")"
                                   : " is not delegated to nsbox") +
        (f.unit_error.empty() ? "" : " (" + f.unit_error + ")") +
        ": a transient scope with Delegate=yes from systemd";
    return plan;
  }
  if (own_namespace) {
    return Error::Msg("cgroup v2: " + v2.dir +
                      " is the root of this cgroup namespace, but other processes are in it "
                      "(pids " +
                      PidList(f.others) +
                      "), so no controller can be passed on to sandboxes. Fix: run nsbox as the "
                      "only process of its container's cgroup, or move the others into a child "
                      "cgroup first");
  }
  if (!f.hierarchy_root_is_root) {
    return Error::Msg("cgroup v2: " + v2.dir +
                      " is not delegated to nsbox and holds processes, and systemd does not run "
                      "to give nsbox a cgroup of its own. Fix: start nsbox in a cgroup of its "
                      "own, with nothing else in it");
  }
  plan.kind = PlacementKind::kCgroupfs;
  plan.root = v2.mount_point;
  plan.base = JoinPathOf(v2.mount_point, kCgroupfsBase);
  plan.why = "no systemd, and " + v2.cgroup_path +
             " is not nsbox's: a cgroup of its own under the root, as a cgroupfs driver makes";
  return plan;
}

Result<PlacementFacts> GatherPlacementFacts() {
  // This process's own cgroup, not a placement's base (LoadCgroupLayout's after one).
  NSBOX_ASSIGN_OR_RETURN(std::string cgroup, ReadFile("/proc/self/cgroup"));
  NSBOX_ASSIGN_OR_RETURN(std::string mountinfo, ReadFile("/proc/self/mountinfo"));
  NSBOX_ASSIGN_OR_RETURN(CgroupLayout layout, ParseCgroupLayout(cgroup, mountinfo));
  if (layout.v2.has_value()) NSBOX_TRY(LoadCgroupV2State(&*layout.v2));
  return GatherPlacementFacts(layout);
}

Result<PlacementFacts> GatherPlacementFacts(const CgroupLayout& own) {
  PlacementFacts f;
  if (!own.v2.has_value()) {
    f.v2_mounted = false;  // a v1-only host: nothing to place
    return f;
  }
  f.v2 = *own.v2;
  bool needed = false;
  for (const char* c : kPlacementControllers) {
    needed = needed || (Contains(f.v2.controllers, c) && !Contains(f.v2.subtree_control, c));
  }
  if (f.v2.is_root || !needed) return f;  // PlanPlacement needs nothing more: kAsFound
  struct stat st;
  f.systemd = ::lstat("/run/systemd/system", &st) == 0 && S_ISDIR(st.st_mode);
  if (f.systemd) {
    f.unit = UnitOfCgroupPath(f.v2.cgroup_path);
    if (!f.unit.empty()) {
      if (Status asked = AskSystemdAboutUnit(&f); !asked.ok()) {
        f.unit_error = asked.error().message();
      }
    }
  }
  NSBOX_ASSIGN_OR_RETURN(std::vector<pid_t> procs, ReadProcs(f.v2.dir));
  const pid_t self = ::getpid();
  for (pid_t p : procs) {
    if (p != self) f.others.push_back(p);
  }
  f.hierarchy_root_is_root =
      ::access(JoinPathOf(f.v2.mount_point, "cgroup.type").c_str(), F_OK) != 0 && errno == ENOENT;
  return f;
}

Status StartDelegatedScope(std::string_view name, pid_t pid, int timeout_ms) {
  std::string busctl = FindTool({"/usr/bin/busctl", "/bin/busctl"});
  if (busctl.empty()) return Error(ENOENT, "systemd runs, but busctl is not installed");
  const std::string description = "nsbox sandboxes of pid " + std::to_string(pid);
  // org.freedesktop.systemd1.Manager.StartTransientUnit(name, mode, properties, aux), as
  // container engines' systemd cgroup driver calls it: the pid moved into a new scope that
  // systemd delegates (its subtree is nsbox's to manage), collected once it is empty.
  std::vector<std::string> call = {"call",
                                   "--quiet",
                                   "org.freedesktop.systemd1",
                                   "/org/freedesktop/systemd1",
                                   "org.freedesktop.systemd1.Manager",
                                   "StartTransientUnit",
                                   "ssa(sv)a(sa(sv))",
                                   std::string(name),
                                   "fail",
                                   "4",
                                   "Description",
                                   "s",
                                   description,
                                   "PIDs",
                                   "au",
                                   "1",
                                   std::to_string(pid),
                                   "Delegate",
                                   "b",
                                   "true",
                                   "CollectMode",
                                   "s",
                                   "inactive-or-failed",
                                   "0"};
  // The system bus first; where no D-Bus daemon runs, systemd's own socket (root only).
  std::string errors;
  bool started = false;
  for (const char* address : {"", "unix:path=/run/systemd/private"}) {
    std::vector<std::string> argv = {busctl, "--system",
                                     "--timeout=" + std::to_string(timeout_ms / 1000 + 1) + "s"};
    if (*address != '\0') argv.push_back(std::string("--address=") + address);
    argv.insert(argv.end(), call.begin(), call.end());
    NSBOX_ASSIGN_OR_RETURN(ProgramRun run, RunProgram(argv, nullptr, 64 * 1024));
    if (WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0) {
      started = true;
      break;
    }
    if (!errors.empty()) errors += "; ";
    errors += (*address == '\0' ? std::string("system bus") : std::string(address)) + ": " +
              DescribeExit(run.status) + ": " + Trim(run.output);
  }
  if (!started) {
    return Error::Msg("systemd did not start the scope " + std::string(name) + " (" + errors + ")");
  }
  // The job moves the pid when it runs; wait until /proc says it did.
  const std::string want = "/" + std::string(name);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    NSBOX_ASSIGN_OR_RETURN(std::string cgroup,
                           ReadFile("/proc/" + std::to_string(pid) + "/cgroup"));
    for (std::string_view line : Split(cgroup, '\n')) {
      if (line.rfind("0::", 0) == 0 && line.size() >= want.size() &&
          line.compare(line.size() - want.size(), want.size(), want) == 0) {
        return Ok();
      }
    }
    if (std::chrono::steady_clock::now() >= give_up) {
      return Error(ETIMEDOUT, "systemd started the scope " + std::string(name) + ", but pid " +
                                  std::to_string(pid) + " was not in it after " +
                                  std::to_string(timeout_ms) + " ms (" + Trim(cgroup) + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Result<PlacementPlan> ApplyPlacement(const PlacementPlan& plan, std::string_view scope_name) {
  PlacementPlan done = plan;
  switch (plan.kind) {
    case PlacementKind::kAsFound:
      SetSandboxCgroupBase("");
      return done;
    case PlacementKind::kSystemdScope: {
      NSBOX_TRY_CTX(StartDelegatedScope(scope_name, ::getpid(), 10000), "cgroup placement");
      NSBOX_ASSIGN_OR_RETURN(PlacementFacts now, GatherPlacementFacts());
      if (!now.others.empty()) {
        return Error::Msg("cgroup placement: the new scope " + now.v2.dir +
                          " holds other processes (pids " + PidList(now.others) + ")");
      }
      done.base = now.v2.dir;
      done.leaf = JoinPathOf(now.v2.dir, kPlacementLeaf);
      done.controllers.clear();
      for (const char* c : kPlacementControllers) {
        if (Contains(now.v2.controllers, c)) done.controllers.emplace_back(c);
      }
      [[fallthrough]];
    }
    case PlacementKind::kOwnLeaf: {
      // Ourselves (the whole thread group) into the leaf, then the controllers for the
      // sandboxes' cgroups, made beside the leaf.
      NSBOX_TRY_CTX(MakeDir(done.leaf, 0755), "cgroup placement");
      NSBOX_TRY_CTX(WriteExistingFileAt(AT_FDCWD, JoinPathOf(done.leaf, "cgroup.procs"),
                                        std::to_string(::getpid())),
                    "cgroup placement: move nsbox into " + done.leaf);
      NSBOX_TRY_CTX(EnableControllers(done.base, done.controllers), "cgroup placement");
      break;
    }
    case PlacementKind::kCgroupfs: {
      // The root passes controllers on whatever it holds; nsbox's own cgroup holds no process.
      NSBOX_TRY_CTX(EnableControllers(done.root, done.controllers), "cgroup placement");
      NSBOX_TRY_CTX(MakeDir(done.base, 0755), "cgroup placement");
      NSBOX_TRY_CTX(EnableControllers(done.base, done.controllers), "cgroup placement");
      break;
    }
  }
  SetSandboxCgroupBase(done.base);
  return done;
}

Result<PlacementPlan> PlaceSelf(std::string_view who, std::string_view scope_name, bool quiet,
                                const CgroupLayout* own) {
  auto placed = [&]() -> Result<PlacementPlan> {
    NSBOX_ASSIGN_OR_RETURN(PlacementFacts facts,
                           own != nullptr ? GatherPlacementFacts(*own) : GatherPlacementFacts());
    NSBOX_ASSIGN_OR_RETURN(PlacementPlan plan, PlanPlacement(facts));
    return ApplyPlacement(plan, scope_name);
  }();
  std::string summary;
  if (placed.ok()) {
    summary = std::string(PlacementKindName(placed->kind)) + ": sandboxes' cgroups under " +
              placed->base +
              (placed->leaf.empty() ? "" : ", " + std::string(who) + " in " + placed->leaf) + " (" +
              placed->why + ")";
    if (quiet) {
      log::debug("{}: cgroup placement: {}", who, summary);
    } else {
      log::info("{}: cgroup placement: {}", who, summary);
    }
  } else {
    summary = "failed: " + placed.error().message();
    if (quiet) {
      log::debug("{}: cgroup placement {}", who, summary);
    } else {
      log::error("{}: cgroup placement {}", who, summary);
    }
  }
  std::lock_guard<std::mutex> lock(State().mu);
  State().summary = summary;
  State().failed = !placed.ok();
  State().who = who;
  State().scope_name = scope_name;
  State().last_try = std::chrono::steady_clock::now();
  return placed;
}

void RetryFailedPlacement() {
  std::string who, scope_name;
  {
    std::lock_guard<std::mutex> lock(State().mu);
    if (!State().failed ||
        std::chrono::steady_clock::now() - State().last_try < std::chrono::seconds(2)) {
      return;
    }
    State().last_try = std::chrono::steady_clock::now();
    who = State().who;
    scope_name = State().scope_name;
  }
  (void)PlaceSelf(who, scope_name, false);
}

std::string PlacementSummary() {
  std::lock_guard<std::mutex> lock(State().mu);
  return State().summary;
}

}  // namespace nsbox::isolate

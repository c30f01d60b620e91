#pragma once

// Where nsbox makes its sandboxes' cgroups on a host whose controllers are in cgroup v2
// (docs/cgroups.md "Placement"). The kernel's no-internal-processes rule lets a v2 cgroup that
// is not the root pass controllers to its children only while it holds no process itself, and
// nsbox holds its own cgroup. So, at start, nsboxd and `nsbox run`:
//   - in the root cgroup, or where no controller needs enabling: stay as they are;
//   - in a cgroup delegated to them (a systemd unit with Delegate=yes, a container's own cgroup
//     namespace): move themselves, and only themselves, into a leaf of it and enable the
//     controllers for the sandboxes made beside that leaf;
//   - where systemd runs and the cgroup is not theirs (a login session's scope, someone else's
//     service): ask systemd for a transient scope with Delegate=yes, then as above;
//   - where systemd does not run: make a cgroup of nsbox's own under the hierarchy's root, as
//     container engines' cgroupfs driver does.
// Planned as plain values (PlanPlacement), then applied.

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "isolate/cgroup.h"

namespace nsbox::isolate {

// What the choice depends on, gathered by GatherPlacementFacts (or written by a test).
struct PlacementFacts {
  bool v2_mounted = true;               // false on a v1-only host: nothing to place
  CgroupHierarchy v2;                   // our own cgroup, LoadCgroupV2State'd, before any placement
  bool systemd = false;                 // systemd is the init system (/run/systemd/system exists)
  std::string unit;                     // the systemd unit of our cgroup ("nsboxd.service"), or ""
  bool unit_delegated = false;          // that unit has Delegate=yes
  std::string unit_cgroup;              // its ControlGroup, "/system.slice/nsboxd.service"
  std::string unit_error;               // why the unit could not be asked about, when it could not
  std::vector<pid_t> others;            // the processes of our cgroup other than this one
  bool hierarchy_root_is_root = false;  // the cgroup at v2.mount_point is the real root
};

enum class PlacementKind {
  kAsFound,       // nothing to do: the root cgroup, or every controller already passes on
  kOwnLeaf,       // our cgroup is delegated to us: move into a leaf of it
  kSystemdScope,  // ask systemd for a delegated scope, then move into a leaf of it
  kCgroupfs,      // no systemd: a cgroup of nsbox's own under the hierarchy's root
};

std::string_view PlacementKindName(PlacementKind kind);

struct PlacementPlan {
  PlacementKind kind = PlacementKind::kAsFound;
  // The controllers the sandboxes get (cpu, io, memory, pids: those the hierarchy has here).
  std::vector<std::string> controllers;
  std::string base;  // absolute: where the sandboxes' cgroups are made ("" for a scope to come)
  std::string leaf;  // absolute: where nsbox moves itself (kOwnLeaf), else ""
  std::string root;  // kCgroupfs: the hierarchy's root, which passes the controllers to `base`
  std::string why;   // one sentence, for the log and `nsbox doctor`
};

// The leaf nsbox moves itself into, in a cgroup delegated to it.
inline constexpr std::string_view kPlacementLeaf = "supervisor";
// The cgroup nsbox makes under the hierarchy's root where systemd does not run.
inline constexpr std::string_view kCgroupfsBase = "nsbox";

// Pure: the placement for `facts`. An error says why none is possible and what to change.
Result<PlacementPlan> PlanPlacement(const PlacementFacts& facts);

// Pure: the innermost systemd unit named in a cgroup path ("/system.slice/nsboxd.service/x" ->
// "nsboxd.service", "/user.slice/user-1000.slice/session-3.scope" -> "session-3.scope"), or "".
std::string UnitOfCgroupPath(std::string_view cgroup_path);

// The facts for this process: its cgroup, systemd's answers (systemctl show) when systemd runs.
Result<PlacementFacts> GatherPlacementFacts();
// The same from the process's layout as LoadCgroupLayout gave it before any placement, which
// the caller already holds (nothing of it is read again).
Result<PlacementFacts> GatherPlacementFacts(const CgroupLayout& own);

// Applies a plan: the moves, mkdirs and subtree_control writes (a scope is asked of systemd,
// named `scope_name`, "nsboxd-1234.scope"). On success, the place where the sandboxes' cgroups
// are made from then on (LoadCgroupLayout's v2 directory) is the plan's base. Returns the plan as
// carried out (a scope's base is known only once it exists).
Result<PlacementPlan> ApplyPlacement(const PlacementPlan& plan, std::string_view scope_name);

// GatherPlacementFacts, PlanPlacement and ApplyPlacement, logged: where nsbox ended up and why.
// `who` names the caller in the log ("nsboxd", "nsbox run"); `quiet` logs at debug only; `own`,
// when given, is the process's layout before any placement (else it is read).
Result<PlacementPlan> PlaceSelf(std::string_view who, std::string_view scope_name, bool quiet,
                                const CgroupLayout* own = nullptr);

// For a daemon whose PlaceSelf failed: tries it again, at most once every 2 s, so that a systemd
// that did not answer at start, or a cgroup tree put right by hand, is used once it is there.
// Nothing when the last PlaceSelf succeeded or there was none.
void RetryFailedPlacement();

// What the last PlaceSelf of this process did or why it failed, for `nsbox doctor` and the
// errors of requests made while it failed: "" before any.
std::string PlacementSummary();

// Asks systemd (over D-Bus, through busctl: the nsbox binaries are static, and Debian ships no
// static libsystemd) to start a transient scope named `name` with `pid` in it and Delegate=yes,
// and waits (up to `timeout_ms`) until `pid` is in it.
Status StartDelegatedScope(std::string_view name, pid_t pid, int timeout_ms);

}  // namespace nsbox::isolate

// The commands' cgroups: a set of exec-<n> directories per command, made ahead on the runner's
// cgroup thread (or before the runner: PremadeCgroups), kept for the next command when it can
// serve as new (Reusable), removed once empty.

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "base/cleanup.h"
#include "base/files.h"
#include "base/log.h"
#include "exec/runner_internal.h"

namespace nsbox::exec {

namespace {

bool SameFile(int a, int b) {
  struct stat sa {
  }, sb{};
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// A fresh exec-<n> in every hierarchy, with the fds the command and its usage report need. A
// stale exec-<n> (a runner before this one left it busy) is skipped, never reused: it may hold
// someone else's processes. Safe on any thread.
Result<CgroupSet> MakeCgroupSet(CgroupParents& parents) {
  CgroupSet set;
  CgroupsLeft made;
  for (int tries = 0;; ++tries) {
    set.name = "exec-" + std::to_string(parents.next_name.fetch_add(1));
    made = CgroupsLeft();
    made.v1.assign(parents.v1.size(), false);
    int err = 0;
    if (parents.v2.valid()) {
      if (::mkdirat(parents.v2.get(), set.name.c_str(), 0755) == 0) {
        made.v2 = true;
      } else {
        err = errno;
      }
    }
    for (size_t i = 0; err == 0 && i < parents.v1.size(); ++i) {
      if (::mkdirat(parents.v1[i].get(), set.name.c_str(), 0755) == 0) {
        made.v1[i] = true;
      } else {
        err = errno;
      }
    }
    if (err == 0) break;
    RemoveCgroups(parents, set.name, made, 0);
    if (err != EEXIST || tries >= 1000) return Error::Sys("mkdir", set.name, err);
  }
  CleanupStack undo;
  undo.Push([&parents, &set, &made] { RemoveCgroups(parents, set.name, made, 0); });
  if (parents.v2.valid()) {
    NSBOX_ASSIGN_OR_RETURN(set.v2, OpenAt(parents.v2.get(), set.name, O_RDONLY | O_DIRECTORY));
  }
  for (const auto& dir : parents.v1) {
    NSBOX_ASSIGN_OR_RETURN(auto fd, OpenAt(dir.get(), set.name, O_RDONLY | O_DIRECTORY));
    NSBOX_ASSIGN_OR_RETURN(auto procs, OpenAt(fd.get(), "cgroup.procs", O_WRONLY));
    set.v1.push_back(std::move(fd));
    set.v1_procs.push_back(std::move(procs));
  }
  auto v1_dir = [&set](int index) { return index >= 0 ? set.v1[index].get() : -1; };
  set.usage = OpenUsageFiles(
      {set.v2.valid() ? set.v2.get() : -1, v1_dir(parents.memory_v1), v1_dir(parents.pids_v1)});
  undo.Release();
  return set;
}

}  // namespace

namespace runner_internal {

// Pure v2: the memory, pids and io controllers the sandbox's cgroup has, passed on to the exec
// cgroups, so that memory.peak, pids.peak, io.stat and memory.events exist there. Best effort
// (nothing to do on a hybrid host, whose v2 directory has no controllers): nsbox-init lives in
// the leaf "init", so the directory holds no process and may pass controllers down.
void EnableAccountingControllers(int cgroup_dir) {
  auto available = ReadFileAt(cgroup_dir, "cgroup.controllers");
  if (!available.ok()) return;
  std::string words = " " + *available + " ";
  for (char& c : words) {
    if (c == '\n') c = ' ';
  }
  for (const char* c : {"memory", "pids", "io"}) {
    if (words.find(" " + std::string(c) + " ") == std::string::npos) continue;
    Status st = WriteExistingFileAt(cgroup_dir, "cgroup.subtree_control", std::string("+") + c);
    if (!st.ok())
      log::warn("exec usage: enable {} for the exec cgroups: {}", c, st.error().message());
  }
}

CgroupsLeft LeftOf(const CgroupSet& set) {
  CgroupsLeft left;
  left.v2 = set.v2.valid();
  for (const auto& fd : set.v1) left.v1.push_back(fd.valid());
  return left;
}

Result<std::shared_ptr<CgroupParents>> DupParents(int v2, const std::vector<int>& v1, int memory_v1,
                                                  int pids_v1) {
  auto parents = std::make_shared<CgroupParents>();
  if (v2 >= 0) {
    NSBOX_ASSIGN_OR_RETURN(parents->v2, DupCloexec(v2, "the exec cgroups' parent"));
  }
  for (int dir : v1) {
    NSBOX_ASSIGN_OR_RETURN(auto fd, DupCloexec(dir, "the exec cgroups' v1 parent"));
    parents->v1.push_back(std::move(fd));
  }
  parents->memory_v1 = memory_v1;
  parents->pids_v1 = pids_v1;
  return parents;
}

// Removes what is left of the set `name` (the v2 directory, the kill scope, first: while it has
// processes, nothing is removed) and says what is still there. A cgroup with processes cannot be
// removed (EBUSY): background processes keep running in it until they end or the sandbox is
// stopped. Safe on any thread.
CgroupsLeft RemoveCgroups(const CgroupParents& parents, const std::string& name, CgroupsLeft left,
                          uint64_t id) {
  if (left.v2) {
    if (::unlinkat(parents.v2.get(), name.c_str(), AT_REMOVEDIR) < 0 && errno != ENOENT) {
      if (errno != EBUSY) log::warn("exec {}: rmdir {}: {}", id, name, ErrnoText(errno));
      return left;
    }
    left.v2 = false;
  }
  for (size_t i = 0; i < left.v1.size() && i < parents.v1.size(); ++i) {
    if (!left.v1[i]) continue;
    if (::unlinkat(parents.v1[i].get(), name.c_str(), AT_REMOVEDIR) < 0 && errno != ENOENT) {
      if (errno != EBUSY) log::warn("exec {}: rmdir v1 {}: {}", id, name, ErrnoText(errno));
      continue;
    }
    left.v1[i] = false;
  }
  return left;
}

V1Layout LayOutV1(RunnerV1Cgroups v1) {
  V1Layout out;
  if (v1.memory_dir >= 0) {
    out.memory = static_cast<int>(out.dirs.size());
    out.dirs.push_back(v1.memory_dir);
  }
  if (v1.pids_dir >= 0) {
    out.pids = static_cast<int>(out.dirs.size());
    if (v1.memory_dir >= 0 && SameFile(v1.memory_dir, v1.pids_dir)) {
      out.pids = out.memory;
    } else {
      out.dirs.push_back(v1.pids_dir);
    }
  }
  return out;
}

}  // namespace runner_internal

bool Runner::Impl::TryRemoveCgroup(Command& cmd) {
  CgroupsLeft left = LeftOf(cmd.cg);
  if (left.any()) ApplyRemoval(cmd, RemoveCgroups(*parents, cmd.cg.name, left, cmd.id));
  return !LeftOf(cmd.cg).any();
}

void Runner::Impl::ApplyRemoval(Command& cmd, const CgroupsLeft& left) {
  if (!left.v2) cmd.cg.v2.reset();
  for (size_t i = 0; i < cmd.cg.v1.size() && i < left.v1.size(); ++i) {
    if (!left.v1[i]) cmd.cg.v1[i].reset();
  }
}

// The rmdirs (≈ 30 µs each in cgroupfs here, three per command on a hybrid host) on the
// runner's cgroup thread, so that the next request does not wait for them. The command keeps
// its fds meanwhile: a kill of the sandbox still reaches what may be left in its cgroup.
void Runner::Impl::RemoveOffLoop(const CommandPtr& cmd) {
  cmd->removing = true;
  cgroup_thread->Submit([reactor = &reactor, alive = alive, parents = parents, id = cmd->id,
                         name = cmd->cg.name, left = LeftOf(cmd->cg), this] {
    CgroupsLeft now = RemoveCgroups(*parents, name, left, id);
    // Only the loop touches the command: it is looked up there by id.
    reactor->Post([alive, id, now, this] {
      if (!*alive) return;  // the runner is gone; `this` must not be touched
      auto it = commands.find(id);
      if (it == commands.end()) return;
      CommandPtr c = it->second;
      c->removing = false;
      ApplyRemoval(*c, now);
      if (now.any()) {
        ScheduleSweep();
        return;
      }
      MaybeRetire(c);
    });
  });
}

Result<CgroupSet> Runner::Impl::TakeCgroupSet() {
  if (parents == nullptr) {
    NSBOX_ASSIGN_OR_RETURN(parents, DupParents(cgroup_dir, v1_dirs, memory_v1, pids_v1));
  }
  if (!spares.empty()) {
    CgroupSet set = spares.back()->Take();
    spares.pop_back();
    return set;
  }
  return MakeCgroupSet(*parents);
}

// Whether the set a command ended with can serve the next command as if it were new: the
// command was not killed, its cgroup is empty and always held that one process (pids.peak 1:
// the v1 peak cannot be reset, and a command's own process makes it at least 1 anyway), and the
// memory peak can be reset (Keep then checks that the OOM killer never struck there, after the
// answer). CPU time and I/O bytes only ever grow, and do not while the cgroup is empty: the next
// command's are reckoned from these. What
// makes and removes a set (three mkdirs and rmdirs in cgroupfs on a hybrid host, ≈ 300 µs of CPU
// with the kernel's work after an rmdir) is then saved for the commonest commands: one program,
// no child.
bool Runner::Impl::Reusable(const Command& cmd, const CommandUsage& counters) const {
  const CgroupSet& cg = cmd.cg;
  if (shutting_down || cmd.kill_reason.has_value() || !cmd.main_exited || cg.name.empty() ||
      !cg.v2.valid()) {
    return false;
  }
  for (const auto& fd : cg.v1) {
    if (!fd.valid()) return false;
  }
  if (cg.usage.pids_peak.valid()) {
    if (counters.pids_peak != uint64_t{1}) return false;
  } else if (!CgroupKnownEmpty(cg.v2.get())) {
    return false;  // something may still run there, or nothing could be read (EMFILE)
  }
  return !cg.usage.memory_peak.valid() || cg.usage.memory_peak_resettable;
}

// Keeps a reusable set for the next commands when there is room, its memory peak reset. False:
// the caller removes it.
bool Runner::Impl::Keep(CgroupSet& set) {
  if (shutting_down || spares.size() >= kKeptSets) return false;
  // Read here, after the answer, not before it: an OOM kill there leaves the set to removal.
  if (!NoOomKills(set.usage)) return false;
  if (set.usage.memory_peak.valid()) {
    if (!ResetMemoryPeak(set.usage)) return false;
    const std::optional<uint64_t> held = MemoryPeak(set.usage);
    if (!held.has_value() || *held > kReuseMaxHeldMemory) return false;
  }
  spares.push_back(std::make_shared<SpareSet>(parents, std::move(set)));
  set = CgroupSet();
  ArmIdle();
  MaybeMakeWarm();
  return true;
}

// The next command's cgroups, made on the cgroup thread while this one runs: three mkdirs
// and a dozen opens in cgroupfs (≈ 150 µs here) that a start no longer waits for.
void Runner::Impl::RequestSpare() {
  if (parents == nullptr || !spares.empty() || spare_pending || shutting_down) return;
  spare_pending = true;
  cgroup_thread->Submit(
      [reactor = &reactor, alive = alive, parents = parents, slot = made_spare, this] {
        auto made = MakeCgroupSet(*parents);
        if (!made.ok()) {
          reactor->Post([alive, this, e = made.error()] {
            if (!*alive) return;  // the runner is gone; `this` must not be touched
            spare_pending = false;
            log::warn("exec cgroups made ahead: {}", e.message());
          });
          return;
        }
        {
          std::lock_guard<std::mutex> lock(slot->mu);
          slot->set = std::make_shared<SpareSet>(parents, std::move(made).value());
        }
        reactor->Post([alive, slot, this] {
          if (!*alive) return;  // Shutdown removed the set; `this` must not be touched
          std::shared_ptr<SpareSet> owned;
          {
            std::lock_guard<std::mutex> lock(slot->mu);
            owned = std::move(slot->set);
          }
          spare_pending = false;
          if (owned == nullptr) return;
          if (spares.size() >= kKeptSets || shutting_down) return;
          spares.push_back(owned);
          ArmIdle();
          MaybeMakeWarm();
        });
      });
}

void Runner::Impl::ScheduleSweep() {
  if (sweep_op != 0 || shutting_down) return;
  sweep_op = reactor.Timer(kSweepInterval, [this, alive = alive](int) {
    if (!*alive) return;  // the runner is gone; `this` must not be touched
    sweep_op = 0;
    Sweep();
  });
}

void Runner::Impl::Sweep() {
  std::vector<CommandPtr> lingering;
  for (const auto& [id, cmd] : commands) {
    if (cmd->reported) lingering.push_back(cmd);
  }
  for (const auto& cmd : lingering) MaybeRetire(cmd);
}

Result<PremadeCgroups> PremadeCgroups::Make(int cgroup_dir, RunnerV1Cgroups v1) {
  if (cgroup_dir < 0 && v1.memory_dir < 0 && v1.pids_dir < 0) return PremadeCgroups();
  if (cgroup_dir >= 0) EnableAccountingControllers(cgroup_dir);
  const V1Layout layout = LayOutV1(v1);
  auto state = std::make_shared<State>();
  NSBOX_ASSIGN_OR_RETURN(state->parents,
                         DupParents(cgroup_dir, layout.dirs, layout.memory, layout.pids));
  // Two: the first command's child made ahead takes one (Runner::Anticipate), and a command
  // that comes before that child is ready takes the other.
  for (size_t i = 0; i < kKeptSets; ++i) {
    NSBOX_ASSIGN_OR_RETURN(CgroupSet set, MakeCgroupSet(*state->parents));
    state->sets.push_back(std::make_shared<SpareSet>(state->parents, std::move(set)));
  }
  PremadeCgroups out;
  out.state_ = std::move(state);
  return out;
}

}  // namespace nsbox::exec

// The idle stop (docs/daemon.md "Idle stop"): Registry::StopIfIdle.

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

#include <chrono>
#include <memory>
#include <mutex>

#include "base/files.h"
#include "base/log.h"
#include "exec/runner.h"
#include "exec/spawn.h"
#include "runtime/registry.h"

namespace nsbox::runtime {

namespace {

// Whether nothing lives in a sandbox but its nsbox-init (`init_pid`, as the host sees it) and the
// child that nsbox-init made ahead for the next command. Every process of a PID namespace
// descends from its PID 1, to which orphans are re-parented, so the children of nsbox-init's
// threads tell; the child made ahead has not called execve yet and still runs nsbox-init's
// executable. Any doubt (a file that cannot be read) is "something lives".
bool NothingRunsBesidesInit(pid_t init_pid) {
  const std::string proc = "/proc/" + std::to_string(init_pid);
  struct stat init_exe {};
  if (::stat((proc + "/exe").c_str(), &init_exe) != 0) return false;
  std::unique_ptr<DIR, int (*)(DIR*)> tasks(::opendir((proc + "/task").c_str()), ::closedir);
  if (!tasks) return false;
  int made_ahead = 0;
  while (dirent* d = ::readdir(tasks.get())) {
    if (d->d_name[0] == '.') continue;
    const std::string task = proc + "/task/" + d->d_name;
    auto children = ReadFile(task + "/children");
    if (!children.ok()) {
      // A thread that ended has no directory any more; a kernel without CONFIG_PROC_CHILDREN has
      // the directory but not the file.
      struct stat st {};
      if (children.error().code() == ENOENT && ::stat(task.c_str(), &st) != 0 && errno == ENOENT) {
        continue;
      }
      return false;
    }
    for (pid_t pid : exec::ParsePids(*children)) {
      // A child without an executable to stat is one that exited but may still hold children
      // (in exit_mm they are not re-parented yet) or threads (a leader that ended before
      // them): something lives. A zombie nsbox-init has not reaped yet is such a case too, for
      // the moment before it does; the next look sees it gone.
      struct stat exe {};
      if (::stat(("/proc/" + std::to_string(pid) + "/exe").c_str(), &exe) != 0 ||
          exe.st_dev != init_exe.st_dev || exe.st_ino != init_exe.st_ino || ++made_ahead > 1) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

bool Registry::StopIfIdle(SandboxEntry& entry) {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lifecycle(entry.lifecycle_mu_, std::try_to_lock);
  if (!lifecycle.owns_lock()) return false;
  std::shared_ptr<Sandbox> box;
  Clock::time_point used;
  {
    std::lock_guard<std::mutex> lock(entry.mu_);
    const auto at = entry.IdleCheckAtLocked();
    if (!at || Clock::now() < *at) return false;
    box = entry.box_;
    used = entry.last_used_;
  }
  // Read without the entry's lock, which every request takes; a request that began since then
  // is seen below (a new command needs one).
  const bool quiet = NothingRunsBesidesInit(box->init_pid());
  const Clock::time_point now = Clock::now();
  Clock::time_point since;
  {
    std::lock_guard<std::mutex> lock(entry.mu_);
    if (entry.box_ != box || entry.users_ > 0 || entry.last_used_ != used) return false;
    if (!quiet || entry.busy_) {
      // A process of its own, or the first look without one since: idle from now on.
      entry.busy_ = !quiet;
      entry.last_busy_ = now;
      return false;
    }
    since = std::max(entry.last_used_, entry.last_busy_);
    entry.box_.reset();
  }
  const auto idle_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - since).count();
  (void)StopBoxLocked(entry, std::move(box),
                      "stopped: idle for " + std::to_string(idle_ms) + " ms (idleStopMs " +
                          std::to_string(entry.idle_stop_ms_) + ")");
  return true;
}

}  // namespace nsbox::runtime

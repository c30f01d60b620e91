#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/pidfd.h"
#include "base/unique_fd.h"
#include "isolate/capabilities.h"
#include "isolate/idmap.h"
#include "isolate/mount_plan.h"
#include "isolate/seccomp.h"

namespace nsbox::isolate {

// Everything a jail is made of, prepared in the parent. Start() turns it into a running jail:
// PID 1 of new user, mount, PID, network, IPC, UTS and cgroup namespaces (a tiny init that
// reaps and forwards signals), and under it the command, with the capabilities, seccomp filter,
// rlimits and environment given here.
struct JailSpec {
  IdMapping ids;
  MountPlan mounts;
  std::string hostname;
  std::string cwd = "/workspace";  // inside the jail
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "K=V"
  // The files execve tries in turn (exec::CommandCandidates); the first that runs wins.
  std::vector<std::string> exec_candidates;
  bool tty = false;  // a pseudo-terminal from the jail's own devpts
  unsigned short tty_rows = 24;
  unsigned short tty_cols = 80;
  std::vector<std::pair<int, struct rlimit>> rlimits;  // already clamped to the host's
  const SeccompProgram* seccomp = nullptr;
  const CapabilityPlan* capabilities = nullptr;
  // An O_DIRECTORY fd of the jail's cgroup v2 directory: the child is born in it
  // (clone3 CLONE_INTO_CGROUP), so there is no moment where it runs outside. -1 for none.
  int cgroup_v2_fd = -1;
  // Init mode only: O_DIRECTORY fds of the jail's cgroup v1 memory and pids directories (the same
  // fd twice where the two are co-mounted), handed to nsbox-init as fds 5 and 6 so that it makes
  // a v1 cgroup per command there too and reads what the command used. -1 for none.
  int cgroup_v1_memory_fd = -1;
  int cgroup_v1_pids_fd = -1;
  // Init mode: instead of running `argv`, PID 1 sets the jail up and then executes this binary
  // (an O_PATH fd the host opened on nsbox-init, so nothing inside the jail can replace it) with
  // `init_argv`, an empty environment, the control channel on fd 3 and, when cgroup_v2_fd >= 0,
  // the jail's cgroup v2 directory on fd 4 (and the v1 memory and pids directories on fds 5 and 6
  // when cgroup_v1_memory_fd and cgroup_v1_pids_fd are >= 0). PID 1 first moves itself into a leaf
  // "init" of that directory, so the directory is free to hold a cgroup per command (cgroup v2's
  // "no internal processes" rule). -1: command mode.
  int init_fd = -1;
  std::vector<std::string> init_argv;
  // Called with the child's host pid before it goes on, to place it in the cgroups it could not
  // be born in (v1 hierarchies; v2 too when clone3 is not available: `joined_v2` says which).
  std::function<Status(pid_t pid, bool joined_v2)> place_in_cgroups;
};

// The running jail: its PID 1, seen from the host.
class Jail {
 public:
  // Sets everything up and starts the command. Errors name the step that failed, e.g.
  // "set up the jail: mount plan step 12 (bind /usr -> /usr (ro,nosuid,nodev)): EPERM ...".
  // A command that cannot be executed is not an error here: see exec_error().
  static Result<Jail> Start(const JailSpec& spec);

  pid_t pid() const { return init_.pid(); }
  const Pidfd& pidfd() const { return init_.pidfd(); }
  // The master side of the terminal (when spec.tty), owned by the caller after Start.
  UniqueFd TakeTtyMaster() { return std::move(tty_master_); }
  // Init mode: the host's end of the control channel (a SOCK_STREAM socket).
  UniqueFd TakeControl() { return std::move(control_); }
  // errno of the failed execve of the command (ENOENT: not found, EACCES: not executable); 0 when
  // it started. When set, PID 1 exits with 127 or 126 as a shell would.
  int exec_error() const { return exec_error_; }

  Status Signal(int sig) const { return init_.Signal(sig); }
  // The exit status of PID 1, which is the command's: its exit code, or 128 + the signal that
  // killed it.
  Result<ExitStatus> Wait() { return init_.Wait(); }
  Result<bool> TryWait(ExitStatus* status) { return init_.TryWait(status); }

 private:
  ChildProcess init_;
  UniqueFd tty_master_;
  UniqueFd control_;
  int exec_error_ = 0;
};

// Where nsbox-init finds the directory its mount plan held (MountOp::Kind::kHoldDir: the jail's
// own /etc of a jail adopted later), to be given as `--own-etc-fd 7`.
inline constexpr int kInitOwnEtcFd = 7;

// Exit codes of `nsbox run`, as a shell and docker run use them.
inline constexpr int kExitSetupFailed = 125;
inline constexpr int kExitNotExecutable = 126;
inline constexpr int kExitNotFound = 127;

}  // namespace nsbox::isolate

#pragma once

#include <signal.h>
#include <sys/types.h>

#include "base/error.h"
#include "base/unique_fd.h"

namespace nsbox {

// A process held by a pidfd: signals go through pidfd_send_signal, never kill(pid), since pids
// are reused. Does not reap; see ChildProcess for an owner that does.
class Pidfd {
 public:
  Pidfd() = default;
  Pidfd(pid_t pid, UniqueFd fd) : pid_(pid), fd_(std::move(fd)) {}

  static Result<Pidfd> Open(pid_t pid);

  pid_t pid() const { return pid_; }
  int fd() const { return fd_.get(); }
  bool valid() const { return fd_.valid(); }

  // ESRCH (the process has exited) is not an error: there is nothing left to signal.
  Status Signal(int sig) const;

 private:
  pid_t pid_ = -1;
  UniqueFd fd_;
};

// How a process ended, as waitid reports it.
struct ExitStatus {
  bool signaled = false;
  int code = 0;    // exit code when !signaled
  int signal = 0;  // signal number when signaled
  bool core_dumped = false;

  // The shell's convention: the exit code, or 128 + the signal number.
  int ShellCode() const { return signaled ? 128 + signal : code; }
};

// The status waitid reported in `info` (si_code CLD_EXITED, CLD_KILLED or CLD_DUMPED).
ExitStatus ExitStatusFromSiginfo(const siginfo_t& info);

// A child process that is killed (SIGKILL) and reaped when the handle is dropped unreaped.
class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(pid_t pid, UniqueFd pidfd) : pidfd_(pid, std::move(pidfd)) {}
  ChildProcess(ChildProcess&& other) noexcept = default;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pidfd_.pid(); }
  const Pidfd& pidfd() const { return pidfd_; }
  bool running() const { return pidfd_.valid() && !reaped_; }

  Status Signal(int sig) const { return pidfd_.Signal(sig); }
  // Blocks until the child exits and reaps it (EINTR is retried).
  Result<ExitStatus> Wait();
  // Reaps the child if it has exited; an empty optional-like result (false) if it still runs.
  Result<bool> TryWait(ExitStatus* status);

 private:
  void KillAndReap();

  Pidfd pidfd_;
  bool reaped_ = false;
};

}  // namespace nsbox

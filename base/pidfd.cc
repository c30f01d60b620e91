#include "base/pidfd.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

#include <string>

#include "base/syscalls.h"

namespace nsbox {

Result<Pidfd> Pidfd::Open(pid_t pid) {
  int fd = sys::PidfdOpen(pid, 0);
  if (fd < 0) {
    return Error::Sys("pidfd_open", std::to_string(pid), errno);
  }
  return Pidfd(pid, UniqueFd(fd));
}

Status Pidfd::Signal(int sig) const {
  if (sys::PidfdSendSignal(fd_.get(), sig, nullptr, 0) < 0 && errno != ESRCH) {
    return Error::Sys("pidfd_send_signal", std::to_string(pid_), errno);
  }
  return Ok();
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    KillAndReap();
    pidfd_ = std::move(other.pidfd_);
    reaped_ = other.reaped_;
  }
  return *this;
}

ChildProcess::~ChildProcess() { KillAndReap(); }

void ChildProcess::KillAndReap() {
  if (running()) {
    (void)pidfd_.Signal(SIGKILL);
    (void)Wait();
  }
}

ExitStatus ExitStatusFromSiginfo(const siginfo_t& info) {
  ExitStatus st;
  if (info.si_code == CLD_EXITED) {
    st.code = info.si_status;
  } else {
    st.signaled = true;
    st.signal = info.si_status;
    st.core_dumped = info.si_code == CLD_DUMPED;
  }
  return st;
}

Result<ExitStatus> ChildProcess::Wait() {
  siginfo_t info{};
  while (waitid(P_PIDFD, static_cast<id_t>(pidfd_.fd()), &info, WEXITED) < 0) {
    if (errno != EINTR) {
      return Error::Sys("waitid", std::to_string(pidfd_.pid()), errno);
    }
  }
  reaped_ = true;
  return ExitStatusFromSiginfo(info);
}

Result<bool> ChildProcess::TryWait(ExitStatus* status) {
  siginfo_t info{};
  if (waitid(P_PIDFD, static_cast<id_t>(pidfd_.fd()), &info, WEXITED | WNOHANG) < 0) {
    return Error::Sys("waitid", std::to_string(pidfd_.pid()), errno);
  }
  if (info.si_pid == 0) {
    return false;
  }
  reaped_ = true;
  *status = ExitStatusFromSiginfo(info);
  return true;
}

}  // namespace nsbox

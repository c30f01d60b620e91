// Kills (timeout, cancel, output cap, stop): SIGTERM to the command's tree, SIGKILL (cgroup.kill)
// after the grace, and the checks that its cgroup emptied.

#include <errno.h>
#include <signal.h>

#include "base/log.h"
#include "base/syscalls.h"
#include "exec/command.h"
#include "exec/runner_internal.h"

namespace nsbox::exec {

void Runner::Impl::BeginKill(const CommandPtr& cmd, EndReason reason) {
  if (cmd->reported || cmd->kill_reason.has_value()) return;
  cmd->kill_reason = reason;
  cmd->killed_running = !cmd->main_exited;
  if (cmd->timeout_op != 0) reactor.Cancel(cmd->timeout_op);
  if (reason == EndReason::kOutputLimit) {
    SendKill(cmd);
    return;
  }
  SignalTree(cmd, SIGTERM);
  ArmTimer(cmd, kKillGrace, &Command::grace_op, [](const CommandPtr& c) { c->impl->SendKill(c); });
}

void Runner::Impl::SignalTree(const CommandPtr& cmd, int sig) {
  // A child made ahead drops what was sent to it before its command: told first, it keeps this.
  if (cmd->warm != nullptr) cmd->warm->NoteSignal(sig);
  if (!cmd->main_exited && cmd->pidfd.valid()) {
    // SAFETY: pidfd_send_signal to our own child. The process group has the main process's
    // pid (setsid), which cannot be reused while that process is our unreaped child, so
    // kill(-pgid) reaches its group and nothing else.
    sys::PidfdSendSignal(cmd->pidfd.get(), sig, nullptr, 0);
    ::kill(-cmd->pid, sig);
  }
  if (cmd->kill_scope) {
    // Also what left the process group (setsid, double fork): the cgroup holds them all. Once
    // the cgroup is removed, nothing of the command is left.
    if (!cmd->cg.v2.valid()) return;
    auto listed = SignalCgroupProcs(cmd->cg.v2.get(), sig);
    if (!listed.ok()) log::warn("exec {}: signal {}: {}", cmd->id, sig, listed.error().message());
  } else {
    // No cgroup: the session is the widest scope there is; setsid escapes it.
    SignalSession(cmd->pid, sig, cmd->main_exited);
  }
}

void Runner::Impl::SendKill(const CommandPtr& cmd) {
  if (!cmd->main_exited && cmd->pidfd.valid()) {
    // SAFETY: as in SignalTree.
    sys::PidfdSendSignal(cmd->pidfd.get(), SIGKILL, nullptr, 0);
    ::kill(-cmd->pid, SIGKILL);
  }
  if (cmd->kill_scope) {
    if (!cmd->cg.v2.valid()) return;  // removed: it was empty
    // cgroup.kill (5.14) kills the whole subtree at once, forks in progress included. Before it:
    // SIGKILL each listed process, again until none is left.
    if (!CgroupKill(cmd->cg.v2.get()).ok()) {
      for (int pass = 0; pass < 20; ++pass) {
        auto listed = SignalCgroupProcs(cmd->cg.v2.get(), SIGKILL);
        if (!listed.ok() || *listed == 0) break;
      }
    }
    if (cmd->check_op == 0 && !shutting_down) {
      ArmTimer(cmd, kKillCheckInterval, &Command::check_op,
               [](const CommandPtr& c) { c->impl->OnKillCheck(c); });
    }
  } else {
    SignalSession(cmd->pid, SIGKILL, cmd->main_exited);
  }
}

void Runner::Impl::OnKillCheck(const CommandPtr& cmd) {
  if (!cmd->cg.v2.valid() || CgroupEmpty(cmd->cg.v2.get())) {
    if (cmd->reported) MaybeRetire(cmd);
    return;
  }
  if (++cmd->kill_checks >= kKillChecks) {
    log::warn("exec {}: cgroup {} still has processes after SIGKILL", cmd->id, cmd->cg.name);
    return;  // the sweep keeps trying to remove it
  }
  SendKill(cmd);
}

void Runner::Impl::KillAll(EndReason reason) {
  DropWarm();
  std::vector<CommandPtr> all;
  all.reserve(commands.size());
  for (const auto& [id, cmd] : commands) all.push_back(cmd);
  for (const auto& cmd : all) {
    if (!cmd->reported) {
      BeginKill(cmd, reason);
    } else if (cmd->grace_op == 0) {
      // Answered already, but background processes of it may live on: the sandbox-wide kill
      // reaches them too.
      SignalTree(cmd, SIGTERM);
      ArmTimer(cmd, kKillGrace, &Command::grace_op,
               [](const CommandPtr& c) { c->impl->SendKill(c); });
    }
  }
}

}  // namespace nsbox::exec

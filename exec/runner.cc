// The command runner of nsbox-init (api.md, exec). One command's life:
//
//   Start   its cgroups: exec-<n> in the v2 directory (and in the v1 memory and pids ones of a
//           hybrid host), the spare set made ahead of time if there is one; pipes; Spawn
//           (clone3 CLONE_INTO_CGROUP, vfork-like; the child joins the v1 ones before execve);
//           on_start; a Read per output pipe, a PollIn on the pidfd, stdin Writes, the timeout;
//           for commands in a row, the next one's set is made on the runner's thread meanwhile.
//   output  delivered as it comes through on_output, counted against output_limit.
//   exit    the pidfd is readable: waitid reaps the main process. The pipes are read until EOF
//           or for the 100 ms drain window, whichever is first; the usage figures are read from
//           the command's cgroups; then on_exit, exactly once.
//   after   the pipes are read and discarded until EOF (background processes never block on a
//           full pipe); a set that can serve the next command as new (Reusable) is kept for
//           it; else the cgroups are removed once empty (tried at once: on the runner's
//           thread for commands in a row, else on the loop; then by a sweep every 500 ms while
//           any is left); then it is forgotten.
//   idle    2 s after the last start with nothing running, the kept sets and the kept read
//           buffers are released: an idle sandbox holds neither.
//
// Kill (timeout, cancel, stop): SIGTERM to the process group and to every process of the
// cgroup (or of the session where there is no cgroup), SIGKILL 2 s later (cgroup.kill). The
// output cap kills at once with SIGKILL: the output is lost anyway, and a tree that spews output
// gets no grace. The answer comes when the main process has died: at once if it dies on SIGTERM.
// A kill that arrives in the drain window (the main process had already exited on its own)
// still reaches the tree, but the answer keeps the natural exit. Kill and KillAll on a command
// already answered: Kill ignores it; KillAll (a sandbox stop) also kills its background processes.
//
// What the caller must know (runner.h cannot say it all):
// - on_start runs inside Start, before it returns; on_output and on_exit from RunOnce.
// - The reactor outlives the runner, and no callback destroys the runner.
// - The destructor SIGKILLs everything, reaps, and calls on_exit (kStopped) for what was still
//   running; output still in the pipes is not read. Exec cgroups are removed, waiting up to 1 s.
// - The runner reaps its own children through their pidfds: nsbox-init, which as PID 1 must
//   reap orphans, must not use waitpid(-1) or waitid(P_ALL) without WNOWAIT; it reaps by pid
//   the exited children that are not the runner's (runner.h has no query for that yet).
// - SIGPIPE: set to SIG_IGN by the constructor where it was SIG_DFL, so that feeding stdin to a
//   command that closed it fails with EPIPE instead of killing nsbox-init.
//
// stdin: a queue of chunks (stdin_data first, then each Input), written in order through the
// reactor; an Input is answered once its last byte is written, which is the sender's flow
// control. Only the chunk at the front is ever being written; the queue is bounded by
// kMaxPendingInput bytes and kMaxPendingInputs chunks. Without stdin_stream the stdin_data chunk
// closes the pipe once written.
//
// Terminals (spec.tty): a pty pair from /dev/ptmx; the slave is the child's 0, 1 and 2 and its
// controlling terminal (SpawnRequest::controlling_tty), and nsbox-init closes its copy at once
// after the spawn, so no other command can inherit it. The master (non-blocking, close-on-exec)
// is read as stream 1, exactly as a stdout pipe: a read of the master fails with EIO once no
// process holds the slave, which is its EOF. Two dups of it: one written for the input (closed
// once a close was written: VEOF, not a hang-up), one kept for TIOCSWINSZ until the answer.
//
// The files: this one, a command's life (Start, its exit and answer, retiring it, idling,
// Shutdown); runner_stdio.cc its pipes, terminal, output and input; runner_cgroups.cc its
// cgroups, made ahead and kept; runner_child.cc its child and the child made ahead;
// runner_kill.cc kills; runner_internal.h what they share (Runner::Impl).

#include "exec/runner.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/cleanup.h"
#include "base/files.h"
#include "base/log.h"
#include "base/pidfd.h"
#include "base/stack.h"
#include "exec/runner_internal.h"
#include "exec/spawn.h"

namespace nsbox::exec {

std::string_view EndReasonName(EndReason reason) {
  switch (reason) {
    case EndReason::kExited:
      return "exited";
    case EndReason::kSignaled:
      return "signaled";
    case EndReason::kTimeout:
      return "timeout";
    case EndReason::kCancelled:
      return "cancelled";
    case EndReason::kOutputLimit:
      return "output_limit";
    case EndReason::kOom:
      return "oom";
    case EndReason::kStopped:
      return "stopped";
  }
  return "unknown";
}

namespace {

void SleepMs(long ms) {
  struct timespec ts {
    ms / 1000, (ms % 1000) * 1000000
  };
  while (::nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

}  // namespace

Status Runner::Impl::OpenDevNull() {
  if (dev_null.valid()) return Ok();
  NSBOX_ASSIGN_OR_RETURN(dev_null, OpenAt(AT_FDCWD, "/dev/null", O_RDWR));
  pipe_size = PipeSizeToAsk();
  return Ok();
}

void Runner::Impl::Anticipate(bool hold) {
  if (hold && last_start == Clock::time_point{}) {
    hold_for_first = true;
    if (idle_op != 0) reactor.Cancel(idle_op);  // the constructor's, for the cgroups made ahead
  }
  if (shutting_down || spares.empty() || warm != nullptr) return;
  if (auto opened = OpenDevNull(); !opened.ok()) {
    log::warn("exec: a child made ahead for the first command: {}", opened.error().message());
    return;
  }
  // A child for the first command only. That command still counts as a lone one, so that a
  // sandbox that runs one command does for it what it did before: no cgroup thread, no set made
  // for a next command, no second child (each would leave its share of kernel memory behind in
  // an idle sandbox, if only for a while: a removed memory cgroup lingers while anything is still
  // charged to it).
  const bool was_in_a_row = in_a_row;
  in_a_row = true;
  MaybeMakeWarm();
  in_a_row = was_in_a_row;
  ArmIdle();
}

Result<uint64_t> Runner::Impl::Start(const CommandSpec& spec, CommandEvents events) {
  if (spec.argv.empty()) return Error::Msg("start command: empty argv");
  if (shutting_down) return Error::Msg("start command: the runner is shutting down");
  hold_for_first = false;  // from now on, idle is idle (Anticipate)
  if (stack == nullptr) {
    auto created = ChildStack::Create(kChildStackSize);
    if (!created.ok()) return std::move(created).error().Context("start command");
    stack = std::move(created).value();
  }
  NSBOX_TRY_CTX(OpenDevNull(), "start command");

  auto cmd = std::make_shared<Command>();
  cmd->impl = this;
  cmd->id = next_id++;
  CleanupStack undo;

  // A child made ahead takes the command when it is ready, with its cgroups and pipes (not a
  // terminal's: the pty is the command's own). One that is still getting ready serves a later
  // command.
  std::unique_ptr<WarmChild> child;
  if (warm != nullptr && !spec.tty.has_value()) {
    switch (warm->Poll()) {
      case WarmChild::State::kReady:
        child = std::move(warm);
        cmd->cg = std::move(warm_set);
        warm_set = CgroupSet();
        cmd->kill_scope = cmd->cg.v2.valid();
        undo.Push([parents = parents, name = cmd->cg.name, left = LeftOf(cmd->cg)] {
          RemoveCgroups(*parents, name, left, 0);
        });
        undo.Push([&child] { child.reset(); });  // killed and reaped before its cgroups go
        break;
      case WarmChild::State::kFailed:
        if (Status why = warm->Failure(); !why.ok()) {
          log::warn("exec: commands start without a child made ahead: {}", why.error().message());
          warm_off = true;
        }
        DropWarm();
        break;
      default:
        break;
    }
  }
  // Its cgroups: the v2 one is the command's kill scope, the v1 ones (memory and pids of a
  // hybrid host) say what it used.
  if (child == nullptr && (cgroup_dir >= 0 || !v1_dirs.empty())) {
    auto set = TakeCgroupSet();
    if (!set.ok()) return std::move(set).error().Context("start command: cgroups");
    cmd->cg = std::move(set).value();
    cmd->kill_scope = cmd->cg.v2.valid();
    undo.Push([parents = parents, name = cmd->cg.name, left = LeftOf(cmd->cg)] {
      RemoveCgroups(*parents, name, left, 0);
    });
  }
  // Commands in a row (this one within kIdleRelease of the last): the next one's cgroups are
  // made ahead and ended ones removed on the cgroup thread. A lone command makes no spare that
  // would only be thrown away, and starts no thread.
  const Clock::time_point now = Clock::now();
  in_a_row = now - last_start < kIdleRelease;
  last_start = now;

  // The child made ahead has its pipes already; a terminal exec gets a pty of its own.
  StdioPipes pipes;
  UniqueFd tty_slave;
  const bool wants_stdin =
      !spec.tty.has_value() && (spec.stdin_data.has_value() || spec.stdin_stream);
  if (child != nullptr) {
    pipes = std::move(warm_pipes);
    warm_pipes = StdioPipes();
  } else if (spec.tty.has_value()) {
    NSBOX_TRY_CTX(OpenTerminal(*spec.tty, &cmd->out.fd, &tty_slave), "start command: terminal");
    NSBOX_ASSIGN_OR_RETURN(cmd->in, DupCloexec(cmd->out.fd.get(), "the terminal's master"));
    NSBOX_ASSIGN_OR_RETURN(cmd->tty, DupCloexec(cmd->out.fd.get(), "the terminal's master"));
    cmd->err.eof = true;  // one stream: the terminal
  } else {
    NSBOX_TRY_CTX(
        MakeStdioPipes(wants_stdin, running < kEnlargedPipeCommands ? pipe_size : 0, &pipes),
        "start command");
  }
  if (!spec.tty.has_value()) {
    cmd->out.fd = std::move(pipes.out);
    cmd->err.fd = std::move(pipes.err);
    // A child made ahead has a stdin pipe; it takes /dev/null instead when there is no input.
    if (wants_stdin) cmd->in = std::move(pipes.in);
  }
  cmd->stdin_stream = spec.stdin_stream || spec.tty.has_value();
  if (spec.stdin_data.has_value() && !spec.stdin_data->empty()) {
    cmd->input.push_back({*spec.stdin_data, 0, !cmd->stdin_stream, nullptr});
  } else if (!cmd->stdin_stream && cmd->in.valid()) {
    cmd->input.push_back({std::string(), 0, true, nullptr});  // nothing to feed: EOF at once
  }

  std::unique_ptr<Launch> launch = PrepareLaunch(spec, child != nullptr);
  SpawnRequest& request = launch->request;
  if (tty_slave.valid()) {
    request.stdin_fd = request.stdout_fd = request.stderr_fd = tty_slave.get();
    request.controlling_tty = true;
  } else {
    request.stdin_fd = pipes.child_in.valid() ? pipes.child_in.get() : dev_null.get();
    request.stdout_fd = pipes.child_out.get();
    request.stderr_fd = pipes.child_err.get();
  }
  request.cgroup_fd = cmd->cg.v2.valid() ? cmd->cg.v2.get() : -1;
  for (size_t i = 0; i < cmd->cg.v1_procs.size() && i < 2; ++i) {
    request.join_procs_fds[i] = cmd->cg.v1_procs[i].get();
  }
  request.reset_signals = reset_signals;
  request.hooks = hooks;
  cmd->started = Clock::now();
  Result<SpawnResult> spawned = child != nullptr
                                    ? Result<SpawnResult>(child->Launch(request, !wants_stdin))
                                    : Spawn(request, *stack);
  if (!spawned.ok()) return std::move(spawned).error().Context("start " + spec.argv[0]);
  undo.Release();
  // Only the child holds the other ends now: EOF comes when its tree has closed them.
  pipes = StdioPipes();
  tty_slave.reset();  // never inherited by another command: only this child holds the slave
  if (in_a_row) RequestSpare();

  cmd->pid = spawned->pid;
  cmd->pidfd = std::move(spawned->pidfd);
  cmd->limit = spec.output_limit;
  cmd->timeout = spec.timeout;
  cmd->events = std::move(events);
  cmd->out.buf = TakeBuffer();
  if (!cmd->err.eof) cmd->err.buf = TakeBuffer();
  // With a fallback, its failure is the one the child reports.
  const std::string& name = spec.fallback_argv.empty() ? spec.argv[0] : spec.fallback_argv[0];
  if (child != nullptr) {
    // It gets to its chdir and execve after this: what became of them is known at its exit.
    cmd->warm = std::move(child);
    cmd->launch = std::move(launch);
    cmd->start_cwd = spec.cwd;
    cmd->start_name = name;
  } else {
    cmd->start_failure = StartFailureLine(spawned->failed_step, spawned->err, spec.cwd, name,
                                          spec.env, spec.fallback_env);
  }

  commands.emplace(cmd->id, cmd);
  ++running;
  if (cmd->events.on_start) cmd->events.on_start(cmd->pid);
  ReadNext(cmd, 1);
  if (!cmd->err.eof) ReadNext(cmd, 2);
  ArmPoll(cmd);
  PumpInput(cmd);
  if (cmd->timeout.count() > 0 && !cmd->main_exited) {
    ArmTimer(cmd, cmd->timeout, &Command::timeout_op, [](const CommandPtr& c) {
      if (!c->main_exited) c->impl->BeginKill(c, EndReason::kTimeout);
    });
  }
  MaybeMakeWarm();
  return cmd->id;
}

OpId Runner::Impl::ArmTimer(const CommandPtr& cmd, milliseconds delay, OpId Command::*slot,
                            void (*fn)(const CommandPtr&)) {
  Clock::time_point deadline = Clock::now() + delay;
  OpId id = reactor.Timer(delay, [cmd, slot, fn, deadline](int res) {
    cmd.get()->*slot = 0;
    Impl* impl = cmd->impl;
    if (impl == nullptr || res == -ECANCELED) return;
    if (res == -EAGAIN) {  // no submission slot: try again for what is left
      auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
      impl->ArmTimer(cmd, std::max(left, milliseconds(0)), slot, fn);
      return;
    }
    fn(cmd);
  });
  cmd.get()->*slot = id;
  return id;
}

void Runner::Impl::ArmPoll(const CommandPtr& cmd) {
  cmd->poll_op = reactor.PollIn(cmd->pidfd.get(), [cmd](int res) {
    cmd->poll_op = 0;
    if (cmd->impl == nullptr) return;
    cmd->impl->OnMainExit(cmd, res);
  });
}

void Runner::Impl::OnMainExit(const CommandPtr& cmd, int res) {
  if (res == -ECANCELED || cmd->main_exited) return;
  siginfo_t info{};
  if (::waitid(P_PIDFD, static_cast<id_t>(cmd->pidfd.get()), &info, WEXITED | WNOHANG) < 0) {
    if (errno == EINTR) {
      ArmPoll(cmd);
      return;
    }
    // ECHILD: someone else reaped it (nsbox-init must leave the runner's children alone).
    log::error("exec {}: waitid pid {}: {}", cmd->id, cmd->pid, ErrnoText(errno));
    info.si_pid = cmd->pid;
    info.si_code = CLD_KILLED;
    info.si_status = SIGKILL;
  } else if (info.si_pid == 0) {
    ArmPoll(cmd);  // woken without an exit (-EAGAIN from the reactor, or spurious)
    return;
  }
  cmd->main_exited = true;
  cmd->status = ExitStatusFromSiginfo(info);
  cmd->pidfd.reset();
  if (cmd->warm != nullptr) {
    cmd->start_failure =
        StartFailureLine(cmd->warm->failed_step(), cmd->warm->err(), cmd->start_cwd,
                         cmd->start_name, cmd->launch->owned_env, cmd->launch->owned_fallback_env);
    warm_stack = cmd->warm->TakeStack();  // the child is reaped: the next one's
    cmd->warm.reset();
    cmd->launch.reset();
  }
  if (cmd->timeout_op != 0) reactor.Cancel(cmd->timeout_op);
  if (cmd->out.eof && cmd->err.eof) {
    Finish(cmd);
    return;
  }
  // What the main process wrote and left in the pipes (FIONREAD). A read under way may have
  // taken some of it already: what that read brings is added when it ends (OnRead); if it was
  // waiting on an empty pipe, what it brings is not the main process's and was not waiting, so
  // the target is met as soon as it is read.
  for (Stream* st : {&cmd->out, &cmd->err}) {
    int waiting = 0;
    if (st->fd.valid() && ::ioctl(st->fd.get(), FIONREAD, &waiting) != 0) waiting = 0;
    st->drain_to = st->read + static_cast<uint64_t>(std::max(waiting, 0));
    st->read_at_exit = st->op != 0;
  }
  ArmDrain(cmd);
}

void Runner::Impl::ArmDrain(const CommandPtr& cmd) {
  // Background processes (`server &`) may hold the pipes open for ever: what the main process
  // wrote is read within the drain window, and the answer is not held back beyond it. While
  // output is paused (PauseOutput), and until a whole window has passed since it resumed, what
  // the main process left in a pipe may still wait unread there: the window starts again, until
  // that much has been read.
  ArmTimer(cmd, kDrainWindow, &Command::drain_op, [](const CommandPtr& c) {
    if (c->reported) return;
    Impl& impl = *c->impl;
    const bool left = (c->out.fd.valid() && c->out.read < c->out.drain_to) ||
                      (c->err.fd.valid() && c->err.read < c->err.drain_to);
    if (left && (impl.output_paused || Clock::now() - impl.output_resumed < kDrainWindow)) {
      impl.ArmDrain(c);
      return;
    }
    impl.Finish(c);
  });
}

void Runner::Impl::MaybeFinish(const CommandPtr& cmd) {
  if (!cmd->reported && cmd->main_exited && cmd->out.eof && cmd->err.eof) Finish(cmd);
}

CommandResult Runner::Impl::ComputeResult(const Command& cmd) const {
  CommandResult r;
  r.duration_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<milliseconds>(Clock::now() - cmd.started).count());
  r.signal = cmd.status.signaled ? cmd.status.signal : 0;
  r.exit_code = cmd.status.ShellCode();
  r.truncated = cmd.truncated;
  // A kill that came in the drain window (the main process had exited on its own) still
  // reaches the background processes, but the answer is how the command ended. The output cap
  // is the exception: the answer has lost output, and says so; also when the cap was reached in
  // the drain window, where it kills nothing (Deliver).
  if (cmd.capped_after_exit && !cmd.kill_reason.has_value()) {
    r.reason = EndReason::kOutputLimit;
    r.exit_code = 1;
    r.signal = 0;
    return r;
  }
  if (cmd.kill_reason.has_value() &&
      (cmd.killed_running || *cmd.kill_reason == EndReason::kOutputLimit)) {
    r.reason = *cmd.kill_reason;
    switch (*cmd.kill_reason) {
      case EndReason::kTimeout:
        r.exit_code = 124;  // as timeout(1)
        r.timed_out = true;
        break;
      case EndReason::kCancelled:
        r.cancelled = true;
        break;
      case EndReason::kOutputLimit:
        r.exit_code = 1;
        break;
      case EndReason::kStopped:
        // api.md: a stop answers 137 and SIGKILL, whichever signal ended it.
        r.exit_code = 128 + SIGKILL;
        r.signal = SIGKILL;
        break;
      default:
        break;
    }
    return r;
  }
  if (!cmd.status.signaled) {
    r.reason = EndReason::kExited;
    return r;
  }
  r.reason = EndReason::kSignaled;
  // The command's own OOM kills: v2 memory.events where the memory controller is enabled for
  // the exec cgroups, else the v1 memory.oom_control of its v1 memory cgroup.
  if (cmd.status.signal == SIGKILL && OomKilledIn(cmd.cg.usage)) r.reason = EndReason::kOom;
  return r;
}

void Runner::Impl::Finish(const CommandPtr& cmd) {
  if (cmd->reported) return;
  cmd->reported = true;
  --running;
  for (OpId* op : {&cmd->drain_op, &cmd->timeout_op}) {
    if (*op != 0) reactor.Cancel(*op);
  }
  if (cmd->write_op != 0) {
    reactor.Cancel(cmd->write_op);  // its callback closes stdin and refuses what is queued
  } else {
    FailInput(cmd, EPIPE, "the command has ended");
  }
  cmd->tty.reset();
  CommandResult result = ComputeResult(*cmd);
  const CommandUsage counters = ReadUsage(cmd->cg.usage);
  result.usage = UsageSince(counters, cmd->cg.before);
  if (Reusable(*cmd, counters)) {
    cmd->cg.before = counters;
    cmd->reusable = true;
  } else {
    cmd->cg.CloseFiles();
  }
  // Nothing more is delivered after on_exit: release what the callbacks hold.
  CommandEvents events = std::move(cmd->events);
  cmd->events = CommandEvents();
  if (events.on_output) {
    // api.md's lines on stderr, each on a line of its own after what the command wrote there.
    auto say = [&](const std::string& line) {
      events.on_output(2, cmd->stderr_at_line_start ? line : "\n" + line);
      cmd->stderr_at_line_start = true;
    };
    if (!cmd->start_failure.empty()) say(cmd->start_failure);
    if (cmd->kill_reason == EndReason::kTimeout && cmd->killed_running) {
      say("nsbox: command timed out after " + std::to_string(cmd->timeout.count()) + " ms\n");
    }
    if (cmd->truncated) {
      say("nsbox: output exceeded " + std::to_string(cmd->limit) + " bytes; " +
          (cmd->capped_after_exit ? "the rest was dropped (the command had exited)\n"
                                  : "process tree killed\n"));
    }
  }
  if (events.on_exit) events.on_exit(result);
  // Reported: its pipes are read (and the bytes dropped) whether output is paused or not.
  Unpark(cmd, 1);
  Unpark(cmd, 2);
  if (cmd->impl != nullptr) MaybeRetire(cmd);
}

void Runner::Impl::ArmIdle() {
  if (idle_op != 0 || shutting_down || hold_for_first) return;
  idle_op = reactor.Timer(kIdleRelease, [this, alive = alive](int res) {
    if (!*alive) return;  // the runner is gone; `this` must not be touched
    idle_op = 0;
    if (res == -ECANCELED) return;
    if (running == 0 && Clock::now() - last_start >= kIdleRelease) {
      ReleaseIdle();
      return;
    }
    ArmIdle();
  });
}

// What only a busy sandbox needs: an idle one keeps no spare cgroups (kernel memory) and no read
// buffers (they go back to the system).
void Runner::Impl::ReleaseIdle() {
  DropWarm();
  if (oom_score_shared && !own_oom_score_adj.empty()) {
    // Nothing shares this process's memory now: the child made ahead is gone, and those that
    // took a command have made their execve (nothing runs). Best effort: the score it had.
    oom_score_shared = false;
    if (auto st = WriteExistingFileAt(AT_FDCWD, "/proc/self/oom_score_adj", own_oom_score_adj);
        !st.ok()) {
      log::warn("exec: the OOM score a child made ahead had changed: {}", st.error().message());
    }
  }
  warm_stack.reset();
  reset_signals = NonDefaultSignals();
  spares.clear();  // removes their directories
  if (!buffers.empty()) {
    buffers.clear();
    ::malloc_trim(0);
  }
  ReleaseUnusedMainStack();  // on the loop, nsbox-init's main thread; elsewhere it does nothing
}

void Runner::Impl::MaybeRetire(const CommandPtr& cmd) {
  if (!cmd->reported || shutting_down || cmd->removing) return;
  if (cmd->reusable) {
    cmd->reusable = false;
    if (!Keep(cmd->cg)) cmd->cg.CloseFiles();
  }
  if (LeftOf(cmd->cg).any()) {
    // Commands in a row: removed on the cgroup thread, which they keep going anyway. A lone
    // command's are removed here, after its answer: starting a thread for them would cost more
    // than its three rmdirs.
    if (in_a_row) {
      RemoveOffLoop(cmd);
      return;
    }
    if (!TryRemoveCgroup(*cmd)) {
      ScheduleSweep();
      return;
    }
  }
  if (!cmd->out.eof || !cmd->err.eof) return;  // reading and discarding goes on
  // A pending SIGKILL timer keeps its reference (at most 2 s): without a cgroup, what ignored
  // SIGTERM and closed its stdio is still to be killed.
  commands.erase(cmd->id);
}

void Runner::Impl::Shutdown() {
  shutting_down = true;
  *alive = false;
  if (sweep_op != 0) reactor.Cancel(sweep_op);
  if (idle_op != 0) reactor.Cancel(idle_op);
  cgroup_thread.reset();  // waits for its jobs; what they post finds `alive` false
  {
    // A set made ahead that the loop has not taken yet: removed now, not whenever the reactor
    // drops the closure that would have taken it.
    std::lock_guard<std::mutex> lock(made_spare->mu);
    made_spare->set.reset();
  }
  ReleaseIdle();
  std::vector<CommandPtr> all;
  for (const auto& [id, cmd] : commands) all.push_back(cmd);
  for (const auto& cmd : all) {
    if (!cmd->kill_reason.has_value() && !cmd->reported) {
      cmd->kill_reason = EndReason::kStopped;
      cmd->killed_running = !cmd->main_exited;
    }
    SendKill(cmd);
    if (!cmd->main_exited) {
      siginfo_t info{};
      while (::waitid(P_PIDFD, static_cast<id_t>(cmd->pidfd.get()), &info, WEXITED) < 0 &&
             errno == EINTR) {
      }
      cmd->main_exited = true;
      cmd->status = ExitStatusFromSiginfo(info);
    }
    // What is already in the pipes is not read: the sandbox is being stopped.
    Finish(cmd);
    for (OpId op : {cmd->out.op, cmd->err.op, cmd->poll_op, cmd->write_op, cmd->timeout_op,
                    cmd->grace_op, cmd->drain_op, cmd->check_op}) {
      if (op != 0) reactor.Cancel(op);
    }
    cmd->impl = nullptr;
  }
  // SIGKILLed processes leave their cgroup when they have exited, a moment later.
  for (int waited = 0; waited < 1000; ++waited) {
    bool busy = false;
    for (const auto& cmd : all) {
      if (!TryRemoveCgroup(*cmd)) busy = true;
    }
    if (!busy) break;
    if (waited % 100 == 99) {
      for (const auto& cmd : all) {
        if (cmd->cg.v2.valid()) SendKill(cmd);
      }
    }
    SleepMs(1);
  }
  for (const auto& cmd : all) {
    if (!TryRemoveCgroup(*cmd)) {
      log::warn("exec {}: cgroup {} still busy at shutdown", cmd->id, cmd->cg.name);
    }
  }
  commands.clear();
}

Runner::Runner(Reactor& reactor, int cgroup_dir, ChildHooks hooks, RunnerV1Cgroups v1,
               PremadeCgroups premade)
    : impl_(std::make_unique<Impl>(reactor, cgroup_dir, hooks, v1, premade.state_ != nullptr)) {
  if (premade.state_ != nullptr && !premade.state_->sets.empty()) {
    // Made from the same directories: the runner's parents, and its first kept sets.
    impl_->parents = premade.state_->parents;
    impl_->spares = std::move(premade.state_->sets);
    impl_->ArmIdle();
  }
  // Writing stdin to a command that has closed it must fail with EPIPE, not kill nsbox-init
  // with SIGPIPE. Only the default disposition is changed; a handler someone set stays.
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
  impl_->reset_signals = NonDefaultSignals();
}

Runner::~Runner() { impl_->Shutdown(); }

Result<uint64_t> Runner::Start(const CommandSpec& spec, CommandEvents events) {
  return impl_->Start(spec, std::move(events));
}

void Runner::Kill(uint64_t id, EndReason reason) {
  auto it = impl_->commands.find(id);
  if (it == impl_->commands.end()) return;
  auto cmd = it->second;  // held: BeginKill may retire it
  impl_->BeginKill(cmd, reason);
}

void Runner::KillAll(EndReason reason) { impl_->KillAll(reason); }

void Runner::PauseOutput(bool paused) { impl_->PauseOutput(paused); }

size_t Runner::running() const { return impl_->running; }

void Runner::Anticipate(bool hold) { impl_->Anticipate(hold); }

void Runner::NoChildrenMadeAhead() {
  impl_->warm_never = true;
  impl_->DropWarm();
}

bool Runner::OwnsIdleChild(pid_t pid) const {
  return impl_->warm != nullptr && impl_->warm->pid() == pid;
}

void Runner::Input(uint64_t id, std::string data, bool close, InputDone done) {
  impl_->Input(id, std::move(data), close, std::move(done));
}

Status Runner::Resize(uint64_t id, TerminalSize size) { return impl_->Resize(id, size); }

}  // namespace nsbox::exec

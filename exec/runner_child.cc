// A command's child: what it is given to execve (Launch), the signals it sets back, the line a
// child that could not start says, and the child made ahead for the next command (WarmChild).

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <string.h>

#include <string>

#include "base/log.h"
#include "exec/command.h"
#include "exec/runner_internal.h"
#include "policy/environment.h"

namespace nsbox::exec {

namespace runner_internal {

// The signals this process does not leave at their default disposition (ignored or caught; bit
// n-1 for signal n), and always glibc's two internal ones (32 and 33: thread cancellation and
// setxid), whose handlers it installs lazily and whose dispositions its sigaction does not tell:
// what a command's child sets back before execve instead of all 64 (≈ 20 µs of each exec,
// docs/benchmarks.md "Where a command's child spends its time"). A disposition changed later is
// picked up when the runner next goes idle: nsbox-init sets its own (SIGPIPE) before it makes the
// runner, and no other afterwards; the child blocks every signal until just before execve, which
// resets handlers to the default anyway.
uint64_t NonDefaultSignals() {
  uint64_t mask = (uint64_t{1} << (32 - 1)) | (uint64_t{1} << (33 - 1));
  for (int sig = 1; sig < 65; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP || sig == 32 || sig == 33) continue;
    struct sigaction action {};
    if (::sigaction(sig, nullptr, &action) != 0 || action.sa_handler != SIG_DFL) {
      mask |= uint64_t{1} << (sig - 1);  // ignored, caught, or unknown: reset it
    }
  }
  return mask;
}

std::unique_ptr<Launch> PrepareLaunch(const CommandSpec& spec, bool own) {
  auto l = std::make_unique<Launch>();
  const std::vector<std::string>* argv = &spec.argv;
  const std::vector<std::string>* env = &spec.env;
  const std::vector<std::string>* fallback_argv = &spec.fallback_argv;
  const std::vector<std::string>* fallback_env = &spec.fallback_env;
  const std::string* file = &spec.file;
  const std::string* cwd = &spec.cwd;
  if (own) {
    l->owned_argv = spec.argv;
    l->owned_env = spec.env;
    l->owned_fallback_argv = spec.fallback_argv;
    l->owned_fallback_env = spec.fallback_env;
    l->owned_file = spec.file;
    l->owned_cwd = spec.cwd;
    argv = &l->owned_argv;
    env = &l->owned_env;
    fallback_argv = &l->owned_fallback_argv;
    fallback_env = &l->owned_fallback_env;
    file = &l->owned_file;
    cwd = &l->owned_cwd;
  }
  l->argv.reserve(argv->size() + 1);
  for (const auto& a : *argv) l->argv.push_back(a.c_str());
  l->argv.push_back(nullptr);
  l->envp.reserve(env->size() + 2);
  for (const auto& e : *env) l->envp.push_back(e.c_str());
  // A direct command's PWD, which the child completes (a path of up to PATH_MAX bytes).
  if (!file->empty() && !fallback_argv->empty()) {
    l->pwd_env.assign(4 + PATH_MAX, '\0');
    l->pwd_env.replace(0, 4, "PWD=");
    l->envp.push_back(l->pwd_env.data());
    for (const auto& a : *fallback_argv) l->fallback_argv.push_back(a.c_str());
    l->fallback_argv.push_back(nullptr);
    for (const auto& e : *fallback_env) l->fallback_envp.push_back(e.c_str());
    l->fallback_envp.push_back(nullptr);
  }
  l->envp.push_back(nullptr);

  SpawnRequest& request = l->request;
  request.argv = l->argv.data();
  request.envp = l->envp.data();
  if (!file->empty()) request.file = file->c_str();
  if (!l->fallback_argv.empty()) {
    request.fallback_argv = l->fallback_argv.data();
    request.fallback_envp = l->fallback_envp.data();
    request.pwd_env = l->pwd_env.data();
    request.pwd_env_size = l->pwd_env.size();
  }
  request.cwd = cwd->empty() ? "/" : cwd->c_str();
  request.shell_line = spec.shell_line;
  return l;
}

// The stderr line of a command whose child stopped at `step` before execve; empty for kNone.
// `env` and `fallback_env` are the environments it was given: an E2BIG of execve names the
// variable too long for it, if one is.
std::string StartFailureLine(SpawnStep step, int err, const std::string& cwd,
                             const std::string& name, const std::vector<std::string>& env,
                             const std::vector<std::string>& fallback_env) {
  switch (step) {
    case SpawnStep::kNone:
      return std::string();
    case SpawnStep::kChdir:
      // As bash says it; the child has exited with 1 (api.md: "cannot be started").
      return "nsbox: cd: " + cwd + ": " + strerrordesc_np(err) + "\n";
    case SpawnStep::kExec:
      if (err == E2BIG) {
        std::string oversized = policy::OversizedEnvEntry(env);
        if (oversized.empty()) oversized = policy::OversizedEnvEntry(fallback_env);
        if (!oversized.empty()) {
          return DescribeExecFailure(name, err).message + " (E2BIG): " + oversized + "\n";
        }
      }
      return DescribeExecFailure(name, err).message + "\n";
    default:
      return "nsbox: the command could not be started: " + std::string(SpawnStepName(step)) + ": " +
             strerrordesc_np(err) + "\n";
  }
}

}  // namespace runner_internal

// A child made ahead for the next command, in a spare set, while commands come in a row: its
// cgroups, session, signals, stdio and the pre_exec hook are done before the command comes
// (≈ 100 µs of each start, docs/benchmarks.md). On the loop, after the command that made room
// for it has started; it gets ready on whichever CPU is free.
void Runner::Impl::MaybeMakeWarm() {
  if (warm != nullptr || warm_off || warm_never || shutting_down || !in_a_row || spares.empty() ||
      !dev_null.valid()) {
    return;
  }
  CgroupSet set = spares.back()->Take();
  spares.pop_back();
  WarmPrep prep;
  prep.cgroup_fd = set.v2.valid() ? set.v2.get() : -1;
  for (size_t i = 0; i < set.v1_procs.size() && i < 2; ++i) {
    prep.join_procs_fds[i] = set.v1_procs[i].get();
  }
  StdioPipes pipes;
  Status piped = MakeStdioPipes(true, running < kEnlargedPipeCommands ? pipe_size : 0, &pipes);
  prep.stdin_fd = pipes.child_in.get();
  prep.stdout_fd = pipes.child_out.get();
  prep.stderr_fd = pipes.child_err.get();
  prep.dev_null = dev_null.get();
  prep.reset_signals = reset_signals;
  prep.hooks = hooks;
  auto made = piped.ok() ? WarmChild::Start(prep, std::move(warm_stack))
                         : Result<std::unique_ptr<WarmChild>>(piped.error());
  if (!made.ok()) {
    log::info("exec: commands start without a child made ahead: {}", made.error().message());
    warm_off = true;
    spares.push_back(std::make_shared<SpareSet>(parents, std::move(set)));
    return;
  }
  warm = std::move(made).value();
  oom_score_shared = true;
  warm_set = std::move(set);
  // The child has its own copies of its ends.
  pipes.child_in.reset();
  pipes.child_out.reset();
  pipes.child_err.reset();
  warm_pipes = std::move(pipes);
  RequestSpare();
}

// Kills and reaps the child made ahead; its set goes back to the spares (or is removed).
void Runner::Impl::DropWarm() {
  if (warm == nullptr) return;
  warm.reset();
  warm_pipes = StdioPipes();
  auto set = std::make_shared<SpareSet>(parents, std::move(warm_set));
  warm_set = CgroupSet();
  if (!shutting_down && spares.size() < kKeptSets) spares.push_back(std::move(set));
}

}  // namespace nsbox::exec

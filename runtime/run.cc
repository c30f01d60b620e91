#include "runtime/run.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "exec/command.h"
#include "fs/path.h"
#include "images/image.h"
#include "isolate/capabilities.h"
#include "isolate/cgroup.h"
#include "isolate/cgroup_placement.h"
#include "isolate/idmap.h"
#include "isolate/jail.h"
#include "isolate/mount_plan.h"
#include "isolate/seccomp.h"
#include "policy/capabilities.h"
#include "policy/environment.h"
#include "policy/limits.h"
#include "policy/seccomp_profile.h"
#include "runtime/jail_setup.h"
#include "runtime/terminal.h"

namespace nsbox::runtime {

namespace {

using isolate::kExitSetupFailed;

int Fail(const Error& error) {
  std::fprintf(stderr, "nsbox run: %s\n", error.message().c_str());
  return kExitSetupFailed;
}

void PrintPlan(const PreparedJail& plan, const isolate::CgroupPlan& cgroups) {
  const auto& spec = plan.spec;
  std::printf("image: %s\nworkspace: %s -> /workspace\ncwd: %s\nhostname: %s\n",
              plan.image.name.c_str(), plan.workspace_path.c_str(), spec.cwd.c_str(),
              spec.hostname.c_str());
  std::printf("uid_map: %sgid_map: %s", isolate::IdMapText(spec.ids.uid).c_str(),
              isolate::IdMapText(spec.ids.gid).c_str());
  std::printf("mounts (assembled under %s):\n", spec.mounts.staging.c_str());
  for (const auto& op : spec.mounts.ops) std::printf("  %s\n", op.Describe().c_str());
  std::printf("cgroups:\n");
  for (const auto& dir : cgroups.dirs) {
    std::printf("  mkdir %s\n", dir.path().c_str());
    if (!dir.accounting.empty()) {
      std::string what;
      for (const auto& c : dir.accounting) what += " " + c;
      std::printf("    (accounting only:%s)\n", what.c_str());
    }
    for (const auto& w : dir.writes) {
      std::printf("    %s = %s%s\n", w.file.c_str(), w.value.c_str(),
                  w.optional ? " (if present)" : "");
    }
  }
  std::printf("environment:\n");
  for (const auto& kv : spec.env) std::printf("  %s\n", kv.c_str());
  std::printf("rlimits:\n");
  for (const auto& rule : policy::DefaultRlimits()) {
    for (const auto& [res, lim] : spec.rlimits) {
      if (res != rule.resource) continue;
      std::printf("  %s %llu %llu\n", rule.name, static_cast<unsigned long long>(lim.rlim_cur),
                  static_cast<unsigned long long>(lim.rlim_max));
    }
  }
  std::printf("command:");
  for (const auto& a : spec.argv) std::printf(" %s", a.c_str());
  std::printf("\n");
}

// Copies what is readable on `from` to `to`; false at EOF or error (EIO: the terminal's last
// user is gone).
bool Pump(int from, int to) {
  char buf[65536];
  ssize_t n = ::read(from, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) return false;
  return WriteAll(to, std::string_view(buf, static_cast<size_t>(n)), "terminal").ok();
}

// Waits for the jail's PID 1, forwarding the caller's signals to it and, with a terminal,
// relaying bytes and window sizes. Returns PID 1's status.
Result<ExitStatus> Supervise(isolate::Jail& jail, int sigfd, UniqueFd tty_master) {
  std::unique_ptr<RawTerminal> raw;
  bool stdin_open = tty_master.valid();
  bool master_open = tty_master.valid();
  if (tty_master.valid()) {
    raw = std::make_unique<RawTerminal>(STDIN_FILENO);
    ::fcntl(tty_master.get(), F_SETFL, ::fcntl(tty_master.get(), F_GETFL) | O_NONBLOCK);
  }
  for (;;) {
    struct pollfd fds[4] = {{sigfd, POLLIN, 0},
                            {jail.pidfd().fd(), POLLIN, 0},
                            {master_open ? tty_master.get() : -1, POLLIN, 0},
                            {stdin_open ? STDIN_FILENO : -1, POLLIN, 0}};
    if (::poll(fds, 4, -1) < 0) {
      if (errno == EINTR) continue;
      return Error::Sys("poll", "nsbox run", errno);
    }
    if (fds[0].revents & POLLIN) {
      struct signalfd_siginfo si {};
      if (::read(sigfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
        int sig = static_cast<int>(si.ssi_signo);
        if (sig == SIGWINCH && master_open) {
          struct winsize ws {};
          if (::ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) == 0) {
            ::ioctl(tty_master.get(), TIOCSWINSZ, &ws);
          }
        } else if (sig != SIGWINCH) {
          NSBOX_TRY_CTX(jail.Signal(sig), "forward a signal");
        }
      }
    }
    if (master_open && (fds[2].revents & (POLLIN | POLLHUP | POLLERR))) {
      master_open = Pump(tty_master.get(), STDOUT_FILENO);
    }
    if (stdin_open && (fds[3].revents & (POLLIN | POLLHUP | POLLERR))) {
      stdin_open = Pump(STDIN_FILENO, tty_master.get());
    }
    if (fds[1].revents & POLLIN) {
      // PID 1 is gone: drain what the terminal still holds, then collect its status.
      while (master_open && Pump(tty_master.get(), STDOUT_FILENO)) {
        struct pollfd p = {tty_master.get(), POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) break;
      }
      return jail.Wait();
    }
  }
}

}  // namespace

int Run(const RunOptions& options) {
  if (::geteuid() != 0) {
    return Fail(Error::Msg(
        "needs root: it writes the uid/gid maps of the jail's user namespace and creates "
        "cgroups (run it with sudo; `nsbox doctor` says what else this host needs)"));
  }
  if (options.command.empty()) {
    return Fail(
        Error(EINVAL, "no command given (usage: nsbox run [OPTIONS] -- COMMAND [ARGS...])"));
  }
  JailOptions with_layers = options;
  // Its own overlays of the host's /usr, /etc entries and device nodes, as nsboxd's sandboxes
  // have (isolate/private_trees.h): a one-shot command is watched by no one and watches no one.
  if (with_layers.layers_dir.empty()) with_layers.layers_dir = kRunLayersDir;
  auto planned = PrepareJail(with_layers);
  if (!planned.ok()) return Fail(planned.error());
  PreparedJail& plan = *planned;

  auto layout = isolate::LoadCgroupLayout();
  if (!layout.ok()) return Fail(std::move(layout).error().Context("cgroups"));
  // Where the jail's cgroups go: on a pure v2 host nsbox may first have to leave the cgroup it
  // was started in (a login session's scope) for one it may pass controllers on from
  // (docs/cgroups.md "Placement"). A dry run only says where that would be.
  if (options.dry_run) {
    auto facts = isolate::GatherPlacementFacts(*layout);
    auto placement = facts.ok() ? isolate::PlanPlacement(*facts)
                                : Result<isolate::PlacementPlan>(std::move(facts).error());
    std::printf("cgroup placement: %s\n",
                placement.ok() ? (std::string(isolate::PlacementKindName(placement->kind)) + " (" +
                                  placement->why + ")")
                                     .c_str()
                               : ("impossible: " + placement.error().message()).c_str());
  } else {
    auto placed = isolate::PlaceSelf(
        "nsbox run", "nsbox-run-" + std::to_string(::getpid()) + ".scope", true, &*layout);
    if (!placed.ok()) return Fail(std::move(placed).error().Context("cgroups"));
    // Moved: the jail's cgroups go under the placement's base, which the layout now names.
    if (placed->kind != isolate::PlacementKind::kAsFound) {
      layout = isolate::LoadCgroupLayout();
      if (!layout.ok()) return Fail(std::move(layout).error().Context("cgroups"));
    }
  }
  auto cgroup_plan =
      isolate::PlanCgroups(*layout, plan.limits, "nsbox-run-" + std::to_string(::getpid()));
  if (!cgroup_plan.ok()) return Fail(std::move(cgroup_plan).error().Context("cgroups"));

  if (options.dry_run) {
    PrintPlan(plan, *cgroup_plan);
    return 0;
  }
  // The jail's move into its v1 cgroups (a hybrid host) would otherwise wait for an RCU grace
  // period whenever the host was quiet before it.
  if (!options.leave_cgroup_mount) isolate::FavorMovesIntoV1(*layout, /*quiet=*/true);

  auto seccomp = isolate::CompileSeccomp(policy::DefaultSeccompProfile());
  if (!seccomp.ok()) return Fail(std::move(seccomp).error().Context("seccomp"));
  auto caps = isolate::PlanCapabilities(policy::DefaultCommandCapabilities());
  if (!caps.ok()) return Fail(std::move(caps).error().Context("capabilities"));
  plan.spec.seccomp = &*seccomp;
  plan.spec.capabilities = &*caps;

  // The caller's signals are read from a signalfd and forwarded to the jail; blocked before the
  // jail starts so none is lost (or kills nsbox and leaves the cgroups behind).
  sigset_t forwarded;
  sigemptyset(&forwarded);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH}) {
    sigaddset(&forwarded, sig);
  }
  ::sigprocmask(SIG_BLOCK, &forwarded, nullptr);
  UniqueFd sigfd(::signalfd(-1, &forwarded, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd.valid()) return Fail(Error::Sys("signalfd", "", errno));

  auto cgroups = isolate::Cgroups::Create(*cgroup_plan);
  if (!cgroups.ok()) return Fail(std::move(cgroups).error().Context("create cgroups"));
  plan.spec.cgroup_v2_fd = cgroups->v2_dir_fd();
  plan.spec.place_in_cgroups = [&](pid_t pid, bool joined_v2) {
    return cgroups->AddProcess(pid, !joined_v2);
  };

  auto jail = isolate::Jail::Start(plan.spec);
  if (!jail.ok()) {
    int code = Fail(jail.error());
    if (jail.error().code() == EPERM || jail.error().code() == ENOSPC ||
        jail.error().code() == EUSERS) {
      std::fprintf(stderr,
                   "nsbox run: `nsbox doctor` checks whether this host allows user "
                   "namespaces and says how to enable them\n");
    }
    return code;
  }
  if (jail->exec_error() != 0) {
    auto failure = exec::DescribeExecFailure(options.command[0], jail->exec_error());
    std::fprintf(stderr, "%s\n", failure.message.c_str());
    (void)jail->Wait();
    (void)cgroups->Destroy();
    return failure.exit_code;
  }

  auto status = Supervise(*jail, sigfd.get(), jail->TakeTtyMaster());
  if (!status.ok()) return Fail(status.error());
  bool oom = false;
  if (plan.limits.memory_bytes) {
    auto killed = cgroups->OomKilled();
    oom = killed.ok() && *killed;
  }
  auto destroyed = cgroups->Destroy();
  if (!destroyed.ok()) {
    std::fprintf(stderr, "nsbox run: remove cgroups: %s\n", destroyed.error().message().c_str());
  }
  if (oom) {
    std::fprintf(stderr,
                 "nsbox run: the command ran out of memory (--memory %s) and was "
                 "killed\n",
                 options.memory->c_str());
  }
  return status->ShellCode();
}

}  // namespace nsbox::runtime

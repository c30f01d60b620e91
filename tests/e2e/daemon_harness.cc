#include "tests/e2e/daemon_harness.h"
#include "runtime/registry.h"
#include "tests/common/cgroups.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace nsbox::e2e {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The daemon's environment: a marker that must never reach a command (api.md: "Nothing of the
// daemon's own environment ever reaches a command").
const char* const kDaemonEnv[] = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
    "NSBOX_E2E_DAEMON_SECRET=must-not-leak", nullptr};

}  // namespace

// ---- Placement ----

std::optional<Placement> PlacementFromEnv(std::string* error) {
  const char* text = getenv("NSBOX_E2E_PLACEMENT");
  const std::string name = text == nullptr ? "" : text;
  if (name.empty() || name == "child") return Placement::kChild;
  if (name == "systemd-unit") return Placement::kSystemdUnit;
  if (name == "sudo-session") return Placement::kSudoSession;
  *error =
      "NSBOX_E2E_PLACEMENT=" + name + " names no placement (child, systemd-unit, sudo-session)";
  return std::nullopt;
}

namespace {

// The Daemon of this process that nsboxd.service runs (Placement::kSystemdUnit): there is one
// unit, so one such daemon at a time.
const Daemon* unit_owner = nullptr;

// How long scripts/start may take before it runs `nsbox serve` (Placement::kSudoSession): it
// checks the Debian packages and runs the build first, which takes seconds even when there is
// nothing to build. Not the daemon's time: its own 10 s count from its exec.
constexpr milliseconds kSessionStartAllowance(120000);

// Forks a child that dies with this process (PR_SET_PDEATHSIG), has stdin on /dev/null and
// stdout and stderr on `log`, default SIGPIPE and no blocked signal, and executes `file` (PATH
// searched when `search_path`) with `argv` and `envp`, built by the caller: nothing is allocated
// between fork and exec. Its pid, or -1 with errno when fork failed.
pid_t ForkExec(const char* file, char* const* argv, char* const* envp, int log, bool search_path) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() != parent) _exit(127);
  int devnull = open("/dev/null", O_RDONLY);
  dup2(devnull, 0);
  dup2(log, 1);
  dup2(log, 2);
  signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // SAFETY: argv and envp are arrays of NUL-terminated strings ending in nullptr.
  if (search_path) {
    execvpe(file, argv, envp);
  } else {
    execve(file, argv, envp);
  }
  _exit(127);
}

// `word` quoted for a unit file (systemd.syntax(7), systemd.service(5) "Command lines"): in
// double quotes, with C escapes for \, " and newline, % doubled (ExecStart= and Environment=
// expand specifiers), and $ doubled on a command line (ExecStart= expands $VAR).
std::string UnitQuote(std::string_view word, bool command_line) {
  std::string out = "\"";
  for (char c : word) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '%') {
      out += "%%";
    } else if (c == '$' && command_line) {
      out += "$$";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// `word` as one word of a sh command line: in single quotes, each ' as '\''.
std::string ShellQuote(std::string_view word) {
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Writes `content` to `path` through a temp file and a rename, so that systemd never reads half
// a unit file.
bool WriteFileWhole(const std::string& path, const std::string& content, std::string* error) {
  const std::string tmp = path + ".e2e-tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    if (!out) {
      *error = "write " + tmp + " failed";
      return false;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    *error = "rename " + tmp + " to " + path + ": " + strerror(errno);
    return false;
  }
  return true;
}

// The argv of process `pid` (/proc/PID/cmdline), empty when it is gone.
std::vector<std::string> Cmdline(pid_t pid) {
  const std::string raw = ReadHostFile("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> argv;
  size_t at = 0;
  while (at < raw.size()) {
    const size_t end = raw.find('\0', at);
    argv.push_back(raw.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return argv;
}

// Whether the process of a pidfd has exited (the pidfd is readable from then on; pidfd_open(2)).
bool PidfdExited(const Pidfd& p) {
  pollfd fd{p.fd(), POLLIN, 0};
  return ::poll(&fd, 1, 0) > 0;
}

// The v2 cgroup of `pid` (the "0::" line of /proc/PID/cgroup), "" when there is none.
std::string CgroupOf(pid_t pid) {
  std::istringstream in(ReadHostFile("/proc/" + std::to_string(pid) + "/cgroup"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  }
  return "";
}

// Runs argv (PATH searched) with stdin on /dev/null, stdout into *out (when given, else into
// `log`) and stderr appended to `log`; its exit code (128 + the signal when killed, 127 when it
// could not be run).
int RunCapturing(const std::vector<std::string>& argv, const std::string& log, std::string* out) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int pipefd[2] = {-1, -1};
  if (out != nullptr && ::pipe2(pipefd, O_CLOEXEC) != 0) return 127;
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log_fd < 0 || null < 0) ::_exit(126);
    ::dup2(null, 0);
    ::dup2(out != nullptr ? pipefd[1] : log_fd, 1);
    ::dup2(log_fd, 2);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  if (log_fd >= 0) ::close(log_fd);
  if (out != nullptr) {
    ::close(pipefd[1]);
    out->clear();
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
      if (n > 0) out->append(buf, static_cast<size_t>(n));
    }
    ::close(pipefd[0]);
  }
  if (pid < 0) return 127;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The login session that starts the daemon in Placement::kSudoSession: `command` (a sh command
// line) run by kSessionUser's login shell in a login session of its own. On Debian, su's PAM
// stack (common-session) runs pam_systemd, so systemd-logind opens a session, a session-N.scope
// in user-UID.slice, and puts su in it: the shell, sudo and the daemon are born there; su exits
// with the command's exit code. The one place to change if the VM gets its session another way.
std::vector<std::string> LoginSessionArgv(const std::string& command) {
  return {"su", "--login", kSessionUser, "--command", command};
}

}  // namespace

// ---- Daemon ----

Daemon::Daemon() {
  if (auto placement = PlacementFromEnv(&placement_error_)) placement_ = *placement;
  char tmpl[] = "/var/tmp/nsbox-e2e-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    error_ = std::string("mkdtemp: ") + strerror(errno);
    return;
  }
  dir_ = tmpl;
  chmod(dir_.c_str(), 0755);
  socket_ = dir_ + "/nsboxd.sock";
  state_ = dir_ + "/state";
  // SIGPIPE from a write to a daemon that hung up must fail a call, not kill the test.
  signal(SIGPIPE, SIG_IGN);
}

Daemon::~Daemon() {
  if (active_) {
    Signal(SIGTERM);
    if (!Reap(milliseconds(10000))) Kill();
  }
  if (wrote_drop_in_ && (unit_owner == nullptr || unit_owner == this)) {
    // Not reloaded: systemd keeps this test's configuration until the next Start writes its own
    // and reloads, and nothing starts the unit in between.
    unlink(kUnitDropIn);
  }
  if (unit_owner == this) unit_owner = nullptr;
  RemoveLeftCgroups();
  if (getenv("NSBOX_E2E_KEEP") != nullptr) {
    std::fprintf(stderr, "e2e harness: NSBOX_E2E_KEEP: kept %s\n", dir_.c_str());
    return;
  }
  RemoveTree(dir_);
}

std::string Daemon::CgroupPrefix() const {
  // Registry::Open: "nsbox-" and the first 8 hex digits of the hash of the state dir's real path.
  char real[PATH_MAX];
  if (state_.empty() || realpath(state_.c_str(), real) == nullptr) return "";
  return "nsbox-" + runtime::IdHash(real).substr(0, 8) + "-";
}

void Daemon::RemoveLeftCgroups() {
  // A daemon that stopped cleanly removed its cgroups; one that was SIGKILLed leaves them to
  // the next daemon of its state dir, which removes them at its start (RemoveStaleCgroups), and
  // there is none once this harness is gone: they would stay on the host, where the leak checks
  // of every later test run would find them.
  const std::string prefix = CgroupPrefix();
  if (prefix.empty() || testutil::FindCgroupsNamed(prefix).empty()) return;
  const std::vector<std::string> left = testutil::RemoveCgroupsNamed(prefix, milliseconds(5000));
  std::fprintf(stderr, "e2e harness: removed the cgroups %s* the daemon of %s left%s\n",
               prefix.c_str(), dir_.c_str(), left.empty() ? "" : "; could not remove:");
  for (const std::string& l : left) std::fprintf(stderr, "  %s\n", l.c_str());
}

void Daemon::LogLine(const std::string& line) const {
  const int log = open(log_path().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) return;
  const std::string text = line + "\n";
  (void)!write(log, text.data(), text.size());
  close(log);
}

bool Daemon::Spawn(const std::vector<std::string>& extra_args) {
  error_.clear();
  exit_status_ = -1;
  if (!placement_error_.empty()) {
    error_ = placement_error_;
    return false;
  }
  std::vector<std::string> argv = {kNsboxBin,     "serve", "--socket",    socket_,
                                   "--state-dir", state_,  "--log-level", "debug"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  int log = open(log_path().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    error_ = std::string("open the log: ") + strerror(errno);
    return false;
  }
  {
    std::string line = "\n=== e2e: starting";
    for (const auto& a : argv) line += " " + a;
    if (placement_ == Placement::kSystemdUnit) line += "\n=== e2e: as " + std::string(kUnitName);
    if (placement_ == Placement::kSudoSession) {
      line +=
          "\n=== e2e: with sudo scripts/start from a login session of " + std::string(kSessionUser);
    }
    line += "\n";
    (void)!write(log, line.data(), line.size());
  }
  bool ok = false;
  switch (placement_) {
    case Placement::kChild:
      ok = SpawnChild(argv, log);
      break;
    case Placement::kSystemdUnit:
      ok = SpawnUnit(argv);
      break;
    case Placement::kSudoSession:
      ok = SpawnSession(argv, log);
      break;
  }
  close(log);
  if (!ok) LogLine("=== e2e: not started: " + error_);
  active_ = ok;
  return ok;
}

bool Daemon::SpawnChild(const std::vector<std::string>& argv_in, int log) {
  std::vector<std::string> argv = argv_in;
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  // Built before the fork: nothing is allocated between fork and execve.
  std::vector<char*> cenv;
  // SAFETY: execve does not write through envp; the cast only fits its prototype.
  for (const char* const* e = kDaemonEnv; *e != nullptr; ++e) {
    cenv.push_back(const_cast<char*>(*e));
  }
  for (auto& e : extra_env_) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  // The daemon dies with the test process, so a crashed test leaves no daemon behind.
  const pid_t pid = ForkExec(kNsboxBin, cargv.data(), cenv.data(), log, /*search_path=*/false);
  if (pid < 0) {
    error_ = std::string("fork: ") + strerror(errno);
    return false;
  }
  pid_ = pid;
  child_ = pid;
  return true;
}

int Daemon::Systemctl(const std::vector<std::string>& args, std::string* out) const {
  std::vector<std::string> argv = {"systemctl"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCapturing(argv, log_path(), out);
}

std::string Daemon::UnitProperty(const std::string& name) const {
  std::string out;
  if (Systemctl({"show", "--property", name, "--value", kUnitName}, &out) != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

bool Daemon::AdoptMainPid() {
  const pid_t main = static_cast<pid_t>(std::strtol(UnitProperty("MainPID").c_str(), nullptr, 10));
  if (main <= 0) return false;
  auto fd = Pidfd::Open(main);
  if (!fd.ok()) return false;
  daemon_fd_ = std::move(*fd);
  pid_ = main;
  return true;
}

bool Daemon::SpawnUnit(const std::vector<std::string>& argv) {
  if (unit_owner != nullptr && unit_owner != this) {
    error_ = "NSBOX_E2E_PLACEMENT=systemd-unit: " + std::string(kUnitName) +
             " runs another daemon of this test already (one unit: one daemon at a time)";
    return false;
  }
  // The project's unit as this tree has it (when the VM installed it already, nothing changes).
  const std::string unit = ReadHostFile(std::string(NSBOX_SOURCE_DIR) + "/deploy/nsboxd.service");
  if (unit.empty()) {
    error_ = std::string("no unit at ") + NSBOX_SOURCE_DIR + "/deploy/nsboxd.service";
    return false;
  }
  if (ReadHostFile(kUnitPath) != unit && !WriteFileWhole(kUnitPath, unit, &error_)) return false;
  // The drop-in `systemctl edit nsboxd` would hold for this test's daemon (the unit's own
  // comment says so): the build's nsbox on this test's socket and state dir, the harness's
  // environment, the log.
  std::string drop_in = "# This test's daemon (tests/e2e/daemon_harness.cc), in " + dir_ +
                        "\n[Service]\nExecStart=\nExecStart=";
  for (size_t i = 0; i < argv.size(); ++i) drop_in += (i > 0 ? " " : "") + UnitQuote(argv[i], true);
  drop_in += "\n";
  for (const char* const* e = kDaemonEnv; *e != nullptr; ++e) {
    drop_in += "Environment=" + UnitQuote(*e, false) + "\n";
  }
  for (const auto& e : extra_env_) drop_in += "Environment=" + UnitQuote(e, false) + "\n";
  drop_in += "StandardOutput=append:" + log_path() + "\nStandardError=append:" + log_path() + "\n";
  // The test decides when the daemon starts again (after a Kill it looks at what was left, or
  // changes the state dir, then calls Restart): the unit's Restart=on-failure would start it
  // behind the test's back 1 s after a SIGKILL.
  drop_in += "Restart=no\n";
  // How the main process ended, as systemd saw it, written where the harness reads it: the
  // unit's ExecMainCode and ExecMainStatus are gone once systemd unloads the stopped unit (it is
  // not enabled, so nothing keeps it loaded). UnitQuote doubles each $, so the shell gets one.
  ::unlink(ExitFile().c_str());
  drop_in += "ExecStopPost=/bin/sh -c " +
             UnitQuote("echo \"$EXIT_CODE $EXIT_STATUS\" > " + ExitFile(), true) + "\n";
  const std::string drop_in_dir =
      std::string(kUnitDropIn).substr(0, std::string(kUnitDropIn).rfind('/'));
  std::filesystem::create_directories(drop_in_dir);
  if (!WriteFileWhole(kUnitDropIn, drop_in, &error_)) return false;
  wrote_drop_in_ = true;
  if (Systemctl({"daemon-reload"}) != 0) {
    error_ = "systemctl daemon-reload failed (its message is in the log):\n" + Log();
    return false;
  }
  // A unit left running by a test binary that crashed is stopped first.
  const std::string state = UnitProperty("ActiveState");
  if (state != "inactive" && state != "failed") {
    LogLine("=== e2e: " + std::string(kUnitName) + " was " + state + ": stopping it first");
    Systemctl({"stop", kUnitName});
  }
  // Forgets the failed state of an earlier run and, above all, its count of recent starts:
  // more than StartLimitBurst (5) starts in StartLimitIntervalSec (10 s), as a few short tests
  // in a row make, and systemd refuses the next.
  Systemctl({"reset-failed", kUnitName});
  if (Systemctl({"start", kUnitName}) != 0) {
    error_ = "systemctl start " + std::string(kUnitName) + " failed:\n" + Log();
    return false;
  }
  unit_owner = this;
  // Type=simple: the start job ends once systemd has forked the daemon, and MainPID is it
  // (0 when it has already exited; Ended() then finds how from the unit).
  AdoptMainPid();
  return true;
}

bool Daemon::SpawnSession(const std::vector<std::string>& argv, int log) {
  // scripts/start runs the build tree's nsbox, build/runtime/nsbox: the one under test must be it.
  const std::string start_nsbox = std::string(NSBOX_SOURCE_DIR) + "/build/runtime/nsbox";
  std::error_code ec;
  if (!std::filesystem::equivalent(start_nsbox, kNsboxBin, ec)) {
    error_ = "NSBOX_E2E_PLACEMENT=sudo-session runs scripts/start, which runs " + start_nsbox +
             ", not the nsbox these tests were built with (" + kNsboxBin + ")";
    return false;
  }
  // sudo resets the environment; the harness's own variables (the secret a command must never
  // see, SetExtraEnv's) are set on its command line, which the user's `ALL` rule allows
  // (sudoers(5): SETENV is implied for ALL). PATH and HOME are sudo's, as for a user.
  std::string command = "sudo";
  for (const char* const* e = kDaemonEnv; *e != nullptr; ++e) {
    const std::string_view entry = *e;
    if (!entry.starts_with("PATH=") && !entry.starts_with("HOME=")) {
      command += " " + ShellQuote(entry);
    }
  }
  for (const auto& e : extra_env_) command += " " + ShellQuote(e);
  command += " " + ShellQuote(std::string(NSBOX_SOURCE_DIR) + "/scripts/start");
  // scripts/start passes its arguments to `nsbox serve`: the daemon's argv less the first two.
  for (size_t i = 2; i < argv.size(); ++i) command += " " + ShellQuote(argv[i]);
  std::vector<std::string> su = LoginSessionArgv(command);
  std::string line = "=== e2e: running";
  for (const auto& a : su) line += " " + ShellQuote(a);
  LogLine(line);
  std::vector<char*> cargv;
  for (auto& a : su) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  // su -l builds the session's environment itself; it gets only a PATH to find its helpers.
  char path_env[] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  char* cenv[] = {path_env, nullptr};
  // su dies with the test process (the daemon, su's grandchild, outlives a crashed test: its
  // socket and state dir are that test's alone, so no later test meets it).
  const pid_t pid = ForkExec(cargv[0], cargv.data(), cenv, log, /*search_path=*/true);
  if (pid < 0) {
    error_ = std::string("fork: ") + strerror(errno);
    return false;
  }
  child_ = pid;
  pid_ = -1;  // known once scripts/start has executed it (FindSessionDaemon)
  return true;
}

bool Daemon::FindSessionDaemon() {
  if (daemon_fd_.valid()) return true;
  // `nsbox serve ... --socket S ...`: S is this test's own temp path, so no other daemon has it.
  // scripts/start's own bash has S on its command line too, but is not comm "nsbox" running
  // "serve" until it executes it.
  auto is_ours = [&](pid_t pid) {
    std::string comm;
    char state = 0;
    if (!ParseStat(pid, nullptr, nullptr, &state, &comm) || comm != "nsbox") return false;
    if (state == 'Z' || state == 'X') return false;
    const std::vector<std::string> argv = Cmdline(pid);
    if (argv.size() < 2 || argv[1] != "serve") return false;
    for (size_t i = 2; i + 1 < argv.size(); ++i) {
      if (argv[i] == "--socket" && argv[i + 1] == socket_) return true;
    }
    return false;
  };
  for (pid_t pid : AllPids()) {
    if (!is_ours(pid)) continue;
    auto fd = Pidfd::Open(pid);
    // Looked at again once held: the pidfd is of the process that was checked, not of one that
    // took its pid in between.
    if (!fd.ok() || !is_ours(pid) || PidfdExited(*fd)) continue;
    daemon_fd_ = std::move(*fd);
    pid_ = pid;
    return true;
  }
  return false;
}

void Daemon::Signal(int sig) {
  switch (placement_) {
    case Placement::kChild:
      kill(pid_, sig);
      break;
    case Placement::kSystemdUnit:
      if (sig == SIGTERM) {
        // As an administrator stops it: the unit's KillSignal (SIGTERM) to the main process
        // alone (KillMode=mixed). Not waited for here: Reap has the deadline.
        Systemctl({"stop", "--no-block", kUnitName});
      } else {
        // A crash: SIGKILL to the daemon alone, as in the other placements (its jails stay
        // until systemd, seeing the main process gone, takes the unit down: KillMode=mixed
        // then SIGKILLs the rest of its cgroup). --kill-whom is systemd 252's name.
        Systemctl({"kill", "--kill-whom=main", "--signal=SIGKILL", kUnitName});
      }
      break;
    case Placement::kSudoSession:
      if (daemon_fd_.valid()) {
        (void)daemon_fd_.Signal(sig);
      } else if (child_ > 0) {
        // scripts/start has not executed the daemon yet: su passes a SIGTERM on to the
        // session's command; a SIGKILL ends su alone (what it started ends on its own).
        kill(child_, sig);
      }
      break;
  }
}

bool Daemon::Ended() {
  if (!active_) return true;
  switch (placement_) {
    case Placement::kChild: {
      int status = 0;
      const pid_t r = waitpid(child_, &status, WNOHANG);
      if (r != child_ && !(r < 0 && errno == ECHILD)) return false;
      exit_status_ = status;
      break;
    }
    case Placement::kSudoSession: {
      // su ends once the daemon has (sudo, the shell and su pass its exit code on); once the
      // daemon is seen gone, su is given a moment to follow.
      const bool daemon_gone = daemon_fd_.valid() && PidfdExited(daemon_fd_);
      const auto deadline =
          Clock::now() + (daemon_gone ? Scaled(milliseconds(10000)) : milliseconds(0));
      int status = 0;
      pid_t r;
      while ((r = waitpid(child_, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(5));
      }
      if (r == 0) {
        if (!daemon_gone) return false;
        error_ = "su did not exit after the daemon did";
        kill(child_, SIGKILL);
        waitpid(child_, &status, 0);
        status = -1;
      }
      exit_status_ = r == child_ ? status : -1;
      break;
    }
    case Placement::kSystemdUnit: {
      if (!daemon_fd_.valid() && !AdoptMainPid()) {
        const std::string state = UnitProperty("ActiveState");
        if (state == "active" || state == "activating" || state == "reloading") return false;
      }
      if (daemon_fd_.valid() && !PidfdExited(daemon_fd_)) return false;
      // The main process is gone. systemd now takes the unit down (KillMode=mixed: SIGKILL to
      // what is left in its cgroup) and has recorded how the process ended. Waited for, so that
      // what the test looks at next (leftovers, a restart) comes after systemd's clean-up.
      const auto deadline = Clock::now() + Scaled(milliseconds(10000));
      std::string state;
      while ((state = UnitProperty("ActiveState")) != "inactive" && state != "failed" &&
             Clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(20));
      }
      if (state != "inactive" && state != "failed") {
        LogLine("=== e2e: " + std::string(kUnitName) + " still " + state +
                " 10 s after its main process ended");
      }
      // ExecStopPost's record: $EXIT_CODE (exited, killed, dumped) and $EXIT_STATUS (the exit
      // code, or the signal's name without SIG), put back into a waitpid status.
      std::string record;
      while ((record = ReadHostFile(ExitFile())).empty() && Clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(20));
      }
      std::istringstream words(record);
      std::string code, value;
      words >> code >> value;
      int signal = 0;
      for (int sig = 1; sig < 65 && signal == 0; ++sig) {
        const char* abbrev = sigabbrev_np(sig);
        if (abbrev != nullptr && value == abbrev) signal = sig;
      }
      if (code == "exited") {
        exit_status_ = (std::atoi(value.c_str()) & 0xff) << 8;
      } else if ((code == "killed" || code == "dumped") && signal != 0) {
        exit_status_ = signal | (code == "dumped" ? 0x80 : 0);
      } else {
        exit_status_ = -1;
      }
      if (unit_owner == this) unit_owner = nullptr;
      break;
    }
  }
  active_ = false;
  pid_ = -1;
  child_ = -1;
  daemon_fd_ = Pidfd();
  return true;
}

std::string Daemon::HowItEnded() const {
  std::string how;
  if (exit_status_ < 0) {
    how = "ended, how is not known";
  } else if (WIFEXITED(exit_status_)) {
    how = "exited with " + std::to_string(WEXITSTATUS(exit_status_));
  } else {
    how = "was killed by signal " + std::to_string(WTERMSIG(exit_status_));
  }
  if (placement_ == Placement::kSystemdUnit) how += " (the unit's ExecStopPost record)";
  if (placement_ == Placement::kSudoSession) how += " (su's exit code)";
  return how;
}

bool Daemon::WaitHealthy() {
  if (placement_ == Placement::kSudoSession) {
    const auto exec_deadline = Clock::now() + Scaled(kSessionStartAllowance);
    while (!FindSessionDaemon()) {
      if (Ended()) {
        error_ = "scripts/start ended before it ran nsbox serve (" + HowItEnded() + "):\n" + Log();
        return false;
      }
      if (Clock::now() >= exec_deadline) {
        error_ = "scripts/start did not run nsbox serve within " +
                 std::to_string(Scaled(kSessionStartAllowance).count()) + " ms:\n" + Log();
        Kill();
        return false;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    // su must have opened a login session of the user's: a wrong recipe would otherwise test
    // another placement without saying so. pam_systemd opens none where systemd-logind does not
    // run, nor for a caller that is in a session already ("Already running in a session or user
    // slice"): then su stays in the harness's own cgroup. (Below the scope is allowed: a daemon
    // that makes a child cgroup of its own must move its scope's other processes into a leaf.)
    const std::string cgroup = CgroupOf(child_);
    const struct passwd* user = getpwnam(kSessionUser);
    const std::string slice =
        user != nullptr ? "/user-" + std::to_string(user->pw_uid) + ".slice/session-" : "?";
    const size_t at = cgroup.find(slice);
    if (at == std::string::npos || cgroup.find(".scope", at) == std::string::npos) {
      error_ = "NSBOX_E2E_PLACEMENT=sudo-session: su is in the cgroup " + cgroup +
               ", not in a login session of " + kSessionUser + " (" + slice +
               "N.scope): is systemd-logind running, libpam-systemd installed, and the test "
               "itself outside a login session?";
      Kill();
      return false;
    }
  }
  Client client(endpoint());
  const milliseconds limit = Scaled(milliseconds(10000));
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (Ended()) {
      error_ = "nsbox serve exited before it answered (" + HowItEnded() + "):\n" + Log();
      return false;
    }
    if (access(socket_.c_str(), F_OK) == 0) {
      Response r = client.Get("/v1/health", Scaled(milliseconds(2000)));
      if (r.status == 200) {
        if (placement_ != Placement::kChild) {
          LogLine("=== e2e: the daemon is pid " + std::to_string(pid_) + ", in the cgroup " +
                  CgroupOf(pid_));
        }
        return true;
      }
      client.Disconnect();
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  error_ = "nsbox serve did not answer GET /v1/health within " + std::to_string(limit.count()) +
           " ms:\n" + Log();
  Kill();
  return false;
}

bool Daemon::Start(const std::vector<std::string>& extra_args) {
  if (dir_.empty()) return false;
  args_ = extra_args;
  if (!Spawn(extra_args)) return false;
  return WaitHealthy();
}

int Daemon::RunToExit(const std::vector<std::string>& extra_args, milliseconds timeout) {
  if (!Spawn(extra_args)) return -1;
  if (placement_ == Placement::kSudoSession) timeout += kSessionStartAllowance;
  if (!Reap(timeout)) {
    Kill();
    return -1;
  }
  if (exit_status_ < 0) return -1;
  if (WIFEXITED(exit_status_)) return WEXITSTATUS(exit_status_);
  return 128 + WTERMSIG(exit_status_);
}

bool Daemon::Reap(milliseconds timeout) {
  const auto deadline = Clock::now() + Scaled(timeout);
  for (;;) {
    if (Ended()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
}

bool Daemon::Stop(milliseconds timeout) {
  if (!active_) {
    error_ = "the daemon was not running";
    return false;
  }
  Signal(SIGTERM);
  if (!Reap(timeout)) {
    error_ = "the daemon did not exit within " + std::to_string(Scaled(timeout).count()) +
             " ms of SIGTERM; SIGKILLed";
    Kill();
    return false;
  }
  if (exit_status_ >= 0 && WIFEXITED(exit_status_) && WEXITSTATUS(exit_status_) == 0) return true;
  error_ = "the daemon " + HowItEnded() + " on SIGTERM";
  return false;
}

void Daemon::Kill() {
  if (!active_) return;
  Signal(SIGKILL);
  if (!Reap(milliseconds(60000))) {
    std::fprintf(stderr, "e2e harness: the daemon of %s did not end within %lld ms of SIGKILL\n",
                 dir_.c_str(), static_cast<long long>(Scaled(milliseconds(60000)).count()));
  }
}

bool Daemon::Restart() {
  if (active_) return false;
  return Start(args_);
}

bool Daemon::running() {
  if (!active_) return false;
  if (Ended()) {
    error_ = "the daemon ended (" + HowItEnded() + ")";
    return false;
  }
  return true;
}

size_t Daemon::LogSize() const {
  struct stat st;
  if (stat(log_path().c_str(), &st) != 0) return 0;
  return static_cast<size_t>(st.st_size);
}

std::string Daemon::Log(size_t from, size_t max) const {
  std::string all = ReadHostFile(log_path());
  if (from > all.size()) from = all.size();
  std::string part = all.substr(from);
  if (part.size() > max) part = "[...]" + part.substr(part.size() - max);
  return part;
}

int Daemon::CountFds() const {
  if (pid_ <= 0) return -1;
  DIR* d = opendir(("/proc/" + std::to_string(pid_) + "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

std::string Daemon::DescribeFds() const {
  std::string out;
  const std::string dir = "/proc/" + std::to_string(pid_) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return "(no fd dir)";
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[512];
    ssize_t n = readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    target[n > 0 ? n : 0] = '\0';
    out += std::string(e->d_name) + " -> " + target + "\n";
  }
  closedir(d);
  return out;
}

std::vector<std::string> Daemon::SandboxDirs() const {
  std::vector<std::string> out;
  DIR* d = opendir((state_ + "/sandboxes").c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    out.push_back(e->d_name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Daemon::SandboxDir(std::string_view id) const {
  for (const auto& name : SandboxDirs()) {
    const std::string dir = state_ + "/sandboxes/" + name;
    boost::system::error_code ec;
    json::value v = json::parse(ReadHostFile(dir + "/config.json"), ec);
    if (ec || !v.is_object()) continue;
    const json::value* got = v.as_object().if_contains("id");
    if (got != nullptr && got->is_string() && got->as_string() == id) return dir;
  }
  return "";
}
}  // namespace nsbox::e2e

#pragma once

// The e2e tier's harness: the real `nsbox serve` on a socket and state dir of its own in a temp
// dir, started, stopped (SIGTERM, asserting a clean exit) or killed (SIGKILL) and restarted on
// the same state dir; what it holds (open fds, descendants); what it leaves on the host (sandbox
// directories, nsbox-* cgroups). And the fixture the e2e tests share: a daemon per test, a
// client, and short-hands for the API's calls.
//
// Where the daemon runs is chosen by NSBOX_E2E_PLACEMENT (Placement below): a child of the test
// process by default, or placed as users place it (the systemd unit, `sudo scripts/start` from a
// login session), for the VM tier (tests/vm/, which runs the subset of tests/vm/e2e_subset.txt).
// Its waits are scaled by NSBOX_E2E_TIME_SCALE (TimeScale() and Scaled(), tests/e2e/http.h).

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "base/pidfd.h"
#include "tests/e2e/http.h"

namespace nsbox::e2e {

// Absolute paths of the binaries under test (tests/CMakeLists.txt).
inline constexpr const char* kNsboxBin = NSBOX_BIN;
inline constexpr const char* kNsboxInitBin = NSBOX_INIT_BIN;

// Why the e2e tier cannot run here (not root, binaries missing), or nullopt when it can.
std::optional<std::string> E2eUnavailable();

// How the daemon under test is placed on the host: NSBOX_E2E_PLACEMENT.
enum class Placement {
  // Unset or "child": a child process of the test, with a fixed environment (the tier as it
  // always ran; the daemon's cgroup is the test's).
  kChild,
  // "systemd-unit": the project's unit, deploy/nsboxd.service, installed as
  // /etc/systemd/system/nsboxd.service, with a drop-in of this test's (kUnitDropIn) that points
  // ExecStart= at the build's nsbox and this test's socket, state dir and arguments. One unit:
  // one daemon at a time (a test with a second Daemon fails to start it, saying so).
  kSystemdUnit,
  // "sudo-session": as the README tells a user, `sudo scripts/start ARGS` from a login session
  // of the user kSessionUser (a session-N.scope of systemd-logind); the daemon is then found by
  // its socket among the host's processes. scripts/start's own checks and build get up to 120 s
  // before the daemon's 10 s count; a su that opened no such session fails the start.
  kSudoSession,
};
// The placement NSBOX_E2E_PLACEMENT names; an error message for a value it does not name.
std::optional<Placement> PlacementFromEnv(std::string* error);
// The user whose login session starts the daemon in Placement::kSudoSession.
inline constexpr const char* kSessionUser = "tester";
// The unit and its drop-in in Placement::kSystemdUnit.
inline constexpr const char* kUnitName = "nsboxd.service";
inline constexpr const char* kUnitPath = "/etc/systemd/system/nsboxd.service";
inline constexpr const char* kUnitDropIn = "/run/systemd/system/nsboxd.service.d/e2e.conf";

// A process as it was seen: its pid and start time (so a reused pid is not mistaken for it).
struct ProcessId {
  pid_t pid = 0;
  unsigned long long start_time = 0;
  std::string comm;
  bool operator<(const ProcessId& o) const { return pid < o.pid; }
};
// Every process under `root` (not `root` itself). A daemon's pool (docs/daemon.md "The pool")
// keeps jails started ahead of any sandbox; their nsbox-init (IsPooledJail, IsJailAdoptedAhead)
// and its children are part of the daemon's standing state, not of a sandbox, and are left out
// unless `include_pool`.
std::vector<ProcessId> Descendants(pid_t root, bool include_pool = false);
// Whether `pid` is the nsbox-init of a jail of a daemon's pool that no sandbox adopted yet (or
// that jail's PID 1 still being made): its cgroup is one of the pool's (nsbox-*-pool-N) and it
// has no /workspace mounted.
bool IsPooledJail(pid_t pid);
// Whether `pid` is the nsbox-init of a jail of a daemon's pool adopted ahead for a directory made
// ahead, that no sandbox took yet: a pool's cgroup, and the placeholder hostname
// (Registry::kAheadHostname) in its /etc/hostname.
bool IsJailAdoptedAhead(pid_t pid);
// Whether that process (same pid and start time) is still alive (zombies count as gone).
bool StillAlive(const ProcessId& p);

// /proc/PID/stat's ppid, start time, state and comm (each may be null); false when it cannot be
// read (the process is gone).
bool ParseStat(pid_t pid, pid_t* ppid, unsigned long long* start_time, char* state,
               std::string* comm);
// Every pid in /proc.
std::vector<pid_t> AllPids();

// Paths of the directories named nsbox-* under /sys/fs/cgroup, 6 levels deep (each v1
// hierarchy and the v2 tree).
std::set<std::string> FindNsboxCgroups();
// The nsbox-* cgroups that are in FindNsboxCgroups() but not in `before`, leaving out the
// nsbox-run-* of concurrent `nsbox run`s whose process is alive (not the daemon's) and those of a
// jail of a daemon's pool that no sandbox took: its cgroups hold a pooled jail (IsPooledJail,
// IsJailAdoptedAhead), or
// they are the daemon's newest pool's and hold no process yet (the jail is being made).
std::vector<std::string> NewNsboxCgroups(const std::set<std::string>& before);

class Daemon {
 public:
  // Makes a temp dir (removed with everything in it by the destructor, after the daemon is
  // stopped) holding nsboxd.sock, state/ and daemon.log. The destructor also removes the cgroups
  // the daemon left on the host (RemoveLeftCgroups): one that was SIGKILLed leaves them to the
  // next daemon of its state dir, and there is none after this harness.
  Daemon();
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Every timeout below is a time on the host: the harness scales it (Scaled()).

  // Starts `nsbox serve --socket S --state-dir D --log-level debug <extra_args...>` and waits
  // (up to 10 s) until GET /v1/health answers 200 on the socket. False, with the reason in
  // error(), when it exited or never answered.
  bool Start(const std::vector<std::string>& extra_args = {});
  // Starts it and waits for it to exit on its own (for command lines it must refuse): the exit
  // code, or -1 when it was still running after `timeout` (it is killed then).
  int RunToExit(const std::vector<std::string>& extra_args,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  // SIGTERM (in Placement::kSystemdUnit, `systemctl stop`, which sends it); true when it exited
  // with 0 within `timeout` (else it is SIGKILLed, and error() says how it ended).
  bool Stop(std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  // SIGKILL to the daemon process alone (its jails stay, as after a crash), and waited for.
  void Kill();
  // Start again with the arguments of the last Start, on the same state dir.
  bool Restart();
  // "NAME=VALUE" entries added to the daemon's environment at the next Start (the adversarial
  // tier plants a canary there); by default the environment is the harness's fixed one.
  void SetExtraEnv(std::vector<std::string> env) { extra_env_ = std::move(env); }
  bool running();

  // The daemon process itself, whatever the placement (-1 when it is not running).
  pid_t pid() const { return pid_; }
  Placement placement() const { return placement_; }
  const std::string& dir() const { return dir_; }
  const std::string& socket_path() const { return socket_; }
  const std::string& state_dir() const { return state_; }
  std::string log_path() const { return dir_ + "/daemon.log"; }
  // kSystemdUnit: where the unit's ExecStopPost writes how the daemon ended.
  std::string ExitFile() const { return dir_ + "/unit-exit"; }
  Endpoint endpoint() const { return Endpoint::Unix(socket_); }
  const std::string& error() const { return error_; }

  // The log, from byte `from` on (the last `max` bytes of it).
  std::string Log(size_t from = 0, size_t max = 64 * 1024) const;
  size_t LogSize() const;

  // Open fds of the daemon process (/proc/PID/fd), -1 if it is not running.
  int CountFds() const;
  // A listing of them (fd -> target) for messages.
  std::string DescribeFds() const;

  // The names of the daemon's cgroups begin with it ("nsbox-<8 hex>-"); "" before its start.
  std::string CgroupPrefix() const;

  // state/sandboxes/<entry> for every entry (the on-disk names).
  std::vector<std::string> SandboxDirs() const;
  // The directory of sandbox `id` (the entry whose config.json names it), "" if none.
  std::string SandboxDir(std::string_view id) const;

 private:
  std::string dir_;
  std::string socket_;
  std::string state_;
  std::vector<std::string> args_;
  std::vector<std::string> extra_env_;
  Placement placement_ = Placement::kChild;
  std::string placement_error_;  // NSBOX_E2E_PLACEMENT names no placement
  bool active_ = false;          // a run started and its end not seen yet
  bool wrote_drop_in_ = false;   // kSystemdUnit: kUnitDropIn is this daemon's
  pid_t pid_ = -1;               // the daemon (-1 while not known)
  // Our child: the daemon itself (kChild), su (kSudoSession), none (kSystemdUnit).
  pid_t child_ = -1;
  // The daemon when it is not our child (kSystemdUnit, kSudoSession): signalled and watched
  // through a pidfd, since its pid could be reused once it is gone.
  Pidfd daemon_fd_;
  std::string error_;
  int exit_status_ = -1;  // waitpid status of the last run (as systemd or su saw it when placed)

  bool Spawn(const std::vector<std::string>& extra_args);
  bool SpawnChild(const std::vector<std::string>& argv, int log);
  bool SpawnUnit(const std::vector<std::string>& argv);
  bool SpawnSession(const std::vector<std::string>& argv, int log);
  bool WaitHealthy();
  // Whether the daemon has ended (reaping what is ours, and taking its status into
  // exit_status_); it is not running from then on.
  bool Ended();
  bool Reap(std::chrono::milliseconds timeout);
  // Sends `sig` to the daemon process (SIGTERM, SIGKILL) as its placement does.
  void Signal(int sig);
  // kSudoSession: the daemon among the host's processes, once scripts/start has executed it.
  bool FindSessionDaemon();
  // kSystemdUnit: `systemctl ARGS` (stdout into *out when given, stderr into the log); its exit
  // code.
  int Systemctl(const std::vector<std::string>& args, std::string* out = nullptr) const;
  // kSystemdUnit: holds the unit's MainPID (daemon_fd_, pid_); false when it has none.
  bool AdoptMainPid();
  // kSystemdUnit: a property of the unit (`systemctl show -p NAME --value`), "" if unknown.
  std::string UnitProperty(const std::string& name) const;
  // How the last run ended, for messages.
  std::string HowItEnded() const;
  // A line into the log (the harness's notes among the daemon's own lines).
  void LogLine(const std::string& line) const;
  // Removes the cgroups of this harness's daemon that it left on the host (killed, it had no
  // chance to), saying so on stderr. The daemon must have ended.
  void RemoveLeftCgroups();
};

// Removes a tree without crossing into other mounts (FTW_MOUNT) or following symlinks.
void RemoveTree(const std::string& path);
// The whole content of a host file ("" when missing).
std::string ReadHostFile(const std::string& path);
// A process's resident set in KiB (/proc/PID/status VmRSS), -1 if unknown.
long RssKib(pid_t pid);
// The most it has ever been (VmHWM).
long PeakRssKib(pid_t pid);
// A TCP port nobody listens on now.
uint16_t FreeTcpPort();
// Runs argv (PATH searched) with stdin on /dev/null and stdout and stderr both into `log_path`;
// its exit code (128 + the signal when killed) and, in *output, what it printed.
int RunProgram(const std::vector<std::string>& argv, const std::string& log_path,
               std::string* output);

// The result of a buffered exec.
struct ExecResult {
  Response response;
  json::object answer;  // the JSON answer when the status is 200
  std::string out() const;
  std::string err() const;
  int64_t exit_code() const;
  std::string reason() const;
  std::string Describe() const { return response.Describe(); }
};

// The fixture of the e2e tests: a daemon of its own for every test, stopped with SIGTERM at the
// end (it must exit 0), its log printed for a failed test; and short-hands.
class E2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  void SetUp() override;
  void TearDown() override;
  // Arguments added to `nsbox serve` when SetUp starts the test's daemon.
  virtual std::vector<std::string> DaemonArgs() const { return {}; }

  static Daemon& daemon() { return *daemon_; }
  Client& client() { return *client_; }
  // A new client on the daemon's socket (one per thread).
  Client NewClient() const { return Client(daemon_->endpoint()); }

  // "/v1/sandboxes/<pct-encoded id>" + suffix.
  static std::string SbPath(std::string_view id, std::string_view suffix = "");
  // A fresh id for this test (test name + a counter).
  std::string NewId(std::string_view hint = "sb");

  // PUT the sandbox; asserts (non-fatally) 200 or 201.
  Response Create(std::string_view id, std::string_view body = "");
  // POST exec; the answer.
  ExecResult Exec(std::string_view id, const json::object& request,
                  std::chrono::milliseconds timeout = kDefaultTimeout);
  ExecResult Exec(std::string_view id, std::string_view command) {
    return Exec(id, json::object{{"command", command}});
  }
  // Runs `command` and returns its stdout, failing the test unless it exits 0.
  std::string Sh(std::string_view id, std::string_view command);
  Response PutFile(std::string_view id, std::string_view path, std::string_view bytes);
  Response GetFile(std::string_view id, std::string_view path);
  Response Fs(std::string_view id, std::string_view verb, const json::object& body);
  Response Delete(std::string_view id) { return client().Delete(SbPath(id)); }
  // Checks the daemon is alive and answers health.
  void ExpectDaemonHealthy();

  static std::unique_ptr<Daemon> daemon_;

 private:
  std::unique_ptr<Client> client_;
  size_t log_offset_ = 0;
  int id_counter_ = 0;
};

// The fixture of the tests that act on one sandbox: E2eTest's daemon, and a sandbox `id_` created
// on it by SetUp (not when the test is skipped or the daemon did not start).
class E2eSandboxTest : public E2eTest {
 protected:
  void SetUp() override;
  std::string id_;
};

// JSON short-hands for assertions, shared by every e2e file: a string member ("<missing>" when it
// is absent or not a string), the answer as an object ({} when it is not one), a member array by
// value (safe in a range-for), and a member by value ("<missing>" when absent).
std::string Str(const json::object& o, std::string_view key);
json::object Obj(const Response& r);
json::array Arr(const Response& r, std::string_view key);
json::value Field(const json::object& o, std::string_view key);

}  // namespace nsbox::e2e

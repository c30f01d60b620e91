#pragma once

// The integration tier's harness: run nsbox (or the probe, for control runs) as a fresh child
// process and capture what it did; a throw-away workspace; key=value parsing for the probe's
// reports; and the checks that nothing (process, cgroup) was left behind.
//
// Every test case starts nsbox as a new child process, so each case runs in a fresh child by
// construction (Chromium's SANDBOX_TEST). The test process makes itself a child subreaper, so a
// process that outlives nsbox is reparented to it and shows up in RunResult::leftover.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "isolate/idmap.h"

namespace nsbox::itest {

// Absolute paths of the binaries under test (tests/CMakeLists.txt).
inline constexpr const char* kNsboxBin = NSBOX_BIN;
inline constexpr const char* kProbeBin = NSBOX_PROBE_BIN;
// Where TempWorkspace puts the probe, as seen inside the jail.
inline constexpr const char* kProbeInJail = "/workspace/nsbox-probe";

struct RunOptions {
  // nullopt: stdin is /dev/null. A value: stdin is a pipe that carries these bytes, then EOF.
  std::optional<std::string> stdin_data;
  // "K=V" added to (or replacing in) the test process's own environment for the child.
  std::vector<std::string> extra_env;
  // The child is SIGKILLed when it runs longer, and RunResult::timed_out is set.
  std::chrono::milliseconds timeout{20000};
  // Once the child's stdout contains `ready_output` (at once if empty) and `ready_delay` has
  // passed since it started: `on_ready` is called with the child's pid (to look at the running
  // jail from the host), then `signal` is sent to the child when it is non-zero. Both only once.
  std::string ready_output;
  std::chrono::milliseconds ready_delay{0};
  std::function<void(pid_t)> on_ready;
  int signal = 0;
};

// Shorthands for the common options.
inline RunOptions WithStdin(std::string data) {
  RunOptions o;
  o.stdin_data = std::move(data);
  return o;
}
inline RunOptions WithTimeout(std::chrono::milliseconds timeout) {
  RunOptions o;
  o.timeout = timeout;
  return o;
}
inline RunOptions WithEnv(std::vector<std::string> extra_env) {
  RunOptions o;
  o.extra_env = std::move(extra_env);
  return o;
}

struct RunResult {
  pid_t pid = -1;
  int exit_code = -1;   // the exit code, or 128 + the signal that killed the child
  int term_signal = 0;  // the signal that killed the child, 0 if it exited
  bool timed_out = false;
  bool ready = false;  // ready_output was seen and on_ready/signal were done
  bool signal_sent = false;
  std::string out;
  std::string err;
  std::chrono::milliseconds elapsed{0};
  // Processes still alive 1 s after the child ended that were reparented to the test process:
  // "pid comm cmdline" each. They are killed and reaped by the harness.
  std::vector<std::string> leftover;
  std::string command;  // the argv, for messages

  // Everything above, for an assertion message.
  std::string Describe() const;
};

// Runs argv[0] (an absolute path) with the arguments, as a child of the test process.
RunResult RunProgram(const std::vector<std::string>& argv, const RunOptions& options = {});
// Runs `nsbox <args...>`.
RunResult RunNsbox(const std::vector<std::string>& args, const RunOptions& options = {});

// "k=v" lines (CR stripped, for output that came through a terminal) into a map; the last value
// of a key wins; lines without '=' are ignored.
using KeyValues = std::map<std::string, std::string>;
KeyValues ParseKeyValues(std::string_view text);
// The value of `key`, or "<missing>".
std::string Get(const KeyValues& kv, const std::string& key);

// Why the integration tier cannot run here (not root, no user namespaces, binaries missing), or
// nullopt when it can.
std::optional<std::string> IntegrationUnavailable();

// The ids root inside the jail maps to: isolate::DefaultIdMapping(), as nsbox run uses it.
isolate::IdMapping MappedIds();

// A directory under /var/tmp owned by the jail's mapped root (so the jail can write to it), with
// the probe copied in as nsbox-probe (mode 0755). Removed with everything in it at the end.
class TempWorkspace {
 public:
  TempWorkspace();
  ~TempWorkspace();
  TempWorkspace(const TempWorkspace&) = delete;
  TempWorkspace& operator=(const TempWorkspace&) = delete;

  const std::string& path() const { return path_; }
  // The host path of `rel` inside the workspace.
  std::string HostPath(std::string_view rel) const;
  // A subdirectory owned by the mapped root, like the workspace itself.
  void MakeDir(std::string_view rel) const;
  // "--workspace", path(): the arguments for nsbox run.
  std::vector<std::string> Args() const { return {"--workspace", path_}; }

 private:
  std::string path_;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
};

// Paths of the directories named nsbox-run-* in every cgroup hierarchy under /sys/fs/cgroup (a
// walk 6 levels deep, which covers the caller's own nested cgroups).
std::set<std::string> FindNsboxRunCgroups();

// Fails the current test when `result` left something behind: a process (result.leftover), its
// own cgroup (nsbox-run-<its pid>), or any nsbox-run-* cgroup that was not in `before` and whose
// pid is not a live process (a concurrent nsbox of someone else's is not ours to judge).
void ExpectNothingLeftBehind(const RunResult& result, const std::set<std::string>& before);

// The fixture of every integration test: skips, loudly and with the reason, where the tier
// cannot run.
class IntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

}  // namespace nsbox::itest

#pragma once

// The adversarial tier's fixture (issue 7, docs/security.md). The attacker is root inside a
// sandbox's user namespace and calls every API verb on its own sandbox with any arguments; some
// attackers hold the TCP token, or are an unprivileged host user who can see the socket path.
//
// Per test suite (ctest runs each case in a process of its own, so in practice per case): a real
// `nsbox serve` on its Unix socket and on TCP with a random bearer token, and four canaries
// holding one random token: a file under /var/tmp (and its twin under /tmp), a variable in the
// daemon's environment, a TCP service on host loopback (127.0.0.1 and ::1) and an abstract Unix
// socket. Every response and every command's output that goes through the fixture is searched
// for the canary and for the bearer token.
//
// After every case (TearDown): the daemon's pid is unchanged, every sandbox's nsbox-init answers
// within 1 s, then every sandbox is deleted and the daemon must be back where it started: no
// process under it, no nsbox cgroup, no mount, no state file that was not there before, its fd
// count within 5 of the baseline; the canary files are intact and nothing connected to the
// canary services but the controls.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"
#include "tests/e2e/http.h"

namespace nsbox::adversarial {

using e2e::Client;
using e2e::Daemon;
using e2e::Endpoint;
using e2e::ExecResult;
using e2e::Headers;
using e2e::NdjsonStream;
using e2e::RawConnection;
using e2e::Response;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

inline constexpr const char* kProbeBin = NSBOX_PROBE_BIN;
inline constexpr const char* kAttackerBin = NSBOX_ATTACKER_BIN;
// Where InstallTools puts them inside a sandbox (its persistent /root).
inline constexpr const char* kJailProbe = "/root/.adv/nsbox-probe";
inline constexpr const char* kJailAttacker = "/root/.adv/nsbox-attacker";

// The lines "key=value" of a probe's output (the first '=' splits).
using KeyValues = std::map<std::string, std::string>;
KeyValues ParseKeyValues(std::string_view text);
// The value, or "<missing>".
std::string Get(const KeyValues& kv, const std::string& key);

// The host-side canaries (SetUpTestSuite plants them, TearDownTestSuite removes them).
class Canaries {
 public:
  Canaries();
  ~Canaries();
  Canaries(const Canaries&) = delete;
  Canaries& operator=(const Canaries&) = delete;

  const std::string& token() const { return token_; }
  const std::string& file() const { return file_; }               // /var/tmp/nsbox-adv-canary-*
  const std::string& tmp_file() const { return tmp_file_; }       // /tmp/nsbox-adv-canary-*
  uint16_t port() const { return port_; }                         // on 127.0.0.1 and ::1
  const std::string& abstract_name() const { return abstract_; }  // without the leading NUL
  static constexpr const char* kEnvName = "NSBOX_ADV_CANARY";
  // Connections the services accepted (each was answered with "CANARY <token>\n").
  int connections() const { return connections_.load(); }
  // Whether the files still hold the token.
  bool FilesIntact() const;
  std::string error() const { return error_; }

 private:
  void Serve();
  std::string token_;
  std::string file_;
  std::string tmp_file_;
  std::string abstract_;
  uint16_t port_ = 0;
  int listeners_[3] = {-1, -1, -1};
  int stop_pipe_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<int> connections_{0};
  std::string error_;
};

// Runs a host binary (a control) and returns its standard output.
std::string RunOnHost(const std::vector<std::string>& argv, int* exit_code = nullptr);

// Mount points of the host's mount table (the test process's) that concern nsbox.
std::multiset<std::string> NsboxMounts(const std::string& daemon_dir);

class AdversarialTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  void SetUp() override;
  void TearDown() override;

  static Daemon& daemon() { return *daemon_; }
  static Canaries& canaries() { return *canaries_; }
  static const std::string& bearer() { return bearer_; }
  static uint16_t tcp_port() { return tcp_port_; }
  Client& client() { return *client_; }
  Client NewClient() const { return Client(daemon_->endpoint()); }

  // "/v1/sandboxes/<pct-encoded id>" + suffix.
  static std::string SbPath(std::string_view id, std::string_view suffix = "");
  // A fresh id for this case.
  std::string NewId(std::string_view hint = "sb");
  // PUT a new sandbox (asserts 201) and return its id.
  std::string NewSandbox(std::string_view hint = "sb", std::string_view body = "");
  // Copies nsbox-probe and nsbox-attacker into the sandbox's /root/.adv.
  void InstallTools(const std::string& id);

  // Every call below searches the answer for the canary and the bearer token (Scan).
  Response Call(std::string_view method, std::string_view target, std::string_view body = {},
                const Headers& headers = {}, milliseconds timeout = e2e::kDefaultTimeout);
  ExecResult Exec(const std::string& id, const json::object& request,
                  milliseconds timeout = e2e::kDefaultTimeout);
  ExecResult Exec(const std::string& id, std::string_view command,
                  milliseconds timeout = e2e::kDefaultTimeout) {
    return Exec(id, json::object{{"command", command}}, timeout);
  }
  // Runs `command`; its stdout, failing the case unless it exits 0.
  std::string Sh(const std::string& id, std::string_view command);
  Response GetFile(const std::string& id, std::string_view path,
                   milliseconds timeout = e2e::kDefaultTimeout);
  Response PutFile(const std::string& id, std::string_view path, std::string_view bytes);
  Response Fs(const std::string& id, std::string_view verb, const json::object& body,
              milliseconds timeout = e2e::kDefaultTimeout);
  // nsbox-probe / nsbox-attacker ARGS... in the sandbox (InstallTools first), parsed.
  KeyValues Probe(const std::string& id, const std::string& args);
  KeyValues Attack(const std::string& id, const std::string& args);
  // The same programs on the host: the controls.
  static KeyValues ProbeOnHost(const std::vector<std::string>& args);
  static KeyValues AttackOnHost(const std::vector<std::string>& args);
  // A control connected to a canary service itself (so the count of connections matches).
  void ExpectCanaryConnection() { ++expected_canary_connections_; }

  // Fails the case if `text` holds the canary token or the bearer token.
  void Scan(std::string_view what, std::string_view text);
  void ScanResponse(std::string_view what, const Response& r);

  // nsbox-init of `id` answers fs/exists within 1 s (an after-each-case check, also usable in
  // the middle of a case).
  void ExpectInitAnswers(const std::string& id);
  // SIGKILL or SIGTERM the daemon and start it again on the same state dir; the invariants then
  // apply to the new pid (the only cases that change it).
  void RestartDaemon(bool kill);

  static std::unique_ptr<Daemon> daemon_;
  static std::unique_ptr<Canaries> canaries_;
  // Arguments added to `nsbox serve` (a suite sets them before calling SetUpTestSuite).
  static std::vector<std::string> extra_daemon_args_;

 private:
  static std::string bearer_;
  static uint16_t tcp_port_;
  static pid_t baseline_pid_;
  static int baseline_fds_;
  static std::set<std::string> baseline_cgroups_;
  static std::multiset<std::string> baseline_mounts_;
  static std::vector<std::string> baseline_state_;
  static std::string unavailable_;
  std::unique_ptr<Client> client_;
  size_t log_offset_ = 0;
  int id_counter_ = 0;
  int expected_canary_connections_ = 0;
  int canary_connections_at_start_ = 0;
};

// JSON short-hands (tests/e2e's).
using e2e::Arr;
using e2e::Field;
using e2e::Obj;
using e2e::PctEncode;
using e2e::PeakRssKib;
using e2e::RssKib;
using e2e::Str;

}  // namespace nsbox::adversarial

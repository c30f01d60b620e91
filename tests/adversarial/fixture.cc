#include "tests/adversarial/fixture.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include "tests/common/cgroups.h"

namespace nsbox::adversarial {

namespace {

// The parent pid of `pid` (field 4 of /proc/PID/stat, after the command's parenthesis), or -1.
pid_t ParentOf(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 1));
  std::string state;
  pid_t ppid = -1;
  rest >> state >> ppid;
  return ppid;
}

std::string RandomHex(size_t n) {
  std::random_device rd;
  std::string out;
  static const char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) out += kHex[rd() % 16];
  return out;
}

bool WriteHostFile(const std::string& path, const std::string& content, mode_t mode) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return false;
  bool ok = write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  fchmod(fd, mode);
  close(fd);
  return ok;
}

// Entries of the state directory two levels deep ("sandboxes/<name>"), sorted.
std::vector<std::string> StateListing(const std::string& state) {
  std::vector<std::string> out;
  DIR* d = opendir(state.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    out.push_back(name);
    DIR* sub = opendir((state + "/" + name).c_str());
    if (sub == nullptr) continue;
    while (struct dirent* s = readdir(sub)) {
      std::string child = s->d_name;
      if (child == "." || child == "..") continue;
      // The sandbox directory the daemon keeps made ahead has a new name after every creation.
      if (child.rfind(".spare-", 0) == 0) child = ".spare-*";
      out.push_back(name + "/" + child);
    }
    closedir(sub);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += "  " + s + "\n";
  return out;
}

template <typename Pred>
bool PollUntil(Pred pred, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (pred()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
}

}  // namespace

KeyValues ParseKeyValues(std::string_view text) {
  KeyValues out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line =
        text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    out[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  return out;
}

std::string Get(const KeyValues& kv, const std::string& key) {
  auto it = kv.find(key);
  return it == kv.end() ? "<missing>" : it->second;
}

// ---- Canaries ----

Canaries::Canaries() {
  token_ = "CANARY" + RandomHex(32);
  const std::string tag = RandomHex(8);
  file_ = "/var/tmp/nsbox-adv-canary-" + tag;
  tmp_file_ = "/tmp/nsbox-adv-canary-" + tag;
  abstract_ = "nsbox-adv-canary-" + tag;
  if (!WriteHostFile(file_, token_ + "\n", 0644) ||
      !WriteHostFile(tmp_file_, token_ + "\n", 0644)) {
    error_ = std::string("cannot plant the canary files: ") + strerror(errno);
    return;
  }
  // 127.0.0.1 and ::1 on one port, and the abstract socket.
  listeners_[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a4{};
  a4.sin_family = AF_INET;
  a4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  setsockopt(listeners_[0], SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t len = sizeof a4;
  // SAFETY: sockaddr_in is the address of an AF_INET socket; len is its size.
  if (bind(listeners_[0], reinterpret_cast<sockaddr*>(&a4), sizeof a4) != 0 ||
      getsockname(listeners_[0], reinterpret_cast<sockaddr*>(&a4), &len) != 0 ||
      listen(listeners_[0], 64) != 0) {
    error_ = std::string("canary TCP listener: ") + strerror(errno);
    return;
  }
  port_ = ntohs(a4.sin_port);
  listeners_[1] = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in6 a6{};
  a6.sin6_family = AF_INET6;
  a6.sin6_addr = in6addr_loopback;
  a6.sin6_port = htons(port_);
  setsockopt(listeners_[1], IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  // SAFETY: sockaddr_in6 is the address of an AF_INET6 socket. A host without IPv6 keeps only
  // the IPv4 service (the jail's probe of ::1 is then compared with the host's own refusal).
  if (listeners_[1] < 0 || bind(listeners_[1], reinterpret_cast<sockaddr*>(&a6), sizeof a6) != 0 ||
      listen(listeners_[1], 64) != 0) {
    if (listeners_[1] >= 0) close(listeners_[1]);
    listeners_[1] = -1;
  }
  listeners_[2] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  memcpy(un.sun_path + 1, abstract_.data(), abstract_.size());
  const socklen_t un_len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + abstract_.size());
  // SAFETY: sockaddr_un is the address of an AF_UNIX socket; un_len covers the abstract name.
  if (bind(listeners_[2], reinterpret_cast<sockaddr*>(&un), un_len) != 0 ||
      listen(listeners_[2], 64) != 0) {
    error_ = std::string("canary abstract socket: ") + strerror(errno);
    return;
  }
  if (pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    error_ = std::string("pipe: ") + strerror(errno);
    return;
  }
  thread_ = std::thread([this] { Serve(); });
}

void Canaries::Serve() {
  const std::string answer = "CANARY " + token_ + "\n";
  for (;;) {
    pollfd fds[4];
    int n = 0;
    for (int l : listeners_) {
      if (l >= 0) fds[n++] = {l, POLLIN, 0};
    }
    fds[n++] = {stop_pipe_[0], POLLIN, 0};
    if (poll(fds, static_cast<nfds_t>(n), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[n - 1].revents != 0) return;
    for (int i = 0; i < n - 1; ++i) {
      if ((fds[i].revents & POLLIN) == 0) continue;
      int c = accept4(fds[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      ++connections_;
      (void)!send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
      close(c);
    }
  }
}

Canaries::~Canaries() {
  if (thread_.joinable()) {
    (void)!write(stop_pipe_[1], "x", 1);
    thread_.join();
  }
  for (int l : listeners_) {
    if (l >= 0) close(l);
  }
  for (int p : stop_pipe_) {
    if (p >= 0) close(p);
  }
  if (!file_.empty()) unlink(file_.c_str());
  if (!tmp_file_.empty()) unlink(tmp_file_.c_str());
}

bool Canaries::FilesIntact() const {
  return e2e::ReadHostFile(file_) == token_ + "\n" && e2e::ReadHostFile(tmp_file_) == token_ + "\n";
}

// ---- host helpers ----

std::string RunOnHost(const std::vector<std::string>& argv, int* exit_code) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return "";
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    int devnull = open("/dev/null", O_RDWR);
    dup2(devnull, 0);
    // SAFETY: execv does not write through argv; the cast only fits its prototype.
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t n = read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (exit_code != nullptr) *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return text;
}

std::multiset<std::string> NsboxMounts(const std::string& daemon_dir) {
  std::multiset<std::string> out;
  std::istringstream in(e2e::ReadHostFile("/proc/self/mountinfo"));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point;
    f >> id >> parent >> dev >> root >> point;
    if (point.find("nsbox") != std::string::npos || root.find("nsbox") != std::string::npos ||
        (!daemon_dir.empty() && point.rfind(daemon_dir, 0) == 0)) {
      out.insert(root + " on " + point);
    }
  }
  return out;
}

// ---- AdversarialTest ----

std::unique_ptr<Daemon> AdversarialTest::daemon_;
std::unique_ptr<Canaries> AdversarialTest::canaries_;
std::string AdversarialTest::bearer_;
uint16_t AdversarialTest::tcp_port_ = 0;
pid_t AdversarialTest::baseline_pid_ = -1;
int AdversarialTest::baseline_fds_ = -1;
std::set<std::string> AdversarialTest::baseline_cgroups_;
std::multiset<std::string> AdversarialTest::baseline_mounts_;
std::vector<std::string> AdversarialTest::baseline_state_;
std::string AdversarialTest::unavailable_;
std::vector<std::string> AdversarialTest::extra_daemon_args_;

void AdversarialTest::SetUpTestSuite() {
  unavailable_.clear();
  if (auto reason = e2e::E2eUnavailable()) {
    unavailable_ = *reason;
    return;
  }
  if (access(kProbeBin, X_OK) != 0 || access(kAttackerBin, X_OK) != 0) {
    unavailable_ =
        std::string("the in-jail programs are missing: ") + kProbeBin + ", " + kAttackerBin;
    return;
  }
  canaries_ = std::make_unique<Canaries>();
  daemon_ = std::make_unique<Daemon>();
  if (!canaries_->error().empty()) return;  // SetUp fails the case with the reason
  // The daemon's environment holds the canary, as a secret of the host would be.
  daemon_->SetExtraEnv({std::string(Canaries::kEnvName) + "=" + canaries_->token()});
  bearer_ = "tok" + RandomHex(40);
  const std::string token_file = daemon_->dir() + "/token";
  WriteHostFile(token_file, bearer_ + "\n", 0600);
  tcp_port_ = e2e::FreeTcpPort();
  std::vector<std::string> args = {"--listen", "127.0.0.1:" + std::to_string(tcp_port_),
                                   "--token-file", token_file};
  args.insert(args.end(), extra_daemon_args_.begin(), extra_daemon_args_.end());
  if (!daemon_->Start(args)) {
    return;  // SetUp reports daemon_->error()
  }
  baseline_cgroups_ = e2e::FindNsboxCgroups();
  baseline_mounts_ = NsboxMounts(daemon_->dir());
  // Warm-up: one sandbox started, used and deleted, so that whatever the daemon opens once
  // (cgroup roots, the worker pool) is in the fd baseline.
  {
    Client c(daemon_->endpoint());
    c.Request("PUT", "/v1/sandboxes/warm-up");
    c.PostJson("/v1/sandboxes/warm-up/exec", json::object{{"command", "true"}});
    c.Delete("/v1/sandboxes/warm-up");
    // The warm-up adopted the pooled jail: its successor is part of the baseline.
    if (!e2e::WaitPoolFull(c))
      std::fprintf(stderr, "adversarial: the daemon's pool did not fill\n");
  }
  baseline_pid_ = daemon_->pid();
  // The daemon keeps two sandbox directories made ahead; the second comes a moment after a
  // creation (Registry::AskForSpareDir), later still when fsync is slow. A baseline taken with
  // one would never match a teardown's listing with two.
  const bool spares_ready = PollUntil(
      [&] {
        baseline_state_ = StateListing(daemon_->state_dir());
        return std::count(baseline_state_.begin(), baseline_state_.end(), "sandboxes/.spare-*") ==
               2;
      },
      milliseconds(10000));
  if (!spares_ready) std::fprintf(stderr, "adversarial: the daemon did not make two spare dirs\n");
  std::this_thread::sleep_for(milliseconds(100));
  baseline_fds_ = daemon_->CountFds();
}

void AdversarialTest::TearDownTestSuite() {
  if (daemon_ && daemon_->running()) {
    if (!daemon_->Stop()) {
      std::fprintf(stderr, "adversarial: the daemon did not stop cleanly: %s\n",
                   daemon_->error().c_str());
    }
  }
  daemon_.reset();
  canaries_.reset();
}

void AdversarialTest::SetUp() {
  if (!unavailable_.empty()) {
    std::fprintf(stderr, "\n*** SKIPPED (NOT RUN): %s ***\n\n", unavailable_.c_str());
    GTEST_SKIP() << "NOT RUN: " << unavailable_;
  }
  ASSERT_TRUE(canaries_ && canaries_->error().empty()) << canaries_->error();
  ASSERT_TRUE(daemon_ && daemon_->running()) << "the daemon is not running: " << daemon_->error();
  ASSERT_EQ(daemon_->pid(), baseline_pid_) << "an earlier case replaced the daemon";
  log_offset_ = daemon_->LogSize();
  client_ = std::make_unique<Client>(daemon_->endpoint());
  canary_connections_at_start_ = canaries_->connections();
  expected_canary_connections_ = 0;
}

void AdversarialTest::TearDown() {
  if (IsSkipped() || !daemon_) return;
  // 1. The daemon is the one the suite started (or the one RestartDaemon made).
  EXPECT_TRUE(daemon_->running()) << "the daemon died: " << daemon_->error();
  EXPECT_EQ(daemon_->pid(), baseline_pid_) << "the daemon's pid changed";
  if (!daemon_->running()) {
    std::fprintf(stderr, "---- daemon log ----\n%s\n", daemon_->Log(log_offset_).c_str());
    // Started again on the same state dir, it removes what the dead one left (its cgroups,
    // half-done deletions); the checks below then run on it, and later cases of this process
    // get a daemon.
    if (!daemon_->Restart()) {
      ADD_FAILURE() << "the daemon does not start again: " << daemon_->error();
      return;
    }
    baseline_pid_ = daemon_->pid();
  }
  Client c(daemon_->endpoint());
  // 2. Every sandbox's nsbox-init answers within 1 s; then every sandbox goes.
  Response list = c.Get("/v1/sandboxes");
  EXPECT_EQ(list.status, 200) << list.Describe();
  std::vector<std::string> ids;
  for (const auto& v : Arr(list, "sandboxes")) {
    if (v.is_object()) ids.push_back(Str(v.as_object(), "id"));
  }
  for (const auto& id : ids) {
    ExpectInitAnswers(id);
    Response del = c.Delete(SbPath(id), milliseconds(30000));
    EXPECT_EQ(del.status, 204) << "DELETE " << id << ": " << del.Describe();
  }
  // 3. Nothing left: processes, cgroups, mounts, state files, fds.
  const pid_t pid = daemon_->pid();
  std::vector<e2e::ProcessId> left;
  bool gone = PollUntil(
      [&] {
        left = e2e::Descendants(pid);
        // nsbox-net, the daemon's own network co-process (docs/network.md), lives as long as
        // the daemon once a sandbox had a network; a sandbox's process is never named so
        // (they are under nsbox-init, which is under the daemon).
        std::erase_if(left, [pid](const e2e::ProcessId& p) {
          return p.comm == "nsbox-net" && ParentOf(p.pid) == pid;
        });
        return left.empty();
      },
      milliseconds(5000));
  if (!gone) {
    std::string names;
    for (const auto& p : left) names += " " + std::to_string(p.pid) + "(" + p.comm + ")";
    ADD_FAILURE() << "processes left under the daemon:" << names;
  }
  std::vector<std::string> cgroups;
  bool no_cgroups = PollUntil(
      [&] {
        cgroups = e2e::NewNsboxCgroups(baseline_cgroups_);
        return cgroups.empty();
      },
      milliseconds(5000));
  EXPECT_TRUE(no_cgroups) << "cgroups left:\n" << Join(cgroups);
  EXPECT_EQ(NsboxMounts(daemon_->dir()), baseline_mounts_) << "the host's mount table changed";
  std::vector<std::string> state;
  bool state_clean = PollUntil(
      [&] {
        state = StateListing(daemon_->state_dir());
        return state == baseline_state_;
      },
      milliseconds(5000));
  EXPECT_TRUE(state_clean) << "state dir now:\n"
                           << Join(state) << "was:\n"
                           << Join(baseline_state_);
  int fds = -1;
  EXPECT_TRUE(e2e::WaitPoolFull(c)) << "the daemon's pool did not fill again";
  bool fds_back = PollUntil(
      [&] {
        fds = daemon_->CountFds();
        return std::abs(fds - baseline_fds_) <= 5;
      },
      milliseconds(5000));
  EXPECT_TRUE(fds_back) << "the daemon holds " << fds << " fds, baseline " << baseline_fds_ << ":\n"
                        << daemon_->DescribeFds();
  // 4. The canaries: intact, and nobody but the controls reached the services.
  EXPECT_TRUE(canaries_->FilesIntact()) << "a canary file changed";
  EXPECT_EQ(canaries_->connections() - canary_connections_at_start_, expected_canary_connections_)
      << "something connected to a canary service";
  client_.reset();
  if (HasFailure()) {
    std::fprintf(stderr, "---- daemon log during this case (%s) ----\n%s\n---- end ----\n",
                 daemon_->log_path().c_str(), daemon_->Log(log_offset_, 32 * 1024).c_str());
  }
}

std::string AdversarialTest::SbPath(std::string_view id, std::string_view suffix) {
  std::string encoded;
  for (char ch : PctEncode(id)) encoded += ch == '.' ? std::string("%2E") : std::string(1, ch);
  return "/v1/sandboxes/" + encoded + std::string(suffix);
}

std::string AdversarialTest::NewId(std::string_view hint) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->name()) + "-" + std::string(hint) + "-" + std::to_string(++id_counter_);
}

std::string AdversarialTest::NewSandbox(std::string_view hint, std::string_view body) {
  const std::string id = NewId(hint);
  Response r = body.empty() ? Call("PUT", SbPath(id))
                            : Call("PUT", SbPath(id), body, {{"Content-Type", "application/json"}});
  EXPECT_EQ(r.status, 201) << "PUT " << id << ": " << r.Describe();
  return id;
}

void AdversarialTest::InstallTools(const std::string& id) {
  for (const auto& [host, jail] :
       {std::pair{kProbeBin, kJailProbe}, std::pair{kAttackerBin, kJailAttacker}}) {
    Response r = PutFile(id, jail, e2e::ReadHostFile(host));
    ASSERT_EQ(r.status, 204) << "upload " << jail << ": " << r.Describe();
  }
  Sh(id, std::string("chmod 0755 ") + kJailProbe + " " + kJailAttacker);
}

void AdversarialTest::Scan(std::string_view what, std::string_view text) {
  if (text.find(canaries_->token()) != std::string_view::npos) {
    ADD_FAILURE() << "CANARY LEAKED in " << what << ": " << text.substr(0, 2000);
  }
  if (!bearer_.empty() && text.find(bearer_) != std::string_view::npos) {
    ADD_FAILURE() << "BEARER TOKEN LEAKED in " << what << ": " << text.substr(0, 2000);
  }
}

void AdversarialTest::ScanResponse(std::string_view what, const Response& r) {
  Scan(what, r.body);
  for (const auto& [k, v] : r.headers) Scan(what, v);
}

Response AdversarialTest::Call(std::string_view method, std::string_view target,
                               std::string_view body, const Headers& headers,
                               milliseconds timeout) {
  Response r = client().Request(method, target, body, headers, timeout);
  ScanResponse(std::string(method) + " " + std::string(target.substr(0, 200)), r);
  return r;
}

ExecResult AdversarialTest::Exec(const std::string& id, const json::object& request,
                                 milliseconds timeout) {
  ExecResult out;
  out.response = client().PostJson(SbPath(id, "/exec"), request, timeout);
  ScanResponse("exec " + json::serialize(request).substr(0, 200), out.response);
  json::value v = out.response.Json();
  if (out.response.status == 200 && v.is_object()) out.answer = v.as_object();
  return out;
}

std::string AdversarialTest::Sh(const std::string& id, std::string_view command) {
  ExecResult r = Exec(id, command);
  EXPECT_EQ(r.response.status, 200) << command << ": " << r.Describe();
  EXPECT_EQ(r.exit_code(), 0) << command << ": " << r.Describe();
  return r.out();
}

Response AdversarialTest::GetFile(const std::string& id, std::string_view path,
                                  milliseconds timeout) {
  return Call("GET", SbPath(id, "/files?path=" + PctEncode(path)), {}, {}, timeout);
}

Response AdversarialTest::PutFile(const std::string& id, std::string_view path,
                                  std::string_view bytes) {
  return Call("PUT", SbPath(id, "/files?path=" + PctEncode(path)), bytes,
              {{"Content-Type", "application/octet-stream"}});
}

Response AdversarialTest::Fs(const std::string& id, std::string_view verb, const json::object& body,
                             milliseconds timeout) {
  return Call("POST", SbPath(id, "/fs/" + std::string(verb)), json::serialize(body),
              {{"Content-Type", "application/json"}}, timeout);
}

KeyValues AdversarialTest::Probe(const std::string& id, const std::string& args) {
  ExecResult r = Exec(id, std::string(kJailProbe) + " " + args);
  EXPECT_EQ(r.response.status, 200) << r.Describe();
  return ParseKeyValues(r.out());
}

KeyValues AdversarialTest::Attack(const std::string& id, const std::string& args) {
  ExecResult r = Exec(id, std::string(kJailAttacker) + " " + args);
  EXPECT_EQ(r.response.status, 200) << r.Describe();
  return ParseKeyValues(r.out());
}

KeyValues AdversarialTest::ProbeOnHost(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kProbeBin};
  argv.insert(argv.end(), args.begin(), args.end());
  return ParseKeyValues(RunOnHost(argv));
}

KeyValues AdversarialTest::AttackOnHost(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kAttackerBin};
  argv.insert(argv.end(), args.begin(), args.end());
  return ParseKeyValues(RunOnHost(argv));
}

void AdversarialTest::ExpectInitAnswers(const std::string& id) {
  Client c(daemon_->endpoint());
  const auto t0 = Clock::now();
  Response r =
      c.PostJson(SbPath(id, "/fs/exists"), json::object{{"path", "/"}}, milliseconds(1000));
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
  EXPECT_EQ(r.status, 200) << "nsbox-init of " << id << " did not answer: " << r.Describe();
  EXPECT_LE(took.count(), 1000) << "nsbox-init of " << id << " answered in " << took.count()
                                << " ms";
  ScanResponse("exists", r);
}

void AdversarialTest::RestartDaemon(bool kill) {
  client_.reset();
  if (kill) {
    daemon_->Kill();
  } else {
    ASSERT_TRUE(daemon_->Stop()) << daemon_->error();
  }
  ASSERT_TRUE(daemon_->Restart()) << daemon_->error();
  baseline_pid_ = daemon_->pid();
  client_ = std::make_unique<Client>(daemon_->endpoint());
  // A restart re-opens what the warm-up opened; the fd baseline is taken again once a sandbox
  // has run (the caller's first exec), in TearDown's tolerance of 5.
  {
    Client c(daemon_->endpoint());
    c.Request("PUT", "/v1/sandboxes/warm-up-2");
    c.PostJson("/v1/sandboxes/warm-up-2/exec", json::object{{"command", "true"}});
    c.Delete("/v1/sandboxes/warm-up-2");
    if (!e2e::WaitPoolFull(c))
      std::fprintf(stderr, "adversarial: the daemon's pool did not fill\n");
  }
  std::this_thread::sleep_for(milliseconds(100));
  baseline_fds_ = daemon_->CountFds();
}

}  // namespace nsbox::adversarial

#include "tests/e2e/daemon_harness.h"
#include "tests/common/cgroups.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
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

bool ParseStat(pid_t pid, pid_t* ppid, unsigned long long* start_time, char* state,
               std::string* comm) {
  std::string stat = ReadHostFile("/proc/" + std::to_string(pid) + "/stat");
  auto open = stat.find('(');
  auto close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return false;
  if (comm != nullptr) *comm = stat.substr(open + 1, close - open - 1);
  std::istringstream rest(stat.substr(close + 1));
  std::vector<std::string> fields;
  std::string f;
  while (rest >> f) fields.push_back(f);
  // After the comm: state is field 3 of proc(5), ppid 4, starttime 22.
  if (fields.size() < 20) return false;
  if (state != nullptr) *state = fields[0][0];
  if (ppid != nullptr) *ppid = static_cast<pid_t>(std::strtol(fields[1].c_str(), nullptr, 10));
  if (start_time != nullptr) *start_time = std::strtoull(fields[19].c_str(), nullptr, 10);
  return true;
}

std::vector<pid_t> AllPids() {
  std::vector<pid_t> pids;
  DIR* d = opendir("/proc");
  if (d == nullptr) return pids;
  while (struct dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0') pids.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  return pids;
}

int RemoveEntry(const char* path, const struct stat*, int type, struct FTW*) {
  if (type == FTW_DP) {
    if (rmdir(path) != 0 && errno != ENOENT) {
      std::fprintf(stderr, "e2e harness: rmdir %s: %s\n", path, strerror(errno));
    }
  } else if (unlink(path) != 0 && errno != ENOENT) {
    std::fprintf(stderr, "e2e harness: unlink %s: %s\n", path, strerror(errno));
  }
  return 0;
}

}  // namespace

std::optional<std::string> E2eUnavailable() {
  if (geteuid() != 0) return "the e2e tier runs the daemon as root; run the tests as root";
  if (access(kNsboxBin, X_OK) != 0) return std::string("no nsbox binary at ") + kNsboxBin;
  if (access(kNsboxInitBin, X_OK) != 0) {
    return std::string("no nsbox-init binary at ") + kNsboxInitBin;
  }
  return std::nullopt;
}

std::string ReadHostFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {
// A "Vm...:" line of /proc/<pid>/status, in KiB; -1 when it is not there.
long StatusKib(pid_t pid, std::string_view key) {
  std::istringstream in(ReadHostFile("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::strtol(line.c_str() + key.size(), nullptr, 10);
  }
  return -1;
}
}  // namespace

long RssKib(pid_t pid) { return StatusKib(pid, "VmRSS:"); }

long PeakRssKib(pid_t pid) { return StatusKib(pid, "VmHWM:"); }

void RemoveTree(const std::string& path) {
  if (path.empty() || path == "/") return;
  nftw(path.c_str(), RemoveEntry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

int RunProgram(const std::vector<std::string>& argv, const std::string& log_path,
               std::string* output) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || null < 0) ::_exit(126);
    ::dup2(null, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  *output = ReadHostFile(log_path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

uint16_t FreeTcpPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  uint16_t port = 0;
  // SAFETY: sockaddr_in is the sockaddr of an AF_INET socket; len is its size.
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

namespace {

// Whether `pid` is in cgroups of a daemon's pool (nsbox-*-pool-N).
bool InPoolCgroup(pid_t pid) {
  std::ifstream cgroup("/proc/" + std::to_string(pid) + "/cgroup");
  std::string line;
  bool pool = false;
  while (std::getline(cgroup, line)) {
    const size_t at = line.find("/nsbox-");
    pool = pool || (at != std::string::npos && line.find("-pool-", at) != std::string::npos);
  }
  return pool;
}

}  // namespace

bool IsJailAdoptedAhead(pid_t pid) {
  if (!InPoolCgroup(pid)) return false;
  std::ifstream hostname("/proc/" + std::to_string(pid) + "/root/etc/hostname");
  std::string name;
  return std::getline(hostname, name) && name == "nsbox-ahead";
}

bool IsPooledJail(pid_t pid) {
  if (!InPoolCgroup(pid)) return false;
  std::string line;
  std::ifstream mounts("/proc/" + std::to_string(pid) + "/mountinfo");
  if (!mounts) return false;
  while (std::getline(mounts, line)) {
    // "ID PARENT MAJ:MIN ROOT MOUNTPOINT ...": the fifth field.
    std::istringstream fields(line);
    std::string field;
    for (int i = 0; i < 5 && (fields >> field); ++i) {
    }
    if (field == "/workspace") return false;
  }
  return true;
}

std::vector<ProcessId> Descendants(pid_t root, bool include_pool) {
  std::multimap<pid_t, ProcessId> children;
  for (pid_t pid : AllPids()) {
    ProcessId p;
    p.pid = pid;
    pid_t ppid = 0;
    char state = 0;
    if (!ParseStat(pid, &ppid, &p.start_time, &state, &p.comm)) continue;
    if (state == 'Z' || state == 'X') continue;
    children.emplace(ppid, p);
  }
  std::vector<ProcessId> out;
  std::vector<pid_t> todo = {root};
  while (!todo.empty()) {
    pid_t parent = todo.back();
    todo.pop_back();
    auto [begin, end] = children.equal_range(parent);
    for (auto it = begin; it != end; ++it) {
      // Not only nsbox-init: a jail being made for the pool is the daemon's clone until it
      // executes nsbox-init, and already in its pool cgroup (CLONE_INTO_CGROUP).
      if (!include_pool && (IsPooledJail(it->second.pid) || IsJailAdoptedAhead(it->second.pid))) {
        continue;
      }
      out.push_back(it->second);
      todo.push_back(it->second.pid);
    }
  }
  return out;
}

bool StillAlive(const ProcessId& p) {
  unsigned long long start = 0;
  char state = 0;
  if (!ParseStat(p.pid, nullptr, &start, &state, nullptr)) return false;
  return start == p.start_time && state != 'Z' && state != 'X';
}

std::set<std::string> FindNsboxCgroups() { return testutil::FindCgroupsNamed("nsbox"); }

namespace {

// The "nsbox-<8 hex>-pool-<n>" component of a path (empty when there is none).
std::string PoolComponent(const std::string& path) {
  const size_t at = path.find("-pool-");
  if (at == std::string::npos) return "";
  const size_t begin = path.rfind('/', at) + 1;
  const size_t end = std::min(path.find('/', at), path.size());
  return path.substr(begin, end - begin);
}

// Its "nsbox-<8 hex>-" (which daemon) and its n.
std::pair<std::string, long> PoolNumber(const std::string& component) {
  const size_t at = component.rfind("pool-");
  return {component.substr(0, at), std::strtol(component.c_str() + at + 5, nullptr, 10)};
}

}  // namespace

std::vector<std::string> NewNsboxCgroups(const std::set<std::string>& before) {
  const std::set<std::string> all = FindNsboxCgroups();
  // The jails of a daemon's pool (docs/daemon.md "The pool"): a pool's cgroups whose processes
  // include a pooled jail (IsPooledJail), in any hierarchy; and the newest pool's of each daemon
  // while they hold no process at all (its jail is being made: the directories come first).
  std::map<std::string, bool> pooled;     // pool component -> holds a pooled jail
  std::map<std::string, bool> populated;  // pool component -> holds any process
  std::map<std::string, long> newest;     // "nsbox-<8 hex>-" -> highest n
  for (const std::string& path : all) {
    const std::string pool = PoolComponent(path);
    if (pool.empty()) continue;
    const auto [daemon, n] = PoolNumber(pool);
    newest[daemon] = std::max(newest[daemon], n);
    for (const char* procs : {"/cgroup.procs", "/init/cgroup.procs"}) {  // v2: init's leaf
      std::ifstream f(path + procs);
      pid_t pid;
      while (f >> pid) {
        populated[pool] = true;
        if (IsPooledJail(pid) || IsJailAdoptedAhead(pid)) pooled[pool] = true;
      }
    }
  }
  std::vector<std::string> out;
  for (const std::string& path : all) {
    if (before.count(path) != 0) continue;
    const std::string leaf = path.substr(path.rfind('/') + 1);
    // Someone else's `nsbox run` (the integration tier may run at the same time).
    if (leaf.starts_with("nsbox-run-")) {
      std::string pid = leaf.substr(10);
      if (access(("/proc/" + pid).c_str(), F_OK) == 0) continue;
    }
    if (const std::string pool = PoolComponent(path); !pool.empty()) {
      if (pooled[pool]) continue;
      const auto [daemon, n] = PoolNumber(pool);
      if (!populated[pool] && n == newest[daemon]) continue;
    }
    // A nested cgroup of one already reported is not a second finding.
    bool nested = false;
    for (const auto& o : out) nested = nested || path.starts_with(o + "/");
    if (!nested) out.push_back(path);
  }
  return out;
}

// ---- Daemon ----

Daemon::Daemon() {
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
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    if (!Reap(milliseconds(10000))) Kill();
  }
  if (getenv("NSBOX_E2E_KEEP") != nullptr) {
    std::fprintf(stderr, "e2e harness: NSBOX_E2E_KEEP: kept %s\n", dir_.c_str());
    return;
  }
  RemoveTree(dir_);
}

bool Daemon::Spawn(const std::vector<std::string>& extra_args) {
  error_.clear();
  std::vector<std::string> argv = {kNsboxBin,     "serve", "--socket",    socket_,
                                   "--state-dir", state_,  "--log-level", "debug"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
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
  int log = open(log_path().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    error_ = std::string("open the log: ") + strerror(errno);
    return false;
  }
  {
    std::string line = "\n=== e2e: starting";
    for (const auto& a : argv) line += " " + a;
    line += "\n";
    (void)!write(log, line.data(), line.size());
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    error_ = std::string("fork: ") + strerror(errno);
    close(log);
    return false;
  }
  if (pid == 0) {
    // The daemon dies with the test process, so a crashed test leaves no daemon behind.
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
    // SAFETY: execve's argv and envp are arrays of NUL-terminated strings ending in nullptr.
    execve(kNsboxBin, cargv.data(), cenv.data());
    _exit(127);
  }
  close(log);
  pid_ = pid;
  exit_status_ = -1;
  return true;
}

bool Daemon::Start(const std::vector<std::string>& extra_args) {
  if (dir_.empty()) return false;
  args_ = extra_args;
  if (!Spawn(extra_args)) return false;
  Client client(endpoint());
  const auto deadline = Clock::now() + milliseconds(10000);
  while (Clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      exit_status_ = status;
      error_ = "nsbox serve exited before it answered (status " + std::to_string(status) + "):\n" +
               Log();
      return false;
    }
    if (access(socket_.c_str(), F_OK) == 0) {
      Response r = client.Get("/v1/health", milliseconds(2000));
      if (r.status == 200) return true;
      client.Disconnect();
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  error_ = "nsbox serve did not answer GET /v1/health within 10 s:\n" + Log();
  Kill();
  return false;
}

int Daemon::RunToExit(const std::vector<std::string>& extra_args, milliseconds timeout) {
  if (!Spawn(extra_args)) return -1;
  if (!Reap(timeout)) {
    Kill();
    return -1;
  }
  if (WIFEXITED(exit_status_)) return WEXITSTATUS(exit_status_);
  return 128 + WTERMSIG(exit_status_);
}

bool Daemon::Reap(milliseconds timeout) {
  if (pid_ <= 0) return true;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      exit_status_ = status;
      pid_ = -1;
      return true;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
}

bool Daemon::Stop(milliseconds timeout) {
  if (pid_ <= 0) {
    error_ = "the daemon was not running";
    return false;
  }
  kill(pid_, SIGTERM);
  if (!Reap(timeout)) {
    error_ = "the daemon did not exit within " + std::to_string(timeout.count()) +
             " ms of SIGTERM; SIGKILLed";
    Kill();
    return false;
  }
  if (WIFEXITED(exit_status_) && WEXITSTATUS(exit_status_) == 0) return true;
  error_ = WIFEXITED(exit_status_)
               ? "the daemon exited with " + std::to_string(WEXITSTATUS(exit_status_))
               : "the daemon was killed by signal " + std::to_string(WTERMSIG(exit_status_));
  error_ += " on SIGTERM";
  return false;
}

void Daemon::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  Reap(milliseconds(60000));
}

bool Daemon::Restart() {
  if (pid_ > 0) return false;
  return Start(args_);
}

bool Daemon::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    exit_status_ = status;
    pid_ = -1;
    error_ = "the daemon ended (waitpid status " + std::to_string(status) + ")";
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

// ---- ExecResult ----

std::string Str(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string(v->as_string()) : "<missing>";
}

json::object Obj(const Response& r) {
  json::value v = r.Json();
  return v.is_object() ? v.as_object() : json::object{};
}

json::array Arr(const Response& r, std::string_view key) {
  json::object o = Obj(r);
  const json::value* v = o.if_contains(key);
  return v != nullptr && v->is_array() ? v->as_array() : json::array{};
}

json::value Field(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v != nullptr ? *v : json::value("<missing>");
}

std::string ExecResult::out() const { return Str(answer, "stdout"); }
std::string ExecResult::err() const { return Str(answer, "stderr"); }
std::string ExecResult::reason() const { return Str(answer, "reason"); }
int64_t ExecResult::exit_code() const {
  const json::value* v = answer.if_contains("exitCode");
  return v != nullptr && v->is_int64() ? v->as_int64() : -1000;
}

// ---- E2eTest ----

std::unique_ptr<Daemon> E2eTest::daemon_;

void E2eTest::SetUpTestSuite() {}

void E2eTest::TearDownTestSuite() {}

void E2eTest::SetUp() {
  if (auto reason = E2eUnavailable()) {
    std::fprintf(stderr, "\n*** SKIPPED (NOT RUN): %s ***\n\n", reason->c_str());
    GTEST_SKIP() << "NOT RUN: " << *reason;
  }
  // A daemon of its own for every test: ctest runs each test in a process of its own anyway,
  // and a test then never sees another's sandboxes.
  daemon_ = std::make_unique<Daemon>();
  ASSERT_TRUE(daemon_->Start(DaemonArgs())) << daemon_->error();
  log_offset_ = 0;
  client_ = std::make_unique<Client>(daemon_->endpoint());
}

void E2eTest::TearDown() {
  if (!daemon_ || IsSkipped()) return;
  client_.reset();
  if (!daemon_->running()) {
    ADD_FAILURE() << "the daemon is not running at the end of the test: " << daemon_->error();
  } else {
    // SIGTERM: it must end every sandbox's processes and exit 0, promptly.
    EXPECT_TRUE(daemon_->Stop()) << daemon_->error();
  }
  if (HasFailure()) {
    std::fprintf(stderr, "---- daemon log during this test (%s) ----\n%s\n---- end of log ----\n",
                 daemon_->log_path().c_str(), daemon_->Log(log_offset_, 32 * 1024).c_str());
  }
  daemon_.reset();
}

std::string E2eTest::SbPath(std::string_view id, std::string_view suffix) {
  // Dots too: a client's URL parser would fold a segment "." or ".." (WHATWG URL).
  std::string encoded;
  for (char c : PctEncode(id)) encoded += c == '.' ? std::string("%2E") : std::string(1, c);
  return "/v1/sandboxes/" + encoded + std::string(suffix);
}

std::string E2eTest::NewId(std::string_view hint) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->name()) + "-" + std::string(hint) + "-" + std::to_string(++id_counter_);
}

namespace {
// A request of the short-hands that got no answer in time: the daemon is stuck, and every later
// call would wait as long; the test is ended at once (gtest reports the exception as a failure
// of the test, and TearDown still runs).
Response Answered(Response r) {
  if (r.status == 0 && r.transport_error.find("timed out") != std::string::npos) {
    throw std::runtime_error("the daemon did not answer in time, test aborted: " +
                             r.transport_error);
  }
  return r;
}
}  // namespace

Response E2eTest::Create(std::string_view id, std::string_view body) {
  Response r = body.empty() ? client().Request("PUT", SbPath(id))
                            : client().Request("PUT", SbPath(id), body,
                                               {{"Content-Type", "application/json"}});
  Answered(r);
  EXPECT_TRUE(r.status == 200 || r.status == 201) << "PUT " << SbPath(id) << ": " << r.Describe();
  return r;
}

ExecResult E2eTest::Exec(std::string_view id, const json::object& request, milliseconds timeout) {
  ExecResult out;
  out.response = Answered(client().PostJson(SbPath(id, "/exec"), request, timeout));
  json::value v = out.response.Json();
  if (out.response.status == 200 && v.is_object()) out.answer = v.as_object();
  return out;
}

std::string E2eTest::Sh(std::string_view id, std::string_view command) {
  ExecResult r = Exec(id, command);
  EXPECT_EQ(r.response.status, 200) << command << ": " << r.Describe();
  EXPECT_EQ(r.exit_code(), 0) << command << ": " << r.Describe();
  return r.out();
}

Response E2eTest::PutFile(std::string_view id, std::string_view path, std::string_view bytes) {
  return Answered(client().Request("PUT", SbPath(id, "/files?path=" + PctEncode(path)), bytes,
                                   {{"Content-Type", "application/octet-stream"}}));
}

Response E2eTest::GetFile(std::string_view id, std::string_view path) {
  return Answered(client().Get(SbPath(id, "/files?path=" + PctEncode(path))));
}

Response E2eTest::Fs(std::string_view id, std::string_view verb, const json::object& body) {
  return Answered(client().PostJson(SbPath(id, "/fs/" + std::string(verb)), body));
}

void E2eTest::ExpectDaemonHealthy() {
  EXPECT_TRUE(daemon_->running()) << daemon_->error();
  Client c(daemon_->endpoint());
  Response r = c.Get("/v1/health", milliseconds(5000));
  EXPECT_EQ(r.status, 200) << r.Describe();
}

}  // namespace nsbox::e2e

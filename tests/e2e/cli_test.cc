// e2e: the `nsbox` client commands (create, ls, exec, cp, stop, rm) against a real
// `nsbox serve`, run as a user would: a subprocess whose stdout, stderr and exit code are
// checked exactly.
//
// The fixture starts its own daemon per suite (NSBOX_BIN serve --socket <tmp>/s.sock --state-dir
// <tmp>/state). With NSBOX_CLI_TEST_SOCKET set it uses the daemon already listening there
// instead (for running these tests against a daemon under a debugger).

#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;

namespace {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr const char* kNsbox = NSBOX_BIN;

// ---- host helpers ----

void WriteHostFile(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

std::string ReadHostFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string RandomBytes(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(gen() & 0xff);
  // Every byte value at least once, NUL and 0xFF included.
  for (size_t i = 0; i < 256 && i < n; ++i) s[i] = static_cast<char>(i);
  return s;
}

int RemoveEntry(const char* path, const struct stat*, int type, struct FTW*) {
  return type == FTW_DP ? ::rmdir(path) : ::unlink(path);
}

// Removes a tree without following symlinks or crossing into other mounts.
void RemoveTree(const std::string& path) {
  ::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) out.push_back(line);
  return out;
}

bool CanConnect(const std::string& socket_path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path.c_str());
  // SAFETY: sockaddr_un is a sockaddr for connect(2); the size passed is its own.
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

bool CanConnectTcp(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  // SAFETY: sockaddr_in is a sockaddr for connect(2); the size passed is its own.
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// ---- running the CLI ----

// Whether uid and gid 65534 with no groups may execute `path`: every directory above it
// searchable by others, the file executable by others. A clone under a 0700 directory (what
// `mktemp -d` makes) fails the first.
bool NobodyCanExecute(const std::string& path, std::string* why) {
  std::filesystem::path p(path);
  for (std::filesystem::path dir = p.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || (st.st_mode & S_IXOTH) == 0) {
      *why = dir.string() + " is not searchable by others";
      return false;
    }
    if (dir == dir.root_path()) break;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & S_IXOTH) == 0) {
    *why = path + " is not executable by others";
    return false;
  }
  return true;
}

// The nsbox that a test runs as nobody: the built one when nobody may execute it where it is,
// else a copy of it in a directory of its own under /var/tmp (0755, removed when the test
// process exits). Empty, with the reason in *why, when neither is possible.
std::string NsboxForNobody(std::string* why) {
  struct Copy {
    std::string dir;
    std::string binary;
    std::string error;
    ~Copy() {
      if (!dir.empty()) RemoveTree(dir);
    }
  };
  static Copy copy = [] {
    Copy c;
    std::string unreachable;
    if (NobodyCanExecute(kNsbox, &unreachable)) {
      c.binary = kNsbox;
      return c;
    }
    char tmpl[] = "/var/tmp/nsbox-cli-nobody-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      c.error = unreachable + ", and mkdtemp /var/tmp failed: " + strerror(errno);
      return c;
    }
    c.dir = tmpl;
    const std::string target = c.dir + "/nsbox";
    std::error_code ec;
    std::filesystem::copy_file(kNsbox, target, ec);
    if (ec || ::chmod(c.dir.c_str(), 0755) != 0 || ::chmod(target.c_str(), 0755) != 0) {
      c.error = unreachable + ", and a copy to " + target + " failed: " + ec.message();
      return c;
    }
    std::string still;
    if (!NobodyCanExecute(target, &still)) {
      c.error = unreachable + ", and so is the copy: " + still;
      return c;
    }
    std::fprintf(stderr, "note: %s; running a copy at %s as nobody\n", unreachable.c_str(),
                 target.c_str());
    c.binary = target;
    return c;
  }();
  *why = copy.error;
  return copy.binary;
}

struct CliResult {
  int code = -1;  // the exit code, or 128 + the signal that killed it
  std::string out;
  std::string err;
  std::string Describe() const {
    return "exit " + std::to_string(code) + "\n--- stdout:\n" + out.substr(0, 4000) +
           "\n--- stderr:\n" + err.substr(0, 4000);
  }
};

// Where a CliProcess's stderr (and stdout) go: pipes, or a pseudo-terminal that the test reads as
// the process's stderr (what a person at a terminal sees).
enum class Terminal { kNone, kStderr, kStdoutAndStderr };

// A running `nsbox` process with its stdin, stdout and stderr on pipes (or a terminal).
class CliProcess {
 public:
  // `as_nobody`: the process runs as uid and gid 65534, with no supplementary groups.
  // `run_dir`: a directory mounted on /run in a mount namespace of the process's own, for the
  // system daemon's socket /run/nsbox/nsboxd.sock (the host's own /run untouched).
  CliProcess(const std::vector<std::string>& args, const std::vector<std::string>& env,
             Terminal terminal = Terminal::kNone, bool as_nobody = false,
             const std::string& run_dir = "") {
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 ||
        ::pipe2(err, O_CLOEXEC) != 0) {
      std::abort();
    }
    if (terminal != Terminal::kNone) {
      // err[0] reads what the process writes to the terminal err[1].
      ::close(err[0]);
      ::close(err[1]);
      if (::openpty(&err[0], &err[1], nullptr, nullptr, nullptr) != 0) std::abort();
      ::fcntl(err[0], F_SETFD, FD_CLOEXEC);
      ::fcntl(err[1], F_SETFD, FD_CLOEXEC);
      if (terminal == Terminal::kStdoutAndStderr) {
        ::close(out[1]);
        out[1] = ::fcntl(err[1], F_DUPFD_CLOEXEC, 0);
      }
    }
    // nobody runs the binary from where it may (NsboxForNobody); a test that cannot place it
    // there fails saying why, not with an exit code 127.
    std::string binary = kNsbox;
    if (as_nobody) {
      std::string why;
      binary = NsboxForNobody(&why);
      if (binary.empty()) {
        ADD_FAILURE() << "cannot run nsbox as nobody: " << why;
        binary = kNsbox;
      }
    }
    std::vector<std::string> argv_s = {binary};
    const std::string exec_failed =
        "test harness: execve " + binary + (as_nobody ? " as uid 65534" : "") + ": ";
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string_view kv = *e;
      if (kv.starts_with("NSBOX_")) continue;  // nothing of the caller's set-up leaks in
      env_s.emplace_back(kv);
    }
    env_s.insert(env_s.end(), env.begin(), env.end());
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      if (!run_dir.empty() && (::unshare(CLONE_NEWNS) != 0 ||
                               ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
                               ::mount(run_dir.c_str(), "/run", nullptr, MS_BIND, nullptr) != 0)) {
        ::_exit(126);
      }
      if (as_nobody &&
          (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0)) {
        ::_exit(126);
      }
      ::execve(argv[0], argv.data(), envp.data());
      // Said on stderr, with nothing allocated after the fork.
      const char* name = strerrorname_np(errno);
      (void)!::write(2, exec_failed.data(), exec_failed.size());
      (void)!::write(2, name != nullptr ? name : "?", name != nullptr ? strlen(name) : 1);
      (void)!::write(2, "\n", 1);
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    in_ = in[1];
    out_ = out[0];
    err_ = err[0];
  }
  ~CliProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : {in_, out_, err_}) {
      if (fd >= 0) ::close(fd);
    }
  }

  pid_t pid() const { return pid_; }
  const std::string& out() const { return result_.out; }
  const std::string& err() const { return result_.err; }

  // Pumps the pipes until `done()` is true or `timeout` passes; false on timeout.
  bool PumpUntil(const std::function<bool()>& done, milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (!done()) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      if (!PumpOnce(static_cast<int>(std::min<int64_t>(left.count(), 100)))) {
        if (out_ < 0 && err_ < 0) return done();
      }
    }
    return true;
  }

  // Feeds `input` to stdin (then EOF), reads everything, and waits for the exit.
  CliResult Finish(std::string_view input = "", milliseconds timeout = milliseconds(120000)) {
    stdin_data_ = std::string(input);
    if (stdin_data_.empty()) CloseStdin();
    auto deadline = Clock::now() + timeout;
    while (out_ >= 0 || err_ >= 0) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        ADD_FAILURE() << "nsbox did not finish within " << timeout.count() << " ms; killed";
        ::kill(pid_, SIGKILL);
        break;
      }
      PumpOnce(static_cast<int>(std::min<int64_t>(left.count(), 100)));
    }
    Wait(deadline);
    return result_;
  }

  // Waits for the exit only (the pipes are drained as it goes).
  int WaitExit(milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        result_.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return result_.code;
      }
      PumpOnce(20);
    }
    return -1;
  }

  bool Running() {
    if (pid_ <= 0) return false;
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == 0) return true;
    pid_ = -1;
    result_.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }

 private:
  void CloseStdin() {
    if (in_ >= 0) ::close(in_);
    in_ = -1;
  }

  // One poll round; false when nothing happened.
  bool PumpOnce(int timeout_ms) {
    std::vector<pollfd> fds;
    if (out_ >= 0) fds.push_back({out_, POLLIN, 0});
    if (err_ >= 0) fds.push_back({err_, POLLIN, 0});
    if (in_ >= 0 && !stdin_data_.empty()) fds.push_back({in_, POLLOUT, 0});
    if (fds.empty()) {
      std::this_thread::sleep_for(milliseconds(timeout_ms));
      return false;
    }
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n <= 0) return false;
    for (const pollfd& p : fds) {
      if (p.revents == 0) continue;
      if (p.fd == in_) {
        ssize_t w = ::write(in_, stdin_data_.data(), std::min<size_t>(stdin_data_.size(), 65536));
        if (w > 0) stdin_data_.erase(0, static_cast<size_t>(w));
        if (w < 0 || stdin_data_.empty()) CloseStdin();
        continue;
      }
      char buf[65536];
      ssize_t r = ::read(p.fd, buf, sizeof buf);
      std::string& sink = p.fd == out_ ? result_.out : result_.err;
      if (r > 0) {
        sink.append(buf, static_cast<size_t>(r));
      } else {
        ::close(p.fd);
        (p.fd == out_ ? out_ : err_) = -1;
      }
    }
    return true;
  }

  void Wait(Clock::time_point deadline) {
    while (pid_ > 0) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        result_.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return;
      }
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        deadline = Clock::now() + milliseconds(5000);
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
  }

  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  int err_ = -1;
  std::string stdin_data_;
  CliResult result_;
};

// ---- the fixture ----

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (::geteuid() != 0) return;
    char tmpl[] = "/tmp/nsbox-cli-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    if (const char* existing = std::getenv("NSBOX_CLI_TEST_SOCKET")) {
      socket_ = existing;
      return;
    }
    socket_ = dir_ + "/s.sock";
    daemon_ = StartDaemon(
        {"--socket", socket_, "--state-dir", dir_ + "/state", "--network-range", "10.217.0.0/24"},
        dir_ + "/daemon.log");
    auto deadline = Clock::now() + milliseconds(15000);
    while (!CanConnect(socket_)) {
      int status = 0;
      if (::waitpid(daemon_, &status, WNOHANG) == daemon_) {
        daemon_ = -1;
        FAIL() << "nsbox serve exited early:\n" << ReadHostFile(dir_ + "/daemon.log");
      }
      ASSERT_LT(Clock::now(), deadline) << "nsbox serve does not accept on " << socket_ << "\n"
                                        << ReadHostFile(dir_ + "/daemon.log");
      std::this_thread::sleep_for(milliseconds(20));
    }
  }

  static void TearDownTestSuite() {
    StopDaemon(daemon_);
    daemon_ = -1;
    if (!dir_.empty()) RemoveTree(dir_);
    dir_.clear();
  }

  static pid_t StartDaemon(const std::vector<std::string>& args, const std::string& log) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<std::string> argv_s = {kNsbox, "serve"};
      argv_s.insert(argv_s.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(kNsbox, argv.data());
      ::_exit(127);
    }
    return pid;
  }

  // SIGTERM, then SIGKILL if it is still there after 10 s.
  static void StopDaemon(pid_t pid) {
    if (pid <= 0) return;
    ::kill(pid, SIGTERM);
    auto deadline = Clock::now() + milliseconds(10000);
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ADD_FAILURE() << "nsbox serve did not exit within 10 s of SIGTERM";
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        return;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
  }

  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "the e2e tier runs as root (nsbox serve needs it)";
    ASSERT_FALSE(socket_.empty()) << "no daemon (see the suite's set-up failure)";
    ASSERT_TRUE(CanConnect(socket_)) << "the daemon is gone:\n"
                                     << ReadHostFile(dir_ + "/daemon.log");
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    prefix_ = std::string(info->name()) + "-";
  }

  void TearDown() override {
    for (const std::string& id : created_) Nsbox({"rm", id});
    if (HasFailure() && daemon_ > 0) {
      std::string log = ReadHostFile(dir_ + "/daemon.log");
      std::printf("--- daemon log (tail):\n%s\n",
                  log.substr(log.size() > 8000 ? log.size() - 8000 : 0).c_str());
    }
  }

  // A sandbox id for this test, removed at the end of it.
  std::string Id(std::string_view hint = "box") {
    std::string id = prefix_ + std::string(hint);
    created_.push_back(id);
    return id;
  }

  // A sandbox made with `nsbox create`.
  std::string NewBox(std::string_view hint = "box") {
    std::string id = Id(hint);
    CliResult r = Nsbox({"create", id});
    EXPECT_EQ(r.code, 0) << r.Describe();
    EXPECT_EQ(r.out, id + " created\n") << r.Describe();
    return id;
  }

  // Runs `nsbox ARGS...` with NSBOX_SOCKET pointing at the daemon.
  CliResult Nsbox(const std::vector<std::string>& args, std::string_view input = "",
                  std::vector<std::string> env = {}) {
    env.push_back("NSBOX_SOCKET=" + socket_);
    CliProcess p(args, env);
    return p.Finish(input);
  }
  // The same with stderr (and with kStdoutAndStderr stdout) on a terminal: `err` is what the
  // terminal showed, its newlines as "\r\n".
  CliResult NsboxOnTerminal(const std::vector<std::string>& args, Terminal terminal) {
    CliProcess p(args, {"NSBOX_SOCKET=" + socket_}, terminal);
    return p.Finish();
  }
  std::unique_ptr<CliProcess> Start(const std::vector<std::string>& args) {
    return std::make_unique<CliProcess>(args, std::vector<std::string>{"NSBOX_SOCKET=" + socket_});
  }

  // `nsbox exec ID -- COMMAND` that must succeed; its stdout.
  std::string Sh(const std::string& id, const std::string& command) {
    CliResult r = Nsbox({"exec", id, "--", command});
    EXPECT_EQ(r.code, 0) << command << "\n" << r.Describe();
    return r.out;
  }

  json::object SandboxJson(const std::string& id) {
    CliResult r = Nsbox({"ls", "--json"});
    EXPECT_EQ(r.code, 0) << r.Describe();
    json::value v = json::parse(r.out);
    for (const json::value& s : v.at("sandboxes").as_array()) {
      if (s.at("id").as_string() == id) return s.as_object();
    }
    return {};
  }

  static std::string dir_;
  static std::string socket_;
  static pid_t daemon_;
  std::string prefix_;
  std::vector<std::string> created_;
};

std::string CliTest::dir_;
std::string CliTest::socket_;
pid_t CliTest::daemon_ = -1;

// ---- create ----

TEST_F(CliTest, CreateSaysCreatedThenExisted) {
  std::string id = Id();
  CliResult r = Nsbox({"create", id});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, id + " created\n");
  EXPECT_EQ(r.err, "");

  r = Nsbox({"create", id});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, id + " existed\n");
  EXPECT_EQ(r.err, "");

  // Options on an existing sandbox are ignored by the API: the CLI says so.
  r = Nsbox({"create", id, "--memory", "256M"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, id + " existed\n");
  EXPECT_EQ(r.err, "nsbox: create " + id +
                       ": the sandbox existed; options apply at creation only, its "
                       "configuration is unchanged\n");

  r = Nsbox({"create", "--json", id});
  EXPECT_EQ(r.code, 0) << r.Describe();
  json::value v = json::parse(r.out);
  EXPECT_EQ(v.at("id").as_string(), id);
  EXPECT_EQ(v.at("image").as_string(), "host");
}

TEST_F(CliTest, CreateSendsLimitsEnvAndImage) {
  std::string id = Id();
  CliResult r = Nsbox({"create", id, "--image", "host", "--memory", "512M", "--pids", "64",
                       "--cpus", "1.5", "--env", "GREETING=hello world", "-e", "N=1", "--json"});
  ASSERT_EQ(r.code, 0) << r.Describe();
  json::object s = json::parse(r.out).as_object();
  EXPECT_EQ(s.at("id").as_string(), id);
  EXPECT_EQ(s.at("image").as_string(), "host");
  const json::object& limits = s.at("limits").as_object();
  EXPECT_EQ(limits.at("memoryBytes").to_number<int64_t>(), 512 << 20);
  EXPECT_EQ(limits.at("pids").to_number<int64_t>(), 64);
  EXPECT_DOUBLE_EQ(limits.at("cpus").to_number<double>(), 1.5);
  EXPECT_EQ(Sh(id, "echo \"$GREETING/$N\""), "hello world/1\n");

  // A fraction of a unit, as docker takes it, rounded down to a whole byte.
  for (auto [memory, bytes] :
       {std::pair{"1.5G", int64_t{1610612736}}, std::pair{"16.5m", int64_t{17301504}},
        std::pair{"0.1GiB", int64_t{107374182}}}) {
    r = Nsbox({"create", Id(std::string("mem") + memory), "--memory", memory, "--json"});
    ASSERT_EQ(r.code, 0) << memory << "\n" << r.Describe();
    EXPECT_EQ(json::parse(r.out).at("limits").at("memoryBytes").to_number<int64_t>(), bytes)
        << memory;
  }
}

TEST_F(CliTest, CreateRejectsBadOptions) {
  CliResult r = Nsbox({"create", Id(), "--memory", "lots"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "nsbox: create: --memory 'lots': not a byte count (examples: 536870912, 512M, 1.5G)\n");

  r = Nsbox({"create", Id(), "--env", "NOEQUALS"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: create: --env 'NOEQUALS': expected NAME=VALUE\n");

  // Below the daemon's least (16M): said by the CLI, as `nsbox run` says its own (4M).
  for (const char* memory : {"1M", "0", "512k", "100", "15.9M"}) {
    r = Nsbox({"create", Id(), "--memory", memory});
    EXPECT_EQ(r.code, 125) << memory << "\n" << r.Describe();
    EXPECT_EQ(r.err, std::string("nsbox: create: --memory '") + memory +
                         "': at least 16M is needed to start\n");
  }
  r = Nsbox({"create", Id(), "--memory", "1.5X"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: create: --memory '1.5X': unknown unit (use K, M, G or T)\n");
  r = Nsbox({"create", Id(), "--memory", "1.G"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err,
            "nsbox: create: --memory '1.G': not a byte count (examples: 536870912, 512M, 1.5G)\n");

  for (const char* disk : {"1M", "15M", "9T"}) {
    r = Nsbox({"create", Id(), "--disk", disk});
    EXPECT_EQ(r.code, 125) << disk << "\n" << r.Describe();
    EXPECT_EQ(r.err, std::string("nsbox: create: --disk '") + disk + "': expected 16M to 8T\n");
  }

  r = Nsbox({"create"});  // no id
  EXPECT_EQ(r.code, 125) << r.Describe();
}

// --disk: the sandbox's own disk, of that size (in whole 4 KiB blocks), seen inside by df.
TEST_F(CliTest, CreateWithADiskOfItsOwn) {
  const std::string id = Id();
  CliResult r = Nsbox({"create", id, "--disk", "32.1M", "--json"});
  ASSERT_EQ(r.code, 0) << r.Describe();
  // 32.1 MiB is 33659289.6 bytes: 33659289, rounded up to 8218 blocks of 4 KiB.
  EXPECT_EQ(json::parse(r.out).at("limits").at("diskBytes").to_number<int64_t>(), 8218 * 4096);
  const int64_t size = std::stoll(Sh(id, "df -B1 --output=size /workspace | tail -1"));
  EXPECT_LE(size, 8218 * 4096);
  EXPECT_GT(size, 8218 * 4096 / 2);  // less ext4's journal and tables, not the host's disk
}

TEST_F(CliTest, CreateWithAnIdleStop) {
  const std::string id = Id();
  CliResult r = Nsbox({"create", id, "--idle-stop", "15m", "--json"});
  ASSERT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(json::parse(r.out).at("idleStopMs").to_number<int64_t>(), 15 * 60 * 1000);
  for (const char* never : {"never", "0"}) {
    r = Nsbox({"create", Id(std::string("never-") + never), "--idle-stop", never, "--json"});
    ASSERT_EQ(r.code, 0) << r.Describe();
    EXPECT_TRUE(json::parse(r.out).at("idleStopMs").is_null()) << r.out;
  }
  for (const char* bad : {"500ms", "31d", "1.5h", "soon"}) {
    r = Nsbox({"create", Id("bad"), "--idle-stop", bad});
    EXPECT_EQ(r.code, 125) << bad << "\n" << r.Describe();
    EXPECT_NE(r.err.find(std::string("--idle-stop '") + bad + "'"), std::string::npos)
        << r.Describe();
  }
}

// ---- network ----

TEST_F(CliTest, CreateWithAnAllowlistAndReplaceIt) {
  std::string id = Id("net");
  CliResult r =
      Nsbox({"create", id, "--allow", "Pkg.Example", "--allow", "10.20.0.0/16:5432", "--json"});
  ASSERT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(json::serialize(json::parse(r.out).at("network")),
            R"({"allow":["pkg.example","10.20.0.0/16:5432"]})");

  r = Nsbox({"network", id});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out,
            "network: allow: pkg.example 10.20.0.0/16:5432\naddress: none (stopped, or no "
            "network)\n");
  // Running, it has an address of the daemon's range on eth0.
  EXPECT_EQ(Sh(id, "ip -o -4 addr show dev eth0 | grep -c ' 10\\.217\\.0\\.'"), "1\n");
  r = Nsbox({"network", id});
  EXPECT_NE(r.out.find("address: 10.217.0."), std::string::npos) << r.Describe();

  r = Nsbox({"network", id, "open", "--allow", "169.254.169.254"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), "network: open, and allow: 169.254.169.254");
  r = Nsbox({"network", id, "none"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "network: none\naddress: none (stopped, or no network)\n");
  EXPECT_EQ(Sh(id, "ip -o link show | cut -d: -f2"), " lo\n");
}

TEST_F(CliTest, NetworkRejectsBadPolicies) {
  std::string id = NewBox("badnet");
  CliResult r = Nsbox({"network", id, "none", "--allow", "a.example"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: network " + id + ": --allow contradicts a network of none\n");
  r = Nsbox({"network", id, "--allow", "foo..com"});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_NE(r.err.find("allow entry 'foo..com'"), std::string::npos) << r.Describe();
  r = Nsbox({"create", Id("badnet2"), "--network", "closed"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: create: network 'closed' is not one of none, open or allow\n");
  r = Nsbox({"network", Id("missing")});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_NE(r.err.find("no sandbox"), std::string::npos) << r.Describe();
}

// Mode allow with nothing to allow would start a network that reaches nothing: refused, naming
// the allow list and the mode none; nothing is created or changed. Control: one entry is taken.
TEST_F(CliTest, AllowWithoutEntriesIsRefused) {
  const std::string fresh = Id("allow-nothing");
  CliResult r = Nsbox({"create", fresh, "--network", "allow"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err,
            "nsbox: create: --network allow needs an allow list: at least one --allow ENTRY (a "
            "name, *.wildcard, IPv4 address or CIDR, with an optional :PORT); for no network at "
            "all, --network none\n");
  EXPECT_EQ(Nsbox({"network", fresh}).code, 1) << "created anyway";

  const std::string id = NewBox("allow-nothing-2");
  r = Nsbox({"network", id, "allow"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: network " + id +
                       ": network mode allow needs an allow list: at least one --allow ENTRY (a "
                       "name, *.wildcard, IPv4 address or CIDR, with an optional :PORT); for no "
                       "network at all, 'nsbox network " +
                       id + " none'\n");
  r = Nsbox({"network", id});
  EXPECT_EQ(r.out, "network: none\naddress: none (stopped, or no network)\n") << r.Describe();

  r = Nsbox({"network", id, "allow", "--allow", "10.20.0.1"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), "network: allow: 10.20.0.1");
  r = Nsbox({"create", fresh, "--network", "allow", "--allow", "pkg.example", "--json"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(json::serialize(json::parse(r.out).at("network")), R"({"allow":["pkg.example"]})");
}

// ---- ls ----

TEST_F(CliTest, LsTableAndJson) {
  std::string a = NewBox("a");
  std::string b = Id("conv/42 ü");  // an id with a slash, a space and non-ASCII
  ASSERT_EQ(Nsbox({"create", b}).code, 0);
  // A sandbox may still be starting when `create` answers; a command in each makes both
  // running, so that the two listings below see the same states.
  for (const std::string& id : {a, b}) ASSERT_EQ(Nsbox({"exec", id, "--", "true"}).code, 0);

  CliResult r = Nsbox({"ls", "--json"});
  ASSERT_EQ(r.code, 0) << r.Describe();
  json::value v = json::parse(r.out);
  std::map<std::string, json::object> by_id;
  for (const json::value& s : v.at("sandboxes").as_array()) {
    by_id[std::string(s.at("id").as_string())] = s.as_object();
  }
  ASSERT_TRUE(by_id.count(a)) << r.out;
  ASSERT_TRUE(by_id.count(b)) << r.out;

  r = Nsbox({"ls"});
  ASSERT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.err, "");
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_GE(lines.size(), 3u) << r.out;
  EXPECT_TRUE(std::regex_match(lines[0], std::regex("ID +STATE +IMAGE +CREATED"))) << lines[0];
  // Columns: 3 spaces at least between them, aligned on the header; ids are counted in
  // characters, not bytes.
  auto chars_before = [](const std::string& line, size_t byte_pos) {
    size_t n = 0;
    for (size_t k = 0; k < byte_pos && k < line.size(); ++k) {
      n += (static_cast<unsigned char>(line[k]) & 0xc0) != 0x80;
    }
    return n;
  };
  size_t state_col = chars_before(lines[0], lines[0].find("STATE"));
  int seen = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    for (const std::string& id : {a, b}) {
      if (!lines[i].starts_with(id + "  ")) continue;
      ++seen;
      const json::object& s = by_id[id];
      std::string expected_tail = std::string(s.at("state").as_string()) + " +" +
                                  std::string(s.at("image").as_string()) + " +" +
                                  std::string(s.at("createdAt").as_string());
      EXPECT_TRUE(std::regex_search(lines[i], std::regex(" {3,}" + expected_tail + "$")))
          << lines[i];
      EXPECT_EQ(chars_before(lines[i], lines[i].find_first_not_of(' ', id.size())), state_col)
          << r.out;
    }
  }
  EXPECT_EQ(seen, 2) << r.out;
}

// ---- exec ----

TEST_F(CliTest, ExecExitCodeAndSeparateStreams) {
  std::string id = NewBox();
  CliResult r = Nsbox({"exec", id, "--", "printf out; printf err >&2; exit 7"});
  EXPECT_EQ(r.code, 7) << r.Describe();
  EXPECT_EQ(r.out, "out");
  EXPECT_EQ(r.err, "err");

  r = Nsbox({"exec", id, "--", "true"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");

  // A signal death is 128 + the signal, as a shell reports it.
  r = Nsbox({"exec", id, "--", "kill -SEGV $$"});
  EXPECT_EQ(r.code, 139) << r.Describe();
}

TEST_F(CliTest, ExecOneArgumentIsAShellLineSeveralAreArgv) {
  std::string id = NewBox();
  CliResult r = Nsbox({"exec", id, "--", "echo abc | tr a-c x-z; echo $((6*7))"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "xyz\n42\n");

  r = Nsbox({"exec", id, "--", "printf", "[%s]\\n", "a b", "c'd", "$HOME", "", "*", "x;y"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "[a b]\n[c'd]\n[$HOME]\n[]\n[*]\n[x;y]\n");

  // argv[0] "X=1" is a command name, not an assignment: not found.
  r = Nsbox({"exec", id, "--", "X=1", "true"});
  EXPECT_EQ(r.code, 127) << r.Describe();

  // Without "--" too, and options after the id.
  r = Nsbox({"exec", id, "--env", "V=1", "printenv", "V"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "1\n");
}

TEST_F(CliTest, ExecOutputIsByteExact) {
  std::string id = NewBox();
  // Invalid UTF-8, NUL and a split multi-byte character come out as they were written.
  CliResult r = Nsbox({"exec", id, "--", "printf '\\377\\000\\342\\202'; printf '\\254\\n' >&2"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, std::string("\xff\0\xe2\x82", 4));
  EXPECT_EQ(r.err, "\xac\n");

  // A large output arrives whole.
  r = Nsbox({"exec", id, "--", "head -c 3000000 /dev/zero | tr '\\0' a"});
  EXPECT_EQ(r.code, 0) << r.Describe().substr(0, 200);
  EXPECT_EQ(r.out, std::string(3000000, 'a'));
}

TEST_F(CliTest, ExecStreamsOutputLive) {
  std::string id = NewBox();
  auto p = Start({"exec", id, "--", "echo first; echo warn >&2; sleep 4; echo second"});
  auto started = Clock::now();
  EXPECT_TRUE(p->PumpUntil([&] { return p->out() == "first\n" && p->err() == "warn\n"; },
                           milliseconds(3000)))
      << "stdout: " << p->out() << " stderr: " << p->err();
  EXPECT_TRUE(p->Running()) << "the first line came only at the end";
  EXPECT_LT(Clock::now() - started, milliseconds(3500));
  CliResult r = p->Finish();
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "first\nsecond\n");
  EXPECT_EQ(r.err, "warn\n");
}

TEST_F(CliTest, ExecCwdEnvAndTimeout) {
  std::string id = NewBox();
  EXPECT_EQ(Sh(id, "pwd"), "/workspace\n");
  EXPECT_EQ(Sh(id, "mkdir -p sub/dir"), "");
  CliResult r = Nsbox({"exec", id, "--cwd", "sub/dir", "--", "pwd"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "/workspace/sub/dir\n");

  r = Nsbox(
      {"exec", "--env", "A=1", "-e", "B=x y", "-e", "C=", id, "--", "echo \"$A|$B|$C|\"${C+set}"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "1|x y||set\n");

  auto started = Clock::now();
  r = Nsbox({"exec", id, "--timeout", "500", "--", "echo before; sleep 30"});
  EXPECT_EQ(r.code, 124) << r.Describe();
  EXPECT_EQ(r.out, "before\n");
  EXPECT_EQ(r.err, "nsbox: command timed out after 500 ms\n");
  EXPECT_LT(Clock::now() - started, milliseconds(8000));

  r = Nsbox({"exec", id, "--timeout", "soon", "--", "true"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: exec: --timeout 'soon': not a whole number\n");
  // The API's range, checked by the CLI: a usage error naming the flag, not the API's field.
  r = Nsbox({"exec", id, "--timeout", "99999999999999", "--", "true"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: exec: --timeout '99999999999999': out of range (0 to 1099511627776)\n");
  r = Nsbox({"exec", id, "--timeout", "0", "--", "echo never"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "never\n");
}

// Ctrl-C on `nsbox exec` ends the command for real: closing the connection kills its process
// tree in the sandbox (api.md "exec", Cancellation).
class CliInterruptTest : public CliTest, public ::testing::WithParamInterface<int> {
 protected:
  void RunInterrupted(const std::string& id, int sig, bool interactive);
};

TEST_P(CliInterruptTest, InterruptKillsTheCommand) {
  int sig = GetParam();
  // Over the streamed POST, and with -i over the WebSocket.
  const std::string id = NewBox();
  for (bool interactive : {false, true}) {
    SCOPED_TRACE(interactive ? "exec -i" : "exec");
    RunInterrupted(id, sig, interactive);
  }
}

void CliInterruptTest::RunInterrupted(const std::string& id, int sig, bool interactive) {
  std::vector<std::string> args = {"exec", id, "--", "sleep 1000 & echo ready; wait"};
  if (interactive) args.insert(args.begin() + 1, "-i");
  auto p = Start(args);
  ASSERT_TRUE(p->PumpUntil([&] { return p->out() == "ready\n"; }, milliseconds(15000)))
      << p->out() << p->err();
  std::string ps = "for f in /proc/[0-9]*/comm; do cat $f; done 2>/dev/null | grep -c '^sleep$'";
  EXPECT_EQ(Sh(id, ps), "1\n");

  ::kill(p->pid(), sig);
  // 128 + the signal, as a shell reports it: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP.
  EXPECT_EQ(p->WaitExit(milliseconds(3000)), 128 + sig) << p->err();
  EXPECT_EQ(p->err(), "");

  // The sandbox's sleep is gone within a few seconds (SIGTERM at once, SIGKILL 2 s later).
  std::string count;
  auto deadline = Clock::now() + milliseconds(6000);
  do {
    CliResult r = Nsbox({"exec", id, "--", ps + " || true"});
    count = r.out;
    if (count == "0\n") break;
    std::this_thread::sleep_for(milliseconds(200));
  } while (Clock::now() < deadline);
  EXPECT_EQ(count, "0\n") << "the command still runs after the CLI was interrupted";
}

// The same while nsbox's own stdout is full (a reader that stopped reading: `| less` left
// open): the signal ends nsbox, not only the command, over the streamed POST and with -i over
// the WebSocket. Its write was retried after the EINTR (or went on after a short write), and it
// waited for the reader.
TEST_P(CliInterruptTest, InterruptEndsTheCliWhileItsOutputIsBlocked) {
  const int sig = GetParam();
  const std::string id = NewBox();
  for (bool interactive : {false, true}) {
    SCOPED_TRACE(interactive ? "exec -i" : "exec");
    std::vector<std::string> args = {"exec", id, "--", "yes"};
    if (interactive) args.insert(args.begin() + 1, "-i");
    auto p = Start(args);
    std::this_thread::sleep_for(milliseconds(1000));  // the pipe to this test fills; never read
    ::kill(p->pid(), sig);
    int status = -1;
    const auto deadline = Clock::now() + milliseconds(5000);
    while (Clock::now() < deadline && ::waitpid(p->pid(), &status, WNOHANG) == 0) {
      status = -1;
      std::this_thread::sleep_for(milliseconds(20));
    }
    ASSERT_NE(status, -1) << "nsbox was still running 5 s after the signal";
    EXPECT_TRUE(WIFEXITED(status)) << "status " << status;
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig);
    std::string count;
    const auto gone = Clock::now() + milliseconds(6000);
    do {
      count = Sh(
          id, "for f in /proc/[0-9]*/comm; do cat $f; done 2>/dev/null | grep -c '^yes$' || true");
      if (count == "0\n") break;
      std::this_thread::sleep_for(milliseconds(200));
    } while (Clock::now() < gone);
    EXPECT_EQ(count, "0\n");
  }
}

INSTANTIATE_TEST_SUITE_P(Signals, CliInterruptTest, ::testing::Values(SIGINT, SIGTERM, SIGHUP),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return std::string(sigabbrev_np(param.param));
                         });

// ---- cp ----

TEST_F(CliTest, CpFileBothWaysBinary) {
  std::string id = NewBox();
  std::string host = dir_ + "/" + prefix_ + "data.bin";
  std::string data = RandomBytes(3 * 1024 * 1024 + 17, 1);
  WriteHostFile(host, data);

  // Host -> sandbox, missing parents made; the path is relative to the sandbox cwd.
  CliResult r = Nsbox({"cp", host, id + ":in/data.bin"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(Sh(id, "wc -c < /workspace/in/data.bin"), std::to_string(data.size()) + "\n");

  // Sandbox -> host file.
  std::string back = host + ".back";
  r = Nsbox({"cp", id + ":/workspace/in/data.bin", back});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_TRUE(ReadHostFile(back) == data) << "the round trip changed the bytes";

  // Sandbox -> stdout.
  r = Nsbox({"cp", id + ":in/data.bin", "-"});
  EXPECT_EQ(r.code, 0) << r.Describe().substr(0, 300);
  EXPECT_TRUE(r.out == data) << "stdout differs, " << r.out.size() << " bytes";
  EXPECT_EQ(r.err, "");

  // Stdin -> sandbox (chunked upload), then into an existing directory (keeps the name).
  r = Nsbox({"cp", "-", id + ":from-stdin"}, data.substr(0, 100000));
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(Sh(id, "wc -c < from-stdin"), "100000\n");
  r = Nsbox({"cp", host, id + ":in"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(Sh(id, "LC_ALL=C ls in"), prefix_ + "data.bin\ndata.bin\n");

  // Into an existing host directory.
  std::string dir = dir_ + "/" + prefix_ + "dl";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  r = Nsbox({"cp", id + ":in/data.bin", dir});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_TRUE(ReadHostFile(dir + "/data.bin") == data);

  // An id with a slash, a space and a colon-free unicode name.
  std::string odd = Id("conv/7 ü");
  ASSERT_EQ(Nsbox({"create", odd}).code, 0);
  r = Nsbox({"cp", host, odd + ":odd name ü.bin"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  r = Nsbox({"cp", odd + ":odd name ü.bin", "-"});
  EXPECT_EQ(r.code, 0) << r.Describe().substr(0, 300);
  EXPECT_TRUE(r.out == data);
}

// A copy out of a sandbox that fails halfway leaves the host file it would replace as it was
// (it was truncated at the first byte), and no temp file: here the host's disk fills up (a
// 1 MiB tmpfs, a 3 MiB file), into a file and into a directory's existing file.
TEST_F(CliTest, CpToTheHostThatFailsLeavesTheOldFile) {
  std::string id = NewBox();
  WriteHostFile(dir_ + "/" + prefix_ + "big", RandomBytes(3 * 1024 * 1024, 3));
  ASSERT_EQ(Nsbox({"cp", dir_ + "/" + prefix_ + "big", id + ":d/big"}).code, 0);
  const std::string small = dir_ + "/" + prefix_ + "small";
  ASSERT_EQ(::mkdir(small.c_str(), 0755), 0);
  ASSERT_EQ(::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=1m"), 0) << strerror(errno);
  ASSERT_EQ(::mkdir((small + "/d").c_str(), 0755), 0);
  WriteHostFile(small + "/kept", "precious");
  WriteHostFile(small + "/d/big", "precious too");
  ASSERT_EQ(::chmod((small + "/kept").c_str(), 0600), 0);

  CliResult r = Nsbox({"cp", id + ":d/big", small + "/kept"});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_NE(r.err.find("ENOSPC"), std::string::npos) << r.err;
  EXPECT_EQ(ReadHostFile(small + "/kept"), "precious");
  r = Nsbox({"cp", id + ":d", small});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_EQ(ReadHostFile(small + "/d/big"), "precious too");
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::recursive_directory_iterator(small)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"big", "d", "kept"}));

  // A copy that succeeds replaces the file, keeping its mode as cp does.
  WriteHostFile(dir_ + "/" + prefix_ + "mine", "old");
  ASSERT_EQ(::chmod((dir_ + "/" + prefix_ + "mine").c_str(), 0600), 0);
  ASSERT_EQ(Sh(id, "echo new > /workspace/new && echo ok"), "ok\n");
  r = Nsbox({"cp", id + ":new", dir_ + "/" + prefix_ + "mine"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(ReadHostFile(dir_ + "/" + prefix_ + "mine"), "new\n");
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/" + prefix_ + "mine").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ::umount2(small.c_str(), MNT_DETACH);
}

TEST_F(CliTest, CpDirectoryTreeBothWays) {
  std::string id = NewBox();
  std::string src = dir_ + "/" + prefix_ + "tree";
  for (const char* d : {"", "/a", "/a/b", "/empty", "/sp ace"}) {
    ASSERT_EQ(::mkdir((src + d).c_str(), 0755), 0) << d;
  }
  std::string bin = RandomBytes(200000, 2);
  WriteHostFile(src + "/top.txt", "top\n");
  WriteHostFile(src + "/a/b/deep.bin", bin);
  WriteHostFile(src + "/sp ace/f", "");
  ASSERT_EQ(::symlink("/etc/passwd", (src + "/a/link").c_str()), 0);

  CliResult r = Nsbox({"cp", src, id + ":copied"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "nsbox: cp: skipped " + src + "/a/link (a symlink; symlinks are not copied)\n");
  EXPECT_EQ(Sh(id, "cd copied && find . | LC_ALL=C sort"),
            ".\n./a\n./a/b\n./a/b/deep.bin\n./empty\n./sp ace\n./sp ace/f\n./top.txt\n");
  EXPECT_EQ(Sh(id, "cat copied/top.txt; wc -c < copied/a/b/deep.bin"), "top\n200000\n");

  // Into an existing directory: the source directory goes inside it, like docker cp.
  r = Nsbox({"cp", src, id + ":copied"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(Sh(id, "ls copied/" + prefix_ + "tree"), "a\nempty\nsp ace\ntop.txt\n");

  // Sandbox -> host, a symlink made inside is reported and skipped.
  EXPECT_EQ(Sh(id, "ln -s /etc copied/a/etc-link"), "");
  std::string dst = dir_ + "/" + prefix_ + "back";
  r = Nsbox({"cp", id + ":copied", dst});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: cp: skipped " + id +
                       ":copied/a/etc-link (a symlink; symlinks are not copied)\n");
  EXPECT_EQ(ReadHostFile(dst + "/top.txt"), "top\n");
  EXPECT_TRUE(ReadHostFile(dst + "/a/b/deep.bin") == bin);
  struct stat st {};
  EXPECT_EQ(::stat((dst + "/empty").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(::stat((dst + "/sp ace/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
  EXPECT_EQ(::lstat((dst + "/a/etc-link").c_str(), &st), -1);
  EXPECT_TRUE(ReadHostFile(dst + "/" + prefix_ + "tree/a/b/deep.bin") == bin);

  // The jail's /dev: its device nodes are the host's, bound over files that readdir reports as
  // files; each is skipped and named, the rest is copied (the copy stopped at /dev/full).
  const std::string devs = dir_ + "/" + prefix_ + "dev";
  r = Nsbox({"cp", id + ":/dev", devs});
  EXPECT_EQ(r.code, 0) << r.Describe();
  for (const char* node : {"null", "zero", "full", "random", "urandom", "tty"}) {
    EXPECT_NE(r.err.find("skipped " + id + ":/dev/" + node + " (not a regular file or directory)"),
              std::string::npos)
        << node << "\n"
        << r.err;
    EXPECT_NE(::lstat((devs + "/" + node).c_str(), &st), 0) << node;
  }
  EXPECT_EQ(::stat((devs + "/shm").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));

  // A directory cannot go to stdout.
  r = Nsbox({"cp", id + ":copied", "-"});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: cp " + id + ":copied -: cannot write a directory to standard output\n");
}

// Modes: a file's permission bits go both ways; a new host file never gets set-id or sticky bits
// (umask applies), an existing one keeps its mode, stdin makes 0644; directories' are not copied.
TEST_F(CliTest, CpKeepsFileModes) {
  std::string id = NewBox();
  const mode_t old_umask = ::umask(022);
  auto host_mode = [](const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
  };
  std::string script = dir_ + "/" + prefix_ + "run.sh";
  WriteHostFile(script, "#!/bin/sh\necho ran\n");
  ASSERT_EQ(::chmod(script.c_str(), 0755), 0);
  CliResult r = Nsbox({"cp", script, id + ":run.sh"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  r = Nsbox({"exec", id, "--", "./run.sh"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "ran\n");

  // Set-id and sticky bits go into the sandbox (they mean nothing to the host there).
  ASSERT_EQ(::chmod(script.c_str(), 04751), 0);
  r = Nsbox({"cp", script, id + ":suid.sh"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  r = Nsbox({"cp", "-", id + ":stdin.txt"}, "x");
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(Sh(id, "stat -c '%a %n' run.sh suid.sh stdin.txt"),
            "755 run.sh\n4751 suid.sh\n644 stdin.txt\n");

  // Back: without the set-uid bit; an existing host file keeps its mode; the umask applies.
  std::string back = dir_ + "/" + prefix_ + "back.sh";
  r = Nsbox({"cp", id + ":suid.sh", back});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(host_mode(back), 0751);
  std::string kept = dir_ + "/" + prefix_ + "kept.sh";
  WriteHostFile(kept, "old");
  ASSERT_EQ(::chmod(kept.c_str(), 0600), 0);
  r = Nsbox({"cp", id + ":run.sh", kept});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(host_mode(kept), 0600);
  EXPECT_EQ(ReadHostFile(kept), "#!/bin/sh\necho ran\n");
  ::umask(077);
  r = Nsbox({"cp", id + ":run.sh", back + ".masked"});
  ::umask(022);
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(host_mode(back + ".masked"), 0700);

  // A tree: each file's mode, set-gid and sticky dropped; directories get the host's default.
  EXPECT_EQ(Sh(id,
               "mkdir -p t/sub && echo a > t/a && chmod 640 t/a && cp suid.sh t/sub/x && "
               "chmod 3710 t/sub/x && chmod 700 t t/sub"),
            "");
  std::string tree = dir_ + "/" + prefix_ + "tree";
  r = Nsbox({"cp", id + ":t", tree});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(host_mode(tree + "/a"), 0640);
  EXPECT_EQ(host_mode(tree + "/sub/x"), 0710);
  EXPECT_EQ(host_mode(tree), 0755);
  EXPECT_EQ(host_mode(tree + "/sub"), 0755);
  // And up again: the files' modes go with them.
  r = Nsbox({"cp", tree, id + ":t2"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(Sh(id, "stat -c '%a %n' t2/a t2/sub/x"), "640 t2/a\n710 t2/sub/x\n");
  ::umask(old_umask);
}

TEST_F(CliTest, CpShowsProgressOnATerminalOnly) {
  // On a terminal, cp keeps one line up to date (rewritten in place, at most every 100 ms, the
  // end of each file at once) and clears it at the end; elsewhere it prints nothing
  // (CpFileBothWaysBinary), nor when the file goes to standard output on the same terminal.
  std::string id = NewBox();
  std::string host = dir_ + "/" + prefix_ + "big.bin";
  WriteHostFile(host, RandomBytes(64u << 20, 3));
  const std::string clear = "\r\033[K";

  CliResult r = NsboxOnTerminal({"cp", host, id + ":big.bin"}, Terminal::kStderr);
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find(clear + "copying " + host + ": 0.0 MiB of 64.0 MiB (0%)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(clear + "copying " + host + ": 64.0 MiB of 64.0 MiB (100%)"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.err.ends_with(clear)) << "the line is cleared at the end: " << r.err;
  EXPECT_EQ(r.err.find('\n'), std::string::npos) << "one line, never a new one: " << r.err;
  EXPECT_EQ(Sh(id, "wc -c < big.bin"), std::to_string(64u << 20) + "\n");

  std::string back = host + ".back";
  r = NsboxOnTerminal({"cp", id + ":big.bin", back}, Terminal::kStderr);
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_NE(r.err.find(clear + "copying " + id + ":big.bin: 64.0 MiB of 64.0 MiB (100%)"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.err.ends_with(clear)) << r.err;
  EXPECT_TRUE(ReadHostFile(back) == ReadHostFile(host)) << "the round trip changed the bytes";

  // A tree: the file's number, and the bytes of all files so far.
  std::string tree = dir_ + "/" + prefix_ + "tree";
  ASSERT_EQ(::mkdir(tree.c_str(), 0755), 0);
  WriteHostFile(tree + "/a", std::string(1u << 20, 'a'));
  WriteHostFile(tree + "/b", std::string(2u << 20, 'b'));
  r = NsboxOnTerminal({"cp", tree, id + ":tree"}, Terminal::kStderr);
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_NE(r.err.find(clear + "copying " + tree + "/b (file 2): 2.0 MiB of 2.0 MiB (100%); " +
                       "3.0 MiB in all"),
            std::string::npos)
      << r.err;

  // To standard output on the terminal itself: the file's text alone.
  r = NsboxOnTerminal({"cp", id + ":tree/a", "-"}, Terminal::kStdoutAndStderr);
  EXPECT_EQ(r.code, 0) << r.Describe().substr(0, 300);
  EXPECT_EQ(r.err.find("copying"), std::string::npos) << r.err.substr(0, 300);
  EXPECT_EQ(r.err, std::string(1u << 20, 'a'));
}

TEST_F(CliTest, CpErrors) {
  std::string id = NewBox();
  CliResult r = Nsbox({"cp", id + ":missing.txt", dir_ + "/x"});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: cp " + id + ":missing.txt " + dir_ +
                       "/x: no such file or directory in sandbox " + id + ": missing.txt\n");
  struct stat st {};
  EXPECT_NE(::stat((dir_ + "/x").c_str(), &st), 0) << "a failed copy left a file";

  r = Nsbox({"cp", "/nonexistent-host-file", id + ":x"});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: cp /nonexistent-host-file " + id +
                       ":x: stat(\"/nonexistent-host-file\"): ENOENT (No such file or "
                       "directory)\n");

  // A destination that ends with '/' names a directory that must be there, both ways (docker cp).
  r = Nsbox({"cp", "/etc/hostname", id + ":newdir/"});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_EQ(r.err,
            "nsbox: cp /etc/hostname " + id + ":newdir/: " + id + ":newdir/: no such directory\n");
  EXPECT_EQ(Nsbox({"exec", id, "--", "ls -A /workspace"}).out, "") << "the copy made newdir";
  ASSERT_EQ(Nsbox({"cp", "-", id + ":afile"}, "x").code, 0);
  r = Nsbox({"cp", "/etc/hostname", id + ":afile/"});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_NE(r.err.find(":afile/: not a directory"), std::string::npos) << r.Describe();
  r = Nsbox({"cp", id + ":afile", dir_ + "/nodir/"});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_NE(r.err.find("no such directory"), std::string::npos) << r.Describe();

  r = Nsbox({"cp", "/etc/hostname", "/tmp/x"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err,
            "nsbox: cp: exactly one of SRC and DST must be ID:PATH in a sandbox (e.g. "
            "box:/a.txt)\n");
}

// ---- stop, rm ----

TEST_F(CliTest, StopThenExecKeepsFiles) {
  std::string id = NewBox();
  CliResult r = Nsbox({"cp", "-", id + ":kept.txt"}, "still here\n");
  ASSERT_EQ(r.code, 0) << r.Describe();

  r = Nsbox({"stop", id});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, id + "\n");
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(SandboxJson(id).at("state").as_string(), "stopped");

  // The next exec starts it again; the workspace survived.
  EXPECT_EQ(Sh(id, "cat kept.txt"), "still here\n");
  EXPECT_EQ(SandboxJson(id).at("state").as_string(), "running");
}

TEST_F(CliTest, RmThenLs) {
  std::string id = NewBox();
  CliResult r = Nsbox({"rm", id});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, id + "\n");
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(SandboxJson(id).empty());
  r = Nsbox({"ls"});
  EXPECT_EQ(r.out.find(id), std::string::npos) << r.out;

  // Again: the API's 404, one line, exit 1.
  r = Nsbox({"rm", id});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(r.err.starts_with("nsbox: rm " + id + ": ")) << r.err;
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
}

// A word "[a,b]" is that word, never the list "a", "b" (CLI11's syntax for several values):
// `rm '[a,b]'` removed the sandboxes a and b and kept "[a,b]", and exec's arguments lost their
// brackets and were split at their commas.
TEST_F(CliTest, AWordInBracketsIsTakenWhole) {
  const std::string a = NewBox("a");
  const std::string b = NewBox("b");
  const std::string listed = "[" + a + "," + b + "]";
  CliResult r = Nsbox({"create", listed});
  ASSERT_EQ(r.code, 0) << r.Describe();
  r = Nsbox({"rm", listed});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, listed + "\n");
  EXPECT_TRUE(SandboxJson(listed).empty());
  EXPECT_FALSE(SandboxJson(a).empty()) << a << " must survive";
  EXPECT_FALSE(SandboxJson(b).empty()) << b << " must survive";

  r = Nsbox({"exec", a, "--", "[ -d /nonexistent ]"});
  EXPECT_EQ(r.code, 1) << r.Describe();
  r = Nsbox({"exec", a, "--", "printf", "<%s>\\n", "[1,2]", "[x]", "\x01[y]", "\x01"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "<[1,2]>\n<[x]>\n<\x01[y]>\n<\x01>\n");
  r = Nsbox({"exec", "--env=[V=1,W=2]", a, "--", "printenv '[V'"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "1,W=2]\n");
}

// ---- errors ----

// Usage errors say what to do, exit 125.
TEST_F(CliTest, UsageErrorsSayWhatToDo) {
  std::string id = NewBox();
  CliResult r = Nsbox({"crate", id});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: unknown command 'crate'\nRun 'nsbox --help' for usage.\n");
  r = Nsbox({"help"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: unknown command 'help'\nRun 'nsbox --help' for usage.\n");
  r = Nsbox({"image", "bogus"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: unknown command 'image bogus'\nRun 'nsbox image --help' for usage.\n");
  r = Nsbox({"ls", "extra"});  // an extra argument of a known command: CLI11's words
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err,
            "nsbox: The following argument was not expected: extra\nRun 'nsbox ls --help' for "
            "usage.\n");

  // The command's options without "--": the way to give them.
  r = Nsbox({"exec", id, "ls", "-la", "/tmp"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "nsbox: exec: unknown option '-la' (for the command's own options, put the "
            "command after '--': nsbox exec " +
                id + " -- ls -la /tmp)\nRun 'nsbox exec --help' for usage.\n");
  r = Nsbox({"exec", id, "--", "ls", "-d", "/tmp"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "/tmp\n");

  // Ports are numbers from 1 to 65535.
  r = Nsbox({"port", "add", id, "abc"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err,
            "nsbox: port add: PORT 'abc': the port must be a number from 1 to 65535 (see nsbox "
            "port add --help)\n");
  r = Nsbox({"port", "add", id, "80", "--host-port", "70000"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err,
            "nsbox: port add: --host-port '70000': the port must be a number from 0 to 65535 "
            "(see nsbox port add --help)\n");
  r = Nsbox({"port", "rm", id, "0"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err,
            "nsbox: port rm: PORT '0': the port must be a number from 1 to 65535 (see nsbox port "
            "rm --help)\n");
}

// An image that exists: the CLI's way to replace it is --replace (the API's is ?replace=1).
TEST_F(CliTest, ImageImportSaysReplace) {
  const std::string name = "cli-test-replace";
  std::string root = dir_ + "/" + prefix_ + "root";
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  WriteHostFile(root + "/hello.txt", "hello\n");
  std::string tar = dir_ + "/" + prefix_ + "root.tar";
  ASSERT_EQ(std::system(("tar -C '" + root + "' -cf '" + tar + "' .").c_str()), 0);
  CliResult r = Nsbox({"image", "import", name, tar});
  ASSERT_EQ(r.code, 0) << r.Describe();
  r = Nsbox({"image", "import", name, tar});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: image import " + name + ": an image named '" + name +
                       "' exists already (replace it with --replace)\n");
  r = Nsbox({"image", "import", "--replace", name, tar});
  EXPECT_EQ(r.code, 0) << r.Describe();
  r = Nsbox({"image", "rm", name});
  EXPECT_EQ(r.code, 0) << r.Describe();
}

TEST_F(CliTest, UnknownSandbox) {
  std::string id = prefix_ + "never-created";
  for (const std::vector<std::string>& args : {std::vector<std::string>{"exec", id, "--", "true"},
                                               {"stop", id},
                                               {"rm", id},
                                               {"cp", id + ":/a", dir_ + "/unknown-dst"},
                                               {"cp", "/etc/hostname", id + ":/a"}}) {
    CliResult r = Nsbox(args);
    EXPECT_EQ(r.code, 1) << args[0] << "\n" << r.Describe();
    EXPECT_EQ(r.out, "");
    std::string what = args[0] == "cp" ? "cp " + args[1] + " " + args[2] : args[0] + " " + id;
    std::string prefix = "nsbox: " + what + ": ";
    EXPECT_TRUE(r.err.starts_with(prefix)) << r.err;
    // api.md: messages are self-contained, so it names the sandbox.
    EXPECT_NE(r.err.find(id, prefix.size()), std::string::npos) << r.err;
    EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
  }
}

// A normal user is refused at start, saying what it takes, before anything is made; root (the
// suite's own daemon, started the same way) is the control.
TEST_F(CliTest, ServeAndRunRefuseANormalUserAtStart) {
  ASSERT_GT(daemon_, 0) << "the control: nsbox serve as root serves";
  ASSERT_TRUE(CanConnect(socket_));
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);
  const std::string socket = dir_ + "/user.sock";
  CliProcess serve({"serve", "--socket", socket, "--state-dir", dir_ + "/user-state"}, {},
                   Terminal::kNone, /*as_nobody=*/true);
  CliResult r = serve.Finish();
  CliProcess run({"run", "--", "true"}, {}, Terminal::kNone, /*as_nobody=*/true);
  CliResult ran = run.Finish();
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_NE(r.err.find("nsbox serve: needs root"), std::string::npos) << r.Describe();
  EXPECT_NE(r.err.find("sudo nsbox serve"), std::string::npos) << r.Describe();
  struct stat st;
  EXPECT_NE(::lstat(socket.c_str(), &st), 0) << "a refused daemon made its socket";
  EXPECT_NE(::lstat((dir_ + "/user-state").c_str(), &st), 0)
      << "a refused daemon made its state directory";
  EXPECT_EQ(ran.code, 125) << ran.Describe();
  EXPECT_NE(ran.err.find("needs root"), std::string::npos) << ran.Describe();
}

TEST_F(CliTest, UnreachableDaemon) {
  std::string missing = dir_ + "/nobody.sock";
  std::string expected = "nsbox: ls: connect to nsboxd at " + missing +
                         ": ENOENT (No such file or directory); is nsboxd running? Start it "
                         "with 'nsbox serve' or point --socket at it\n";
  // The global option before or after the subcommand, or the environment.
  for (const auto& args : {std::vector<std::string>{"--socket", missing, "ls"},
                           std::vector<std::string>{"ls", "--socket", missing}}) {
    CliResult r = Nsbox(args);
    EXPECT_EQ(r.code, 1) << r.Describe();
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, expected);
  }
  CliProcess p({"ls"}, {"NSBOX_SOCKET=" + missing});
  CliResult r = p.Finish();
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_EQ(r.err, expected);

  // TCP: a port nobody listens on.
  r = Nsbox({"exec", "--url", "http://localhost:1", "box", "--", "true"});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_EQ(r.err,
            "nsbox: exec box: connect to nsboxd at http://127.0.0.1:1: ECONNREFUSED (Connection "
            "refused); is nsboxd running? Start it with 'nsbox serve' or point --url at it\n");

  // A socket this user may not use: not "is nsboxd running?", but what it takes. The daemon's
  // own socket (0660), its directory opened for traversal for the time of the test.
  if (daemon_ > 0) {
    ASSERT_EQ(::chmod(dir_.c_str(), 0711), 0);
    CliProcess nobody({"ls"}, {"NSBOX_SOCKET=" + socket_}, Terminal::kNone, /*as_nobody=*/true);
    r = nobody.Finish();
    ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
    EXPECT_EQ(r.code, 1) << r.Describe();
    EXPECT_EQ(r.err, "nsbox: ls: connect to nsboxd at " + socket_ +
                         ": EACCES (Permission denied); the daemon's socket is not accessible to "
                         "this user (mode 0660, group root (id 0)): run as root (sudo nsbox ...); "
                         "group root is not one to join: whoever runs nsboxd can give its socket "
                         "a group for nsbox's users (nsbox serve --socket-group GROUP; the "
                         "Debian package's service uses group nsbox), which a user then joins\n");
    // A group of the socket's other than root's is the one to join (issue 52: joining root was
    // said of root's too). Group 1 (daemon, bin...), which nobody is not in.
    const struct group* g = ::getgrgid(1);
    ASSERT_NE(g, nullptr) << "no group 1 in /etc/group";
    const std::string group = g->gr_name;
    ASSERT_EQ(::chown(socket_.c_str(), 0, 1), 0) << strerror(errno);
    ASSERT_EQ(::chmod(dir_.c_str(), 0711), 0);
    CliProcess other({"ls"}, {"NSBOX_SOCKET=" + socket_}, Terminal::kNone, /*as_nobody=*/true);
    r = other.Finish();
    ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
    ASSERT_EQ(::chown(socket_.c_str(), 0, 0), 0) << strerror(errno);
    EXPECT_EQ(r.code, 1) << r.Describe();
    EXPECT_EQ(r.err, "nsbox: ls: connect to nsboxd at " + socket_ +
                         ": EACCES (Permission denied); the daemon's socket is not accessible to "
                         "this user (mode 0660, group " +
                         group + " (id 1)): run as root, or join group " + group +
                         " (sudo usermod -aG " + group + " $USER, then log in again)\n");
  }

  // --url: without a scheme, the one to write; TLS is said of https:// only.
  r = Nsbox({"ls", "--url", "127.0.0.1:47711"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: ls: --url '127.0.0.1:47711': no scheme; write http://127.0.0.1:47711\n");
  r = Nsbox({"ls", "--url", "ftp://127.0.0.1:21"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: ls: --url 'ftp://127.0.0.1:21': only http://HOST:PORT is supported\n");
  r = Nsbox({"ls", "--url", "https://127.0.0.1:7711"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err,
            "nsbox: ls: --url 'https://127.0.0.1:7711': only http://HOST:PORT is supported (put "
            "TLS in front with a proxy)\n");
  r = Nsbox({"ls", "--url", "http://example.com:80"});
  EXPECT_EQ(r.code, 125) << r.Describe();
  r = Nsbox({"ls", "--url", "http://127.0.0.1:1", "--socket", missing});
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_EQ(r.err, "nsbox: ls: --socket and --url exclude each other\n");
}

// A socket file nothing listens on (connect: ECONNREFUSED), as a daemon that died leaves; open to
// every user.
void MakeDeadSocket(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  // SAFETY: sockaddr_un is a sockaddr for bind(2); the size passed is its own.
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << path;
  ::close(fd);
  ASSERT_EQ(::chmod(path.c_str(), 0666), 0) << path;  // anyone may try it
}

// A normal user with no --socket, --url, NSBOX_SOCKET or NSBOX_URL: the CLI tries the user's own
// socket ($XDG_RUNTIME_DIR/nsbox/nsboxd.sock), then the system's (/run/nsbox/nsboxd.sock, here a
// hard link to the suite's root daemon's socket, in a /run of the process's own); and says of
// each why it did not answer. A socket given is tried alone.
TEST_F(CliTest, DefaultSocketsAsANormalUser) {
  if (daemon_ <= 0) GTEST_SKIP() << "needs the suite's own daemon (not NSBOX_CLI_TEST_SOCKET)";
  const std::string xdg = dir_ + "/xdg";
  const std::string run = dir_ + "/run";
  const std::string user_socket = xdg + "/nsbox/nsboxd.sock";
  ASSERT_EQ(::mkdir(xdg.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((xdg + "/nsbox").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(run.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((run + "/nsbox").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir_ + "/empty-run").c_str(), 0755), 0);  // a /run without nsbox/
  ASSERT_EQ(::link(socket_.c_str(), (run + "/nsbox/nsboxd.sock").c_str()), 0) << strerror(errno);
  auto as_nobody = [&](const std::vector<std::string>& args) {
    CliProcess p(args, {"XDG_RUNTIME_DIR=" + xdg}, Terminal::kNone, /*as_nobody=*/true, run);
    return p.Finish();
  };
  ASSERT_EQ(::chmod(dir_.c_str(), 0711), 0);

  // The user's socket is not there; the system's is the root daemon's, 0660 root:root.
  CliResult none_mine = as_nobody({"ls"});
  EXPECT_EQ(none_mine.code, 1) << none_mine.Describe();
  EXPECT_EQ(none_mine.out, "");
  EXPECT_EQ(none_mine.err,
            "nsbox: ls: no nsboxd answers on the default sockets: " + user_socket +
                ": ENOENT (No such file or directory), no daemon there; /run/nsbox/nsboxd.sock: "
                "EACCES (Permission denied), the daemon's socket is not accessible to this user "
                "(mode 0660, group root (id 0)): run as root (sudo nsbox ...); group root is "
                "not one to join: whoever runs nsboxd can give its socket a group for nsbox's "
                "users (nsbox serve --socket-group GROUP; the Debian package's service uses "
                "group nsbox), which a user then joins\n");

  // Neither answers: a dead socket of the user's own (tried first), none of the system's.
  MakeDeadSocket(user_socket);
  CliProcess nothing({"ls"}, {"XDG_RUNTIME_DIR=" + xdg}, Terminal::kNone, /*as_nobody=*/true,
                     dir_ + "/empty-run");
  CliResult neither = nothing.Finish();
  EXPECT_EQ(neither.code, 1) << neither.Describe();
  EXPECT_EQ(neither.err, "nsbox: ls: no nsboxd answers on the default sockets: " + user_socket +
                             ": ECONNREFUSED (Connection refused), no daemon listens there; "
                             "/run/nsbox/nsboxd.sock: ENOENT (No such file or directory), no "
                             "daemon there; start it with 'sudo nsbox serve' (it listens on "
                             "/run/nsbox/nsboxd.sock), or point --socket or --url at a daemon\n");

  // The control: a socket the user may use (the daemon's, opened to others for the time of the
  // test) is found after the user's dead one, and answers.
  ASSERT_EQ(::chmod(socket_.c_str(), 0666), 0);
  CliResult found = as_nobody({"ls", "--json"});
  // A socket given is tried alone: the system's, which would answer, is not tried after it.
  CliProcess given({"ls", "--socket", user_socket}, {"XDG_RUNTIME_DIR=" + xdg}, Terminal::kNone,
                   /*as_nobody=*/true, run);
  CliResult alone = given.Finish();
  CliProcess env_given({"ls"}, {"XDG_RUNTIME_DIR=" + xdg, "NSBOX_SOCKET=" + user_socket},
                       Terminal::kNone, /*as_nobody=*/true, run);
  CliResult env_alone = env_given.Finish();
  ASSERT_EQ(::chmod(socket_.c_str(), 0660), 0);
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  EXPECT_EQ(found.code, 0) << found.Describe();
  EXPECT_TRUE(found.out.starts_with("{\"sandboxes\":")) << found.Describe();
  const std::string refused = "nsbox: ls: connect to nsboxd at " + user_socket +
                              ": ECONNREFUSED (Connection refused); is nsboxd running? Start it "
                              "with 'nsbox serve' or point --socket at it\n";
  EXPECT_EQ(alone.code, 1) << alone.Describe();
  EXPECT_EQ(alone.err, refused);
  EXPECT_EQ(env_alone.code, 1) << env_alone.Describe();
  EXPECT_EQ(env_alone.err, refused);
}

// --url and --token against a daemon with a TCP listener; a wrong token is the API's 401.
TEST_F(CliTest, TcpWithToken) {
  if (daemon_ <= 0) GTEST_SKIP() << "needs a daemon of its own";
  std::string dir = dir_ + "/tcp";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  WriteHostFile(dir + "/token", "s3cret-token-0123456789\n");
  ASSERT_EQ(::chmod((dir + "/token").c_str(), 0600), 0);
  // A free port: bind to 0 and read it back.
  int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  // SAFETY: sockaddr_in is a sockaddr for bind(2)/getsockname(2); sizes are its own.
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  int port = ntohs(addr.sin_port);
  ::close(probe);
  std::string url = "http://127.0.0.1:" + std::to_string(port);

  pid_t tcp = StartDaemon({"--socket", dir + "/s.sock", "--state-dir", dir + "/state", "--listen",
                           "127.0.0.1:" + std::to_string(port), "--token-file", dir + "/token"},
                          dir + "/daemon.log");
  auto deadline = Clock::now() + milliseconds(15000);
  while (!CanConnect(dir + "/s.sock") || !CanConnectTcp(port)) {
    int status = 0;
    ASSERT_EQ(::waitpid(tcp, &status, WNOHANG), 0) << "nsbox serve --listen exited:\n"
                                                   << ReadHostFile(dir + "/daemon.log");
    ASSERT_LT(Clock::now(), deadline) << ReadHostFile(dir + "/daemon.log");
    std::this_thread::sleep_for(milliseconds(20));
  }
  std::string id = prefix_ + "tcp";
  CliResult r = Nsbox({"create", "--url", url, "--token", "s3cret-token-0123456789", id});
  EXPECT_EQ(r.code, 0) << r.Describe() << ReadHostFile(dir + "/daemon.log");
  EXPECT_EQ(r.out, id + " created\n");

  CliProcess p({"exec", id, "--", "echo over tcp"},
               {"NSBOX_URL=" + url, "NSBOX_TOKEN=s3cret-token-0123456789"});
  r = p.Finish();
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "over tcp\n");

  r = Nsbox({"rm", "--url", url, "--token", "s3cret-token-0123456789", id});
  EXPECT_EQ(r.code, 0) << r.Describe();

  // A wrong or missing token: the API's 401 as one line, and the daemon carries on.
  r = Nsbox({"ls", "--url", url, "--token", "wrong"});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_TRUE(r.err.starts_with("nsbox: ls: ")) << r.err;
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
  EXPECT_EQ(r.err.find("connect to nsboxd"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("check the token given with --token or NSBOX_TOKEN"), std::string::npos)
      << r.err;
  // Without one: the flag and the variable that give it, not the header the API speaks of.
  r = Nsbox({"ls", "--url", url});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_EQ(r.err,
            "nsbox: ls: this listener needs an Authorization: Bearer token; give the daemon's "
            "token with --token TOKEN or NSBOX_TOKEN\n");
  r = Nsbox({"ls"}, "", {"NSBOX_URL=" + url});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_NE(r.err.find("--token TOKEN or NSBOX_TOKEN"), std::string::npos) << r.err;
  r = Nsbox({"ls", "--url", url, "--token", "s3cret-token-0123456789"});
  EXPECT_EQ(r.code, 0) << r.Describe() << "\n" << ReadHostFile(dir + "/daemon.log");
  StopDaemon(tcp);
}

// Each numeric flag of `nsbox serve` out of its range is refused (125) before anything is made,
// with a message of its own naming that flag, the value and its range, and no other flag (issue
// 52: --output-ring 100 and --exec-retention 604801 printed one sentence about both). Control:
// the bounds themselves start a daemon that serves.
TEST_F(CliTest, ServeSaysWhichValueIsOutOfRange) {
  if (daemon_ <= 0) GTEST_SKIP() << "needs a daemon of its own";
  const std::string dir = dir_ + "/ranges";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::string socket = dir + "/s.sock", state = dir + "/state";
  struct Case {
    std::string flag, value, range;
  };
  const std::vector<Case> cases = {
      {"--output-ring", "100", "at least 4096"},  {"--exec-retention", "604801", "0 to 604800"},
      {"--auth-timeout", "0", "1 to 3600"},       {"--pool", "65", "0 to 64"},
      {"--image-max-layers", "0", "1 to 65536"},  {"--image-imports", "0", "1 to 64"},
      {"--image-max-bytes", "1K", "at least 1M"}, {"--idle-stop", "500ms", "1s to 30d"},
  };
  for (const Case& c : cases) {
    CliProcess p({"serve", "--socket", socket, "--state-dir", state, c.flag, c.value}, {});
    CliResult r = p.Finish();
    EXPECT_EQ(r.code, 125) << c.flag << " " << c.value << ": " << r.Describe();
    const std::string first = r.err.substr(0, r.err.find('\n'));
    EXPECT_NE(first.find(c.flag), std::string::npos) << r.Describe();
    EXPECT_NE(first.find(c.value), std::string::npos) << r.Describe();
    EXPECT_NE(first.find(c.range), std::string::npos) << r.Describe();
    for (const Case& other : cases) {
      if (other.flag != c.flag) {
        EXPECT_EQ(r.err.find(other.flag), std::string::npos) << c.flag << ": " << r.Describe();
      }
    }
    struct stat st;
    EXPECT_NE(::lstat(socket.c_str(), &st), 0) << c.flag << ": a refused daemon made its socket";
    EXPECT_NE(::lstat(state.c_str(), &st), 0) << c.flag << ": a refused daemon made its state";
  }

  // Control: every bound itself is taken.
  pid_t bounds = StartDaemon({"--socket",           socket,  "--state-dir",      state,
                              "--output-ring",      "4096",  "--exec-retention", "604800",
                              "--auth-timeout",     "3600",  "--pool",           "0",
                              "--image-max-layers", "65536", "--image-imports",  "64",
                              "--image-max-bytes",  "1M",    "--idle-stop",      "1s"},
                             dir + "/daemon.log");
  auto deadline = Clock::now() + milliseconds(15000);
  CliResult ls;
  for (;;) {
    ls = Nsbox({"ls", "--socket", socket});
    if (ls.code == 0) break;
    int status = 0;
    ASSERT_EQ(::waitpid(bounds, &status, WNOHANG), 0) << "nsbox serve exited:\n"
                                                      << ReadHostFile(dir + "/daemon.log");
    ASSERT_LT(Clock::now(), deadline) << ls.Describe() << ReadHostFile(dir + "/daemon.log");
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(ls.code, 0) << ls.Describe();
  StopDaemon(bounds);
}

// `nsbox serve --help` names the documents of the API and the daemon: each is in the tree.
TEST(CliHelp, ServeHelpNamesDocumentsThatExist) {
  CliProcess p({"serve", "--help"}, {});
  CliResult r = p.Finish();
  EXPECT_EQ(r.code, 0) << r.Describe();
  std::vector<std::string> named;
  const std::regex doc(R"(docs/[a-z0-9_/.-]*\.md)");
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), doc);
       it != std::sregex_iterator(); ++it) {
    named.push_back(it->str());
  }
  EXPECT_NE(std::find(named.begin(), named.end(), "docs/api.md"), named.end()) << r.out;
  EXPECT_NE(std::find(named.begin(), named.end(), "docs/daemon.md"), named.end()) << r.out;
  for (const std::string& path : named) {
    EXPECT_TRUE(std::filesystem::is_regular_file(std::string(NSBOX_SOURCE_DIR) + "/" + path))
        << path << " is named by nsbox serve --help but is not in the tree";
  }
  EXPECT_NE(r.out.find("(default /run/nsbox/nsboxd.sock)"), std::string::npos) << r.out;
}

}  // namespace

#include "tests/integration/harness.h"
#include "tests/common/cgroups.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

extern char** environ;

namespace nsbox::itest {

namespace {

using Clock = std::chrono::steady_clock;

std::string ErrnoName(int err) {
  const char* name = strerrorname_np(err);
  return name != nullptr ? name : std::to_string(err);
}

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Makes the test process the reaper of every orphan it causes, once, and ignores SIGPIPE.
void BecomeSubreaper() {
  static const bool done = [] {
    // SAFETY: only changes who inherits our orphaned descendants.
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
      std::fprintf(stderr, "harness: PR_SET_CHILD_SUBREAPER: %s\n", strerror(errno));
    }
    // Feeding stdin to a child that already exited must not kill the test process; the child
    // gets the default disposition back before execve.
    signal(SIGPIPE, SIG_IGN);
    return true;
  }();
  (void)done;
}

// The live (non-zombie) children of the test process other than `except`: what an nsbox run
// left behind once it was reaped.
std::vector<pid_t> LiveChildren() {
  std::vector<pid_t> pids;
  const pid_t self = getpid();
  DIR* d = opendir("/proc");
  if (d == nullptr) return pids;
  while (struct dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    std::string status = ReadSmallFile("/proc/" + std::string(e->d_name) + "/status");
    auto ppid_at = status.find("\nPPid:");
    auto state_at = status.find("\nState:");
    if (ppid_at == std::string::npos || state_at == std::string::npos) continue;
    if (std::strtol(status.c_str() + ppid_at + 6, nullptr, 10) != self) continue;
    const char* state = status.c_str() + state_at + 7;
    while (*state == ' ' || *state == '\t') ++state;
    if (*state == 'Z' || *state == 'X') continue;
    pids.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  return pids;
}

void ReapZombies() {
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

std::string DescribeProcess(pid_t pid) {
  std::string base = "/proc/" + std::to_string(pid);
  std::string comm = ReadSmallFile(base + "/comm");
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  std::string cmdline = ReadSmallFile(base + "/cmdline");
  for (char& c : cmdline) {
    if (c == '\0') c = ' ';
  }
  return std::to_string(pid) + " " + comm + " " + cmdline;
}

// Waits up to 1 s for what the run left behind to go away by itself, then kills and reaps it.
std::vector<std::string> CollectLeftovers() {
  std::vector<std::string> left;
  const auto until = Clock::now() + std::chrono::seconds(1);
  std::vector<pid_t> live;
  for (;;) {
    ReapZombies();
    live = LiveChildren();
    if (live.empty() || Clock::now() >= until) break;
    usleep(10 * 1000);
  }
  for (pid_t pid : live) {
    left.push_back(DescribeProcess(pid));
    // Our own unreaped child: its pid cannot have been reused.
    kill(pid, SIGKILL);
  }
  for (pid_t pid : live) waitpid(pid, nullptr, 0);
  return left;
}

std::vector<std::string> ChildEnvironment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  for (const auto& kv : extra) {
    std::string key = kv.substr(0, kv.find('='));
    std::erase_if(
        env, [&](const std::string& v) { return v.compare(0, key.size() + 1, key + "=") == 0; });
    env.push_back(kv);
  }
  return env;
}

struct Pipe {
  int r = -1;
  int w = -1;
  Pipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) == 0) {
      r = fds[0];
      w = fds[1];
    }
  }
  ~Pipe() {
    if (r >= 0) close(r);
    if (w >= 0) close(w);
  }
  void CloseRead() {
    if (r >= 0) close(r);
    r = -1;
  }
  void CloseWrite() {
    if (w >= 0) close(w);
    w = -1;
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
};

// Reads what is there; false at EOF or error.
// Signals the child through its pidfd (never a reused pid), or by pid where there is none.
void SendSignal(int pidfd, pid_t pid, int sig) {
  if (pidfd >= 0 && syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0) == 0) return;
  kill(pid, sig);
}

bool Drain(int fd, std::string* to) {
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      to->append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    return false;
  }
}

}  // namespace

std::string RunResult::Describe() const {
  std::ostringstream s;
  s << "command: " << command << "\n  exit code " << exit_code;
  if (term_signal != 0) s << " (killed by signal " << term_signal << ")";
  if (timed_out) s << " (TIMED OUT, killed)";
  s << ", " << elapsed.count() << " ms\n  stdout: [" << out << "]\n  stderr: [" << err << "]";
  for (const auto& l : leftover) s << "\n  left behind: " << l;
  return s.str();
}

RunResult RunProgram(const std::vector<std::string>& argv, const RunOptions& options) {
  BecomeSubreaper();
  RunResult result;
  for (const auto& a : argv) result.command += (result.command.empty() ? "" : " ") + a;

  std::vector<std::string> env = ChildEnvironment(options.extra_env);
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  Pipe out, err, in;
  if (out.r < 0 || err.r < 0 || in.r < 0) {
    result.err = "harness: pipe2: " + ErrnoName(errno);
    return result;
  }
  const auto start = Clock::now();
  pid_t pid = fork();
  if (pid < 0) {
    result.err = "harness: fork: " + ErrnoName(errno);
    return result;
  }
  if (pid == 0) {
    // The child: only async-signal-safe calls until execve.
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int stdin_fd = options.stdin_data.has_value() ? in.r : devnull;
    if (dup2(stdin_fd, STDIN_FILENO) < 0 || dup2(out.w, STDOUT_FILENO) < 0 ||
        dup2(err.w, STDERR_FILENO) < 0) {
      _exit(200);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    execve(cargv[0], cargv.data(), cenv.data());
    const char msg[] = "harness: execve failed\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    _exit(201);
  }
  result.pid = pid;
  out.CloseWrite();
  err.CloseWrite();
  in.CloseRead();
  const std::string input = options.stdin_data.value_or("");
  size_t input_off = 0;
  if (!options.stdin_data.has_value() || input.empty()) in.CloseWrite();
  for (int fd : {out.r, err.r, in.w}) {
    if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  // pidfd_open (5.3): readable when the child exits. We are its parent and have not reaped it,
  // so the pid cannot have been reused.
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));

  bool out_open = true, err_open = true, exited = false;
  Clock::time_point exited_at;
  for (;;) {
    const auto now = Clock::now();
    if (!result.timed_out && now - start >= options.timeout) {
      SendSignal(pidfd, pid, SIGKILL);
      result.timed_out = true;
    }
    if ((options.signal != 0 || options.on_ready) && !result.ready && !exited &&
        now - start >= options.ready_delay &&
        (options.ready_output.empty() ||
         result.out.find(options.ready_output) != std::string::npos)) {
      result.ready = true;
      if (options.on_ready) options.on_ready(pid);
      if (options.signal != 0) {
        SendSignal(pidfd, pid, options.signal);
        result.signal_sent = true;
      }
    }
    // After the child exits, give whatever still holds the pipes 2 s to close them.
    if (exited && ((!out_open && !err_open) || now - exited_at > std::chrono::seconds(2))) break;
    struct pollfd fds[4] = {{out_open ? out.r : -1, POLLIN, 0},
                            {err_open ? err.r : -1, POLLIN, 0},
                            {in.w, POLLOUT, 0},
                            {exited ? -1 : pidfd, POLLIN, 0}};
    int rc = poll(fds, 4, 20);
    if (rc < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) out_open = Drain(out.r, &result.out);
    if (fds[1].revents != 0) err_open = Drain(err.r, &result.err);
    if (in.w >= 0 && (fds[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t n = write(in.w, input.data() + input_off, input.size() - input_off);
      if (n > 0) input_off += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) input_off = input.size();
      if (input_off >= input.size()) in.CloseWrite();
    }
    if (!exited) {
      siginfo_t si{};
      if (waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          si.si_pid == pid) {
        exited = true;
        exited_at = Clock::now();
      }
    }
  }
  if (pidfd >= 0) close(pidfd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.term_signal = WTERMSIG(status);
    result.exit_code = 128 + result.term_signal;
  }
  result.leftover = CollectLeftovers();
  return result;
}

RunResult RunNsbox(const std::vector<std::string>& args, const RunOptions& options) {
  std::vector<std::string> argv = {kNsboxBin};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProgram(argv, options);
}

KeyValues ParseKeyValues(std::string_view text) {
  KeyValues kv;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    while (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    kv[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  return kv;
}

std::string Get(const KeyValues& kv, const std::string& key) {
  auto it = kv.find(key);
  return it == kv.end() ? "<missing>" : it->second;
}

std::optional<std::string> IntegrationUnavailable() {
  if (geteuid() != 0) {
    return "integration tests need root (nsbox run writes uid maps and creates cgroups); "
           "euid is " +
           std::to_string(geteuid());
  }
  for (const char* bin : {kNsboxBin, kProbeBin}) {
    if (access(bin, X_OK) != 0) {
      return std::string("binary under test missing: ") + bin + ": " + ErrnoName(errno);
    }
  }
  // User namespaces: a forked child tries to make one.
  pid_t pid = fork();
  if (pid == 0) _exit(unshare(CLONE_NEWUSER) == 0 ? 0 : errno);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return "fork: " + ErrnoName(errno);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return "user namespaces are unavailable: unshare(CLONE_NEWUSER): " +
           ErrnoName(WIFEXITED(status) ? WEXITSTATUS(status) : EINTR) +
           " (see user.max_user_namespaces, kernel.unprivileged_userns_clone, nsbox doctor)";
  }
  return std::nullopt;
}

isolate::IdMapping MappedIds() {
  auto ids = isolate::DefaultIdMapping();
  if (!ids.ok()) {
    ADD_FAILURE() << "isolate::DefaultIdMapping(): " << ids.error().message();
    return {};
  }
  return *ids;
}

TempWorkspace::TempWorkspace() {
  isolate::IdMapping ids = MappedIds();
  uid_ = ids.uid.outside;
  gid_ = ids.gid.outside;
  char tmpl[] = "/var/tmp/nsbox-itest-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << tmpl << ": " << ErrnoName(errno);
    return;
  }
  path_ = tmpl;
  if (chown(path_.c_str(), uid_, gid_) != 0 || chmod(path_.c_str(), 0755) != 0) {
    ADD_FAILURE() << "chown/chmod " << path_ << ": " << ErrnoName(errno);
  }
  const std::string probe = HostPath("nsbox-probe");
  {
    std::ifstream src(kProbeBin, std::ios::binary);
    std::ofstream dst(probe, std::ios::binary);
    dst << src.rdbuf();
    if (!src || !dst) ADD_FAILURE() << "copy " << kProbeBin << " to " << probe;
  }
  if (chown(probe.c_str(), uid_, gid_) != 0 || chmod(probe.c_str(), 0755) != 0) {
    ADD_FAILURE() << "chown/chmod " << probe << ": " << ErrnoName(errno);
  }
}

TempWorkspace::~TempWorkspace() {
  if (path_.empty()) return;
  // Depth first, never following symlinks the jail may have planted.
  nftw(
      path_.c_str(),
      [](const char* p, const struct stat*, int type, struct FTW*) {
        int rc = type == FTW_DP ? rmdir(p) : unlink(p);
        if (rc != 0) std::fprintf(stderr, "harness: remove %s: %s\n", p, strerror(errno));
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

std::string TempWorkspace::HostPath(std::string_view rel) const {
  return path_ + "/" + std::string(rel);
}

void TempWorkspace::MakeDir(std::string_view rel) const {
  const std::string p = HostPath(rel);
  if (mkdir(p.c_str(), 0755) != 0 || chown(p.c_str(), uid_, gid_) != 0) {
    ADD_FAILURE() << "mkdir/chown " << p << ": " << ErrnoName(errno);
  }
}

std::set<std::string> FindNsboxRunCgroups() { return testutil::FindCgroupsNamed("nsbox-run-"); }

void ExpectNothingLeftBehind(const RunResult& result, const std::set<std::string>& before) {
  EXPECT_TRUE(result.leftover.empty()) << "processes outlived nsbox:\n" << result.Describe();
  const std::string own = "nsbox-run-" + std::to_string(result.pid);
  for (const std::string& path : FindNsboxRunCgroups()) {
    const std::string name = path.substr(path.rfind('/') + 1);
    if (name == own) {
      ADD_FAILURE() << "nsbox left its cgroup behind: " << path << "\n" << result.Describe();
      continue;
    }
    if (before.count(path) != 0) continue;
    // Someone else's nsbox that is still running owns it.
    std::string pid = name.substr(std::string("nsbox-run-").size());
    if (!pid.empty() && access(("/proc/" + pid).c_str(), F_OK) == 0) continue;
    ADD_FAILURE() << "a cgroup appeared and was left behind: " << path << "\n" << result.Describe();
  }
}

void IntegrationTest::SetUp() {
  static const std::optional<std::string> reason = IntegrationUnavailable();
  if (reason.has_value()) {
    // Loud: a skipped isolation test must never look like a passing one.
    std::fprintf(stderr, "\n*** SKIPPED (NOT RUN): %s: %s ***\n\n",
                 ::testing::UnitTest::GetInstance()->current_test_info()->name(), reason->c_str());
    GTEST_SKIP() << "NOT RUN: " << *reason;
  }
}

}  // namespace nsbox::itest

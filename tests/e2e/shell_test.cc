// e2e: `nsbox shell` and `nsbox exec -i/-t` as a person uses them. The terminal cases run the
// CLI inside tmux (send-keys, capture-pane), on a real pseudo-terminal, against a real daemon;
// the pipe cases feed the CLI's stdin from a file and a pipe.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string Quote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Runs the CLI with stdin from `in_path` (or /dev/null), stdout and stderr into files; waits.
struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
  std::string Describe() const { return "exit " + std::to_string(code) + "\n" + out + "\n" + err; }
};

CliRun RunCli(const std::vector<std::string>& args, const std::string& in_path,
              const std::string& dir) {
  const std::string out_path = dir + "/cli.out";
  const std::string err_path = dir + "/cli.err";
  pid_t pid = ::fork();
  if (pid == 0) {
    int in = ::open(in_path.empty() ? "/dev/null" : in_path.c_str(), O_RDONLY);
    int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || out < 0 || err < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<std::string> argv_s = {NSBOX_BIN};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(NSBOX_BIN, argv.data());
    ::_exit(127);
  }
  CliRun r;
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadHostFile(out_path);
  r.err = ReadHostFile(err_path);
  return r;
}

// A tmux server of the test's own (its own socket), with one window of a fixed size running a
// host shell, in which the test types as a person would.
class Tmux {
 public:
  explicit Tmux(std::string dir) : dir_(std::move(dir)), socket_(dir_ + "/tmux.sock") {}
  ~Tmux() { Run({"kill-server"}); }

  bool Start(int cols, int rows) {
    // A plain host shell with a known prompt: `nsbox shell` is typed into it, as a person would.
    return Run({"-f", "/dev/null", "new-session", "-d", "-x", std::to_string(cols), "-y",
                std::to_string(rows), "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                "TERM=screen", "PS1=host$ ", "bash", "--norc", "--noprofile"}) == 0;
  }
  int Run(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"tmux", "-S", socket_};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string ignored;
    return RunProgram(argv, dir_ + "/tmux.log", &ignored);
  }
  void Type(std::string_view text) { Run({"send-keys", "-t", "0", "-l", std::string(text)}); }
  void Key(std::string_view key) { Run({"send-keys", "-t", "0", std::string(key)}); }
  void Line(std::string_view text) {
    Type(text);
    Key("Enter");
  }
  std::string Screen() {
    std::vector<std::string> argv = {"tmux", "-S", socket_, "capture-pane", "-p",
                                     "-J",   "-t", "0",     "-S",           "-200"};
    std::string out;
    RunProgram(argv, dir_ + "/capture.log", &out);
    return out;
  }
  // Waits until the screen holds `text`; false after `timeout`.
  bool WaitFor(std::string_view text, milliseconds timeout = milliseconds(20000)) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (Screen().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(milliseconds(50));
    }
    return false;
  }
  // Waits until `text` appears at least `n` times on the screen.
  bool WaitForCount(std::string_view text, size_t n, milliseconds timeout = milliseconds(20000)) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (Count(text) >= n) return true;
      std::this_thread::sleep_for(milliseconds(50));
    }
    return false;
  }
  // How often `text` appears on the screen.
  size_t Count(std::string_view text) {
    std::string screen = Screen();
    size_t n = 0;
    for (size_t at = screen.find(text); at != std::string::npos; at = screen.find(text, at + 1)) {
      ++n;
    }
    return n;
  }

 private:
  std::string dir_;
  std::string socket_;
};

class ShellTest : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    char tmpl[] = "/tmp/nsbox-shell-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    RemoveTree(dir_);
    E2eTest::TearDown();
  }
  std::string NsboxCommand(const std::string& args) {
    return std::string(NSBOX_BIN) + " --socket " + Quote(daemon().socket_path()) + " " + args;
  }
  std::string dir_;
};

TEST_F(ShellTest, ExecInteractiveStreamsAFileThroughTheCommand) {
  const std::string id = NewId();
  Create(id);
  std::mt19937 gen(7);
  std::string input(3u << 20, '\0');
  for (char& c : input) c = static_cast<char>(gen());
  const std::string in_path = dir_ + "/input";
  {
    int fd = ::open(in_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, input.data(), input.size()), static_cast<ssize_t>(input.size()));
    ::close(fd);
  }
  CliRun r = RunCli({"--socket", daemon().socket_path(), "exec", "-i", id, "--", "sh", "-c",
                     "cat > /workspace/in; wc -c < /workspace/in; echo err >&2; exit 5"},
                    in_path, dir_);
  EXPECT_EQ(r.code, 5) << r.Describe();
  EXPECT_EQ(r.out, std::to_string(input.size()) + "\n") << r.Describe();
  EXPECT_EQ(r.err, "err\n");
  // Byte for byte.
  std::string host_sha;
  RunProgram({"sh", "-c", "sha256sum < " + in_path + " | cut -d' ' -f1"}, dir_ + "/sha.log",
             &host_sha);
  EXPECT_EQ(Sh(id, "sha256sum < /workspace/in | cut -d' ' -f1"), host_sha);
}

TEST_F(ShellTest, ExecInteractiveWithoutInputSeesEof) {
  const std::string id = NewId();
  Create(id);
  CliRun r = RunCli({"--socket", daemon().socket_path(), "exec", "-i", id, "--", "sh", "-c",
                     "n=$(cat | wc -c); echo read $n"},
                    "", dir_);
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_EQ(r.out, "read 0\n");
}

TEST_F(ShellTest, TerminalWithoutATerminalIsAClearUsageError) {
  const std::string id = NewId();
  Create(id);
  CliRun r = RunCli({"--socket", daemon().socket_path(), "exec", "-t", id, "--", "true"}, "", dir_);
  EXPECT_EQ(r.code, 125) << r.Describe();
  EXPECT_NE(r.err.find("the input is not a terminal"), std::string::npos) << r.err;
  r = RunCli({"--socket", daemon().socket_path(), "shell", id}, "", dir_);
  EXPECT_EQ(r.code, 125) << r.Describe();
  // A sandbox that does not exist is said first, whatever the terminal: the same commands.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"shell", "no-such-box"},
        std::vector<std::string>{"exec", "-t", "no-such-box", "--", "true"}}) {
    std::vector<std::string> argv = {"--socket", daemon().socket_path()};
    argv.insert(argv.end(), args.begin(), args.end());
    r = RunCli(argv, "", dir_);
    EXPECT_EQ(r.code, 1) << r.Describe();
    EXPECT_NE(r.err.find("no-such-box"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("terminal"), std::string::npos) << r.err;
  }
  // An unknown sandbox through the WebSocket is the API's message, not a handshake error.
  r = RunCli({"--socket", daemon().socket_path(), "exec", "-i", "no-such-box", "--", "true"}, "",
             dir_);
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_NE(r.err.find("no-such-box"), std::string::npos) << r.err;
}

TEST_F(ShellTest, ShellInTmuxLikeAPerson) {
  if (::access("/usr/bin/tmux", X_OK) != 0) GTEST_SKIP() << "tmux is not installed";
  const std::string id = NewId();
  Create(id);
  Tmux tmux(dir_);
  ASSERT_TRUE(tmux.Start(120, 40));
  ASSERT_TRUE(tmux.WaitFor("host$ ")) << tmux.Screen();
  tmux.Line(NsboxCommand("shell " + Quote(id) + " --env 'PS1=box$ '") +
            " -- bash --norc --noprofile -i");
  ASSERT_TRUE(tmux.WaitFor("box$ ")) << tmux.Screen();

  // A command and its output, on the sandbox's terminal.
  tmux.Line("echo sum=$((6*7)); tty");
  ASSERT_TRUE(tmux.WaitFor("sum=42")) << tmux.Screen();
  EXPECT_TRUE(tmux.WaitFor("/dev/pts/")) << tmux.Screen();

  // The window size, then a resize followed through SIGWINCH.
  tmux.Line("trap 'echo got-winch' WINCH; stty size");
  ASSERT_TRUE(tmux.WaitFor("40 120")) << tmux.Screen();
  tmux.Run({"resize-window", "-t", "0", "-x", "100", "-y", "30"});
  ASSERT_TRUE(tmux.WaitFor("got-winch")) << tmux.Screen();
  tmux.Line("stty size");
  ASSERT_TRUE(tmux.WaitFor("30 100")) << tmux.Screen();

  // Ctrl-C interrupts a foreground sleep; the shell lives on.
  const auto before = Clock::now();
  tmux.Line("sleep 100");
  std::this_thread::sleep_for(milliseconds(500));
  tmux.Key("C-c");
  tmux.Line("echo after-$((1+1))");
  ASSERT_TRUE(tmux.WaitFor("after-2")) << tmux.Screen();
  EXPECT_LT(Clock::now() - before, std::chrono::seconds(60));

  // A line read by the program, then the shell's exit code through nsbox to the host shell,
  // whose terminal is back in its normal mode.
  tmux.Line("read -r x; echo got:$x");
  tmux.Line("hello there");
  ASSERT_TRUE(tmux.WaitFor("got:hello there")) << tmux.Screen();
  tmux.Line("exit 7");
  ASSERT_TRUE(tmux.WaitForCount("host$ ", 2)) << tmux.Screen();
  tmux.Line("echo rc=$?; stty -a | grep -o -- '-\\?icanon' | head -1");
  ASSERT_TRUE(tmux.WaitFor("rc=7")) << tmux.Screen();
  EXPECT_TRUE(tmux.WaitFor("\nicanon")) << "the terminal was not restored:\n" << tmux.Screen();
}

TEST_F(ShellTest, CtrlDEndsTheLoginShell) {
  if (::access("/usr/bin/tmux", X_OK) != 0) GTEST_SKIP() << "tmux is not installed";
  const std::string id = NewId();
  Create(id);
  Tmux tmux(dir_);
  ASSERT_TRUE(tmux.Start(80, 24));
  ASSERT_TRUE(tmux.WaitFor("host$ ")) << tmux.Screen();
  // The default: a login shell (bash -l) in the sandbox's cwd.
  tmux.Line(NsboxCommand("shell " + Quote(id)));
  tmux.Line("echo in-$((2*21)) $(pwd)");
  ASSERT_TRUE(tmux.WaitFor("in-42 /workspace")) << tmux.Screen();
  ASSERT_EQ(tmux.Count("host$ "), 1u) << tmux.Screen();
  tmux.Key("C-d");
  // Typed only once the host shell is back: keys typed before would go to the sandbox's.
  ASSERT_TRUE(tmux.WaitForCount("host$ ", 2)) << tmux.Screen();
  tmux.Line("echo rc=$?");
  ASSERT_TRUE(tmux.WaitFor("rc=0")) << tmux.Screen();
}

TEST_F(ShellTest, ExecDashItRunsOneCommandOnATerminal) {
  if (::access("/usr/bin/tmux", X_OK) != 0) GTEST_SKIP() << "tmux is not installed";
  const std::string id = NewId();
  Create(id);
  Tmux tmux(dir_);
  ASSERT_TRUE(tmux.Start(90, 20));
  ASSERT_TRUE(tmux.WaitFor("host$ ")) << tmux.Screen();
  tmux.Line(NsboxCommand("exec -it " + Quote(id) +
                         " -- sh -c 'stty size; tty -s && echo on-a-tty; exit 3'"));
  ASSERT_TRUE(tmux.WaitFor("on-a-tty")) << tmux.Screen();
  EXPECT_TRUE(tmux.WaitFor("20 90")) << tmux.Screen();
  ASSERT_TRUE(tmux.WaitForCount("host$ ", 2)) << tmux.Screen();
  tmux.Line("echo rc=$?");
  ASSERT_TRUE(tmux.WaitFor("rc=3")) << tmux.Screen();
}

}  // namespace
}  // namespace nsbox::e2e

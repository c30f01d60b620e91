// `nsbox run` as a command line: bad input is refused with 125 and a message that names the flag
// and the value, before anything is created; a missing or non-executable command is 127 or 126;
// --dry-run prints the plan and starts nothing; --tty gives the command a terminal.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "isolate/idmap.h"
#include "tests/integration/harness.h"

namespace nsbox::itest {
namespace {

class RunCliTest : public IntegrationTest {
 protected:
  void SetUp() override {
    IntegrationTest::SetUp();
    if (IsSkipped()) return;
    ws_.emplace();
    before_ = FindNsboxRunCgroups();
  }

  // nsbox run --workspace WS <args...>
  RunResult RunInWorkspace(const std::vector<std::string>& args, const RunOptions& o = {}) {
    std::vector<std::string> argv = {"run"};
    auto ws = ws_->Args();
    argv.insert(argv.end(), ws.begin(), ws.end());
    argv.insert(argv.end(), args.begin(), args.end());
    return RunNsbox(argv, o);
  }

  // Bad input: exit 125, each of `mentions` on stderr, nothing left behind, nothing created in
  // the workspace.
  void ExpectRefused(const RunResult& r, const std::vector<std::string>& mentions) {
    EXPECT_EQ(r.exit_code, 125) << r.Describe();
    for (const auto& m : mentions) {
      EXPECT_NE(r.err.find(m), std::string::npos) << "stderr should mention '" << m << "'\n"
                                                  << r.Describe();
    }
    EXPECT_TRUE(r.out.empty()) << r.Describe();
    ExpectNothingLeftBehind(r, before_);
  }

  std::optional<TempWorkspace> ws_;
  std::set<std::string> before_;
};

TEST_F(RunCliTest, UnknownFlagIs125) {
  RunResult r = RunInWorkspace({"--no-such-flag", "--", "true"});
  ExpectRefused(r, {"--no-such-flag"});
}

TEST_F(RunCliTest, NonNumericMemoryIs125) {
  RunResult r = RunInWorkspace({"--memory", "abc", "--", "true"});
  ExpectRefused(r, {"--memory", "abc"});
}

TEST_F(RunCliTest, ZeroPidsIs125) {
  RunResult r = RunInWorkspace({"--pids", "0", "--", "true"});
  ExpectRefused(r, {"--pids", "0"});
}

TEST_F(RunCliTest, NegativeCpusIs125) {
  RunResult r = RunInWorkspace({"--cpus", "-1", "--", "true"});
  ExpectRefused(r, {"--cpus", "-1"});
  r = RunInWorkspace({"--cpus=-1", "--", "true"});
  ExpectRefused(r, {"--cpus", "-1"});
}

TEST_F(RunCliTest, UidBaseZeroIs125) {
  // Root inside must never be root outside.
  RunResult r = RunInWorkspace({"--uid-base", "0", "--", "true"});
  ExpectRefused(r, {"--uid-base", "0"});
}

TEST_F(RunCliTest, BadHostnameIs125) {
  RunResult r = RunInWorkspace({"--hostname", "bad/name", "--", "true"});
  ExpectRefused(r, {"--hostname", "bad/name"});
}

TEST_F(RunCliTest, MissingWorkspaceIs125) {
  RunResult r = RunNsbox({"run", "--workspace", "/nonexistent/nsbox-itest", "--", "true"});
  ExpectRefused(r, {"--workspace", "/nonexistent/nsbox-itest"});
  struct stat st;
  EXPECT_NE(stat("/nonexistent/nsbox-itest", &st), 0) << "the workspace must not be created";
}

TEST_F(RunCliTest, WorkspaceThatIsAFileIs125) {
  const std::string file = ws_->HostPath("plain-file");
  std::ofstream(file) << "x";
  RunResult r = RunNsbox({"run", "--workspace", file, "--", "true"});
  ExpectRefused(r, {"--workspace", file, "not a directory"});
}

TEST_F(RunCliTest, UnknownImageIs125) {
  RunResult r = RunInWorkspace({"--image", "nope", "--", "true"});
  ExpectRefused(r, {"--image", "nope"});
}

TEST_F(RunCliTest, NoCommandIs125) {
  RunResult r = RunInWorkspace({"--"});
  EXPECT_EQ(r.exit_code, 125) << r.Describe();
  ExpectNothingLeftBehind(r, before_);
}

TEST_F(RunCliTest, CommandNotFoundIs127) {
  RunResult r = RunInWorkspace({"--", "nsbox-itest-no-such-command", "arg"});
  EXPECT_EQ(r.exit_code, 127) << r.Describe();
  EXPECT_NE(r.err.find("nsbox: nsbox-itest-no-such-command: command not found"), std::string::npos)
      << r.Describe();
  ExpectNothingLeftBehind(r, before_);
  r = RunInWorkspace({"--", "/workspace/no-such-file"});
  EXPECT_EQ(r.exit_code, 127) << r.Describe();
  ExpectNothingLeftBehind(r, before_);
}

TEST_F(RunCliTest, NonExecutableFileIs126) {
  const std::string script = ws_->HostPath("not-executable.sh");
  std::ofstream(script) << "#!/bin/sh\necho should not run\n";
  ASSERT_EQ(chmod(script.c_str(), 0644), 0);
  RunResult r = RunInWorkspace({"--", "/workspace/not-executable.sh"});
  EXPECT_EQ(r.exit_code, 126) << r.Describe();
  EXPECT_EQ(r.out.find("should not run"), std::string::npos) << r.Describe();
  EXPECT_NE(r.err.find("not-executable.sh"), std::string::npos) << r.Describe();
  ExpectNothingLeftBehind(r, before_);
}

TEST_F(RunCliTest, DryRunPrintsThePlanAndStartsNothing) {
  const isolate::IdMapping ids = MappedIds();
  RunResult r = RunInWorkspace(
      {"--dry-run", "--memory", "64M", "--", "sh", "-c", "echo ran > /workspace/dry-run-ran"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.out.find("uid_map: 0 " + std::to_string(ids.uid.outside) + " 65536"),
            std::string::npos)
      << r.Describe();
  EXPECT_NE(r.out.find("/usr"), std::string::npos) << r.Describe();
  EXPECT_NE(r.out.find("/workspace"), std::string::npos) << r.Describe();
  EXPECT_NE(r.out.find(ws_->path()), std::string::npos) << r.Describe();
  struct stat st;
  EXPECT_NE(stat(ws_->HostPath("dry-run-ran").c_str(), &st), 0) << "the command ran";
  ExpectNothingLeftBehind(r, before_);
}

TEST_F(RunCliTest, TtyGivesTheCommandATerminal) {
  // The harness gives nsbox a pipe as stdin: the terminal is the jail's own pty.
  RunResult r = RunInWorkspace({"--tty", "--", "tty"}, WithStdin(""));
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  std::string out = r.out;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  EXPECT_EQ(out, "/dev/pts/0") << r.Describe();
  ExpectNothingLeftBehind(r, before_);

  RunResult no_tty = RunInWorkspace({"--", "tty"}, WithStdin(""));
  EXPECT_EQ(no_tty.exit_code, 1) << "tty(1) without a terminal: " << no_tty.Describe();
  EXPECT_EQ(no_tty.out, "not a tty\n") << no_tty.Describe();
}

TEST_F(RunCliTest, StdinReachesTheCommand) {
  RunResult r = RunInWorkspace({"--", "cat"}, WithStdin("hello through nsbox\n"));
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.out, "hello through nsbox\n") << r.Describe();
}

// The harness's own checks must be able to fail: a process that outlives the command and a
// stray nsbox-run-* cgroup are both seen (security-references.md: non-vacuous).
TEST(HarnessSelfTest, SeesALeftoverProcess) {
  if (geteuid() != 0) GTEST_SKIP() << "NOT RUN: needs root";
  RunResult r = RunProgram({"/bin/sh", "-c", "sleep 30 >/dev/null 2>&1 & echo started"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  ASSERT_EQ(r.leftover.size(), 1u) << r.Describe();
  EXPECT_NE(r.leftover[0].find("sleep"), std::string::npos) << r.Describe();
}

TEST(HarnessSelfTest, SeesAStrayCgroupAndATimeout) {
  if (geteuid() != 0) GTEST_SKIP() << "NOT RUN: needs root";
  const std::string stray = "/sys/fs/cgroup/pids/nsbox-run-itest-selftest";
  if (mkdir(stray.c_str(), 0755) != 0) GTEST_SKIP() << "NOT RUN: no pids hierarchy: " << stray;
  EXPECT_EQ(FindNsboxRunCgroups().count(stray), 1u);
  rmdir(stray.c_str());
  EXPECT_EQ(FindNsboxRunCgroups().count(stray), 0u);

  RunResult r = RunProgram({"/bin/sleep", "30"}, WithTimeout(std::chrono::milliseconds(200)));
  EXPECT_TRUE(r.timed_out) << r.Describe();
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.Describe();
  EXPECT_LT(r.elapsed, std::chrono::seconds(2)) << r.Describe();
}

}  // namespace
}  // namespace nsbox::itest

namespace nsbox::itest {
namespace {

// A workspace whose parent the jail's root may not traverse (mkdtemp makes 0700 directories,
// owned by the host's root): the jail attaches a copy of the mount made on the host, so the path
// is never walked inside. Control: the same path is not traversable by the mapped uid.
TEST_F(RunCliTest, WorkspaceUnderADirectoryTheJailCannotTraverse) {
  char tmpl[] = "/var/tmp/nsbox-itest-0700-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string parent = tmpl;
  std::string ws = parent + "/ws";
  ASSERT_EQ(::mkdir(ws.c_str(), 0755), 0);
  auto ids = MappedIds();
  ASSERT_EQ(::chown(ws.c_str(), ids.uid.outside, ids.gid.outside), 0);
  struct stat st {};
  ASSERT_EQ(::stat(parent.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "control: the parent is closed to the mapped uid";
  RunResult r = RunNsbox({"run", "--workspace", ws, "--", "sh", "-c", "echo hi > /workspace/f"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  struct stat f {};
  EXPECT_EQ(::stat((ws + "/f").c_str(), &f), 0);
  EXPECT_EQ(f.st_uid, ids.uid.outside);
  ::unlink((ws + "/f").c_str());
  ::rmdir(ws.c_str());
  ::rmdir(parent.c_str());
}

// A workspace of another owner that the jail's root may not even enter (mkdtemp's 0700, a home
// directory of Debian 12's adduser): the note says so and how to open it, not "can only read
// it" followed by the jail's chdir failing with EACCES. Control: the same directory at 0755 is
// read, and the note says it can only be read.
TEST_F(RunCliTest, WorkspaceClosedToTheJailIsNamedInTheNote) {
  char tmpl[] = "/var/tmp/nsbox-itest-closed-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string ws = tmpl;
  RunResult closed = RunNsbox({"run", "--workspace", ws, "--", "ls", "/workspace"});
  EXPECT_NE(closed.exit_code, 0) << closed.Describe();
  EXPECT_NE(closed.err.find("cannot enter it (mode 0700: chmod o+rx it"), std::string::npos)
      << closed.Describe();
  EXPECT_EQ(closed.err.find("can only read it"), std::string::npos) << closed.Describe();
  ExpectNothingLeftBehind(closed, before_);

  ASSERT_EQ(::chmod(ws.c_str(), 0755), 0);
  RunResult open = RunNsbox({"run", "--workspace", ws, "--", "ls", "/workspace"});
  EXPECT_EQ(open.exit_code, 0) << open.Describe();
  EXPECT_NE(open.err.find("can only read it"), std::string::npos) << open.Describe();
  EXPECT_EQ(open.err.find("cannot enter it"), std::string::npos) << open.Describe();
  ::rmdir(ws.c_str());
}

}  // namespace
}  // namespace nsbox::itest

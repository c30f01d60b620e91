// nsbox-init's duties as PID 1 and as a server that trusts nothing: it reaps orphans, cannot be
// traced, signalled or read by the commands it runs, leaks no fd to them, leaves nothing alive
// when its channel closes, and survives hostile frames and hostile paths.

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "init_fixture.h"

namespace nsbox::itest {
namespace {

using fs::proto::Type;

// The state letter of /proc/PID/stat (after the parenthesised comm), or 0.
char StateOf(const std::string& stat_line) {
  size_t close = stat_line.rfind(')');
  if (close == std::string::npos || close + 2 >= stat_line.size()) return 0;
  return stat_line[close + 2];
}

long HostRssKiB(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

UniqueFd PidfdOpen(pid_t pid) {
  // SAFETY: pidfd_open(2) of a pid we just listed; a pid that is gone gives ESRCH, and the fd
  // refers to that very process from here on (no reuse race).
  return UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
}

// Waits until every pidfd is readable (its process exited); the pids still alive.
std::vector<pid_t> WaitAllExited(const std::vector<std::pair<pid_t, UniqueFd>>& procs,
                                 milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::vector<pid_t> alive;
  for (const auto& [pid, fd] : procs) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    struct pollfd p = {fd.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::max<long long>(left, 0))) != 1) alive.push_back(pid);
  }
  return alive;
}

fs::proto::ErrorReply DecodeError(const fs::InitClient::RawReply& reply) {
  fs::proto::ErrorReply e;
  EXPECT_EQ(reply.type, Type::kError) << fs::proto::TypeName(reply.type);
  EXPECT_TRUE(fs::proto::Decode(reply.payload, &e));
  return e;
}

class InitPid1Test : public InitTest {
 protected:
  // Starts the long-lived processes a stop must end: one exec's main process, and another's
  // setsid-ed and double-forked children. Returns the sandbox's processes with their pidfds.
  std::vector<std::pair<pid_t, UniqueFd>> StartLongLivedProcesses(
      std::vector<std::shared_ptr<AsyncExec>>& execs) {
    execs.push_back(Start("echo up; exec sleep 100"));
    execs.push_back(Start("setsid sleep 100 & (sleep 101 &) ; sleep 0.1; echo up; sleep 102"));
    execs.push_back(Start("trap '' TERM; echo up; exec sleep 103"));
    for (auto& e : execs) EXPECT_TRUE(e->WaitForOutput("up")) << e->Result().Describe();
    std::vector<std::pair<pid_t, std::string>> procs;
    auto deadline = Clock::now() + milliseconds(2000);
    do {
      procs = SandboxProcesses();
      if (procs.size() >= 5) break;
      std::this_thread::sleep_for(milliseconds(20));
    } while (Clock::now() < deadline);
    // sleep (1st exec); sleep 100, sleep 101, sleep 102 (2nd exec; bash exec-s the last one);
    // a sleep that ignores SIGTERM (3rd).
    EXPECT_GE(procs.size(), 5u) << Names(procs);
    std::vector<std::pair<pid_t, UniqueFd>> out;
    for (const auto& [pid, comm] : procs) {
      UniqueFd fd = PidfdOpen(pid);
      EXPECT_TRUE(fd.valid()) << "pidfd_open " << pid << " " << comm;
      if (fd.valid()) out.emplace_back(pid, std::move(fd));
    }
    UniqueFd init = PidfdOpen(box_->init_pid());
    EXPECT_TRUE(init.valid());
    EXPECT_EQ(HostComm(box_->init_pid()), "nsbox-init");
    out.emplace_back(box_->init_pid(), std::move(init));
    return out;
  }
};

// ---- PID 1 ---------------------------------------------------------------------------------

TEST_F(InitPid1Test, ReapsOrphans) {
  // Double forks: each subshell's child is orphaned, re-parented to nsbox-init, and exits
  // (some at once, some after the answer).
  ExecRun run =
      Run("for i in 1 2 3 4 5 6 7 8; do ( (exit 3) & ); ( (sleep 0.3; exit 4) & ); done; "
          "( (sleep 0.2 & sleep 0.1 &) & ); echo spawned");
  ASSERT_TRUE(run.ok) << run.Describe();
  EXPECT_EQ(run.out, "spawned\n");
  std::this_thread::sleep_for(milliseconds(800));
  // From the host: nothing of the sandbox is left, zombie or not.
  auto left = WaitSandboxEmpty(milliseconds(1000));
  std::string states;
  for (const auto& [pid, comm] : left) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(f, line);
    states += std::to_string(pid) + ":" + comm + ":" + StateOf(line) + " ";
  }
  EXPECT_TRUE(left.empty()) << "left: " << states;
  // From inside: no process in state Z.
  std::string stats = Sh("for f in /proc/[0-9]*/stat; do cat $f 2>/dev/null; echo; done");
  std::istringstream lines(stats);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    EXPECT_NE(StateOf(line), 'Z') << line;
  }
}

TEST_F(InitPid1Test, CommandsCannotTraceOrSignalInit) {
  // PTRACE_ATTACH (16) and PTRACE_SEIZE (0x4206) of PID 1: EPERM (x86_64 ptrace is 101).
  EXPECT_EQ(Sh("perl -e 'for my $req (16, 0x4206) { my $r = syscall(101, $req, 1, 0, 0); "
               "print $r == -1 ? $! + 0 : \"attached\", \"\\n\" }'"),
            "1\n1\n");
  // Signals from inside the PID namespace that init does not handle are dropped; it lives on.
  ExecRun run =
      Run("for s in KILL TERM INT HUP QUIT USR1 USR2 STOP ALRM PIPE SEGV; do kill -$s 1; done; "
          "sleep 0.2; kill -0 1 && echo init-alive");
  ASSERT_TRUE(run.ok) << run.Describe();
  EXPECT_EQ(run.out, "init-alive\n") << run.Describe();
  auto probe = ParseKeyValues(Run("/workspace/nsbox-probe signal-init").out);
  EXPECT_EQ(Get(probe, "init_alive"), "1");
  EXPECT_TRUE(Succeeds(client().Ping()));
  EXPECT_EQ(HostComm(box_->init_pid()), "nsbox-init");
  // Not stopped either: it still serves.
  auto read = client().ReadFile("/etc/hostname");
  ASSERT_TRUE(Succeeds(read));
  EXPECT_EQ(read.value(), "box\n");
  EXPECT_EQ(Sh("echo still serving"), "still serving\n");
}

TEST_F(InitPid1Test, CommandsCannotReadInitsProcEntries) {
  auto kv =
      ParseKeyValues(Sh("/workspace/nsbox-probe read /proc/1/environ /proc/1/mem "
                        "/proc/1/maps /proc/1/auxv /proc/1/fd/3 && "
                        "/workspace/nsbox-probe list /proc/1/fd /proc/1/root /proc/1/cwd"));
  for (std::string key :
       {"read[/proc/1/environ]", "read[/proc/1/mem]", "read[/proc/1/maps]", "read[/proc/1/auxv]",
        "read[/proc/1/fd/3]", "list[/proc/1/fd]", "list[/proc/1/root]", "list[/proc/1/cwd]"}) {
    std::string v = Get(kv, key);
    EXPECT_TRUE(v == "EACCES" || v == "EPERM") << key << "=" << v;
  }
  ExecRun run = Run("readlink /proc/1/exe /proc/1/root /proc/1/fd/3");
  EXPECT_NE(run.exit.exit_code, 0) << run.Describe();
  EXPECT_EQ(run.out, "");
}

TEST_F(InitPid1Test, InitsFdsDoNotLeakIntoCommands) {
  // bash's own fds (it forks ls: "; true" stops it from exec-ing ls in its place).
  EXPECT_EQ(Sh("ls /proc/$$/fd; true"), "0\n1\n2\n");
  EXPECT_EQ(Sh("perl -e 'opendir(my $d, \"/proc/self/fd\") or die; "
               "print join(\",\", sort grep { !/^\\./ } readdir $d), \"\\n\"'"),
            "0,1,2,3\n");
  // (The glob's own directory fd is gone by the time readlink runs: ignore its failure.)
  std::string targets = Run("for f in /proc/$$/fd/*; do readlink $f; done").out;
  EXPECT_NE(targets.find("/dev/null\npipe:"), std::string::npos) << targets;
  EXPECT_EQ(targets.find("socket:"), std::string::npos) << targets;
  EXPECT_EQ(targets.find("cgroup"), std::string::npos) << targets;
  EXPECT_EQ(targets.find("anon_inode"), std::string::npos) << targets;
  auto req = Request("ls /proc/$$/fd; true");
  req.stdin_data = "x";
  EXPECT_EQ(Run(req).out, "0\n1\n2\n");
}

// ---- Closing the channel -------------------------------------------------------------------

TEST_F(InitPid1Test, StopLeavesNoProcessAlive) {
  std::vector<std::shared_ptr<AsyncExec>> execs;
  auto procs = StartLongLivedProcesses(execs);
  auto start = Clock::now();
  auto stopped = box_->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped.error().message();
  auto alive = WaitAllExited(procs, milliseconds(3000) - Since(start));
  std::string names;
  for (pid_t p : alive) names += std::to_string(p) + ":" + HostComm(p) + " ";
  EXPECT_TRUE(alive.empty()) << "alive 3 s after Stop(): " << names;
  for (const auto& [pid, fd] : procs) {
    EXPECT_EQ(::kill(pid, 0), -1) << pid;
    EXPECT_EQ(errno, ESRCH) << pid;
  }
  // Every exec got its end (stopped, or the channel's close).
  for (auto& e : execs) {
    EXPECT_TRUE(e->WaitDone(milliseconds(100)));
    ExecRun run = e->Result();
    if (run.ok) {
      EXPECT_EQ(run.exit.reason, Reason(exec::EndReason::kStopped)) << run.Describe();
    }
  }
  // The workspace stays.
  EXPECT_TRUE(HostPathExists(ws_.HostPath("nsbox-probe")));
}

TEST_F(InitPid1Test, DestroyingTheSandboxLeavesNoProcessAlive) {
  std::vector<std::shared_ptr<AsyncExec>> execs;
  auto procs = StartLongLivedProcesses(execs);
  auto start = Clock::now();
  box_.reset();  // the client goes with it: the channel closes
  auto alive = WaitAllExited(procs, milliseconds(3000) - Since(start));
  std::string names;
  for (pid_t p : alive) names += std::to_string(p) + ":" + HostComm(p) + " ";
  EXPECT_TRUE(alive.empty()) << "alive 3 s after the sandbox was destroyed: " << names;
  for (auto& e : execs) EXPECT_TRUE(e->WaitDone(milliseconds(100)));
}

// ---- Hostile frames ------------------------------------------------------------------------

TEST_F(InitPid1Test, HostileFramesAreAnsweredWithErrors) {
  auto& c = client();
  {
    uint64_t tag = c.NextTag();
    auto r = SendAndAwait(fs::proto::EncodeFrame(static_cast<Type>(999), tag, "x"), tag);
    ASSERT_TRUE(Succeeds(r));
    auto e = DecodeError(r.value());
    EXPECT_EQ(e.err, EINVAL);
    EXPECT_NE(e.message.find("999"), std::string::npos) << e.message;
  }
  {
    uint64_t tag = c.NextTag();  // a response type sent as a request
    auto r = SendAndAwait(fs::proto::EncodeFrame(Type::kExecExit, tag, ""), tag);
    ASSERT_TRUE(Succeeds(r));
    EXPECT_EQ(DecodeError(r.value()).err, EINVAL);
  }
  {
    uint64_t tag = c.NextTag();
    auto r = SendAndAwait(fs::proto::EncodeFrame(Type::kExec, tag, "not an exec request"), tag);
    ASSERT_TRUE(Succeeds(r));
    EXPECT_EQ(DecodeError(r.value()).err, EINVAL);
  }
  {
    // A well-formed exec request with a byte too many.
    uint64_t tag = c.NextTag();
    auto r = SendAndAwait(
        fs::proto::EncodeFrame(Type::kExec, tag, fs::proto::Encode(Request("echo no")) + "!"), tag);
    ASSERT_TRUE(Succeeds(r));
    EXPECT_EQ(DecodeError(r.value()).err, EINVAL);
  }
  {
    // An exec request whose length field points past the end.
    uint64_t tag = c.NextTag();
    std::string payload = fs::proto::Encode(Request("echo no"));
    payload[0] = '\xff';
    payload[1] = '\xff';
    auto r = SendAndAwait(fs::proto::EncodeFrame(Type::kExec, tag, payload), tag);
    ASSERT_TRUE(Succeeds(r));
    EXPECT_EQ(DecodeError(r.value()).err, EINVAL);
  }
  for (Type type : {Type::kReadFile, Type::kStat, Type::kReaddir, Type::kExists, Type::kMkdir,
                    Type::kRm, Type::kWriteBegin}) {
    uint64_t tag = c.NextTag();
    auto r = SendAndAwait(fs::proto::EncodeFrame(type, tag, "\x01"), tag);
    ASSERT_TRUE(Succeeds(r)) << fs::proto::TypeName(type);
    EXPECT_EQ(DecodeError(r.value()).err, EINVAL) << fs::proto::TypeName(type);
  }
  {
    uint64_t tag = c.NextTag();  // a second hello
    fs::proto::Hello hello;
    auto r = SendAndAwait(fs::proto::EncodeFrame(Type::kHello, tag, fs::proto::Encode(hello)), tag);
    ASSERT_TRUE(Succeeds(r));
    EXPECT_EQ(DecodeError(r.value()).err, EINVAL);
  }
  {
    uint64_t tag = c.NextTag();  // an exec-kill with a reason it may not carry
    auto r =
        SendAndAwait(fs::proto::EncodeFrame(
                         Type::kExecKill, tag,
                         fs::proto::Encode(fs::proto::ExecKill{Reason(exec::EndReason::kExited)})),
                     tag);
    ASSERT_TRUE(Succeeds(r));
    EXPECT_EQ(DecodeError(r.value()).err, EINVAL);
  }
  {
    uint64_t tag = c.NextTag();  // a commit of a write that was never begun
    auto r = SendAndAwait(fs::proto::EncodeFrame(Type::kWriteCommit, tag, ""), tag);
    ASSERT_TRUE(Succeeds(r));
    EXPECT_EQ(DecodeError(r.value()).err, ENOENT);
  }
  {
    // A second exec under the tag of a running one.
    uint64_t tag = c.NextTag();
    std::string frame =
        fs::proto::EncodeFrame(Type::kExec, tag, fs::proto::Encode(Request("sleep 1")));
    auto started = SendAndAwait(frame, tag);
    ASSERT_TRUE(Succeeds(started));
    EXPECT_EQ(started.value().type, Type::kExecStarted);
    auto dup = SendAndAwait(frame, tag);
    ASSERT_TRUE(Succeeds(dup));
    EXPECT_EQ(DecodeError(dup.value()).err, EEXIST);
  }
  // The channel works on.
  EXPECT_TRUE(Succeeds(c.Ping()));
  EXPECT_EQ(Sh("echo alive"), "alive\n");
}

TEST_F(InitPid1Test, OversizedFrameIsRefusedFromItsHeaderAndSkipped) {
  long rss_before = HostRssKiB(box_->init_pid());
  uint64_t tag = client().NextTag();
  char header[fs::proto::kHeaderSize];
  fs::proto::EncodeHeader({100u << 20, Type::kReadFile, tag}, header);
  // Answered from the header alone, before any of the payload is sent.
  auto r = SendAndAwait(std::string_view(header, sizeof header), tag);
  ASSERT_TRUE(Succeeds(r));
  auto e = DecodeError(r.value());
  EXPECT_EQ(e.err, E2BIG) << e.message;
  // The 100 MiB follow and are skipped, not buffered.
  const std::string chunk(1 << 20, 'j');
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(client().SendRaw(chunk).ok()) << i;
  EXPECT_TRUE(Succeeds(client().Ping()));
  long rss_after = HostRssKiB(box_->init_pid());
  EXPECT_LT(rss_after - rss_before, 16 * 1024)
      << "nsbox-init VmRSS " << rss_before << " -> " << rss_after << " KiB";
  auto read = client().ReadFile("/etc/hostname");
  ASSERT_TRUE(Succeeds(read));
  EXPECT_EQ(read.value(), "box\n");
  EXPECT_EQ(Sh("echo alive"), "alive\n");
}

// ---- Hostile paths -------------------------------------------------------------------------

TEST_F(InitPid1Test, PathWithNulIsInvalid) {
  const std::string path("/workspace/a\0b", 14);
  EXPECT_TRUE(FailsWith(client().ReadFile(path), EINVAL));
  EXPECT_TRUE(FailsWith(client().WriteFile(path, "x"), EINVAL));
  EXPECT_TRUE(FailsWith(client().Stat(path), EINVAL));
  EXPECT_TRUE(FailsWith(client().Readdir(path, false), EINVAL));
  EXPECT_TRUE(FailsWith(client().Mkdir(path, true), EINVAL));
  EXPECT_TRUE(FailsWith(client().Rm(path, true, true), EINVAL));
  auto exists = client().Exists(path);
  ASSERT_TRUE(Succeeds(exists));
  EXPECT_FALSE(exists.value());
  // Not truncated at the NUL: nothing named "a" was made.
  EXPECT_EQ(Sh("ls -A | grep -v nsbox-probe || true"), "");
}

TEST_F(InitPid1Test, OverlongPathsAndNames) {
  const std::string long_path = "/workspace/" + std::string(4097 - 11, 'p');
  ASSERT_EQ(long_path.size(), 4097u);
  EXPECT_TRUE(FailsWith(client().ReadFile(long_path), ENAMETOOLONG));
  EXPECT_TRUE(FailsWith(client().WriteFile(long_path, "x"), ENAMETOOLONG));
  EXPECT_TRUE(FailsWith(client().Stat(long_path), ENAMETOOLONG));
  EXPECT_TRUE(FailsWith(client().Readdir(long_path, true), ENAMETOOLONG));
  EXPECT_TRUE(FailsWith(client().Mkdir(long_path, true), ENAMETOOLONG));
  EXPECT_TRUE(FailsWith(client().Rm(long_path, true, true), ENAMETOOLONG));
  EXPECT_FALSE(client().Exists(long_path).value());

  const std::string long_name = "/workspace/" + std::string(256, 'n');
  EXPECT_TRUE(FailsWith(client().ReadFile(long_name), ENAMETOOLONG));
  EXPECT_TRUE(FailsWith(client().WriteFile(long_name, "x"), ENAMETOOLONG));
  EXPECT_TRUE(FailsWith(client().Stat(long_name), ENAMETOOLONG));
  EXPECT_TRUE(FailsWith(client().Readdir(long_name, false), ENAMETOOLONG));
  EXPECT_TRUE(FailsWith(client().Mkdir(long_name, false), ENAMETOOLONG));
  EXPECT_TRUE(FailsWith(client().Mkdir(long_name + "/sub", true), ENAMETOOLONG));
  EXPECT_TRUE(FailsWith(client().Rm(long_name, false, true), ENAMETOOLONG));
  EXPECT_FALSE(client().Exists(long_name).value());

  // 255 bytes is a name like any other, for every verb.
  const std::string name255 = std::string(255, 'm');
  const std::string path255 = "/workspace/" + name255;
  ASSERT_TRUE(Succeeds(client().WriteFile(path255, "max")));
  ASSERT_TRUE(Succeeds(client().WriteFile(path255, "max again")));
  EXPECT_EQ(client().ReadFile(path255).value(), "max again");
  EXPECT_EQ(client().Stat(path255).value().size, 9u);
  auto list = client().Readdir("/workspace", false);
  ASSERT_TRUE(Succeeds(list));
  std::vector<std::string> names;
  for (const auto& e : list.value().entries) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{name255, "nsbox-probe"}));
  ASSERT_TRUE(Succeeds(client().Rm(path255, false, false)));
  ASSERT_TRUE(Succeeds(client().Mkdir(path255 + "/" + name255, true)));
  ASSERT_TRUE(Succeeds(client().Rm(path255, true, false)));
  EXPECT_EQ(Sh("ls -A"), "nsbox-probe\n");
}

TEST_F(InitPid1Test, RmOfAFiveThousandDeepTree) {
  auto made =
      Run("perl -e 'mkdir \"deep\" or die; chdir \"deep\" or die; "
          "for (1..5000) { mkdir \"d\" or die \"mkdir: $!\"; chdir \"d\" or die \"chdir: $!\" } "
          "open(my $f, \">\", \"bottom\") or die; print \"made\\n\"'");
  ASSERT_TRUE(made.ok && made.exit.exit_code == 0) << made.Describe();
  ASSERT_EQ(made.out, "made\n");
  EXPECT_TRUE(FailsWith(client().Rm("/workspace/deep", false, false), EISDIR));
  // A bound for a hang only: how fast it goes is bench's business, not a test's.
  auto removed = Within<fs::FsOutcome<fs::Unit>>(
      milliseconds(60000), [this] { return client().Rm("/workspace/deep", true, false); });
  ASSERT_TRUE(removed.has_value()) << "rm of the deep tree did not answer within 60 s";
  EXPECT_TRUE(Succeeds(*removed));
  EXPECT_FALSE(client().Exists("/workspace/deep").value());
  EXPECT_EQ(Sh("ls -A"), "nsbox-probe\n");
  EXPECT_TRUE(Succeeds(client().Ping()));
}

}  // namespace
}  // namespace nsbox::itest

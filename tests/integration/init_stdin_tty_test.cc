// Streamed stdin and terminals through nsbox-init (fs/protocol.h kExecInput, kExecResize,
// ExecRequest.stdin_stream and .tty): input frames written with flow control, the errors of
// input that cannot be written, and real interactive programs on a pty of the jail's devpts.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "init_fixture.h"

namespace nsbox::itest {
namespace {

using exec::EndReason;
namespace proto = fs::proto;

class InitStdinTtyTest : public InitTest {
 protected:
  fs::FsOutcome<fs::Unit> Input(uint64_t exec_tag, std::string data, bool close = false) {
    proto::ExecInput in;
    in.exec_tag = exec_tag;
    in.data = std::move(data);
    in.close = close;
    return client().Input(in);
  }

  fs::FsOutcome<fs::Unit> Resize(uint64_t exec_tag, uint16_t rows, uint16_t cols) {
    return client().Resize(proto::ExecResize{exec_tag, {rows, cols}});
  }

  static proto::ExecRequest Streamed(std::string command) {
    auto req = Request(std::move(command));
    req.stdin_stream = true;
    return req;
  }

  static proto::ExecRequest Terminal(std::string command, uint16_t rows = 40, uint16_t cols = 120) {
    auto req = Request(std::move(command));
    req.tty = proto::TtySize{rows, cols};
    return req;
  }

  // An interactive bash (no rc files) on a terminal, its prompt "prompt> ".
  proto::ExecRequest InteractiveBash(uint16_t rows = 40, uint16_t cols = 120) {
    auto req = Terminal("", rows, cols);
    req.argv = {"bash", "--norc", "--noprofile", "-i"};
    req.env.push_back("PS1=prompt> ");
    return req;
  }

  // The output after the `n`-th occurrence of `needle` (0: all of it).
  static size_t Count(const std::string& haystack, std::string_view needle) {
    size_t n = 0;
    for (size_t at = haystack.find(needle); at != std::string::npos;
         at = haystack.find(needle, at + needle.size())) {
      ++n;
    }
    return n;
  }

  // Waits until `needle` occurs at least `times` times in the exec's stream 1.
  static bool WaitForCount(AsyncExec& a, std::string_view needle, size_t times,
                           milliseconds timeout = milliseconds(10000)) {
    std::unique_lock<std::mutex> lock(a.mu);
    return a.cv.wait_for(lock, timeout, [&] { return Count(a.out, needle) >= times || a.done; }) &&
           Count(a.out, needle) >= times;
  }

  static std::string Out(AsyncExec& a) {
    std::lock_guard<std::mutex> lock(a.mu);
    return a.out;
  }

  // Processes inside the jail named `comm` (via /proc of the jail, from another exec).
  std::string JailPids(const std::string& comm) {
    return Sh(
        "for p in /proc/[0-9]*; do "
        "[ \"$(cat $p/comm 2>/dev/null)\" = '" +
        comm + "' ] && echo ${p#/proc/}; done; true");
  }

  static std::string WithoutCr(std::string s) {
    s.erase(std::remove(s.begin(), s.end(), '\r'), s.end());
    return s;
  }

  // The host's /proc/PID/status line `key` (without the key).
  static std::string HostStatus(pid_t pid, const std::string& key) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind(key + ":", 0) == 0) return line.substr(key.size() + 1);
    }
    return "";
  }

  // Targets of nsbox-init's fds, as the host sees them.
  std::vector<std::string> InitFdTargets() {
    std::vector<std::string> out;
    std::string dir = "/proc/" + std::to_string(box_->init_pid()) + "/fd";
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      std::error_code ec;
      auto target = std::filesystem::read_symlink(e.path(), ec);
      if (!ec) out.push_back(target.string());
    }
    return out;
  }
};

// ---- stdin streams -------------------------------------------------------------------------

TEST_F(InitStdinTtyTest, CatFedInThreeFramesThenClosed) {
  auto a = Start(Streamed("cat; echo '<eof>'"));
  ASSERT_TRUE(Succeeds(Input(a->tag, "one\n")));
  ASSERT_TRUE(a->WaitForOutput("one\n")) << "the first frame reaches cat before the others";
  ASSERT_TRUE(Succeeds(Input(a->tag, std::string("two\0", 4))));
  ASSERT_TRUE(Succeeds(Input(a->tag, "three", /*close=*/true)));
  ASSERT_TRUE(a->WaitDone());
  ExecRun run = a->Result();
  ASSERT_TRUE(run.ok) << run.Describe();
  EXPECT_EQ(run.out, std::string("one\ntwo\0three<eof>\n", 19)) << run.Describe();
  EXPECT_EQ(run.exit.exit_code, 0);
  // stdin_data goes first, and the stream goes on after it.
  auto req = Streamed("cat");
  req.stdin_data = "data,";
  auto b = Start(req);
  ASSERT_TRUE(Succeeds(Input(b->tag, "stream", true)));
  ASSERT_TRUE(b->WaitDone());
  EXPECT_EQ(b->Result().out, "data,stream") << b->Result().Describe();
  // A close without bytes is an EOF; then stdin is closed for good.
  auto c = Start(Streamed("cat; echo closed; sleep 2"));
  ASSERT_TRUE(Succeeds(Input(c->tag, "", true)));
  ASSERT_TRUE(c->WaitForOutput("closed\n"));
  EXPECT_TRUE(FailsWith(Input(c->tag, "late"), EPIPE));
  client().KillExec(c->tag, Reason(EndReason::kCancelled));
  ASSERT_TRUE(c->WaitDone());
}

TEST_F(InitStdinTtyTest, EightMiBThroughSha256sumInFullFrames) {
  // Deterministic bytes of every value; the expected digest from the same bytes in a file.
  std::string data(8u << 20, '\0');
  uint32_t x = 12345;
  for (auto& ch : data) {
    x = x * 1103515245u + 12345u;
    ch = static_cast<char>(x >> 24);
  }
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/data", data)));
  const std::string expected = Sh("sha256sum < /workspace/data");
  ASSERT_EQ(expected.size(), 64u + 4u) << expected;

  auto a = Start(Streamed("sha256sum"));
  auto start = Clock::now();
  for (size_t at = 0; at < data.size(); at += proto::kMaxInputChunk) {
    bool last = at + proto::kMaxInputChunk >= data.size();
    auto r = Input(a->tag, data.substr(at, proto::kMaxInputChunk), last);
    ASSERT_TRUE(Succeeds(r)) << "at " << at;
  }
  ASSERT_TRUE(a->WaitDone());
  ExecRun run = a->Result();
  EXPECT_EQ(run.out, expected) << run.Describe();
  std::printf("8 MiB through sha256sum in 256 KiB frames: %lld ms\n",
              static_cast<long long>(Since(start).count()));

  // Pipelined: eight frames sent before any answer; each answered once written, in order.
  auto b = Start(Streamed("sha256sum"));
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> answers;
  const std::string part = data.substr(0, 2u << 20);
  for (size_t i = 0; i < 8; ++i) {
    proto::ExecInput in;
    in.exec_tag = b->tag;
    in.data = part.substr(i * proto::kMaxInputChunk, proto::kMaxInputChunk);
    in.close = i == 7;
    client().SendInput(in, [&, i](fs::FsOutcome<fs::Unit> r) {
      std::lock_guard<std::mutex> lock(mu);
      answers.push_back(r.ok() ? static_cast<int>(i) : -r.error().err);
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, milliseconds(20000), [&] { return answers.size() == 8; }));
    EXPECT_EQ(answers, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  }
  ASSERT_TRUE(b->WaitDone());
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/part", part)));
  EXPECT_EQ(b->Result().out, Sh("sha256sum < /workspace/part"));
}

TEST_F(InitStdinTtyTest, InputAfterTheEndAndForUnknownExecs) {
  auto a = Start(Streamed("echo done"));
  ASSERT_TRUE(a->WaitDone());
  EXPECT_EQ(a->Result().out, "done\n");
  EXPECT_TRUE(FailsWith(Input(a->tag, "too late"), EPIPE));
  EXPECT_TRUE(FailsWith(Input(a->tag, "", true), EPIPE));
  EXPECT_TRUE(FailsWith(Input(987654321, "x"), ESRCH));
  EXPECT_TRUE(FailsWith(Resize(987654321, 10, 10), ESRCH));
  // An exec without stdin_stream refuses input: EINVAL (its stdin was stdin_data or /dev/null).
  auto b = Start(Request("sleep 5"));
  auto refused = Input(b->tag, "x");
  EXPECT_TRUE(FailsWith(refused, EINVAL));
  client().KillExec(b->tag, Reason(EndReason::kCancelled));
  ASSERT_TRUE(b->WaitDone());
  // Malformed input frames: EINVAL, and nsbox-init goes on.
  const uint64_t tag = client().NextTag();
  auto reply = SendAndAwait(proto::EncodeFrame(proto::Type::kExecInput, tag, "\x01\x02"), tag);
  ASSERT_TRUE(reply.ok()) << Describe(reply.error());
  EXPECT_EQ(reply.value().type, proto::Type::kError);
  EXPECT_TRUE(Succeeds(client().Ping()));
}

TEST_F(InitStdinTtyTest, CommandThatClosesItsStdinEarly) {
  auto a = Start(Streamed("exec 0<&-; echo closed; sleep 1; echo slept"));
  ASSERT_TRUE(a->WaitForOutput("closed\n"));
  EXPECT_TRUE(FailsWith(Input(a->tag, "nobody reads this\n"), EPIPE));
  EXPECT_TRUE(FailsWith(Input(a->tag, "nor this\n"), EPIPE)) << "stdin stays closed";
  ASSERT_TRUE(a->WaitDone());
  ExecRun run = a->Result();
  EXPECT_EQ(run.out, "closed\nslept\n") << run.Describe();
  EXPECT_EQ(run.exit.exit_code, 0);
  // nsbox-init survived the EPIPE: SIGPIPE is ignored, and it answers.
  EXPECT_TRUE(Succeeds(client().Ping()));
  const std::string ignored = HostStatus(box_->init_pid(), "SigIgn");
  ASSERT_FALSE(ignored.empty());
  EXPECT_NE(std::stoull(ignored, nullptr, 16) & (1ull << (SIGPIPE - 1)), 0u) << ignored;
}

TEST_F(InitStdinTtyTest, PendingInputIsBoundedAndRefusedAtTheEnd) {
  // sleep never reads: the pipe fills, the rest waits in nsbox-init up to its bound (4 MiB).
  auto a = Start(Streamed("sleep 100"));
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> errors;
  const int frames = 24;  // 6 MiB
  for (int i = 0; i < frames; ++i) {
    proto::ExecInput in;
    in.exec_tag = a->tag;
    in.data = std::string(proto::kMaxInputChunk, 'p');
    client().SendInput(in, [&](fs::FsOutcome<fs::Unit> r) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(r.ok() ? 0 : r.error().err);
      cv.notify_all();
    });
  }
  auto count = [&](int err) { return std::count(errors.begin(), errors.end(), err); };
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, milliseconds(10000), [&] { return count(EAGAIN) >= 4; }))
        << errors.size() << " answers";
  }
  EXPECT_TRUE(Succeeds(client().Ping())) << "nsbox-init is not blocked on the full pipe";
  client().KillExec(a->tag, Reason(EndReason::kCancelled));
  ASSERT_TRUE(a->WaitDone());
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, milliseconds(10000), [&] { return errors.size() == frames; }));
  // The pipe took a little (64 KiB: not one whole frame), the bound the next 16, the rest EAGAIN;
  // what waited is refused with EPIPE when the command ends.
  EXPECT_EQ(count(0) + count(EPIPE) + count(EAGAIN), frames);
  EXPECT_GE(count(EPIPE), 14) << "queued frames";
  EXPECT_GE(count(EAGAIN), 4);
}

// ---- terminals -----------------------------------------------------------------------------

TEST_F(InitStdinTtyTest, InteractiveBash) {
  auto a = Start(InteractiveBash());
  ASSERT_TRUE(a->WaitForOutput("prompt> ")) << Out(*a);
  ASSERT_TRUE(Succeeds(Input(a->tag, "read x; echo got:$x\n")));
  ASSERT_TRUE(Succeeds(Input(a->tag, "hello\n")));
  ASSERT_TRUE(a->WaitForOutput("got:hello")) << Out(*a);

  ASSERT_TRUE(Succeeds(Input(a->tag, "stty size\n")));
  ASSERT_TRUE(a->WaitForOutput("40 120\r\n")) << Out(*a);
  // The echo of the line shows got-""winch; only the trap prints got-winch.
  ASSERT_TRUE(Succeeds(Input(a->tag, "trap 'echo got-\"\"winch' WINCH\n")));
  ASSERT_TRUE(WaitForCount(*a, "prompt> ", 4)) << Out(*a);
  ASSERT_TRUE(Succeeds(Resize(a->tag, 50, 100)));
  ASSERT_TRUE(a->WaitForOutput("got-winch")) << "the resize sends SIGWINCH\n" << Out(*a);
  ASSERT_TRUE(Succeeds(Input(a->tag, "stty size\n")));
  ASSERT_TRUE(a->WaitForOutput("50 100\r\n")) << Out(*a);

  // Ctrl-C ends the foreground job (sleep), not bash.
  const size_t prompts = Count(Out(*a), "prompt> ");
  ASSERT_TRUE(Succeeds(Input(a->tag, "sleep 100\n")));
  ASSERT_TRUE(WaitForCount(*a, "sleep 100\r\n", 1));
  // Wait until sleep is running (the foreground job), so that ^C reaches it, not bash.
  auto deadline = Clock::now() + milliseconds(10000);
  while (JailPids("sleep").empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_FALSE(JailPids("sleep").empty()) << Out(*a);
  auto interrupted = Clock::now();
  ASSERT_TRUE(Succeeds(Input(a->tag, "\x03")));
  ASSERT_TRUE(WaitForCount(*a, "prompt> ", prompts + 1, milliseconds(20000))) << Out(*a);
  EXPECT_LT(Since(interrupted).count(), 20000);
  ASSERT_TRUE(Succeeds(Input(a->tag, "echo alive:$?\n")));
  ASSERT_TRUE(a->WaitForOutput("alive:130")) << Out(*a);
  EXPECT_EQ(JailPids("sleep"), "") << "^C ended sleep";
  {
    std::lock_guard<std::mutex> lock(a->mu);
    EXPECT_FALSE(a->done);
  }

  ASSERT_TRUE(Succeeds(Input(a->tag, "exit 3\n")));
  ASSERT_TRUE(a->WaitDone());
  ExecRun run = a->Result();
  ASSERT_TRUE(run.ok) << run.Describe();
  EXPECT_EQ(run.exit.exit_code, 3) << run.Describe();
  EXPECT_EQ(run.exit.reason, Reason(EndReason::kExited));
  EXPECT_EQ(run.err, "") << "a terminal has one stream";
  EXPECT_TRUE(FailsWith(Input(a->tag, "x"), EPIPE));
  EXPECT_TRUE(FailsWith(Resize(a->tag, 10, 10), ESRCH));
}

TEST_F(InitStdinTtyTest, CloseSendsEofToATerminal) {
  auto a = Start(InteractiveBash());
  ASSERT_TRUE(a->WaitForOutput("prompt> ")) << Out(*a);
  ASSERT_TRUE(Succeeds(Input(a->tag, "", /*close=*/true)));
  ASSERT_TRUE(a->WaitDone()) << Out(*a);
  ExecRun run = a->Result();
  EXPECT_EQ(run.exit.exit_code, 0) << run.Describe();
  EXPECT_NE(run.out.find("exit"), std::string::npos) << run.Describe();
  // A plain read sees EOF from the VEOF character, and the terminal (the output) stays.
  auto b = Start(Terminal("cat; echo after-eof"));
  ASSERT_TRUE(Succeeds(Input(b->tag, "line\n", true)));
  ASSERT_TRUE(b->WaitDone());
  EXPECT_EQ(WithoutCr(b->Result().out), "line\nline\nafter-eof\n") << b->Result().Describe();
  // A close after an unended line: VEOF there only hands the line over, so the close sends a
  // second one, the end (a read waited for ever before).
  auto c = Start(Terminal("read x; read y; echo \"y=$y.\"; echo after-eof"));
  ASSERT_TRUE(Succeeds(Input(c->tag, "hello\n")));
  ASSERT_TRUE(Succeeds(Input(c->tag, "partial", true)));
  ASSERT_TRUE(c->WaitDone()) << Out(*c);
  EXPECT_NE(WithoutCr(c->Result().out).find("y=partial.\nafter-eof\n"), std::string::npos)
      << c->Result().Describe();
}

TEST_F(InitStdinTtyTest, TerminalIsTheControllingTerminal) {
  auto req = Terminal(
      "tty -s && echo tty; echo to-stderr >&2; set -- $(cat /proc/$$/stat); "
      "echo tty_nr=$7; [ \"$6\" = $$ ] && echo session-leader; [ \"$8\" = $$ ] && echo foreground;"
      " echo TERM=$TERM");
  ExecRun run = Run(req);
  ASSERT_TRUE(run.ok) << run.Describe();
  std::string out = WithoutCr(run.out);
  EXPECT_EQ(run.err, "");
  EXPECT_NE(out.find("tty\n"), std::string::npos) << out;
  EXPECT_NE(out.find("to-stderr\n"), std::string::npos) << "stderr arrives as stream 1: " << out;
  EXPECT_EQ(out.find("tty_nr=0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("tty_nr="), std::string::npos) << out;
  EXPECT_NE(out.find("session-leader\n"), std::string::npos) << out;
  EXPECT_NE(out.find("foreground\n"), std::string::npos) << out;
  EXPECT_NE(out.find("TERM=xterm-256color\n"), std::string::npos) << out;
  EXPECT_EQ(run.exit.exit_code, 0);
  // A TERM of the request stays.
  req = Terminal("echo TERM=$TERM");
  req.env.push_back("TERM=dumb");
  EXPECT_EQ(WithoutCr(Run(req).out), "TERM=dumb\n");
  // Control: a pipe exec has no controlling terminal.
  ExecRun pipe =
      Run("tty -s || echo notty; set -- $(cat /proc/$$/stat); echo tty_nr=$7; tr '\\0' '\\n' < "
          "/proc/$$/environ | grep '^TERM=' || echo TERM-unset");
  EXPECT_EQ(pipe.out, "notty\ntty_nr=0\nTERM-unset\n") << pipe.Describe();
}

TEST_F(InitStdinTtyTest, ResizeErrors) {
  auto a = Start(Terminal("sleep 30"));
  EXPECT_TRUE(Succeeds(Resize(a->tag, 1, 1)));
  EXPECT_TRUE(Succeeds(Resize(a->tag, 4096, 4096)));
  EXPECT_TRUE(FailsWith(Resize(a->tag, 0, 80), EINVAL));
  EXPECT_TRUE(FailsWith(Resize(a->tag, 24, 0), EINVAL));
  EXPECT_TRUE(FailsWith(Resize(a->tag, 4097, 80), EINVAL));
  // Raw frames: sizes beyond 16 bits, and a truncated payload.
  for (std::string payload :
       {proto::Encode(proto::ExecResize{a->tag, {24, 80}}).substr(0, 12), std::string()}) {
    const uint64_t tag = client().NextTag();
    auto reply = SendAndAwait(proto::EncodeFrame(proto::Type::kExecResize, tag, payload), tag);
    ASSERT_TRUE(reply.ok()) << Describe(reply.error());
    ASSERT_EQ(reply.value().type, proto::Type::kError);
    EXPECT_EQ(fs::ReplyError(reply.value(), "ok").err, EINVAL);
  }
  {
    std::string payload = proto::Encode(proto::ExecResize{a->tag, {24, 80}});
    payload[8] = '\xff';  // rows: 0x...ff, far out of range in either byte order
    payload[9] = '\xff';
    payload[10] = '\xff';
    payload[11] = '\x7f';
    const uint64_t tag = client().NextTag();
    auto reply = SendAndAwait(proto::EncodeFrame(proto::Type::kExecResize, tag, payload), tag);
    ASSERT_TRUE(reply.ok()) << Describe(reply.error());
    EXPECT_EQ(fs::ReplyError(reply.value(), "ok").err, EINVAL);
  }
  // A pipe exec has no terminal to resize.
  auto b = Start(Streamed("sleep 30"));
  EXPECT_TRUE(FailsWith(Resize(b->tag, 24, 80), ENOTTY));
  client().KillExec(a->tag, Reason(EndReason::kCancelled));
  client().KillExec(b->tag, Reason(EndReason::kCancelled));
  ASSERT_TRUE(a->WaitDone());
  ASSERT_TRUE(b->WaitDone());
  EXPECT_TRUE(a->Result().exit.cancelled);
  EXPECT_TRUE(Succeeds(client().Ping()));
}

TEST_F(InitStdinTtyTest, TerminalExecsAsPipeExecsAtTheEnd) {
  // Timeout and the kill of the whole tree (cgroup), as for pipes.
  auto req = Terminal("sleep 60 & sleep 60");
  req.timeout_ms = 300;
  ExecRun run = Run(req);
  ASSERT_TRUE(run.ok) << run.Describe();
  EXPECT_TRUE(run.exit.timed_out) << run.Describe();
  EXPECT_EQ(run.exit.exit_code, 124);
  EXPECT_TRUE(WaitSandboxEmpty(milliseconds(5000)).empty());
  // The output cap.
  req = Terminal("yes");
  req.output_limit = 100000;
  run = Run(req);
  EXPECT_TRUE(run.exit.truncated) << run.Describe();
  EXPECT_EQ(run.out.size(), 100000u);
  // Output written just before the exit is drained from the master.
  run = Run(Terminal("head -c 300000 /dev/zero | tr '\\0' x; exit 7"));
  EXPECT_EQ(run.exit.exit_code, 7);
  EXPECT_EQ(run.out, std::string(300000, 'x')) << run.out.size();
  // A background process that keeps the terminal does not hold the answer.
  run = Run(Terminal("sleep 30 & echo bg"));
  EXPECT_EQ(WithoutCr(run.out), "bg\n");
  EXPECT_LT(run.elapsed.count(), 10000);
}

TEST_F(InitStdinTtyTest, TerminalFdsReachNoOtherCommand) {
  auto a = Start(Terminal("sleep 30"));
  auto b = Start(Terminal("echo ready; sleep 30"));
  ASSERT_TRUE(b->WaitForOutput("ready"));
  // nsbox-init keeps the masters (close-on-exec) and no slave.
  int masters = 0;
  for (const auto& t : InitFdTargets()) {
    if (t == "/dev/pts/ptmx" || t == "/dev/ptmx") ++masters;
    EXPECT_TRUE(t.rfind("/dev/pts/", 0) != 0 || t == "/dev/pts/ptmx") << "a slave in init: " << t;
  }
  EXPECT_GE(masters, 2);
  // A sibling pipe exec holds nothing of them; a terminal exec holds only its own terminal.
  EXPECT_EQ(Sh("ls /proc/self/fd | sort -n | tr '\\n' ' '"), "0 1 2 3 ");
  EXPECT_EQ(Sh("for f in /proc/$$/fd/*; do readlink $f; done | grep -c pts || true"), "0\n");
  ExecRun own = Run(Terminal("readlink /proc/$$/fd/*"));
  std::string links = WithoutCr(own.out);
  ASSERT_EQ(Count(links, "\n"), 3u) << "fds 0, 1 and 2: " << links;
  const std::string first = links.substr(0, links.find('\n') + 1);
  EXPECT_EQ(links, first + first + first) << "all three its own terminal";
  EXPECT_EQ(first.rfind("/dev/pts/", 0), 0u) << links;
  EXPECT_EQ(links.find("ptmx"), std::string::npos) << links;
  for (auto* e : {a.get(), b.get()}) client().KillExec(e->tag, Reason(EndReason::kCancelled));
  ASSERT_TRUE(a->WaitDone());
  ASSERT_TRUE(b->WaitDone());
  // Once the execs are answered nsbox-init has let go of their terminals.
  for (int i = 0; i < 100; ++i) {
    masters = 0;
    for (const auto& t : InitFdTargets()) masters += t == "/dev/pts/ptmx" ? 1 : 0;
    if (masters == 0) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(masters, 0);
}

// The commands' filter refuses terminal injection on a real controlling terminal too.
TEST_F(InitStdinTtyTest, TiocstiAndTioclinuxRefusedOnTheTerminal) {
  std::error_code ec;
  std::filesystem::copy_file(NSBOX_PROBE_BIN, ws_.path() + "/nsbox-probe",
                             std::filesystem::copy_options::overwrite_existing, ec);
  ASSERT_FALSE(ec) << ec.message();
  ExecRun run = Run(Terminal("/workspace/nsbox-probe tiocsti --stdin"));
  std::string out = WithoutCr(run.out);
  EXPECT_EQ(run.exit.exit_code, 0) << run.Describe();
  EXPECT_NE(out.find("tiocsti.stdin_isatty=1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("tiocsti.stdin=EPERM\n"), std::string::npos) << out;
  EXPECT_NE(out.find("tioclinux.stdin=EPERM\n"), std::string::npos) << out;
  EXPECT_NE(out.find("tiocsti.pty=EPERM\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace nsbox::itest

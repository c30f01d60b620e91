// The control channel read by the caller's loop (fs::InitClient::CallerReads), as nsboxd reads
// every sandbox's on its event loop: the same answers as with the client's own reader thread,
// dispatched on that loop; the reading handed to a thread when the loop ends; and every pending
// call answered when the channel closes.

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>

#include <atomic>
#include <fstream>
#include <thread>
#include <tuple>

#include "init_fixture.h"

namespace nsbox::itest {
namespace {

// A loop of the kind nsboxd runs, reduced to one channel: poll(2), then ReadReady until the
// client says the channel closed. Like Boost.Asio, it makes the fd non-blocking, so the client's
// blocking calls from other threads meet EAGAIN on it.
class ChannelLoop {
 public:
  ChannelLoop() : stop_(::eventfd(0, EFD_CLOEXEC)) {}
  ~ChannelLoop() { Stop(); }

  void Watch(std::shared_ptr<fs::InitClient> client) {
    const int flags = ::fcntl(client->fd(), F_GETFL);
    ::fcntl(client->fd(), F_SETFL, flags | O_NONBLOCK);
    thread_ = std::thread([this, client = std::move(client)] {
      id_ = std::this_thread::get_id();
      for (;;) {
        struct pollfd p[2] = {{client->fd(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
        if (::poll(p, 2, -1) < 0) continue;
        if (p[1].revents != 0) return;  // stopped: the channel stays open
        if (!client->ReadReady()) {
          saw_close_ = true;
          return;
        }
      }
    });
  }
  // Ends the loop (the channel stays as it is) and waits for it.
  void Stop() {
    if (!thread_.joinable()) return;
    uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof one);
    thread_.join();
  }
  // Waits until the loop has ended by itself (ReadReady said the channel closed).
  bool WaitClosed(milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (!saw_close_ && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    return saw_close_;
  }
  std::thread::id id() const { return id_; }

 private:
  UniqueFd stop_;
  std::thread thread_;
  std::thread::id id_;
  std::atomic<bool> saw_close_{false};
};

class InitCallerReadsTest : public InitTest {
 protected:
  void Configure(runtime::SandboxOptions& o) override {
    o.watch_channel = [this](std::shared_ptr<fs::InitClient> client) {
      loop_.Watch(std::move(client));
    };
  }
  void TearDown() override {
    InitTest::TearDown();
    loop_.Stop();
  }
  ChannelLoop loop_;
};

TEST_F(InitCallerReadsTest, AnswersAndCallbacksRunOnTheCallersLoop) {
  ASSERT_TRUE(Succeeds(client().Ping()));

  // 20 MB of output: many frames, most reads ending inside one, several ReadReady calls.
  std::atomic<bool> off_loop{false};
  std::string out;
  fs::InitClient::ExecCallbacks cb;
  cb.on_output = [&](int stream, std::string_view data) {
    if (std::this_thread::get_id() != loop_.id()) off_loop = true;
    if (stream == 1) out.append(data);
  };
  auto big = Request("head -c 20000000 /dev/zero | tr '\\0' x");
  auto r = client().Exec(big, cb);
  ASSERT_TRUE(Succeeds(r));
  EXPECT_EQ(r.value().exit_code, 0);
  EXPECT_EQ(out.size(), 20000000u);
  EXPECT_EQ(out.find_first_not_of('x'), std::string::npos);
  EXPECT_FALSE(off_loop) << "an output callback ran off the caller's loop";

  // 2 MB of stdin: the request is larger than the socket's buffer, so sending it meets EAGAIN on
  // the non-blocking fd and waits.
  auto counted = Request("wc -c");
  counted.stdin_data = std::string(2'000'000, 'i');
  ExecRun wc = Run(counted);
  ASSERT_TRUE(wc.ok) << wc.Describe();
  EXPECT_EQ(wc.out, "2000000\n");

  // A large file travels as an fd (SCM_RIGHTS), both ways.
  std::string content(3 << 20, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 7 + i / 4096);
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/big", content)));
  auto read = client().ReadFile("/workspace/big");
  ASSERT_TRUE(Succeeds(read));
  EXPECT_TRUE(read.value() == content) << "3 MiB read back differs";

  // Many callers at once.
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 8; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto st = client().Stat("/workspace/big");
        if (!st.ok() || st.value().size != content.size()) ++failures;
        auto missing = client().Exists("/workspace/none");
        if (!missing.ok() || missing.value()) ++failures;
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// nsbox-init's resident memory, in KiB.
uint64_t VmRssKib(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

TEST_F(InitCallerReadsTest, AHostThatStopsReadingStopsTheCommandsNotInitsMemory) {
  // Nothing reads the channel for a while (nsboxd waiting on a slow disk). nsbox-init stops
  // reading its commands' pipes once 4 MiB wait for the host: a command writing 40 MiB blocks
  // on its pipe instead of growing nsbox-init's memory. A command started meanwhile that writes
  // 1 MB (less than its pipe holds) and exits keeps those bytes in its pipe: the drain window
  // does not run out while they wait. When the host reads again, every byte arrives, in order.
  ASSERT_TRUE(Succeeds(client().Ping()));
  const uint64_t rss_before = VmRssKib(box_->init_pid());
  loop_.Stop();
  auto big = Start("dd if=/dev/zero bs=1M count=40 status=none | tr '\\0' x");
  std::this_thread::sleep_for(milliseconds(500));
  auto small = Start("head -c 1000000 /dev/zero | tr '\\0' y");
  std::this_thread::sleep_for(milliseconds(1000));
  const uint64_t rss_stalled = VmRssKib(box_->init_pid());
  EXPECT_LT(rss_stalled, rss_before + 16 * 1024)
      << "nsbox-init grew from " << rss_before << " to " << rss_stalled << " KiB";
  const std::string procs = Names(SandboxProcesses());
  EXPECT_NE(procs.find(":dd "), std::string::npos) << "the 40 MiB writer blocks: " << procs;
  EXPECT_EQ(procs.find(":head "), std::string::npos) << "the 1 MB writer has exited: " << procs;
  EXPECT_FALSE(big->done);
  EXPECT_FALSE(small->done) << "an answer came with nobody reading the channel";

  client().ReadOnOwnThread();
  ASSERT_TRUE(big->WaitDone(milliseconds(30000)));
  ASSERT_TRUE(small->WaitDone(milliseconds(30000)));
  for (auto& [run, size, c] : {std::tuple{big->Result(), size_t{40u << 20}, 'x'},
                               std::tuple{small->Result(), size_t{1000000}, 'y'}}) {
    ASSERT_TRUE(run.ok) << run.Describe();
    EXPECT_EQ(run.exit.exit_code, 0) << run.Describe();
    EXPECT_EQ(run.out.size(), size);
    EXPECT_EQ(run.out.find_first_not_of(c), std::string::npos);
  }
}

TEST_F(InitCallerReadsTest, AChattyBackgroundProcessDoesNotHoldBackTheAnswerAfterAPause) {
  // The host stops reading while a background process floods the command's stdout: nsbox-init
  // pauses the pipes (the main process's last line may wait in one). Once the host reads again,
  // the answer comes with that line after the drain window, as always: not when the flood
  // reaches the output cap, which would kill the background process with the command.
  ASSERT_TRUE(Succeeds(client().Ping()));
  loop_.Stop();
  auto run = Start("yes flood & echo main-done");
  std::this_thread::sleep_for(milliseconds(1000));
  EXPECT_FALSE(run->done) << "an answer came with nobody reading the channel";
  client().ReadOnOwnThread();
  ASSERT_TRUE(run->WaitDone(milliseconds(20000)));
  ExecRun r = run->Result();
  ASSERT_TRUE(r.ok) << r.Describe();
  EXPECT_EQ(r.exit.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.exit.reason, Reason(exec::EndReason::kExited)) << r.Describe();
  EXPECT_FALSE(r.exit.truncated);
  EXPECT_NE(r.out.find("main-done\n"), std::string::npos);
  EXPECT_LT(r.out.size(), size_t{32} << 20) << "the answer waited for the flood";
  const std::string procs = Names(SandboxProcesses());
  EXPECT_NE(procs.find(":yes "), std::string::npos) << "the background process lives on: " << procs;
}

TEST_F(InitCallerReadsTest, ReadingMovesToAThreadOfItsOwnWhenTheLoopEnds) {
  auto slow = Start("sleep 0.3; echo late");
  loop_.Stop();
  client().ReadOnOwnThread();
  ASSERT_TRUE(slow->WaitDone(milliseconds(10000)));
  ExecRun run = slow->Result();
  ASSERT_TRUE(run.ok) << run.Describe();
  EXPECT_EQ(run.out, "late\n");
  // The fd is still non-blocking: the thread waits for it instead of taking EAGAIN for an end.
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_TRUE(Succeeds(client().Ping()));
  EXPECT_EQ(Sh("echo again"), "again\n");
}

TEST_F(InitCallerReadsTest, ClosingTheChannelAnswersWhatIsPending) {
  auto sleeper = Start("sleep 100");
  {
    std::unique_lock<std::mutex> lock(sleeper->mu);
    ASSERT_TRUE(sleeper->cv.wait_for(lock, milliseconds(10000), [&] { return sleeper->pid != 0; }));
  }
  client().Close();
  // The loop sees the channel close, answers the exec and stops watching.
  EXPECT_TRUE(loop_.WaitClosed(milliseconds(10000)));
  ASSERT_TRUE(sleeper->WaitDone(milliseconds(10000)));
  EXPECT_TRUE(FailsWith(fs::FsOutcome<fs::Unit>(sleeper->Result().error), EPIPE));
  EXPECT_TRUE(FailsWith(client().Ping(), EPIPE));
}

TEST_F(InitCallerReadsTest, DestroyingAnUnreadClientAnswersWhatIsPending) {
  loop_.Stop();  // nothing reads the channel any more
  auto sleeper = Start("sleep 100");
  box_.reset();  // closes the channel and waits for nsbox-init to end
  ASSERT_TRUE(sleeper->WaitDone(milliseconds(10000)));
  ExecRun run = sleeper->Result();
  EXPECT_FALSE(run.ok) << run.Describe();
  EXPECT_EQ(run.error.err, EPIPE) << run.Describe();
}

}  // namespace
}  // namespace nsbox::itest

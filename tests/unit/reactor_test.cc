#include "exec/reactor.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/syscalls.h"
#include "base/unique_fd.h"

namespace nsbox::exec {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Upper bounds are generous: the machine is a noisy 2-vCPU guest. Lower bounds are exact.
constexpr auto kSlack = 3s;

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

Pipe MakePipe() {
  int fds[2];
  // Non-blocking, as the reactor's callers make them (the epoll backend needs it).
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) ADD_FAILURE() << "pipe2: " << strerror(errno);
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

void WriteString(int fd, const std::string& s) {
  ASSERT_EQ(::write(fd, s.data(), s.size()), static_cast<ssize_t>(s.size()));
}

class ReactorTest : public ::testing::TestWithParam<Reactor::Backend> {
 protected:
  void SetUp() override {
    auto r = CreateReactor(GetParam());
    if (!r.ok() && GetParam() == Reactor::Backend::kIoUring) {
      GTEST_SKIP() << "SKIPPED LOUDLY: io_uring is unavailable here, its backend is untested: "
                   << r.error().message();
    }
    ASSERT_TRUE(r.ok()) << r.error().message();
    reactor_ = std::move(r).value();
    ASSERT_EQ(reactor_->backend(), GetParam());
  }

  // Runs the loop until `done` holds or `limit` passes; false on the limit.
  template <typename Pred>
  bool RunUntil(Pred done, std::chrono::milliseconds limit = 10s) {
    auto deadline = Clock::now() + limit;
    while (!done()) {
      if (Clock::now() >= deadline) return false;
      auto status = reactor_->RunOnce(100ms);
      EXPECT_TRUE(status.ok()) << status.error().message();
    }
    return true;
  }

  std::unique_ptr<Reactor> reactor_;
};

TEST_P(ReactorTest, ReadsFromAPipeAsDataArrives) {
  Pipe p = MakePipe();
  char buf[64];
  std::optional<ssize_t> got;
  reactor_->Read(p.read.get(), buf, sizeof(buf), [&](ssize_t n) { got = n; });
  ASSERT_TRUE(reactor_->RunOnce(30ms).ok());
  EXPECT_FALSE(got.has_value()) << "completed before any data was written";
  WriteString(p.write.get(), "hello");
  ASSERT_TRUE(RunUntil([&] { return got.has_value(); }));
  ASSERT_EQ(*got, 5);
  EXPECT_EQ(std::string(buf, 5), "hello");
  EXPECT_EQ(reactor_->pending(), 0u);
}

TEST_P(ReactorTest, EofReadsZero) {
  Pipe p = MakePipe();
  char buf[8];
  std::optional<ssize_t> got;
  reactor_->Read(p.read.get(), buf, sizeof(buf), [&](ssize_t n) { got = n; });
  p.write.reset();
  ASSERT_TRUE(RunUntil([&] { return got.has_value(); }));
  EXPECT_EQ(*got, 0);
}

TEST_P(ReactorTest, CancelledReadOnAnEmptyPipeReportsEcanceledAndTakesNoData) {
  Pipe p = MakePipe();
  char buf[8];
  int calls = 0;
  ssize_t got = 1;
  OpId id = reactor_->Read(p.read.get(), buf, sizeof(buf), [&](ssize_t n) {
    ++calls;
    got = n;
  });
  EXPECT_NE(id, 0u);
  ASSERT_TRUE(reactor_->RunOnce(10ms).ok());
  reactor_->Cancel(id);
  ASSERT_TRUE(RunUntil([&] { return calls > 0; }));
  EXPECT_EQ(got, -ECANCELED);
  EXPECT_EQ(reactor_->pending(), 0u);
  // The cancelled read is gone: data written now stays in the pipe for whoever reads next.
  WriteString(p.write.get(), "xy");
  ASSERT_TRUE(reactor_->RunOnce(20ms).ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(::read(p.read.get(), buf, sizeof(buf)), 2);
  // Cancelling a completed id does nothing.
  reactor_->Cancel(id);
  ASSERT_TRUE(reactor_->RunOnce(10ms).ok());
  EXPECT_EQ(calls, 1);
}

TEST_P(ReactorTest, WritesToAPipe) {
  Pipe p = MakePipe();
  const std::string data = "abc";
  std::optional<ssize_t> got;
  reactor_->Write(p.write.get(), data.data(), data.size(), [&](ssize_t n) { got = n; });
  ASSERT_TRUE(RunUntil([&] { return got.has_value(); }));
  EXPECT_EQ(*got, 3);
  char buf[8];
  ASSERT_EQ(::read(p.read.get(), buf, sizeof(buf)), 3);
  EXPECT_EQ(std::string(buf, 3), "abc");
}

TEST_P(ReactorTest, WriteWithNoReaderIsEpipe) {
  // Users of the reactor ignore SIGPIPE (nsbox-init does): both backends write from the loop's
  // own thread, so a write to a pipe without a reader would otherwise kill the process.
  struct sigaction old {};
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGPIPE, &ign, &old), 0);
  Pipe p = MakePipe();
  p.read.reset();
  std::optional<ssize_t> got;
  reactor_->Write(p.write.get(), "z", 1, [&](ssize_t n) { got = n; });
  EXPECT_TRUE(RunUntil([&] { return got.has_value(); }));
  EXPECT_EQ(got.value_or(0), -EPIPE);
  ::sigaction(SIGPIPE, &old, nullptr);
}

TEST_P(ReactorTest, ReadAndPollInOnTheSameFd) {
  Pipe p = MakePipe();
  char buf[8];
  std::optional<ssize_t> read_result;
  std::optional<int> poll_result;
  reactor_->PollIn(p.read.get(), [&](int revents) { poll_result = revents; });
  reactor_->Read(p.read.get(), buf, sizeof(buf), [&](ssize_t n) { read_result = n; });
  EXPECT_EQ(reactor_->pending(), 2u);
  ASSERT_TRUE(reactor_->RunOnce(20ms).ok());
  EXPECT_FALSE(read_result.has_value());
  EXPECT_FALSE(poll_result.has_value());
  WriteString(p.write.get(), "q");
  ASSERT_TRUE(RunUntil([&] { return read_result.has_value() && poll_result.has_value(); }));
  EXPECT_EQ(*read_result, 1);
  EXPECT_TRUE(*poll_result & POLLIN);
}

TEST_P(ReactorTest, ReadAndWriteOnTheSameSocket) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]);
  UniqueFd b(sv[1]);
  char buf[8];
  std::optional<ssize_t> read_result;
  std::optional<ssize_t> write_result;
  reactor_->Read(a.get(), buf, sizeof(buf), [&](ssize_t n) { read_result = n; });
  reactor_->Write(a.get(), "out", 3, [&](ssize_t n) { write_result = n; });
  ASSERT_TRUE(RunUntil([&] { return write_result.has_value(); }));
  EXPECT_EQ(*write_result, 3);
  EXPECT_FALSE(read_result.has_value());
  WriteString(b.get(), "in");
  ASSERT_TRUE(RunUntil([&] { return read_result.has_value(); }));
  EXPECT_EQ(*read_result, 2);
}

TEST_P(ReactorTest, PollOutWaitsForRoomInAFullPipe) {
  Pipe p = MakePipe();
  // Fill the pipe to the brim: writable again only once a reader makes room.
  std::string chunk(4096, 'f');
  while (::write(p.write.get(), chunk.data(), chunk.size()) > 0) {
  }
  ASSERT_EQ(errno, EAGAIN);
  std::optional<int> revents;
  reactor_->PollOut(p.write.get(), [&](int r) { revents = r; });
  ASSERT_TRUE(reactor_->RunOnce(30ms).ok());
  EXPECT_FALSE(revents.has_value()) << "a full pipe reported writable";
  std::vector<char> sink(1 << 20);
  while (::read(p.read.get(), sink.data(), sink.size()) > 0) {
  }
  ASSERT_TRUE(RunUntil([&] { return revents.has_value(); }));
  EXPECT_TRUE(*revents & POLLOUT);
}

TEST_P(ReactorTest, PollInOnAPidfdCompletesWhenTheChildExits) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::usleep(50'000);
    ::_exit(7);
  }
  UniqueFd pidfd(sys::PidfdOpen(pid, 0));
  ASSERT_TRUE(pidfd.valid()) << strerror(errno);
  std::optional<int> revents;
  reactor_->PollIn(pidfd.get(), [&](int r) { revents = r; });
  EXPECT_TRUE(RunUntil([&] { return revents.has_value(); }));
  EXPECT_TRUE(revents.value_or(0) & POLLIN);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

TEST_P(ReactorTest, TimersFireInOrderAndNotEarly) {
  struct Fired {
    int ms;
    int result;
    Clock::duration after;
  };
  std::vector<Fired> fired;
  auto start = Clock::now();
  for (int ms : {60, 20, 40, 0}) {
    reactor_->Timer(std::chrono::milliseconds(ms), [&, ms](int r) {
      fired.push_back({ms, r, Clock::now() - start});
    });
  }
  EXPECT_EQ(reactor_->pending(), 4u);
  ASSERT_TRUE(RunUntil([&] { return fired.size() == 4; }));
  ASSERT_EQ(fired.size(), 4u);
  int expected_order[] = {0, 20, 40, 60};
  for (size_t i = 0; i < fired.size(); ++i) {
    EXPECT_EQ(fired[i].ms, expected_order[i]);
    EXPECT_EQ(fired[i].result, 0);
    EXPECT_GE(fired[i].after, std::chrono::milliseconds(fired[i].ms)) << "fired early";
    EXPECT_LT(fired[i].after, std::chrono::milliseconds(fired[i].ms) + kSlack);
  }
  EXPECT_EQ(reactor_->pending(), 0u);
}

TEST_P(ReactorTest, CancelledTimerReportsEcanceledAndOthersStillFire) {
  std::vector<std::pair<int, int>> fired;  // (which, result)
  OpId soon = reactor_->Timer(30ms, [&](int r) { fired.emplace_back(1, r); });
  OpId later = reactor_->Timer(10s, [&](int r) { fired.emplace_back(2, r); });
  reactor_->Timer(60ms, [&](int r) { fired.emplace_back(3, r); });
  reactor_->Cancel(soon);
  ASSERT_TRUE(RunUntil([&] { return fired.size() == 1; }));
  EXPECT_EQ(fired[0], std::make_pair(1, -ECANCELED));
  ASSERT_TRUE(RunUntil([&] { return fired.size() == 2; }));
  EXPECT_EQ(fired[1], std::make_pair(3, 0));
  reactor_->Cancel(later);
  ASSERT_TRUE(RunUntil([&] { return fired.size() == 3; }, 2s))
      << "the 10 s timer was not cancelled";
  EXPECT_EQ(fired[2], std::make_pair(2, -ECANCELED));
  EXPECT_EQ(reactor_->pending(), 0u);
}

TEST_P(ReactorTest, CallbacksStartNewOps) {
  Pipe p = MakePipe();
  char buf[16];
  std::string received;
  std::function<void(ssize_t)> on_read = [&](ssize_t n) {
    if (n <= 0) return;
    received.append(buf, static_cast<size_t>(n));
    if (received.size() < 6) reactor_->Read(p.read.get(), buf, 3, on_read);
  };
  reactor_->Read(p.read.get(), buf, 3, on_read);
  int ticks = 0;
  std::function<void(int)> on_tick = [&](int) {
    if (++ticks < 3) reactor_->Timer(5ms, on_tick);
    WriteString(p.write.get(), "ab");
  };
  reactor_->Timer(5ms, on_tick);
  ASSERT_TRUE(RunUntil([&] { return received.size() >= 6 && ticks == 3; }));
  EXPECT_EQ(received, "ababab");
  EXPECT_EQ(reactor_->pending(), 0u);
}

TEST_P(ReactorTest, CancelFromInsideACallback) {
  Pipe p = MakePipe();
  char buf[8];
  int read_calls = 0;
  ssize_t read_result = 0;
  OpId read_id = reactor_->Read(p.read.get(), buf, sizeof(buf), [&](ssize_t n) {
    ++read_calls;
    read_result = n;
  });
  int timer_calls = 0;
  OpId timer_id = 0;
  timer_id = reactor_->Timer(10ms, [&](int r) {
    ++timer_calls;
    EXPECT_EQ(r, 0);
    reactor_->Cancel(read_id);
    reactor_->Cancel(timer_id);  // itself: already completed, so nothing happens
  });
  ASSERT_TRUE(RunUntil([&] { return read_calls > 0; }));
  ASSERT_TRUE(reactor_->RunOnce(20ms).ok());
  EXPECT_EQ(timer_calls, 1);
  EXPECT_EQ(read_calls, 1);
  EXPECT_EQ(read_result, -ECANCELED);
  EXPECT_EQ(reactor_->pending(), 0u);
}

TEST_P(ReactorTest, CancelOfAnOpCompletedInTheSameBatchRunsItOnce) {
  // Both timers and both reads complete together; whichever callback runs first cancels the
  // others. Each must still run exactly once: with its result (it completed first) or
  // -ECANCELED.
  std::array<Pipe, 2> pipes = {MakePipe(), MakePipe()};
  std::array<char, 4> bufs[2];
  std::array<OpId, 4> ids{};
  std::array<int, 4> calls{};
  std::array<ssize_t, 4> results{};
  auto cancel_others = [&](size_t self) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i != self) reactor_->Cancel(ids[i]);
    }
  };
  for (size_t i = 0; i < 2; ++i) {
    ids[i] = reactor_->Timer(0ns, [&, i](int r) {
      ++calls[i];
      results[i] = r;
      cancel_others(i);
    });
    ids[2 + i] =
        reactor_->Read(pipes[i].read.get(), bufs[i].data(), bufs[i].size(), [&, i](ssize_t n) {
          ++calls[2 + i];
          results[2 + i] = n;
          cancel_others(2 + i);
        });
    WriteString(pipes[i].write.get(), "d");
  }
  ASSERT_TRUE(RunUntil([&] { return reactor_->pending() == 0; }));
  ASSERT_TRUE(reactor_->RunOnce(20ms).ok());
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(calls[i], 1) << "op " << i;
    ssize_t ok_result = i < 2 ? 0 : 1;
    EXPECT_TRUE(results[i] == ok_result || results[i] == -ECANCELED)
        << "op " << i << ": " << results[i];
  }
}

TEST_P(ReactorTest, PostFromAnotherThreadWakesRunOnce) {
  bool ran = false;
  std::thread poster([&] {
    std::this_thread::sleep_for(50ms);
    reactor_->Post([&] { ran = true; });
  });
  auto start = Clock::now();
  // No timeout and no operations: only the Post can end this wait.
  auto status = reactor_->RunOnce(std::nullopt);
  poster.join();
  ASSERT_TRUE(status.ok()) << status.error().message();
  EXPECT_TRUE(ran);
  EXPECT_GE(Clock::now() - start, 40ms);
  // Many posts from several threads: all run, in order per thread.
  std::vector<int> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) reactor_->Post([&, t, i] { seen.push_back(t * 1000 + i); });
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(RunUntil([&] { return seen.size() == 400; }));
  std::array<int, 4> last = {-1, -1, -1, -1};
  for (int v : seen) {
    EXPECT_GT(v % 1000, last[v / 1000]);
    last[v / 1000] = v % 1000;
  }
}

TEST_P(ReactorTest, TwoHundredConcurrentPipes) {
  constexpr int kPipes = 200;
  std::vector<Pipe> pipes;
  std::vector<std::array<char, 16>> bufs(kPipes);
  std::vector<ssize_t> results(kPipes, -1);
  int done = 0;
  for (int i = 0; i < kPipes; ++i) {
    pipes.push_back(MakePipe());
    reactor_->Read(pipes[i].read.get(), bufs[i].data(), bufs[i].size(), [&, i](ssize_t n) {
      results[i] = n;
      ++done;
    });
  }
  EXPECT_EQ(reactor_->pending(), static_cast<size_t>(kPipes));
  ASSERT_TRUE(reactor_->RunOnce(10ms).ok());
  EXPECT_EQ(done, 0);
  for (int i = kPipes - 1; i >= 0; --i) WriteString(pipes[i].write.get(), std::to_string(i));
  ASSERT_TRUE(RunUntil([&] { return done == kPipes; }));
  for (int i = 0; i < kPipes; ++i) {
    ASSERT_GT(results[i], 0);
    EXPECT_EQ(std::string(bufs[i].data(), results[i]), std::to_string(i));
  }
  EXPECT_EQ(reactor_->pending(), 0u);
}

TEST_P(ReactorTest, PendingCountsOpsUntilTheirCallbacksRun) {
  Pipe p = MakePipe();
  char buf[4];
  EXPECT_EQ(reactor_->pending(), 0u);
  OpId r = reactor_->Read(p.read.get(), buf, sizeof(buf), [](ssize_t) {});
  reactor_->PollIn(p.read.get(), [](int) {});
  bool timer_done = false;
  reactor_->Timer(1ms, [&](int) { timer_done = true; });
  EXPECT_EQ(reactor_->pending(), 3u);
  ASSERT_TRUE(RunUntil([&] { return timer_done; }));
  EXPECT_EQ(reactor_->pending(), 2u);
  reactor_->Cancel(r);
  EXPECT_EQ(reactor_->pending(), 2u) << "a cancelled op is pending until its callback ran";
  ASSERT_TRUE(RunUntil([&] { return reactor_->pending() == 1; }));
  WriteString(p.write.get(), "x");
  ASSERT_TRUE(RunUntil([&] { return reactor_->pending() == 0; }));
}

TEST_P(ReactorTest, RunOnceWithNothingToDoReturnsAfterTheTimeout) {
  for (auto timeout : {0ms, 50ms}) {
    auto start = Clock::now();
    ASSERT_TRUE(reactor_->RunOnce(timeout).ok());
    auto took = Clock::now() - start;
    EXPECT_GE(took, timeout);
    EXPECT_LT(took, timeout + kSlack);
  }
  // An op that is not ready does not end the wait early either (no busy loop on it).
  Pipe p = MakePipe();
  char buf[4];
  reactor_->Read(p.read.get(), buf, sizeof(buf), [](ssize_t) {});
  auto start = Clock::now();
  ASSERT_TRUE(reactor_->RunOnce(50ms).ok());
  EXPECT_GE(Clock::now() - start, 50ms);
}

TEST_P(ReactorTest, DestroyingTheReactorWithPendingOpsRunsNoCallback) {
  Pipe p = MakePipe();
  char buf[4];
  bool ran = false;
  reactor_->Read(p.read.get(), buf, sizeof(buf), [&](ssize_t) { ran = true; });
  reactor_->Timer(10s, [&](int) { ran = true; });
  ASSERT_TRUE(reactor_->RunOnce(5ms).ok());
  reactor_.reset();
  WriteString(p.write.get(), "late");
  EXPECT_FALSE(ran);
  EXPECT_EQ(::read(p.read.get(), buf, sizeof(buf)), 4) << "the cancelled read took data";
}

INSTANTIATE_TEST_SUITE_P(Backends, ReactorTest,
                         ::testing::Values(Reactor::Backend::kIoUring, Reactor::Backend::kEpoll),
                         [](const ::testing::TestParamInfo<Reactor::Backend>& param_info) {
                           return std::string(
                               BackendName(param_info.param) == "io_uring" ? "IoUring" : "Epoll");
                         });

// NSBOX_REACTOR forces a backend so the whole suite can run on each; restores the variable.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(CreateReactor, EnvironmentForcesEpoll) {
  ScopedEnv env("NSBOX_REACTOR", "epoll");
  auto r = CreateReactor();
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)->backend(), Reactor::Backend::kEpoll);
}

TEST(CreateReactor, EnvironmentForcesIoUringOrSaysWhyNot) {
  ScopedEnv env("NSBOX_REACTOR", "io_uring");
  auto r = CreateReactor();
  if (!CreateReactor(Reactor::Backend::kIoUring).ok()) {
    ASSERT_FALSE(r.ok()) << "forcing an unavailable io_uring must fail, not fall back";
    EXPECT_NE(r.error().message().find("io_uring"), std::string::npos) << r.error().message();
    GTEST_SKIP() << "SKIPPED LOUDLY: io_uring unavailable: " << r.error().message();
  }
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)->backend(), Reactor::Backend::kIoUring);
}

TEST(CreateReactor, BogusEnvironmentValueIsAnError) {
  ScopedEnv env("NSBOX_REACTOR", "kqueue");
  auto r = CreateReactor();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("NSBOX_REACTOR=kqueue"), std::string::npos)
      << r.error().message();
}

TEST(CreateReactor, DefaultPrefersIoUring) {
  ScopedEnv env("NSBOX_REACTOR", "");
  auto r = CreateReactor();
  ASSERT_TRUE(r.ok()) << r.error().message();
  bool uring = CreateReactor(Reactor::Backend::kIoUring).ok();
  EXPECT_EQ((*r)->backend(), uring ? Reactor::Backend::kIoUring : Reactor::Backend::kEpoll);
}

TEST(BackendName, NamesMatchTheEnvironmentValues) {
  EXPECT_EQ(BackendName(Reactor::Backend::kIoUring), "io_uring");
  EXPECT_EQ(BackendName(Reactor::Backend::kEpoll), "epoll");
}

}  // namespace
}  // namespace nsbox::exec

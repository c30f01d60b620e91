// runtime/listener_probe.h: what a new daemon finds on the address it wants, over real sockets of
// this process's (a listener that is absent, one that never accepts, one whose backlog is full,
// one that answers HTTP and one that answers something else).

#include "runtime/listener_probe.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/unique_fd.h"

namespace nsbox::runtime {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kWait(100);

class ListenerProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nsbox-probe-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << strerror(errno);
    dir_ = tmpl;
    path_ = dir_ + "/s.sock";
  }
  void TearDown() override {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }

  // A Unix socket bound at path_; listening with `backlog` unless it is negative.
  UniqueFd BindUnix(int backlog) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    EXPECT_TRUE(fd.valid()) << strerror(errno);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    ::memcpy(addr.sun_path, path_.data(), path_.size());
    // SAFETY: sockaddr_un is a sockaddr for bind(2); the size passed is its own.
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0)
        << strerror(errno);
    if (backlog >= 0) {
      EXPECT_EQ(::listen(fd.get(), backlog), 0) << strerror(errno);
    }
    return fd;
  }

  // Accepts one connection on `listener` and writes `answer` once the request is read.
  static std::thread AnswerOnce(int listener, std::string answer) {
    return std::thread([listener, answer] {
      UniqueFd c(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
      if (!c.valid()) return;
      char buf[512];
      (void)::recv(c.get(), buf, sizeof buf, 0);
      (void)::send(c.get(), answer.data(), answer.size(), MSG_NOSIGNAL);
    });
  }

  std::string dir_;
  std::string path_;
};

TEST_F(ListenerProbeTest, NoSocketOrNoListenerIsNothing) {
  auto none = ProbeUnixListener(path_, kWait);
  ASSERT_TRUE(none.ok()) << none.error().message();
  EXPECT_EQ(*none, ListenerFound::kNothing);
  UniqueFd bound = BindUnix(-1);  // a dead daemon's socket file: bound, nobody listening
  auto dead = ProbeUnixListener(path_, kWait);
  ASSERT_TRUE(dead.ok()) << dead.error().message();
  EXPECT_EQ(*dead, ListenerFound::kNothing);
}

// A listener that never accepts (a dead daemon's socket still held by a jail it was cloning) is
// there but silent; one that answers HTTP is a live server (the control); one that answers
// something else is not.
TEST_F(ListenerProbeTest, SilentAnsweringAndOtherListeners) {
  UniqueFd listener = BindUnix(16);
  auto silent = ProbeUnixListener(path_, kWait);
  ASSERT_TRUE(silent.ok()) << silent.error().message();
  EXPECT_EQ(*silent, ListenerFound::kSilent);

  // The silent probe's request is still in the backlog: a listener of its own answers.
  listener = UniqueFd();
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  listener = BindUnix(16);
  std::thread http = AnswerOnce(listener.get(), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  auto answers = ProbeUnixListener(path_, milliseconds(5000));
  http.join();
  ASSERT_TRUE(answers.ok()) << answers.error().message();
  EXPECT_EQ(*answers, ListenerFound::kAnswers);

  std::thread other = AnswerOnce(listener.get(), "SSH-2.0-OpenSSH_9.2\r\n");
  auto not_http = ProbeUnixListener(path_, kWait);
  other.join();
  ASSERT_TRUE(not_http.ok()) << not_http.error().message();
  EXPECT_EQ(*not_http, ListenerFound::kSilent);
}

// A backlog that is full makes a blocking connect(2) wait until the listener accepts, which a
// dead daemon's copy never does: the probe is not blocked by it.
TEST_F(ListenerProbeTest, AFullBacklogIsSilentNotAHang) {
  UniqueFd listener = BindUnix(0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ::memcpy(addr.sun_path, path_.data(), path_.size());
  std::vector<UniqueFd> queued;
  bool backlog_full = false;
  for (int i = 0; i < 64 && !backlog_full; ++i) {
    UniqueFd c(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    // SAFETY: sockaddr_un is a sockaddr for connect(2); the size passed is its own.
    if (::connect(c.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ASSERT_EQ(errno, EAGAIN) << strerror(errno);
      backlog_full = true;
    }
    queued.push_back(std::move(c));
  }
  ASSERT_TRUE(backlog_full) << "the backlog took " << queued.size() << " connections";
  auto full = ProbeUnixListener(path_, kWait);
  ASSERT_TRUE(full.ok()) << full.error().message();
  EXPECT_EQ(*full, ListenerFound::kSilent);
}

TEST_F(ListenerProbeTest, TcpPortsAnsweringOrClosed) {
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(listener.valid());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  // SAFETY: sockaddr_in is a sockaddr for bind(2)/getsockname(2); sizes are its own.
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(::listen(listener.get(), 16), 0);
  // Asked as 0.0.0.0 (a --listen on every address): probed on the loopback.
  sockaddr_in any = addr;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  std::thread http = AnswerOnce(listener.get(), "HTTP/1.1 401 Unauthorized\r\n\r\n");
  // SAFETY: sockaddr_in is a sockaddr; the size passed is its own.
  auto answers =
      ProbeTcpListener(reinterpret_cast<sockaddr*>(&any), sizeof any, milliseconds(5000));
  http.join();
  ASSERT_TRUE(answers.ok()) << answers.error().message();
  EXPECT_EQ(*answers, ListenerFound::kAnswers);
  listener = UniqueFd();
  // SAFETY: as above.
  auto closed = ProbeTcpListener(reinterpret_cast<sockaddr*>(&addr), sizeof addr, kWait);
  ASSERT_TRUE(closed.ok()) << closed.error().message();
  EXPECT_EQ(*closed, ListenerFound::kNothing);
}

}  // namespace
}  // namespace nsbox::runtime

// A daemon's listeners when another process holds them (docs/daemon.md "State on disk"): a
// predecessor's copy that goes away at once is waited for, a daemon that answers is refused at
// once, something that stays is refused after the wait.

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

using std::chrono::milliseconds;

// A daemon SIGKILLed while it cloned a jail leaves the clone with copies of its listening
// sockets for a moment, until the clone dies too: the daemon restarted at once found its socket
// still answering ("another nsboxd is already listening") or its port in use. A listener that goes
// away within a second is now waited for; one that stays is refused as before.
class PredecessorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto reason = E2eUnavailable()) GTEST_SKIP() << "NOT RUN: " << *reason;
  }

  // A listening socket, closed by a thread after `after` (joined by the destructor).
  struct Listener {
    int fd = -1;
    std::thread closer;
    ~Listener() {
      if (closer.joinable()) closer.join();
      if (fd >= 0) ::close(fd);
    }
    void CloseAfter(std::chrono::milliseconds after) {
      closer = std::thread([this, after] {
        std::this_thread::sleep_for(after);
        ::close(fd);
        fd = -1;
      });
    }
  };

  static void ListenUnix(const std::string& path, Listener* l) {
    l->fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(l->fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    ASSERT_LT(path.size(), sizeof addr.sun_path);
    std::copy(path.begin(), path.end(), addr.sun_path);
    ASSERT_EQ(::bind(l->fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << strerror(errno);
    ASSERT_EQ(::listen(l->fd, 16), 0) << strerror(errno);
  }

  // On a free port of 127.0.0.1, set in *port.
  static void ListenTcp(Listener* l, uint16_t* port) {
    *port = FreeTcpPort();
    ASSERT_NE(*port, 0);
    l->fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(l->fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(*port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(l->fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << strerror(errno);
    ASSERT_EQ(::listen(l->fd, 16), 0) << strerror(errno);
  }

  static std::string TokenFile(const Daemon& d) {
    const std::string file = d.dir() + "/token";
    FILE* f = std::fopen(file.c_str(), "w");
    std::fputs("0123456789abcdef0123456789abcdef", f);
    std::fclose(f);
    ::chmod(file.c_str(), 0600);
    return file;
  }
};

TEST_F(PredecessorTest, ASocketWhoseListenerGoesAwayAtOnceIsTakenOver) {
  Daemon d;
  Listener old;
  ASSERT_NO_FATAL_FAILURE(ListenUnix(d.socket_path(), &old));
  old.CloseAfter(milliseconds(300));
  ASSERT_TRUE(d.Start()) << d.error();
  Client c(d.endpoint());
  EXPECT_EQ(c.Get("/v1/health").status, 200);
}

TEST_F(PredecessorTest, ASocketThatKeepsAnsweringIsRefused) {
  Daemon first;
  ASSERT_TRUE(first.Start()) << first.error();
  Daemon second;
  std::string output;
  const int code = RunProgram(
      {kNsboxBin, "serve", "--socket", first.socket_path(), "--state-dir", second.state_dir()},
      second.dir() + "/second.log", &output);
  EXPECT_NE(code, 0) << output;
  EXPECT_NE(output.find("another nsboxd is already listening on " + first.socket_path()),
            std::string::npos)
      << output;
  Client c(first.endpoint());
  EXPECT_EQ(c.Get("/v1/health").status, 200) << "the first daemon lost its socket";
}

TEST_F(PredecessorTest, APortWhoseListenerGoesAwayAtOnceIsTakenOver) {
  Daemon d;
  Listener old;
  uint16_t port = 0;
  ASSERT_NO_FATAL_FAILURE(ListenTcp(&old, &port));
  old.CloseAfter(milliseconds(300));
  ASSERT_TRUE(
      d.Start({"--listen", "127.0.0.1:" + std::to_string(port), "--token-file", TokenFile(d)}))
      << d.error();
  Client c(Endpoint::Tcp("127.0.0.1", port));
  EXPECT_EQ(c.Get("/v1/health").status, 401) << "not nsboxd on the port";
}

TEST_F(PredecessorTest, APortThatStaysInUseIsRefused) {
  Daemon d;
  Listener other;
  uint16_t port = 0;
  ASSERT_NO_FATAL_FAILURE(ListenTcp(&other, &port));
  const int code =
      d.RunToExit({"--listen", "127.0.0.1:" + std::to_string(port), "--token-file", TokenFile(d)});
  EXPECT_NE(code, 0);
  EXPECT_NE(code, -1) << "it kept running";
  EXPECT_NE(
      d.Log().find("listen on 127.0.0.1:" + std::to_string(port) + ": Address already in use"),
      std::string::npos)
      << d.Log();
}

// A port where a daemon answers is refused at once, saying so, without the second's wait for a
// predecessor's copy (the message is the answering path's); the first daemon still serves on it.
TEST_F(PredecessorTest, APortWhereADaemonAnswersIsRefusedSayingSo) {
  Daemon first;
  const uint16_t port = FreeTcpPort();
  ASSERT_NE(port, 0);
  const std::string listen = "127.0.0.1:" + std::to_string(port);
  ASSERT_TRUE(first.Start({"--listen", listen, "--token-file", TokenFile(first)})) << first.error();
  Daemon second;
  const int code = second.RunToExit({"--listen", listen, "--token-file", TokenFile(second)});
  EXPECT_NE(code, 0);
  EXPECT_NE(code, -1) << "it kept running";
  EXPECT_NE(second.Log().find("listen on " + listen +
                              ": Address already in use: an HTTP server (another nsboxd?) answers "
                              "there"),
            std::string::npos)
      << second.Log();
  struct stat st {};
  EXPECT_NE(::stat(second.state_dir().c_str(), &st), 0) << "the state directory was made";
  Client c(Endpoint::Tcp("127.0.0.1", port));
  EXPECT_EQ(c.Get("/v1/health").status, 401) << "the first daemon lost its port";
  EXPECT_TRUE(first.Stop()) << first.error();
}

}  // namespace
}  // namespace nsbox::e2e

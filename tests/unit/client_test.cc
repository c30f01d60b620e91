// fs::InitClient's framing over a real socketpair, the test writing nsbox-init's side: frames cut
// anywhere and frames larger than the read buffer arrive whole, with the client's own reader
// thread and with the caller's loop reading (CallerReads). nsbox-init itself never sends a frame
// over 1 MiB; the client must still take one up to the protocol's limit.

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "fs/client.h"
#include "fs/protocol.h"

namespace nsbox::fs {
namespace {

using std::chrono::milliseconds;

struct Pair {
  UniqueFd host;
  UniqueFd init;
};

Pair SocketPair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Writes `bytes` in pieces of `piece` bytes, with a pause between them so that the reader sees
// them apart. False when the socket was shut down under it.
bool WriteInPieces(int fd, const std::string& bytes, size_t piece) {
  for (size_t off = 0; off < bytes.size(); off += piece) {
    size_t n = std::min(piece, bytes.size() - off);
    size_t done = 0;
    while (done < n) {
      ssize_t w = ::send(fd, bytes.data() + off + done, n - done, MSG_NOSIGNAL);
      if (w <= 0) return false;
      done += static_cast<size_t>(w);
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

// Three frames: a small one, one of 3 MiB (over the 1 MiB read buffer) and a small one again,
// as one byte stream.
struct Frames {
  std::string big = std::string(3 << 20, '\0');
  std::string stream;
  Frames() {
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31 + i / 7919);
    stream = proto::EncodeFrame(proto::Type::kPong, 1, "first") +
             proto::EncodeFrame(proto::Type::kPong, 2, big) +
             proto::EncodeFrame(proto::Type::kPong, 3, "last");
  }
};

// Sends the frames from nsbox-init's end (`init`) and checks that the client got all three.
void ExpectAllThree(InitClient& client, const Frames& frames, int init) {
  auto first = client.ExpectReply(1);
  auto big = client.ExpectReply(2);
  auto last = client.ExpectReply(3);
  std::thread writer([&] { WriteInPieces(init, frames.stream, 100'003); });
  auto r1 = first(milliseconds(5000));
  auto r2 = big(milliseconds(5000));
  auto r3 = last(milliseconds(5000));
  ::shutdown(init, SHUT_RDWR);  // a writer stuck on a client that stopped reading gives up
  writer.join();
  ASSERT_TRUE(r1.ok() && r2.ok() && r3.ok()) << "a frame did not arrive";
  EXPECT_EQ(r1.value().payload, "first");
  EXPECT_EQ(r2.value().payload.size(), frames.big.size());
  EXPECT_TRUE(r2.value().payload == frames.big) << "the 3 MiB frame arrived changed";
  EXPECT_EQ(r3.value().payload, "last");
}

TEST(InitClient, OwnReaderTakesFramesCutAnywhereAndLargerThanItsBuffer) {
  Frames frames;
  Pair p = SocketPair();
  InitClient client(std::move(p.host));
  ExpectAllThree(client, frames, p.init.get());
}

TEST(InitClient, CallerReadsTakesFramesCutAnywhereAndLargerThanItsBuffer) {
  Frames frames;
  Pair p = SocketPair();
  auto client = std::make_shared<InitClient>(std::move(p.host), InitClient::CallerReads{});
  ::fcntl(client->fd(), F_SETFL, ::fcntl(client->fd(), F_GETFL) | O_NONBLOCK);
  std::atomic<bool> closed{false};
  std::atomic<int> calls{0};
  std::thread loop([&] {
    for (;;) {
      struct pollfd pfd = {client->fd(), POLLIN, 0};
      if (::poll(&pfd, 1, -1) < 0) continue;
      ++calls;
      if (!client->ReadReady()) {
        closed = true;
        return;
      }
    }
  });
  ExpectAllThree(*client, frames, p.init.get());
  // Many reads, several ReadReady calls: the frames were put together across them.
  EXPECT_GT(calls.load(), 1);
  p.init.reset();  // nsbox-init "exits" (its end was shut down already)
  loop.join();
  EXPECT_TRUE(closed);
  EXPECT_FALSE(client->connected());
}

TEST(InitClient, CallerReadsAnswersPendingCallsWhenDestroyedUnread) {
  Pair p = SocketPair();
  auto client = std::make_unique<InitClient>(std::move(p.host), InitClient::CallerReads{});
  auto wait = client->ExpectReply(7);
  client.reset();
  auto r = wait(milliseconds(1000));
  ASSERT_TRUE(r.ok()) << "no answer at all";
  EXPECT_EQ(ReplyError(r.value(), "pong").err, EPIPE);
}

}  // namespace
}  // namespace nsbox::fs

// fs::InitClient's framing over a real socketpair, the test writing nsbox-init's side: frames cut
// anywhere and frames larger than the read buffer arrive whole, with the client's own reader
// thread and with the caller's loop reading (CallerReads). nsbox-init itself never sends a frame
// over 1 MiB; the client must still take one up to the protocol's limit.

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
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

// Reads one whole frame from nsbox-init's end: its header.
proto::Header ReadRequest(int init) {
  std::string bytes;
  char buf[4096];
  while (bytes.size() < proto::kHeaderSize ||
         bytes.size() < proto::kHeaderSize + proto::DecodeHeader(bytes.data()).size) {
    ssize_t n = ::read(init, buf, sizeof buf);
    if (n <= 0) {
      ADD_FAILURE() << "the request did not come";
      return {};
    }
    bytes.append(buf, static_cast<size_t>(n));
  }
  return proto::DecodeHeader(bytes.data());
}

// Sends `frame` from nsbox-init's end with `fds` attached to its first byte, as nsbox-init does
// (with one).
void SendWithFds(int init, const std::string& frame, const std::vector<int>& fds) {
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()), 0);
  struct iovec iov {
    const_cast<char*>(frame.data()), frame.size()
  };
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  ASSERT_EQ(::sendmsg(init, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
}

// An OpenRead of a large file, answered from nsbox-init's end with `fds` attached to the answer
// (nsbox-init attaches one: the file it opened).
FsOutcome<InitClient::OpenedRead> OpenReadAnsweredWith(InitClient& client, int init,
                                                       const std::vector<int>& fds) {
  FsOutcome<InitClient::OpenedRead> opened = FsError{};
  std::thread opener([&] { opened = client.OpenRead("/big"); });
  proto::Header request = ReadRequest(init);
  EXPECT_EQ(request.type, proto::Type::kReadFile);
  SendWithFds(init, proto::EncodeFrame(proto::Type::kFileFd, request.tag, proto::EncodeU64(0)),
              fds);
  opener.join();
  return opened;
}

// nsbox-init ends with a request of the host's unread: the host's next read of the channel fails
// with ECONNRESET. The kernel then leaves the read's control buffer as it was, and the client's
// reader thread reads the channel from the same stack slot each time, where the fd of the read
// before is still written. The client must take no fd from a read that failed: it would close a
// number that, by then, is a file of someone else's.
TEST(InitClient, AFailedReadTakesNoFdAnEarlierReadLeftInItsBuffer) {
  Pair p = SocketPair();
  int reused = -1;
  UniqueFd mine;
  {
    InitClient client(std::move(p.host));
    UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(null.valid());
    // A large file's answer carries an fd, the host's to read and close.
    FsOutcome<InitClient::OpenedRead> opened =
        OpenReadAnsweredWith(client, p.init.get(), {null.get()});
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    ASSERT_TRUE(opened.value().fd.valid());
    reused = opened.value().fd.get();
    opened.value().fd.reset();  // read and closed: the number is free again
    // The test's own file takes that number.
    mine.reset(::open("/dev/zero", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(mine.valid());
    if (mine.get() != reused) {
      ASSERT_EQ(::dup3(mine.get(), reused, O_CLOEXEC), reused);
      mine.reset(reused);
    }
    // A request nsbox-init never reads, then nsbox-init ends.
    FsOutcome<Unit> pinged = Unit{};
    std::thread pinger([&] { pinged = client.Ping(); });
    struct pollfd pfd = {p.init.get(), POLLIN, 0};
    EXPECT_EQ(::poll(&pfd, 1, 5000), 1) << "the ping did not come";
    p.init.reset();
    pinger.join();
    ASSERT_FALSE(pinged.ok()) << "control: the ping failed with the channel";
    EXPECT_NE(pinged.error().message.find("ECONNRESET"), std::string::npos)
        << "control: the read failed, not a clean end: " << pinged.error().message;
  }  // the client and what it holds are gone
  EXPECT_GE(::fcntl(reused, F_GETFD), 0) << "the client closed fd " << reused << ", not its own";
}

// More fds with one frame than a read of the channel takes (nsbox-init sends one at most): the
// kernel drops the rest (MSG_CTRUNC), which frame an fd belongs to can no longer be told, and the
// client ends the channel rather than hand out the wrong file.
TEST(InitClient, MoreFdsThanOneReadTakesEndTheChannel) {
  Pair p = SocketPair();
  InitClient client(std::move(p.host));
  UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(null.valid());
  FsOutcome<InitClient::OpenedRead> opened =
      OpenReadAnsweredWith(client, p.init.get(), std::vector<int>(17, null.get()));
  ASSERT_FALSE(opened.ok()) << "the answer was taken with one of 17 fds";
  EXPECT_NE(opened.error().message.find("more file descriptors"), std::string::npos)
      << opened.error().message;
  EXPECT_FALSE(client.connected());
}

// A listing in parts (kReaddirPart frames, then kReaddirResult) is gathered whole, in order; a
// part that no directory could hold, or a channel lost half-way, is an error, never a listing
// cut short.
proto::ReaddirReply Names(std::initializer_list<std::string> names) {
  proto::ReaddirReply r;
  for (const auto& n : names) r.entries.push_back({n, 0});
  return r;
}

FsOutcome<proto::ReaddirReply> ReaddirAnsweredWith(
    int init, InitClient& client, const std::vector<std::pair<proto::Type, std::string>>& frames,
    bool then_close = false) {
  FsOutcome<proto::ReaddirReply> listed = FsError{};
  std::thread lister([&] { listed = client.Readdir("/big", false); });
  proto::Header request = ReadRequest(init);
  EXPECT_EQ(request.type, proto::Type::kReaddir);
  std::string bytes;
  for (const auto& [type, payload] : frames)
    bytes += proto::EncodeFrame(type, request.tag, payload);
  EXPECT_TRUE(WriteInPieces(init, bytes, 7));
  if (then_close) ::shutdown(init, SHUT_RDWR);
  lister.join();
  return listed;
}

TEST(InitClient, AListingInPartsIsGatheredWholeAndChecked) {
  {
    Pair p = SocketPair();
    InitClient client(std::move(p.host));
    auto listed =
        ReaddirAnsweredWith(p.init.get(), client,
                            {{proto::Type::kReaddirPart, proto::Encode(Names({"a", "b"}))},
                             {proto::Type::kReaddirPart, proto::Encode(Names({"c"}))},
                             {proto::Type::kReaddirResult, proto::Encode(Names({"d", "e"}))}});
    ASSERT_TRUE(listed.ok()) << listed.error().message;
    std::vector<std::string> got;
    for (const auto& e : listed.value().entries) got.push_back(e.name);
    EXPECT_EQ(got, (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  }
  for (const std::string& bad :
       std::vector<std::string>{"..", ".", "", "a/b", std::string("a\0b", 3)}) {
    Pair p = SocketPair();
    InitClient client(std::move(p.host));
    auto listed =
        ReaddirAnsweredWith(p.init.get(), client,
                            {{proto::Type::kReaddirPart, proto::Encode(Names({"a", bad}))},
                             {proto::Type::kReaddirResult, proto::Encode(Names({"z"}))}});
    ASSERT_FALSE(listed.ok()) << "a part holding '" << bad << "' was taken";
    EXPECT_EQ(listed.error().err, EPROTO) << listed.error().message;
  }
  {
    Pair p = SocketPair();
    InitClient client(std::move(p.host));
    auto listed = ReaddirAnsweredWith(
        p.init.get(), client, {{proto::Type::kReaddirPart, proto::Encode(Names({"a"}))}}, true);
    ASSERT_FALSE(listed.ok()) << "a listing cut short by the channel's end was taken";
    EXPECT_EQ(listed.error().err, EPIPE) << listed.error().message;
  }
}

}  // namespace
}  // namespace nsbox::fs

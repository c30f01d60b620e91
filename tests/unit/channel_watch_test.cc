// runtime/channel_watch with fs::InitClient's holds, over a real socketpair, the test writing
// nsbox-init's side: nsboxd's loop reads a sandbox's control channel, and stops reading it while
// a hold is kept (an exec's log waiting on the disk) until the last hold goes, or the channel
// closes.

#include "runtime/channel_watch.h"

#include <sys/socket.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "fs/client.h"
#include "fs/protocol.h"

namespace nsbox::runtime {
namespace {

using std::chrono::milliseconds;

// Returns once the loop has finished what it was doing (the handler that dispatched the last
// answer has returned, and parked or re-armed the watch): a handler posted now runs after it.
void Sync(boost::asio::io_context& io) {
  std::promise<void> ran;
  boost::asio::post(io, [&] { ran.set_value(); });
  ran.get_future().wait();
}

TEST(ChannelWatch, AHeldChannelWaitsUnreadUntilReleasedOrClosed) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  UniqueFd init(fds[1]);
  auto client = std::make_shared<fs::InitClient>(UniqueFd(fds[0]), fs::InitClient::CallerReads{});
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  ChannelWatch watch(io);
  watch.Watch(client);
  // The loop's thread, stopped and joined however the test ends (a failed ASSERT too).
  struct Loop {
    boost::asio::io_context& io;
    std::thread thread{[this] { io.run(); }};
    ~Loop() {
      io.stop();
      thread.join();
    }
  } loop{io};
  auto send = [&](uint64_t tag) {
    const std::string frame = fs::proto::EncodeFrame(fs::proto::Type::kPong, tag, "x");
    ASSERT_EQ(::send(init.get(), frame.data(), frame.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(frame.size()));
  };

  // A hold, then a frame: the hold takes effect once the loop has read (what that read brought
  // is dispatched), and the loop then parks.
  auto hold_and_read = [&](uint64_t tag) {
    client->HoldReads();
    auto reply = client->ExpectReply(tag);
    send(tag);
    EXPECT_TRUE(reply(milliseconds(5000)).ok());
    Sync(io);
    return client->ReadsParked();
  };
  ASSERT_TRUE(hold_and_read(1));
  // Then nothing is read while it is kept, also with two holds and one of them released.
  client->HoldReads();
  auto second = client->ExpectReply(2);
  send(2);
  EXPECT_FALSE(second(milliseconds(300)).ok()) << "read while held";
  client->ReleaseReads();
  EXPECT_FALSE(second(milliseconds(300)).ok()) << "read while one hold is left";
  EXPECT_TRUE(client->ReadsParked());
  client->ReleaseReads();
  EXPECT_TRUE(second(milliseconds(5000)).ok()) << "not read after the last hold went";
  Sync(io);
  EXPECT_FALSE(client->ReadsParked());
  client->ReleaseReads();  // one more than were kept: nothing happens

  // Held and parked again: closing the channel wakes the loop, which answers what is pending.
  ASSERT_TRUE(hold_and_read(3));
  auto fourth = client->ExpectReply(4);
  client->Close();
  auto r = fourth(milliseconds(5000));
  ASSERT_TRUE(r.ok()) << "a pending call was not answered after Close";
  EXPECT_EQ(fs::ReplyError(r.value(), "pong").err, EPIPE);
}

}  // namespace
}  // namespace nsbox::runtime

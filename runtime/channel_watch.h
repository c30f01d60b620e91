#pragma once

// nsboxd reads every running sandbox's control channel on its event loop: the answers of
// nsbox-init (an exec's start, output and exit, a file's bytes) are dispatched where the HTTP
// side waits for them, with no thread per sandbox and no hand-off between threads.

#include <boost/asio/io_context.hpp>
#include <memory>
#include <mutex>
#include <vector>

#include "fs/client.h"

namespace nsbox::runtime {

class ChannelWatch {
 public:
  explicit ChannelWatch(boost::asio::io_context& io) : io_(io) {}

  // From any thread: the loop reads the client's channel (fs::InitClient::ReadReady) from now
  // on, until it closes. The client was made with fs::InitClient::CallerReads.
  void Watch(std::shared_ptr<fs::InitClient> client);

  // Once the loop has returned for good: every client still open, and every one handed over
  // from now on, reads on a thread of its own, so that calls made after the loop (the final
  // stop of every sandbox) are still answered.
  void LoopEnded();

 private:
  boost::asio::io_context& io_;
  std::mutex mu_;
  bool ended_ = false;
  std::vector<std::weak_ptr<fs::InitClient>> clients_;
};

}  // namespace nsbox::runtime

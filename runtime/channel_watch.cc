#include "runtime/channel_watch.h"

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <utility>

#include "base/log.h"

namespace nsbox::runtime {

namespace {

namespace asio = boost::asio;

// One channel on the loop. The descriptor only watches: the client owns the fd and closes it.
struct Watched {
  Watched(asio::io_context& io, std::shared_ptr<fs::InitClient> c)
      : descriptor(io), client(std::move(c)) {}
  ~Watched() {
    if (descriptor.is_open()) (void)descriptor.release();
  }
  asio::posix::stream_descriptor descriptor;
  std::shared_ptr<fs::InitClient> client;
};

void Arm(std::shared_ptr<Watched> w) {
  asio::posix::stream_descriptor& d = w->descriptor;
  d.async_wait(asio::posix::stream_descriptor::wait_read,
               [w = std::move(w)](const boost::system::error_code& ec) mutable {
                 if (ec) {
                   if (ec != asio::error::operation_aborted) {
                     log::error("watching an nsbox-init control channel: {}", ec.message());
                   }
                   return;
                 }
                 if (!w->client->ReadReady()) return;
                 // Held (an exec's log waits on the disk): watched again on release.
                 auto resume = [w] {
                   asio::post(w->descriptor.get_executor(), [w]() mutable { Arm(std::move(w)); });
                 };
                 if (w->client->ParkReadsIfHeld(std::move(resume))) return;
                 Arm(std::move(w));
               });
}

}  // namespace

void ChannelWatch::Watch(std::shared_ptr<fs::InitClient> client) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) {
      client->ReadOnOwnThread();
      return;
    }
    std::erase_if(clients_, [](const std::weak_ptr<fs::InitClient>& c) { return c.expired(); });
    clients_.push_back(client);
  }
  asio::post(io_, [this, client = std::move(client)]() mutable {
    auto w = std::make_shared<Watched>(io_, std::move(client));
    boost::system::error_code ec;
    w->descriptor.assign(w->client->fd(), ec);
    if (ec) {
      // The loop cannot watch it (epoll refused the fd): a thread reads it instead.
      log::warn("nsbox-init control channel on the event loop: {}; reading it on a thread",
                ec.message());
      w->client->ReadOnOwnThread();
      return;
    }
    Arm(std::move(w));
  });
}

void ChannelWatch::LoopEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = true;
  for (const auto& weak : clients_) {
    if (auto client = weak.lock()) client->ReadOnOwnThread();
  }
  clients_.clear();
}

}  // namespace nsbox::runtime

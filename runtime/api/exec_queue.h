#pragma once

// Exec events on their way from a sandbox's control-channel reader thread to the event loop,
// and the backpressure that keeps what waits bounded.

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nettle/hmac.h>
#include <nettle/sha2.h>

#include "base/base64.h"
#include "base/files.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/utf8.h"
#include "exec/runner.h"
#include "fs/fs_error.h"
#include "fs/path.h"
#include "images/image.h"
#include "images/store.h"
#include "isolate/cgroup.h"
#include "isolate/cgroup_placement.h"
#include "isolate/disk.h"
#include "net/policy.h"
#include "policy/environment.h"
#include "runtime/api/http.h"
#include "runtime/api/json_shapes.h"
#include "runtime/api_client.h"
#include "runtime/api_error.h"
#include "runtime/channel_watch.h"
#include "runtime/exec_events.h"
#include "runtime/exec_session.h"
#include "runtime/image_imports.h"
#include "runtime/listing.h"
#include "runtime/metrics.h"
#include "runtime/netns.h"
#include "runtime/paths.h"
#include "runtime/ports.h"
#include "runtime/registry.h"
#include "runtime/units.h"
#include "runtime/version.h"

namespace nsbox::runtime::api {

// ---- exec events, from the control channel's reader thread to the event loop
// ----

struct ExecEvent {
  enum Kind { kStarted, kOutput, kExit } kind = kOutput;
  uint32_t pid = 0;
  int stream = 1;
  std::string data;
  std::optional<fs::FsOutcome<fs::proto::ExecExit>> exit;
};

// Backpressure on a sandbox's control channel (fs::InitClient::HoldReads): each hold is
// followed by one release. Nothing when the sandbox is gone (its channel with it).
void HoldChannel(const std::weak_ptr<Sandbox>& weak, bool hold);

// An exec's output between the control channel and its log: queued, or taken by its pump and not
// yet appended. Over kHigh bytes the sandbox's channel is held (fs::InitClient::HoldReads) until
// the pump has brought it under kLow: what waits here stays bounded however far the pump falls
// behind (a loop busy elsewhere), since nsbox-init then stops reading the commands' pipes.
class QueuedOutput {
 public:
  static constexpr uint64_t kHigh = 8u << 20;
  static constexpr uint64_t kLow = 2u << 20;

  explicit QueuedOutput(std::weak_ptr<Sandbox> box) : box_(std::move(box)) {}
  ~QueuedOutput() {
    if (held_) HoldChannel(box_, false);
  }
  QueuedOutput(const QueuedOutput&) = delete;
  QueuedOutput& operator=(const QueuedOutput&) = delete;

  // Any thread (the channel is read on threads of the client's own once the loop has ended).
  void Add(uint64_t n) {
    bool hold = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      bytes_ += n;
      hold = !held_ && bytes_ > kHigh;
      held_ = held_ || hold;
    }
    if (hold) HoldChannel(box_, true);
  }
  void Taken(uint64_t n) {
    bool release = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      bytes_ -= std::min(n, bytes_);
      release = held_ && bytes_ <= kLow;
      held_ = held_ && !release;
    }
    if (release) HoldChannel(box_, false);
  }

 private:
  const std::weak_ptr<Sandbox> box_;
  std::mutex mu_;
  uint64_t bytes_ = 0;
  bool held_ = false;
};

// Events pushed from any thread (the control channel's reader, a worker of the pool) and taken
// on the event loop.
template <typename Event>
class LoopQueue : public std::enable_shared_from_this<LoopQueue<Event>> {
 public:
  explicit LoopQueue(asio::any_io_executor ex) : wake_(ex) {}

  // Any thread.
  void Push(Event event) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(std::move(event));
    }
    asio::post(wake_.get_executor(), [self = this->shared_from_this()] { self->wake_.cancel(); });
  }

  // On the loop: the events so far, waiting for at least one. A Push cannot be
  // missed: its cancel() runs on the loop too, so after the check below or
  // while the wait is pending.
  asio::awaitable<std::vector<Event>> Next() {
    for (;;) {
      std::vector<Event> out;  // unlike a deque, allocates nothing while empty
      {
        std::lock_guard<std::mutex> lock(mu_);
        out.swap(events_);
      }
      if (!out.empty()) co_return out;
      wake_.expires_at(Clock::time_point::max());
      (void)co_await wake_.async_wait(kTuple);
    }
  }

 private:
  std::mutex mu_;
  std::vector<Event> events_;
  asio::steady_timer wake_;
};
using ExecQueue = LoopQueue<ExecEvent>;

}  // namespace nsbox::runtime::api

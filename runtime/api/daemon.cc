// The daemon's life: its connections accepted, the idle stop's loop, the shutdown, and the
// ended exec sessions' memory bound.

#include "runtime/api/daemon.h"

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
#include "runtime/api/exec_queue.h"
#include "runtime/api/exec_request.h"
#include "runtime/api/http.h"
#include "runtime/api/json_shapes.h"
#include "runtime/api/proxy_auth.h"
#include "runtime/api/routes.h"
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

void Daemon::KeepEndedRing(const std::shared_ptr<ExecSession>& s) {
  // Those dropped since (their retention over, their sandbox deleted) leave from the front.
  while (!ended_rings_.empty()) {
    auto first = ended_rings_.front().lock();
    if (first != nullptr && first->counted_ring > 0) break;
    ended_rings_.pop_front();
  }
  if (s->dropped() || s->ring_size() == 0) return;
  s->counted_ring = s->ring_size();
  ended_ring_bytes_ += s->counted_ring;
  ended_rings_.push_back(s);
  while (ended_ring_bytes_ > kEndedRingBudget && !ended_rings_.empty()) {
    auto first = ended_rings_.front().lock();
    ended_rings_.pop_front();
    if (first == nullptr || first->counted_ring == 0) continue;
    ForgetRing(*first);
    first->RetireRing();
  }
}

void UnlinkLogged(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    log::warn("{}", Error::Sys("unlink", path, errno).message());
  }
}

asio::awaitable<void> Daemon::RemoveFile(std::string path) {
  auto work = [path] {
    UnlinkLogged(path);
    return true;
  };
  co_await Blocking(std::move(work));
}

asio::awaitable<void> Daemon::AcceptLoop(Acceptor& acceptor, bool tcp) {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(kTuple);
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
    if (ec) {
      // EMFILE and friends: say so and breathe, rather than spin.
      log::error("accept: {}", ec.message());
      asio::steady_timer pause(io_, std::chrono::milliseconds(100));
      (void)co_await pause.async_wait(kTuple);
      continue;
    }
    if (tcp && *unauthenticated_tcp_ >= kMaxUnauthenticatedTcp) {
      // A flood of connections without the token: the newest goes at once. Said once a minute.
      if (Clock::now() - refused_logged_ > std::chrono::minutes(1)) {
        refused_logged_ = Clock::now();
        log::warn(
            "{} TCP connections have not shown the token yet; closing new ones until "
            "fewer wait",
            *unauthenticated_tcp_);
      }
      boost::system::error_code ignored;
      socket.close(ignored);
      continue;
    }
    if (tcp) ++*unauthenticated_tcp_;  // until the session's PendingAuth has passed
    asio::co_spawn(io_, Session(std::move(socket), tcp), asio::detached);
  }
}

void Daemon::ArmIdleStops() {
  if (idle_stops_armed_ || shutting_down_) return;
  idle_stops_armed_ = true;
  asio::co_spawn(io_, IdleStops(), [this](const std::exception_ptr& failed) {
    if (failed == nullptr) return;
    idle_stops_armed_ = false;  // the next PUT with idleStopMs starts it again
    try {
      std::rethrow_exception(failed);
    } catch (const std::exception& e) {
      log::error("the idle stop's loop failed: {}", e.what());
    }
  });
}

asio::awaitable<void> Daemon::IdleStops() {
  Clock::duration wait = kIdleCheckPeriod;
  for (;;) {
    asio::steady_timer tick(io_, wait);
    (void)co_await tick.async_wait(kTuple);
    if (shutting_down_) break;
    // From the look at the sandboxes to the decision to end, nothing waits: a PUT that makes a
    // sandbox with idleStopMs either is seen here or finds this loop ended and starts it again.
    const Clock::time_point now = Clock::now();
    Clock::time_point next = now + kIdleCheckPeriod;
    bool any = false;
    std::vector<std::shared_ptr<SandboxEntry>> due;
    for (const auto& e : registry_.List()) {
      if (e->idle_stop_ms() == 0) continue;
      any = true;
      const auto at = e->IdleCheckAt();
      if (!at) continue;  // stopped, or in use: looked at again within kIdleCheckPeriod
      if (*at <= now) {
        due.push_back(e);
      } else {
        next = std::min(next, *at);
      }
    }
    if (!any) break;
    if (!due.empty()) {
      auto work = [this, due = std::move(due)] {
        int stopped = 0;
        for (const auto& e : due) stopped += registry_.StopIfIdle(*e) ? 1 : 0;
        return stopped;
      };
      for (int stopped = co_await Blocking(std::move(work)); stopped > 0; --stopped) {
        metrics_.IdleStop();
      }
    }
    wait = std::max<Clock::duration>(next - Clock::now(), std::chrono::milliseconds(10));
  }
  idle_stops_armed_ = false;
}

void Daemon::Shutdown(std::vector<Acceptor*> acceptors) {
  if (shutting_down_) return;
  shutting_down_ = true;
  log::info("stopping: no new connections; ending every sandbox's processes");
  // An import under way ends now, unpublished, and its client is told so below: unpacking
  // gigabytes would hold up the exit for minutes.
  registry_.CancelImports();
  for (Acceptor* a : acceptors) {
    boost::system::error_code ec;
    a->close(ec);
  }
  ports_.CloseEverything();  // ports.json stays: the next daemon re-opens them
  asio::co_spawn(
      io_,
      [this]() -> asio::awaitable<void> {
        auto work1 = [this] {
          registry_.StopAll();
          return true;
        };
        co_await Blocking(std::move(work1));
        // The answers of the execs that were running ("stopped") go out before
        // the loop ends.
        auto deadline = Clock::now() + std::chrono::seconds(3);
        while ((running_execs_.load() > 0 || running_imports_.load() > 0) &&
               Clock::now() < deadline) {
          asio::steady_timer t(io_, std::chrono::milliseconds(20));
          (void)co_await t.async_wait(kTuple);
        }
        io_.stop();
      },
      asio::detached);
}

}  // namespace nsbox::runtime::api

// The daemon's own routes (api.md "Health", "Metrics"): GET /v1/health and GET /metrics.

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
#include "runtime/api/daemon.h"
#include "runtime/api/exec_queue.h"
#include "runtime/api/exec_request.h"
#include "runtime/api/http.h"
#include "runtime/api/json_shapes.h"
#include "runtime/api/proxy_auth.h"
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

asio::awaitable<bool> Daemon::Health(Ctx& c, const RouteArgs& a) {
  (void)a;
  json::object o;
  o["ok"] = true;
  o["version"] = kVersion;
  co_return co_await ReplyJson(c, 200, o);
}

asio::awaitable<bool> Daemon::MetricsText(Ctx& c, const RouteArgs& a) {
  (void)a;
  auto work = [this] {
    return metrics_.Render(registry_.CountByState()) +
           RenderPool(registry_.PoolReady(), registry_.pool_size(), registry_.AdoptedAheadReady()) +
           RenderTrash(registry_.trash().pending(), registry_.trash().failures()) +
           RenderNetworkConnections(registry_.NetworkCounters());
  };
  std::string reply_body = co_await Blocking(std::move(work));
  co_return co_await Reply(c, 200, std::move(reply_body),
                           "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace nsbox::runtime::api

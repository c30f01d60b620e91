#pragma once

// The token of the HTTP path through the API (/v1/sandboxes/{id}/ports/{port}/http/...) as a
// browser carries it: the path's prefix, the cookie keyed for that prefix, the Cookie header
// split. The connection's auth (connection.cc) and the proxy (port_routes.cc) share them.

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

// ---- the HTTP path through the API (/v1/sandboxes/{id}/ports/{port}/http/...) ----

// The raw path's prefix up to and with the '/' after "http" when `path` is such a path, else "".
std::string ProxyPrefix(std::string_view path);

constexpr std::string_view kTokenCookie = "nsbox_token";

// The Cookie headers split: the nsbox_token value (decoded; nullopt when absent) and the other
// cookies, joined again for the upstream.
struct CookieSplit {
  std::optional<std::string> token;
  std::string others;
};
template <typename Fields>
CookieSplit SplitCookies(const Fields& fields) {
  CookieSplit out;
  for (const auto& f : fields) {
    if (f.name() != http::field::cookie) continue;
    AnyListItem(f.value(), ';', [&out](std::string_view item) {
      const size_t eq = item.find('=');
      if (item.substr(0, eq) == kTokenCookie) {
        if (eq != std::string_view::npos) out.token = PercentDecode(item.substr(eq + 1), false);
      } else {
        if (!out.others.empty()) out.others += "; ";
        out.others += item;
      }
      return false;  // every cookie
    });
  }
  return out;
}

// The proxy cookie's value for one prefix (.../ports/{port}/http/): an HMAC-SHA256 of the
// prefix keyed with the token, in hex. It authenticates under that prefix only (network.md), and
// the token itself is never in a cookie.
std::string ProxyCookieValue(std::string_view token, std::string_view prefix);

}  // namespace nsbox::runtime::api

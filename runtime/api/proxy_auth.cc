// The token of the HTTP path through the API (proxy_auth.h).

#include "runtime/api/proxy_auth.h"

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

std::string ProxyPrefix(std::string_view path) {
  std::vector<std::string_view> segs;
  size_t slash7 = std::string_view::npos;
  int slashes = 0;
  size_t start = 0;
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '/') continue;
    if (slashes > 0) segs.push_back(path.substr(start, i - start));
    start = i + 1;
    if (++slashes == 7) {
      slash7 = i;
      break;
    }
  }
  // Compared decoded, as the router compares them: "%68ttp" routes to the proxy, and its prefix
  // must be found too (the upstream got "/" for ".../%68ttp/zzz").
  auto is = [&segs](size_t i, std::string_view want) {
    return segs[i] == want || PercentDecode(segs[i], false) == want;
  };
  if (slash7 == std::string_view::npos || segs.size() != 6 || !is(0, "v1") || !is(1, "sandboxes") ||
      !is(3, "ports") || !is(5, "http")) {
    return "";
  }
  return std::string(path.substr(0, slash7 + 1));
}

std::string ProxyCookieValue(std::string_view token, std::string_view prefix) {
  struct hmac_sha256_ctx ctx;
  hmac_sha256_set_key(&ctx, token.size(), reinterpret_cast<const uint8_t*>(token.data()));
  static constexpr std::string_view kPurpose = "nsbox proxy cookie for ";
  hmac_sha256_update(&ctx, kPurpose.size(), reinterpret_cast<const uint8_t*>(kPurpose.data()));
  hmac_sha256_update(&ctx, prefix.size(), reinterpret_cast<const uint8_t*>(prefix.data()));
  uint8_t digest[SHA256_DIGEST_SIZE];
  hmac_sha256_digest(&ctx, sizeof digest, digest);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : digest) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

}  // namespace nsbox::runtime::api

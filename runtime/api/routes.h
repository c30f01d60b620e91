#pragma once

// The queries the routes take, checked before anything is done (docs/daemon.md).

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

// The query parameters each route takes (api.md, docs/exec.md, docs/images.md); every other
// route takes none. `segs` is a route of the API's, not the HTTP path through it, whose query is
// the upstream's.
std::span<const std::string_view> QueryKeysOf(const std::vector<std::string>& segs,
                                              http::verb method);

// "GET /v1/sandboxes/{id}/execs/{execId}/output" for the messages: the route, not the ids.
std::string RouteName(std::string_view method, const std::vector<std::string>& segs);

// The query parameters a route takes, as a JSON body's keys (docs/daemon.md): a key it does not
// take is refused naming it and the ones it takes, a key given twice is refused (which one would
// count is a guess), and so is a malformed escape; before anything is done. The messages name the
// route ("PUT /v1/sandboxes/{id}/files"). Empty pairs ("a=1&&b=2", a trailing
// '&') carry no key and are passed over.
std::optional<ApiError> QueryCheck(std::string_view query, const std::vector<std::string>& segs,
                                   http::verb method);

}  // namespace nsbox::runtime::api

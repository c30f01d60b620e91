#pragma once

// nsboxd's HTTP mechanics that know nothing of sandboxes: the request target (absolute form,
// percent-decoding), the bearer token, queries, Accept and method lists, JSON from a client, the
// sizes a request may have, and a TCP connection's wait for the token. Under the handlers of
// runtime/api/ and the connection loop (connection.cc).

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

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace json = boost::json;

// JSON from a client, where JavaScript's JSON.stringify may have written a lone UTF-16 surrogate
// escape (a string cut in the middle of a pair): Boost.JSON refuses it, Node's fs and
// child_process write it as U+FFFD. On a parse error the text is tried once more with such
// escapes as `\ufffd` (utf8::ReplaceLoneSurrogateEscapes), when it had any. A stream parser, for
// where a refused text stopped (`*used`, its bytes parsed): a model that wrote it can find its
// mistake.
json::value ParseClientJson(std::string_view text, boost::system::error_code& ec,
                            size_t* used = nullptr);

using Socket = asio::generic::stream_protocol::socket;
using Acceptor = asio::basic_socket_acceptor<asio::generic::stream_protocol>;
using Clock = std::chrono::steady_clock;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

constexpr size_t kMaxJsonBody = 1u << 20;    // api.md: JSON bodies up to 1 MiB
constexpr size_t kHeaderLimit = 64u << 10;   // a 4096-byte path percent-encoded fits
constexpr size_t kStreamChunk = 256u << 10;  // file bodies move in pieces of this size
// Beast reads a socket into a flat_buffer as much as its free capacity (at least 512 bytes, at
// most 64 KiB): a request with a body that is not small gets a buffer of this room, given back
// after the request so that an idle keep-alive connection holds none (a 200 MB upload took
// 409,604 reads of 512 bytes, and as many epoll_waits, before).
constexpr size_t kSocketReadRoom = 64u << 10;

// A TCP connection until it has sent a request with a valid token. It is counted among the
// unauthenticated ones (by the acceptor, which checks the count, then by this), and cut off once
// `timeout` has passed since its accept: its socket's pending operations are cancelled and no
// further request is read. Passed() ends both, and so does its destruction. The timer's handler
// and the count are shared, so that either may outlive the session, and the session (a coroutine
// frame that the loop destroys as it ends) may outlive the daemon.
class PendingAuth {
 public:
  PendingAuth(asio::io_context& io, Socket& socket, std::shared_ptr<size_t> counter,
              std::chrono::seconds timeout)
      : timer_(io, timeout), state_(std::make_shared<State>()), counter_(std::move(counter)) {
    state_->socket = &socket;
    timer_.async_wait([state = state_](const boost::system::error_code& ec) {
      if (ec || state->socket == nullptr) return;
      state->expired = true;
      boost::system::error_code ignored;
      state->socket->cancel(ignored);
    });
  }
  PendingAuth(const PendingAuth&) = delete;
  PendingAuth& operator=(const PendingAuth&) = delete;
  ~PendingAuth() { Passed(); }

  void Passed() {
    if (counter_ == nullptr) return;
    --*counter_;
    counter_.reset();
    state_->socket = nullptr;
    timer_.cancel();
  }
  bool expired() const { return state_->expired; }

 private:
  struct State {
    Socket* socket = nullptr;
    bool expired = false;
  };
  asio::steady_timer timer_;
  std::shared_ptr<State> state_;
  std::shared_ptr<size_t> counter_;  // null once passed
};

double SecondsSince(Clock::time_point start);

// ---- small parsers ----

// Percent-decoding; `plus_is_space` for query values
// (application/x-www-form-urlencoded, as URLSearchParams writes them). nullopt
// for a malformed escape.
std::optional<std::string> PercentDecode(std::string_view in, bool plus_is_space);

// The token of an `Authorization: Bearer <token>` value; nullopt for another scheme or none.
// The scheme is case-insensitive (RFC 9110 §11.1: "bearer" and "BEARER" are "Bearer"), one or
// more spaces follow it (RFC 6750 §2.1: 1*SP); the token is taken as it is, for TokenMatches.
std::optional<std::string_view> BearerCredentials(std::string_view auth);

// A request target in absolute form ("http://host:port/path?query", RFC 9112 §3.2.2: what a
// client sends to a proxy, and which a server MUST accept): its authority, and the origin form
// the daemon routes on ("/path?query"; "/" for an empty path, RFC 9112 §3.2.1).
struct AbsoluteTarget {
  std::string authority;
  std::string origin;
};

// nullopt when `target` is not in absolute form (it does not start with a scheme and ':', as
// "/v1/health" or "*"); an error when it is, but not an http or https URI this daemon can take.
ApiOutcome<std::optional<AbsoluteTarget>> ParseAbsoluteTarget(std::string_view target);

// Constant-time comparison of a presented token with the expected one (api.md:
// 401 "compared in constant time"): the time depends only on the expected
// token's length.
bool TokenMatches(std::string_view presented, std::string_view expected);

// Calls `fn(key, value)` for each parameter of the query, in order, both percent-decoded ('+' a
// space); an empty pair ("a=1&&b=2", a trailing '&') carries none. Stops at the first error: a
// malformed escape, or what `fn` answers.
template <typename Fn>
std::optional<ApiError> ForEachQueryParam(std::string_view query, Fn&& fn) {
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    auto key = PercentDecode(pair.substr(0, eq), true);
    auto value = PercentDecode(eq == std::string_view::npos ? "" : pair.substr(eq + 1), true);
    if (!key || !value) return ApiError::Invalid("malformed percent-encoding in the query");
    if (std::optional<ApiError> stop = fn(std::move(*key), std::move(*value))) return stop;
  }
  return std::nullopt;
}

// A query parameter, percent-decoded (its key too, as QueryCheck and QueryPath read it); nullopt
// when absent (or malformed, which QueryCheck refuses first on every route but the proxy's).
std::optional<std::string> QueryValue(std::string_view query, std::string_view name);

// The query without the parameters named `name`.
std::string QueryWithout(std::string_view query, std::string_view name);

// `s` without the spaces and tabs around it.
std::string_view TrimBlanks(std::string_view s);

// Calls `f` on each item of a header's `sep`-separated list (blanks trimmed, empty items
// skipped) until it returns true; whether it did.
template <typename F>
bool AnyListItem(std::string_view list, char sep, F&& f) {
  while (!list.empty()) {
    const size_t at = list.find(sep);
    const std::string_view item = TrimBlanks(list.substr(0, at));
    list = at == std::string_view::npos ? std::string_view() : list.substr(at + 1);
    if (!item.empty() && f(item)) return true;
  }
  return false;
}

// Whether an Accept header asks for NDJSON (api.md): one of its media ranges is
// application/x-ndjson, compared without regard to case (RFC 9110 §8.3.1), and not refused with
// q=0.
bool WantsNdjson(std::string_view accept);

// A 0/1 query parameter ("true"/"false" too; a bare name is 1; absent is 0); another value is a
// 400 naming the parameter.
ApiOutcome<bool> QueryBool(std::string_view query, std::string_view name);

}  // namespace nsbox::runtime::api

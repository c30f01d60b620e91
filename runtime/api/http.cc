// nsboxd's HTTP mechanics (http.h).

#include "runtime/api/http.h"

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

json::value ParseClientJson(std::string_view text, boost::system::error_code& ec, size_t* used) {
  auto parse = [](std::string_view t, boost::system::error_code& err, size_t* at) {
    json::stream_parser parser;
    const size_t n = parser.write(t.data(), t.size(), err);
    if (at != nullptr) *at = n;
    if (!err) parser.finish(err);
    return err ? json::value() : parser.release();
  };
  json::value v = parse(text, ec, used);
  if (!ec) return v;
  const std::string replaced = utf8::ReplaceLoneSurrogateEscapes(text);
  if (replaced == text) return v;
  boost::system::error_code again;
  json::value w = parse(replaced, again, nullptr);
  if (again) return v;  // the first error is the one to report
  ec = again;
  return w;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::optional<std::string> PercentDecode(std::string_view in, bool plus_is_space) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%') {
      if (i + 2 >= in.size()) return std::nullopt;
      int hi = HexDigitValue(in[i + 1]);
      int lo = HexDigitValue(in[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (in[i] == '+' && plus_is_space) {
      out += ' ';
    } else {
      out += in[i];
    }
  }
  return out;
}

std::optional<std::string_view> BearerCredentials(std::string_view auth) {
  constexpr std::string_view kScheme = "Bearer";
  if (auth.size() <= kScheme.size() || !beast::iequals(auth.substr(0, kScheme.size()), kScheme) ||
      auth[kScheme.size()] != ' ') {
    return std::nullopt;
  }
  std::string_view token = auth.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  if (token.empty()) return std::nullopt;
  return token;
}

ApiOutcome<std::optional<AbsoluteTarget>> ParseAbsoluteTarget(std::string_view target) {
  auto alpha = [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); };
  auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
  // RFC 3986 §3.1: scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ), then ':'.
  if (target.empty() || !alpha(target[0])) return std::optional<AbsoluteTarget>();
  size_t colon = 1;
  while (colon < target.size() &&
         (alpha(target[colon]) || digit(target[colon]) || target[colon] == '+' ||
          target[colon] == '-' || target[colon] == '.')) {
    ++colon;
  }
  if (colon == target.size() || target[colon] != ':') return std::optional<AbsoluteTarget>();
  const std::string_view scheme = target.substr(0, colon);
  const std::string shown = utf8::DecodeLossy(target.substr(0, 200));
  if (!beast::iequals(scheme, "http") && !beast::iequals(scheme, "https")) {
    return ApiError::Invalid("the request target \"" + shown +
                             "\" is in absolute form with a scheme other than http or https");
  }
  std::string_view rest = target.substr(colon + 1);
  if (rest.substr(0, 2) != "//") {
    return ApiError::Invalid("the request target \"" + shown + "\" has no \"//\" and authority");
  }
  rest.remove_prefix(2);
  if (rest.find('#') != std::string_view::npos) {
    return ApiError::Invalid("the request target \"" + shown +
                             "\" has a fragment (#), which a request target never has");
  }
  const size_t end = rest.find_first_of("/?");
  const std::string_view authority = rest.substr(0, end);
  // RFC 9110 §4.2.4: userinfo ("user@") in an http URI is treated as an error; §4.2.1: so is an
  // empty host. The authority's other characters: RFC 3986 §3.2 (unreserved, pct-encoded,
  // sub-delims, ':' and an IP literal's brackets).
  const bool chars_ok = std::all_of(authority.begin(), authority.end(), [&](char ch) {
    return alpha(ch) || digit(ch) ||
           std::string_view("-._~%!$&'()*+,;=:[]").find(ch) != std::string_view::npos;
  });
  std::string_view host = authority;
  std::string_view port;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    host = authority.substr(0, close == std::string_view::npos ? close : close + 1);
    port = authority.substr(host.size());
    if (close == std::string_view::npos || close == 1 || (!port.empty() && port[0] != ':')) {
      host = {};
    }
  } else if (size_t c = authority.find(':'); c != std::string_view::npos) {
    host = authority.substr(0, c);
    port = authority.substr(c);
  }
  if (!port.empty()) port.remove_prefix(1);
  const bool port_ok = std::all_of(port.begin(), port.end(), digit) && port.size() <= 5;
  if (!chars_ok || host.empty() || !port_ok ||
      (authority[0] != '[' && host.find_first_of("[]") != std::string_view::npos)) {
    return ApiError::Invalid("the request target \"" + shown + "\" has a malformed authority \"" +
                             utf8::DecodeLossy(authority.substr(0, 100)) +
                             "\" (host[:port], with no user@)");
  }
  AbsoluteTarget out;
  out.authority = std::string(authority);
  const std::string_view path_and_query =
      end == std::string_view::npos ? std::string_view() : rest.substr(end);
  out.origin = path_and_query.empty() || path_and_query[0] == '?'
                   ? "/" + std::string(path_and_query)
                   : std::string(path_and_query);
  return std::optional<AbsoluteTarget>(std::move(out));
}

bool TokenMatches(std::string_view presented, std::string_view expected) {
  unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<unsigned char>(p ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

std::optional<std::string> QueryValue(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    size_t eq = pair.find('=');
    if (pair.substr(0, eq) != name && PercentDecode(pair.substr(0, eq), true) != name) continue;
    return PercentDecode(eq == std::string_view::npos ? "" : pair.substr(eq + 1), true);
  }
  return std::nullopt;
}

std::string QueryWithout(std::string_view query, std::string_view name) {
  std::string out;
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.substr(0, pair.find('=')) == name) continue;
    if (!out.empty()) out += '&';
    out += pair;
  }
  return out;
}

std::string_view TrimBlanks(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool WantsNdjson(std::string_view accept) {
  return AnyListItem(accept, ',', [](std::string_view range) {
    const size_t semi = range.find(';');
    if (!beast::iequals(TrimBlanks(range.substr(0, semi)), "application/x-ndjson")) return false;
    if (semi == std::string_view::npos) return true;
    const bool refused = AnyListItem(range.substr(semi + 1), ';', [](std::string_view param) {
      if (param.size() < 2 || (param[0] != 'q' && param[0] != 'Q') || param[1] != '=') return false;
      const std::string_view q = param.substr(2);
      return !q.empty() && q.find_first_not_of("0.") == std::string_view::npos;
    });
    return !refused;
  });
}

ApiOutcome<bool> QueryBool(std::string_view query, std::string_view name) {
  auto v = QueryValue(query, name);
  if (!v || *v == "0" || *v == "false") return false;
  if (*v == "1" || *v == "true" || v->empty()) return true;
  return ApiError::Invalid("\"" + std::string(name) + "\" must be 1 or 0 (true or false), not \"" +
                           utf8::DecodeLossy(v->substr(0, 40)) + "\"");
}

}  // namespace nsbox::runtime::api

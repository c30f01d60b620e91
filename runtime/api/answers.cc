// How nsboxd answers: a whole answer, an error, a chunked or NDJSON stream; and how it reads a
// request's body (to its end, into a file, as JSON).

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

// ---- answers ----

asio::awaitable<bool> Daemon::Reply(Ctx& c, unsigned status, std::string body,
                                    std::string_view content_type, std::string_view allow) {
  http::response<http::string_body> res{static_cast<http::status>(status), 11};
  res.set(http::field::server, std::string("nsboxd/") + kVersion);
  if (!body.empty() || status != 204) res.set(http::field::content_type, content_type);
  if (!allow.empty()) res.set(http::field::allow, allow);
  // Every 401 says which scheme it wants (RFC 9110 §15.5.2: it MUST carry WWW-Authenticate).
  if (status == 401) res.set(http::field::www_authenticate, "Bearer realm=\"nsbox\"");
  // A 503 is for a moment (a sandbox restarting, the listings' budget full): try again in one
  // second, unless the handler said when (an import's lane, 429).
  if (c.retry_after > 0) {
    res.set(http::field::retry_after, std::to_string(c.retry_after));
  } else if (status == 503) {
    res.set(http::field::retry_after, "1");
  }
  // A request whose body was not read to its end cannot be followed by another.
  res.keep_alive(c.parser.get().keep_alive() && c.body_done && !c.must_close && !shutting_down_);
  metrics_.BytesOut(body.size());
  res.body() = std::move(body);
  // A 204 has no body and no Content-Length (RFC 9110 §8.6); every other answer has its length.
  if (status != 204) res.prepare_payload();
  c.status = static_cast<int>(status);
  auto [ec, n] = co_await http::async_write(c.socket, res, kTuple);
  (void)n;
  co_return !ec && res.keep_alive();
}

asio::awaitable<bool> Daemon::ReplyJson(Ctx& c, unsigned status, const json::value& value) {
  {
    std::string reply_body = json::serialize(value);
    co_return co_await Reply(c, status, std::move(reply_body));
  }
}

asio::awaitable<bool> Daemon::ReplyError(Ctx& c, const ApiError& given, std::string_view allow) {
  ApiError error = given;
  if (error.code == "sandbox_unavailable" && !c.sandbox_id.empty() &&
      registry_.Find(c.sandbox_id) == nullptr) {
    // Its nsbox-init went away under the request because a DELETE removed the sandbox meanwhile:
    // that is what the client is told, not that a server is not answering.
    error = ApiError::SandboxNotFound(c.sandbox_id);
    error.message += " (it was deleted while this request ran)";
  }
  metrics_.Error(error.code);
  c.retry_after = error.retry_after_seconds;
  if (error.status >= 500) {
    log::error("{}{}: {}", c.sandbox_id.empty() ? "" : "sandbox=" + c.sandbox_id + " ", error.code,
               error.message);
  }
  {
    const unsigned reply_status = static_cast<unsigned>(error.status);
    std::string reply_body = ErrorBody(error);
    co_return co_await Reply(c, reply_status, std::move(reply_body), "application/json", allow);
  }
}

asio::awaitable<bool> Daemon::ReplyNoContent(Ctx& c, unsigned status) {
  co_return co_await Reply(c, status, "");
}

asio::awaitable<bool> Daemon::MethodNotAllowed(Ctx& c, std::string_view allow) {
  {
    const ApiError reply_error =
        ApiError::Of(405, "method_not_allowed",
                     "method " + std::string(c.parser.get().method_string()) +
                         " is not allowed here; use " + std::string(allow));
    co_return co_await ReplyError(c, reply_error, allow);
  }
}

asio::awaitable<bool> Daemon::SendContinue(Ctx& c) {
  if (c.continue_sent || c.body_done) co_return true;
  c.continue_sent = true;
  auto expect = c.parser.get()[http::field::expect];
  if (!beast::iequals(expect, "100-continue")) co_return true;
  static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
  auto [ec, n] = co_await asio::async_write(c.socket, asio::buffer(kContinue), kTuple);
  (void)n;
  co_return !ec;
}

asio::awaitable<bool> Daemon::StartNdjson(Ctx& c) {
  co_return co_await StartChunked(c, "application/x-ndjson", c.parser.get().keep_alive());
}

asio::awaitable<bool> Daemon::StartChunked(Ctx& c, std::string_view content_type, bool keep_alive) {
  http::response<http::empty_body> res{http::status::ok, 11};
  res.set(http::field::server, std::string("nsboxd/") + kVersion);
  res.set(http::field::content_type, content_type);
  res.chunked(true);
  res.keep_alive(keep_alive);
  http::response_serializer<http::empty_body> sr{res};
  auto [ec, n] = co_await http::async_write_header(c.socket, sr, kTuple);
  (void)n;
  c.status = 200;
  co_return !ec;
}

asio::awaitable<bool> Daemon::SendBufferedExec(Ctx& c,
                                               std::array<std::vector<std::string>, 2>& output,
                                               bool base64, const json::object& exit) {
  const bool keep_alive =
      c.parser.get().keep_alive() && c.body_done && !c.must_close && !shutting_down_;
  // What goes out next, sent as one chunk once it holds kSocketReadRoom (many small pieces of
  // output make one write). An answer that never fills it goes as one write with its length:
  // sent as a head, a chunk and the last chunk, it woke the client up to three times.
  std::string out;
  bool chunked = false;  // the head is sent, the body goes in chunks
  auto flush = [&]() -> asio::awaitable<bool> {
    if (!chunked) {
      if (!co_await StartChunked(c, "application/json", keep_alive)) co_return false;
      chunked = true;
    }
    co_return co_await SendChunk(c, out, /*last=*/false);
  };
  for (int i = 0; i < 2; ++i) {
    out += i == 0 ? (base64 ? "{\"stdoutBase64\":\"" : "{\"stdout\":\"")
                  : (base64 ? "\",\"stderrBase64\":\"" : "\",\"stderr\":\"");
    StreamCut cut(base64);
    auto encode = [&](std::string_view bytes) {
      if (base64) {
        out += Base64Encode(bytes);
      } else {
        // A JSON string's escaping is byte by byte: a cut's escaped text, quotes dropped.
        const std::string quoted = json::serialize(json::string_view(utf8::DecodeLossy(bytes)));
        out.append(quoted, 1, quoted.size() - 2);
      }
    };
    for (std::string& block : output[i]) {
      encode(cut.Next(block));
      std::string().swap(block);  // its memory goes as soon as it is encoded
      if (out.size() >= kSocketReadRoom && !co_await flush()) co_return false;
    }
    encode(cut.Finish());
  }
  // `exit` is a JSON object with at least one key: its text, less the opening brace.
  const std::string rest = json::serialize(exit);
  out += "\",";
  out.append(rest, 1);
  if (!chunked) co_return co_await Reply(c, 200, std::move(out));
  // The last piece and the end in one write.
  const bool sent = co_await SendChunk(c, out, /*last=*/true);
  co_return sent&& keep_alive;
}

asio::awaitable<bool> Daemon::SendChunk(Ctx& c, std::string& bytes, bool last) {
  if (bytes.empty() && !last) co_return true;
  metrics_.BytesOut(bytes.size());
  boost::system::error_code ec;
  if (bytes.empty()) {
    std::tie(ec, std::ignore) =
        co_await asio::async_write(c.socket, http::make_chunk_last(), kTuple);
  } else if (last) {
    std::tie(ec, std::ignore) = co_await asio::async_write(
        c.socket,
        beast::buffers_cat(http::make_chunk(asio::buffer(bytes)), http::make_chunk_last()), kTuple);
  } else {
    std::tie(ec, std::ignore) =
        co_await asio::async_write(c.socket, http::make_chunk(asio::buffer(bytes)), kTuple);
  }
  bytes.clear();
  co_return !ec;
}

asio::awaitable<Daemon::BodyCopy> Daemon::CopyBodyTo(Ctx& c, int fd, std::string_view what,
                                                     const WriteCheck* check) {
  // The writes go to the worker pool, never the loop: ext4 has no RWF_NOWAIT for buffered writes,
  // and a write waits whenever the kernel throttles the writer of dirty pages to the disk's pace
  // (or the journal is full), which would hold up every other client. Each piece is written
  // there while the next one is read from the socket, into the other buffer.
  using asio::experimental::awaitable_operators::operator&&;
  BodyCopy out;
  std::vector<char> bufs[2] = {std::vector<char>(kStreamChunk), std::vector<char>(kStreamChunk)};
  const std::string name(what);
  size_t pending = 0;  // bytes in bufs[1 - next] still to be written
  int next = 0;        // the buffer the next piece is read into
  while (!c.parser.is_done()) {
    std::optional<size_t> got;
    if (pending == 0) {
      got = co_await ReadBodyPiece(c, bufs[next], &out.hangup);
    } else {
      auto [read, err] = co_await (ReadBodyPiece(c, bufs[next], &out.hangup) &&
                                   WritePiece(fd, bufs[1 - next].data(), pending, name, check));
      if (err != 0) {
        out.write_error = err;
        co_return out;
      }
      out.bytes += pending;
      got = read;
    }
    pending = 0;
    if (!got) co_return out;
    if (*got == 0) continue;
    pending = *got;
    next = 1 - next;
  }
  if (pending > 0) {
    const int err = co_await WritePiece(fd, bufs[1 - next].data(), pending, name, check);
    if (err != 0) {
      out.write_error = err;
      co_return out;
    }
    out.bytes += pending;
  }
  c.body_done = true;
  co_return out;
}

asio::awaitable<int> Daemon::WritePiece(int fd, const char* data, size_t len,
                                        const std::string& what, const WriteCheck* check) {
  auto work = [fd, data, len, &what, check] {
    if (check != nullptr) {
      auto allowed = (*check)(len);
      if (!allowed.ok()) return allowed.error().code() != 0 ? allowed.error().code() : EIO;
    }
    auto st = WriteAll(fd, std::string_view(data, len), what);
    return st.ok() ? 0 : st.error().code() != 0 ? st.error().code() : EIO;
  };
  co_return co_await Blocking(std::move(work));
}

asio::awaitable<std::optional<size_t>> Daemon::ReadBodyPiece(Ctx& c, std::vector<char>& buf,
                                                             std::string* hangup) {
  auto& p = c.parser;
  p.get().body().data = buf.data();
  p.get().body().size = buf.size();
  auto [ec, n] = co_await http::async_read(c.socket, c.buffer, p, kTuple);
  (void)n;
  if (ec == http::error::need_buffer) ec = {};
  if (ec) {
    *hangup = ec.message();
    co_return std::nullopt;
  }
  const size_t got = buf.size() - p.get().body().size;
  metrics_.BytesIn(got);
  co_return got;
}

asio::awaitable<ApiOutcome<std::string>> Daemon::ReadBody(Ctx& c) {
  auto& p = c.parser;
  if (auto length = p.content_length(); length && *length > kMaxJsonBody) {
    co_return ApiError::Of(
        413, "payload_too_large",
        "a JSON body may have at most 1048576 bytes; this one has " + std::to_string(*length));
  }
  if (!co_await SendContinue(c)) co_return ApiError::Invalid("the client went away");
  // Read straight into the string: all the rest at once when the length is known, else 16 KiB
  // more at a time (a chunked body). A JSON body is usually a few dozen bytes.
  std::string body;
  size_t got = 0;
  const uint64_t length = p.content_length().value_or(0);
  while (!p.is_done()) {
    const size_t want = length > got ? static_cast<size_t>(length) - got : size_t{16} << 10;
    body.resize(got + want);
    p.get().body().data = body.data() + got;
    p.get().body().size = want;
    auto [ec, n] = co_await http::async_read(c.socket, c.buffer, p, kTuple);
    (void)n;
    if (ec == http::error::need_buffer) ec = {};
    if (ec) co_return ApiError::Invalid("the request body ended early: " + ec.message());
    got += want - p.get().body().size;
    if (got > kMaxJsonBody) {
      co_return ApiError::Of(413, "payload_too_large",
                             "a JSON body may have at most 1048576 bytes");
    }
  }
  body.resize(got);
  c.body_done = true;
  metrics_.BytesIn(body.size());
  co_return body;
}

asio::awaitable<ApiOutcome<json::object>> Daemon::ReadJson(Ctx& c, bool optional) {
  auto read = co_await ReadBody(c);
  if (!read.ok()) co_return read.error();
  const std::string& body = read.value();
  if (body.empty()) {
    if (optional) co_return json::object();
    co_return ApiError::Invalid("the request needs a JSON body");
  }
  boost::system::error_code ec;
  size_t used = 0;
  json::value v = ParseClientJson(body, ec, &used);
  if (ec) {
    // JSON is UTF-8 (RFC 8259 8.1): say so rather than Boost's "syntax error" at such a byte.
    if (!utf8::IsValid(body))
      co_return ApiError::Invalid("the body is not valid JSON: it is not UTF-8");
    co_return ApiError::Invalid("the body is not valid JSON: " + ec.message() +
                                (used < body.size()
                                     ? " at byte " + std::to_string(used)
                                     : " at its end (byte " + std::to_string(body.size()) + ")"));
  }
  if (!v.is_object()) co_return ApiError::Invalid("the body must be a JSON object");
  co_return std::move(v.as_object());
}

}  // namespace nsbox::runtime::api

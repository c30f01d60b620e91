#include "runtime/api_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <cerrno>
#include <charconv>
#include <string>
#include <vector>

namespace nsbox::runtime {

namespace asio = boost::asio;
namespace http = boost::beast::http;
namespace json = boost::json;
using Socket = asio::generic::stream_protocol::socket;

namespace {

constexpr size_t kMaxWholeBody = 256u << 20;  // a whole answer (JSON) held in memory
constexpr size_t kMaxErrorBody = 1u << 20;    // an error body read during a streamed call
constexpr size_t kMaxLine = 64u << 20;        // one NDJSON line
constexpr size_t kIoChunk = 64u << 10;

http::verb Verb(Method m) {
  switch (m) {
    case Method::kGet:
      return http::verb::get;
    case Method::kPut:
      return http::verb::put;
    case Method::kPost:
      return http::verb::post;
    case Method::kDelete:
      return http::verb::delete_;
  }
  return http::verb::get;
}

// A Boost error as an nsbox Error: errno values keep their name, the rest (end of stream, HTTP
// parse errors) their message.
Error FromBoost(const boost::system::error_code& ec, std::string_view what) {
  if (ec == asio::error::eof || ec == http::error::end_of_stream ||
      ec == http::error::partial_message) {
    return Error(ECONNRESET, std::string(what) + ": the daemon closed the connection");
  }
  if (ec.category() == boost::system::system_category() ||
      ec.category() == boost::system::generic_category()) {
    return Error(ec.value(), std::string(what) + ": " + ErrnoText(ec.value()));
  }
  return Error::Msg(std::string(what) + ": " + ec.message());
}

std::string JsonString(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  if (v == nullptr || !v->is_string()) return "";
  return std::string(v->get_string());
}

}  // namespace

// ---- endpoints ----

ApiEndpoint ApiEndpoint::Unix(std::string path) {
  ApiEndpoint e;
  e.socket_path = std::move(path);
  return e;
}

Result<ApiEndpoint> ApiEndpoint::FromUrl(std::string_view url, std::string token) {
  auto bad = [&](std::string_view why) {
    return Error(EINVAL, "--url '" + std::string(url) + "': " + std::string(why));
  };
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return bad("only http://HOST:PORT is supported (put TLS in front with a proxy)");
  }
  std::string_view rest = url.substr(kScheme.size());
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) return bad("a path is not allowed");
  std::string_view host;
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("missing ']'");
    host = rest.substr(1, close - 1);
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("expected ':PORT' after ']'");
      port_text = after.substr(1);
    }
  } else {
    size_t colon = rest.rfind(':');
    host = rest.substr(0, colon);
    if (colon != std::string_view::npos) port_text = rest.substr(colon + 1);
  }
  if (host.empty()) return bad("no host");
  if (host == "localhost") host = "127.0.0.1";
  boost::system::error_code ec;
  asio::ip::address address = asio::ip::make_address(std::string(host), ec);
  if (ec) return bad("the host must be a numeric IP address or localhost");
  ApiEndpoint e;
  e.host = address.to_string();
  e.port = 80;
  e.token = std::move(token);
  if (!port_text.empty()) {
    unsigned port = 0;
    auto [ptr, err] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (err != std::errc() || ptr != port_text.data() + port_text.size() || port == 0 ||
        port > 65535) {
      return bad("the port must be a number from 1 to 65535");
    }
    e.port = static_cast<uint16_t>(port);
  }
  return e;
}

std::string ApiEndpoint::Describe() const {
  if (!socket_path.empty()) return socket_path;
  if (host.find(':') != std::string::npos) return "http://[" + host + "]:" + std::to_string(port);
  return "http://" + host + ":" + std::to_string(port);
}

// ---- answers ----

ApiErrorBody ApiErrorBody::Parse(int status, std::string_view body) {
  ApiErrorBody e;
  e.status = status;
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  const json::object* top = ec ? nullptr : v.if_object();
  const json::value* inner = top != nullptr ? top->if_contains("error") : nullptr;
  if (inner != nullptr && inner->is_object()) {
    e.code = JsonString(inner->get_object(), "code");
    e.message = JsonString(inner->get_object(), "message");
    e.path = JsonString(inner->get_object(), "path");
  }
  if (e.message.empty()) {
    // Not an api.md error body: say what came, briefly.
    std::string_view text = body.substr(0, 200);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
    e.message = "HTTP " + std::to_string(status) + (text.empty() ? "" : ": " + std::string(text));
  }
  return e;
}

Result<json::value> ApiResponse::Json() const {
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec) return Error::Msg("the daemon's answer is not JSON: " + ec.message());
  return v;
}

// ---- encodings ----

std::string PercentEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string SandboxTarget(std::string_view id, std::string_view suffix) {
  return "/v1/sandboxes/" + PercentEncode(id) + std::string(suffix);
}

std::string FilesTarget(std::string_view id, std::string_view path) {
  return SandboxTarget(id, "/files?path=") + PercentEncode(path);
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) {
      return false;
    }
    i += len;
  }
  return true;
}

// ---- the client ----

struct ApiClient::Connection {
  asio::io_context io;
  Socket socket{io};
  boost::beast::flat_buffer buffer;
};

ApiClient::ApiClient(ApiEndpoint endpoint) : endpoint_(std::move(endpoint)) {}

ApiClient::~ApiClient() { Disconnect(); }

int ApiClient::socket_fd() const {
  return conn_ != nullptr && conn_->socket.is_open() ? conn_->socket.native_handle() : -1;
}

void ApiClient::Disconnect() {
  if (conn_ == nullptr) return;
  boost::system::error_code ignored;
  conn_->socket.close(ignored);
  conn_.reset();
}

Status ApiClient::Connect() {
  if (conn_ != nullptr) {
    // A kept-alive connection the daemon may have closed while it was idle: anything readable
    // now (EOF, or bytes nobody asked for) means it cannot carry the next request.
    pollfd p{conn_->socket.native_handle(), POLLIN, 0};
    if (conn_->buffer.size() == 0 && ::poll(&p, 1, 0) == 0) return Ok();
    Disconnect();
  }
  auto conn = std::make_unique<Connection>();
  boost::system::error_code ec;
  if (!endpoint_.socket_path.empty()) {
    // The socket, then each fallback in turn (the CLI's default sockets); the first that
    // connects becomes the endpoint's socket for good, and each that did not is kept for the
    // message.
    connect_failures_.clear();
    std::vector<std::string> sockets = {endpoint_.socket_path};
    sockets.insert(sockets.end(), endpoint_.socket_fallbacks.begin(),
                   endpoint_.socket_fallbacks.end());
    for (const std::string& path : sockets) {
      if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
        connect_failures_.push_back({path, ENAMETOOLONG});
        continue;
      }
      conn->socket.close(ec);
      conn->socket.connect(
          asio::generic::stream_protocol::endpoint(asio::local::stream_protocol::endpoint(path)),
          ec);
      if (!ec) {
        endpoint_.socket_path = path;
        endpoint_.socket_fallbacks.clear();
        connect_failures_.clear();
        break;
      }
      connect_failures_.push_back({path, ec.category() == boost::system::system_category() ||
                                                 ec.category() == boost::system::generic_category()
                                             ? ec.value()
                                             : EIO});
    }
    if (!connect_failures_.empty()) {
      connect_failed_ = true;
      const ConnectFailure& first = connect_failures_.front();
      return Error(first.code,
                   "connect to nsboxd at " + first.socket + ": " + ErrnoText(first.code));
    }
  } else {
    asio::ip::address address = asio::ip::make_address(endpoint_.host, ec);
    if (ec) return FromBoost(ec, "connect to nsboxd at " + endpoint_.Describe());
    conn->socket.connect(
        asio::generic::stream_protocol::endpoint(asio::ip::tcp::endpoint(address, endpoint_.port)),
        ec);
    if (ec) {
      connect_failed_ = true;
      return FromBoost(ec, "connect to nsboxd at " + endpoint_.Describe());
    }
  }
  if (endpoint_.socket_path.empty()) {
    conn->socket.set_option(asio::ip::tcp::no_delay(true), ec);  // small requests, answer now
  }
  // Reads wait in poll(POLLIN), not in a blocking recv. A socket has one wait queue for both
  // directions: the daemon's read of each request frees our sent bytes and wakes whatever sleeps
  // there. A blocked recv wakes for it, finds nothing and sleeps again (a cross-CPU wake-up per
  // request on this machine kind); poll wakes only for what it asked.
  conn->socket.native_non_blocking(true, ec);
  if (ec) return FromBoost(ec, "connect to nsboxd at " + endpoint_.Describe());
  // Beast reads as much as the buffer's free room (512 bytes when it has none): a download
  // would move in reads and file writes of 512 bytes.
  conn->buffer.reserve(kIoChunk);
  conn_ = std::move(conn);
  return Ok();
}

Result<UniqueFd> ApiClient::ReleaseSocket() {
  // A fresh connection: one kept alive may hold buffered bytes of an earlier answer.
  Disconnect();
  NSBOX_TRY(Connect());
  boost::system::error_code ec;
  conn_->socket.native_non_blocking(false, ec);  // its new owner reads it blocking
  if (ec) return FromBoost(ec, "take the connection to nsboxd at " + endpoint_.Describe());
  UniqueFd fd(conn_->socket.release(ec));
  conn_.reset();
  if (ec) return FromBoost(ec, "take the connection to nsboxd at " + endpoint_.Describe());
  return fd;
}

namespace {

template <typename Body>
void SetHeaders(http::request<Body>& req, const ApiEndpoint& endpoint) {
  req.set(http::field::host, endpoint.socket_path.empty()
                                 ? endpoint.host + ":" + std::to_string(endpoint.port)
                                 : std::string("localhost"));
  req.set(http::field::user_agent, "nsbox-cli");
  if (!endpoint.token.empty()) req.set(http::field::authorization, "Bearer " + endpoint.token);
  req.keep_alive(true);
}

}  // namespace

Status ApiClient::Send(Method method, const std::string& target, const json::value& body,
                       std::string_view accept) {
  connect_failed_ = false;
  NSBOX_TRY(Connect());
  http::request<http::string_body> req{Verb(method), target, 11};
  SetHeaders(req, endpoint_);
  if (!accept.empty()) req.set(http::field::accept, accept);
  if (!body.is_null()) {
    req.set(http::field::content_type, "application/json");
    req.body() = json::serialize(body);
  }
  req.prepare_payload();
  boost::system::error_code ec;
  http::write(conn_->socket, req, ec);
  if (ec) {
    Disconnect();
    return FromBoost(ec, "send request to nsboxd");
  }
  return Ok();
}

Result<ApiResponse> ApiClient::Call(Method method, const std::string& target) {
  return Call(method, target, json::value(nullptr));
}

Result<ApiResponse> ApiClient::Call(Method method, const std::string& target,
                                    const json::value& body) {
  NSBOX_TRY(Send(method, target, body, {}));
  boost::system::error_code ec;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxWholeBody);
  http::read(conn_->socket, conn_->buffer, parser, ec);
  if (ec) {
    Disconnect();
    return FromBoost(ec, "read answer from nsboxd");
  }
  ApiResponse out;
  out.status = parser.get().result_int();
  out.content_type = std::string(parser.get()[http::field::content_type]);
  out.body = std::move(parser.get().body());
  if (!parser.get().keep_alive()) Disconnect();
  return out;
}

Result<ApiResponse> ApiClient::ReadStreamed(const ChunkFn& on_chunk) {
  boost::system::error_code ec;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);
  http::read_header(conn_->socket, conn_->buffer, parser, ec);
  if (ec) {
    Disconnect();
    return FromBoost(ec, "read answer from nsboxd");
  }
  ApiResponse out;
  out.status = parser.get().result_int();
  out.content_type = std::string(parser.get()[http::field::content_type]);
  std::vector<char> chunk(kIoChunk);
  while (!parser.is_done()) {
    parser.get().body().data = chunk.data();
    parser.get().body().size = chunk.size();
    // read_some, not read: a stream's bytes are handed on as soon as they arrive.
    http::read_some(conn_->socket, conn_->buffer, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      Disconnect();
      return FromBoost(ec, "read answer from nsboxd");
    }
    size_t n = chunk.size() - parser.get().body().size;
    if (n == 0) continue;
    if (out.ok()) {
      if (Status st = on_chunk(std::string_view(chunk.data(), n)); !st.ok()) {
        Disconnect();  // the rest of the answer is unread: this connection is done
        return std::move(st).error();
      }
    } else if (out.body.size() < kMaxErrorBody) {
      out.body.append(chunk.data(), std::min(n, kMaxErrorBody - out.body.size()));
    }
  }
  if (!parser.get().keep_alive()) Disconnect();
  return out;
}

Result<ApiResponse> ApiClient::StreamLines(Method method, const std::string& target,
                                           const json::value& body, std::string_view accept,
                                           const LineFn& on_line) {
  NSBOX_TRY(Send(method, target, body, accept));
  return ReadLines(on_line);
}

Result<ApiResponse> ApiClient::ReadLines(const LineFn& on_line) {
  std::string pending;
  auto result = ReadStreamed([&](std::string_view chunk) -> Status {
    size_t start = 0;
    for (size_t nl = chunk.find('\n'); nl != std::string_view::npos; nl = chunk.find('\n', start)) {
      std::string_view piece = chunk.substr(start, nl - start);
      start = nl + 1;
      if (pending.empty()) {
        NSBOX_TRY(on_line(piece));
      } else {
        pending.append(piece);
        NSBOX_TRY(on_line(pending));
        pending.clear();
      }
    }
    pending.append(chunk.substr(start));
    if (pending.size() > kMaxLine) {
      return Error(EMSGSIZE, "a line of the daemon's stream is longer than " +
                                 std::to_string(kMaxLine) + " bytes");
    }
    return Ok();
  });
  if (!result.ok()) return result;
  if (result->ok() && !pending.empty()) NSBOX_TRY(on_line(pending));
  return result;
}

Result<ApiResponse> ApiClient::Download(const std::string& target, const ChunkFn& on_chunk) {
  NSBOX_TRY(Send(Method::kGet, target, json::value(nullptr), {}));
  return ReadStreamed(on_chunk);
}

Result<ApiResponse> ApiClient::Upload(Method method, const std::string& target, int fd,
                                      const UploadOptions& options) {
  connect_failed_ = false;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Error::Sys("fstat", "", errno);
  bool sized = S_ISREG(st.st_mode);
  uint64_t remaining = 0;
  if (sized) {
    off_t pos = ::lseek(fd, 0, SEEK_CUR);
    remaining = static_cast<uint64_t>(st.st_size - std::clamp<off_t>(pos, 0, st.st_size));
  }
  NSBOX_TRY(Connect());
  http::request<http::buffer_body> req{Verb(method), target, 11};
  SetHeaders(req, endpoint_);
  req.set(http::field::content_type, "application/octet-stream");
  if (options.on_line) req.set(http::field::accept, "application/x-ndjson");
  if (sized) {
    req.content_length(remaining);
  } else {
    req.chunked(true);
  }
  req.body().data = nullptr;
  req.body().more = true;
  http::request_serializer<http::buffer_body> serializer{req};
  boost::system::error_code ec;
  http::write_header(conn_->socket, serializer, ec);
  std::vector<char> chunk(kIoChunk);
  uint64_t sent = 0;
  while (!ec) {
    size_t want =
        sized ? static_cast<size_t>(std::min<uint64_t>(remaining, chunk.size())) : chunk.size();
    ssize_t n = 0;
    if (want > 0) {
      do {
        n = ::read(fd, chunk.data(), want);
      } while (n < 0 && errno == EINTR);
    }
    if (n < 0) {
      int err = errno;
      Disconnect();  // a half-sent body: the daemon discards it when the connection drops
      return Error::Sys("read", "", err);
    }
    if (sized && n == 0 && remaining > 0) {
      Disconnect();
      return Error(EIO, "the file shrank while it was being sent");
    }
    req.body().data = n > 0 ? chunk.data() : nullptr;
    req.body().size = static_cast<size_t>(n);
    req.body().more = n > 0;
    http::write(conn_->socket, serializer, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (n == 0) break;
    remaining -= static_cast<uint64_t>(n);
    sent += static_cast<uint64_t>(n);
    if (options.on_sent && !ec) options.on_sent(sent);
  }
  // Even when sending failed, the daemon may have answered early (see below).
  if (options.on_line) return ReadLines(options.on_line);
  // Even when sending failed, the daemon may have answered early (a 404 for an unknown
  // sandbox, a 507 when the disk is full) before it stopped reading: that answer says more.
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxErrorBody);
  boost::system::error_code read_ec;
  http::read(conn_->socket, conn_->buffer, parser, read_ec);
  if (read_ec) {
    Disconnect();
    return FromBoost(ec ? ec : read_ec, ec ? "send file to nsboxd" : "read answer from nsboxd");
  }
  ApiResponse out;
  out.status = parser.get().result_int();
  out.content_type = std::string(parser.get()[http::field::content_type]);
  out.body = std::move(parser.get().body());
  if (ec || !parser.get().keep_alive()) Disconnect();
  return out;
}

}  // namespace nsbox::runtime

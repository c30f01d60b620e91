#include "tests/e2e/http.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <thread>
#include <utility>

namespace nsbox::e2e {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using Socket = asio::generic::stream_protocol::socket;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kNoBodyLimit = std::numeric_limits<uint64_t>::max();

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

template <typename Fields>
std::map<std::string, std::string> HeaderMap(const Fields& fields) {
  std::map<std::string, std::string> out;
  for (const auto& f : fields) {
    out[Lower(std::string_view(f.name_string().data(), f.name_string().size()))] =
        std::string(f.value());
  }
  return out;
}

}  // namespace

// One connection and the io_context that drives it. Every operation runs until it completes or
// its deadline passes; on the deadline the socket is closed, so the caller never hangs.
class Conn {
 public:
  Conn() : sock_(ioc_) {}

  bool is_open() const { return sock_.is_open(); }
  Socket& sock() { return sock_; }
  beast::flat_buffer& buffer() { return buffer_; }

  beast::error_code Connect(const Endpoint& endpoint, milliseconds timeout) {
    Close();
    buffer_.clear();
    asio::generic::stream_protocol::endpoint ep;
    try {
      if (!endpoint.unix_path.empty()) {
        ep = asio::local::stream_protocol::endpoint(endpoint.unix_path);
      } else {
        ep = asio::ip::tcp::endpoint(asio::ip::make_address(endpoint.host), endpoint.port);
      }
    } catch (const std::exception& e) {
      return asio::error::invalid_argument;
    }
    return Run(
        [&](auto handler) {
          sock_.async_connect(ep, [handler](beast::error_code ec) mutable { handler(ec, 0); });
        },
        timeout);
  }

  // Starts the asynchronous operation `start(handler)` and runs it to its end or the deadline.
  template <typename Start>
  beast::error_code Run(Start&& start, milliseconds timeout, size_t* transferred = nullptr) {
    beast::error_code result;
    bool finished = false;
    size_t n = 0;
    start([&](beast::error_code ec, size_t bytes) {
      result = ec;
      n = bytes;
      finished = true;
    });
    ioc_.restart();
    ioc_.run_for(timeout);
    if (!finished) {
      beast::error_code ignored;
      sock_.close(ignored);
      ioc_.restart();
      ioc_.run();
      result = asio::error::timed_out;
    }
    if (transferred != nullptr) *transferred = n;
    return result;
  }

  void Close() {
    beast::error_code ignored;
    if (sock_.is_open()) sock_.close(ignored);
  }

 private:
  asio::io_context ioc_;
  Socket sock_;
  beast::flat_buffer buffer_;
};

std::string Endpoint::Describe() const {
  if (!unix_path.empty()) return "unix:" + unix_path;
  return host + ":" + std::to_string(port);
}

std::string Response::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? "" : it->second;
}

json::value Response::Json() const {
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec) return nullptr;
  return v;
}

std::string Response::ErrorCode() const {
  json::value v = Json();
  if (!v.is_object()) return "";
  const json::value* code = v.as_object().if_contains("error");
  if (code == nullptr || !code->is_object()) return "";
  const json::value* c = code->as_object().if_contains("code");
  return c != nullptr && c->is_string() ? std::string(c->as_string()) : "";
}

std::string Response::ErrorMessage() const {
  json::value v = Json();
  if (!v.is_object()) return "";
  const json::value* e = v.as_object().if_contains("error");
  if (e == nullptr || !e->is_object()) return "";
  const json::value* m = e->as_object().if_contains("message");
  return m != nullptr && m->is_string() ? std::string(m->as_string()) : "";
}

std::string Response::Describe() const {
  std::string out = "HTTP " + std::to_string(status);
  if (!transport_error.empty()) out += " (no answer: " + transport_error + ")";
  for (const auto& [k, v] : headers) out += "\n  " + k + ": " + v;
  out += "\n  body (" + std::to_string(body.size()) + " bytes): ";
  out += body.size() > 2000 ? body.substr(0, 2000) + "..." : body;
  return out;
}

// ---- Client ----

struct Client::Impl {
  Endpoint endpoint;
  std::string token;
  Conn conn;
};

Client::Client(Endpoint endpoint, std::string bearer_token) : impl_(std::make_unique<Impl>()) {
  impl_->endpoint = std::move(endpoint);
  impl_->token = std::move(bearer_token);
}
Client::~Client() = default;
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;

void Client::Disconnect() { impl_->conn.Close(); }

Response Client::Request(std::string_view method, std::string_view target, std::string_view body,
                         const Headers& headers, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto left = [&] {
    return std::max(milliseconds(1),
                    std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  };
  http::request<http::string_body> req;
  req.method_string(beast::string_view(method.data(), method.size()));
  req.target(beast::string_view(target.data(), target.size()));
  req.version(11);
  req.set(http::field::host, "nsboxd");
  req.keep_alive(true);
  if (!impl_->token.empty()) req.set(http::field::authorization, "Bearer " + impl_->token);
  for (const auto& [k, v] : headers) req.set(k, v);
  req.body() = std::string(body);
  if (!body.empty() || method == "PUT" || method == "POST") req.prepare_payload();

  Response out;
  // A reused keep-alive connection the daemon closed meanwhile is retried once on a fresh one.
  for (int attempt = 0; attempt < 2; ++attempt) {
    Conn& conn = impl_->conn;
    const bool reused = conn.is_open();
    if (!reused) {
      if (auto ec = conn.Connect(impl_->endpoint, left())) {
        out.transport_error = "connect " + impl_->endpoint.Describe() + ": " + ec.message();
        return out;
      }
    }
    auto ec = conn.Run([&](auto h) { http::async_write(conn.sock(), req, h); }, left());
    http::response_parser<http::string_body> parser;
    parser.body_limit(kNoBodyLimit);
    // A daemon may answer before it read the whole request (413 on a Content-Length over the
    // limit) and close: the write fails, but the answer is there to be read, as curl would.
    const bool write_cut = ec == asio::error::broken_pipe || ec == asio::error::connection_reset;
    if (!ec || write_cut) {
      auto read_ec = conn.Run(
          [&](auto h) { http::async_read(conn.sock(), conn.buffer(), parser, h); }, left());
      if (!read_ec || !write_cut) ec = read_ec;
    }
    if (ec) {
      conn.Close();
      const bool stale =
          reused && (ec == http::error::end_of_stream || ec == asio::error::connection_reset ||
                     ec == asio::error::broken_pipe || ec == asio::error::eof);
      if (stale && attempt == 0) continue;
      out.transport_error = std::string(method) + " " + std::string(target) + ": " + ec.message();
      return out;
    }
    auto& res = parser.get();
    out.status = res.result_int();
    out.headers = HeaderMap(res.base());
    out.body = std::move(res.body());
    if (!res.keep_alive()) conn.Close();
    return out;
  }
  return out;
}

Response Client::PostJson(std::string_view target, const json::value& body, milliseconds timeout) {
  return Request("POST", target, json::serialize(body), {{"Content-Type", "application/json"}},
                 timeout);
}

Response Client::PutJson(std::string_view target, const json::value& body, milliseconds timeout) {
  return Request("PUT", target, json::serialize(body), {{"Content-Type", "application/json"}},
                 timeout);
}

// ---- NdjsonStream ----

struct NdjsonStream::Impl {
  Conn conn;
  http::response_parser<http::buffer_body> parser;
};

NdjsonStream::NdjsonStream(const Endpoint& endpoint, std::string_view method,
                           std::string_view target, std::string_view body, milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->parser.body_limit(kNoBodyLimit);
  Conn& conn = impl_->conn;
  if (auto ec = conn.Connect(endpoint, timeout)) {
    error_ = "connect " + endpoint.Describe() + ": " + ec.message();
    done_ = true;
    return;
  }
  http::request<http::string_body> req;
  req.method_string(beast::string_view(method.data(), method.size()));
  req.target(beast::string_view(target.data(), target.size()));
  req.version(11);
  req.set(http::field::host, "nsboxd");
  req.set(http::field::accept, "application/x-ndjson");
  req.set(http::field::content_type, "application/json");
  req.body() = std::string(body);
  req.prepare_payload();
  auto ec = conn.Run([&](auto h) { http::async_write(conn.sock(), req, h); }, timeout);
  if (!ec) {
    ec = conn.Run(
        [&](auto h) { http::async_read_header(conn.sock(), conn.buffer(), impl_->parser, h); },
        timeout);
  }
  if (ec) {
    error_ = "request " + std::string(target) + ": " + ec.message();
    done_ = true;
    conn.Close();
    return;
  }
  status_ = impl_->parser.get().result_int();
  headers_ = HeaderMap(impl_->parser.get().base());
  if (impl_->parser.is_done()) done_ = true;
}

NdjsonStream::~NdjsonStream() = default;

void NdjsonStream::Close() {
  impl_->conn.Close();
  done_ = true;
}

std::optional<std::string> NdjsonStream::NextLine(milliseconds timeout, bool* timed_out) {
  const auto deadline = Clock::now() + timeout;
  if (timed_out != nullptr) *timed_out = false;
  char chunk[65536];
  for (;;) {
    auto nl = pending_.find('\n');
    if (nl != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return line;
    }
    if (done_ || impl_->parser.is_done()) {
      done_ = true;
      if (!pending_.empty()) {
        std::string line = std::move(pending_);
        pending_.clear();
        return line;
      }
      return std::nullopt;
    }
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left <= milliseconds(0)) {
      if (timed_out != nullptr) *timed_out = true;
      error_ = "no line within the deadline";
      return std::nullopt;
    }
    auto& body = impl_->parser.get().body();
    body.data = chunk;
    body.size = sizeof(chunk);
    Conn& conn = impl_->conn;
    auto ec = conn.Run(
        [&](auto h) { http::async_read_some(conn.sock(), conn.buffer(), impl_->parser, h); }, left);
    pending_.append(chunk, sizeof(chunk) - body.size);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      if (ec == asio::error::timed_out) {
        if (timed_out != nullptr) *timed_out = true;
      }
      error_ = "reading the stream: " + ec.message();
      done_ = true;
      conn.Close();
      if (!pending_.empty()) {
        // The partial line before the error is not returned: the stream was cut.
        error_ += " (partial line: " + pending_ + ")";
        pending_.clear();
      }
      return std::nullopt;
    }
  }
}

std::optional<json::object> NdjsonStream::Next(milliseconds timeout) {
  auto line = NextLine(timeout);
  if (!line) return std::nullopt;
  boost::system::error_code ec;
  json::value v = json::parse(*line, ec);
  if (ec || !v.is_object()) {
    error_ = "not a JSON object line: " + *line;
    return std::nullopt;
  }
  return std::move(v.as_object());
}

std::vector<json::object> NdjsonStream::ReadAll(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<json::object> out;
  for (;;) {
    auto left = std::max(milliseconds(1),
                         std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
    auto ev = Next(left);
    if (!ev) break;
    out.push_back(std::move(*ev));
  }
  return out;
}

std::string NdjsonStream::ReadRest(milliseconds timeout) {
  std::string out;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    auto left = std::max(milliseconds(1),
                         std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
    auto line = NextLine(left);
    if (!line) break;
    out += *line;
    if (!done_) out += "\n";
  }
  return out;
}

// ---- RawConnection ----

struct RawConnection::Impl {
  Conn conn;
};

RawConnection::RawConnection(const Endpoint& endpoint, milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  if (auto ec = impl_->conn.Connect(endpoint, timeout)) {
    error_ = "connect " + endpoint.Describe() + ": " + ec.message();
  }
}

RawConnection::~RawConnection() = default;

bool RawConnection::connected() const { return impl_->conn.is_open(); }

bool RawConnection::Send(std::string_view bytes, milliseconds timeout) {
  Conn& conn = impl_->conn;
  if (!conn.is_open()) return false;
  auto ec = conn.Run(
      [&](auto h) { asio::async_write(conn.sock(), asio::buffer(bytes.data(), bytes.size()), h); },
      timeout);
  if (ec) {
    error_ = "send: " + ec.message();
    return false;
  }
  return true;
}

void RawConnection::ShutdownWrite() {
  beast::error_code ignored;
  if (impl_->conn.is_open()) impl_->conn.sock().shutdown(Socket::shutdown_send, ignored);
}

Response RawConnection::ReadResponse(milliseconds timeout) {
  Response out;
  Conn& conn = impl_->conn;
  if (!conn.is_open()) {
    out.transport_error = "not connected: " + error_;
    return out;
  }
  http::response_parser<http::string_body> parser;
  parser.body_limit(kNoBodyLimit);
  auto ec =
      conn.Run([&](auto h) { http::async_read(conn.sock(), conn.buffer(), parser, h); }, timeout);
  if (ec) {
    out.transport_error = "read response: " + ec.message();
    return out;
  }
  auto& res = parser.get();
  out.status = res.result_int();
  out.headers = HeaderMap(res.base());
  out.body = std::move(res.body());
  return out;
}

bool RawConnection::WaitClosed(milliseconds timeout, std::string* received) {
  Conn& conn = impl_->conn;
  if (!conn.is_open()) return true;
  const auto deadline = Clock::now() + timeout;
  // Bytes the parser of an earlier ReadResponse buffered beyond its message.
  if (received != nullptr && conn.buffer().size() > 0) {
    received->append(beast::buffers_to_string(conn.buffer().data()));
  }
  conn.buffer().clear();
  char chunk[16384];
  for (;;) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left <= milliseconds(0)) return false;
    size_t n = 0;
    auto ec = conn.Run(
        [&](auto h) { conn.sock().async_read_some(asio::buffer(chunk, sizeof(chunk)), h); }, left,
        &n);
    if (received != nullptr) received->append(chunk, n);
    if (ec == asio::error::timed_out) return false;
    if (ec) {
      conn.Close();
      return true;
    }
  }
}

void RawConnection::Close() { impl_->conn.Close(); }

// ---- encoding ----

std::string PctEncode(std::string_view s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string JsonQuoteRaw(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = (static_cast<unsigned char>(bytes[i]) << 16) |
                 (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                 static_cast<unsigned char>(bytes[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == bytes.size()) {
    uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    uint32_t v = (static_cast<unsigned char>(bytes[i]) << 16) |
                 (static_cast<unsigned char>(bytes[i + 1]) << 8);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::optional<std::string> Base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      char c = text[i + j];
      v <<= 6;
      if (c == '=') {
        if (i + 4 != text.size() || j < 2) return std::nullopt;
        ++pad;
        continue;
      }
      if (pad > 0) return std::nullopt;
      const char* at = std::strchr(kB64, c);
      if (c == '\0' || at == nullptr) return std::nullopt;
      v |= static_cast<uint32_t>(at - kB64);
    }
    out += static_cast<char>((v >> 16) & 255);
    if (pad < 2) out += static_cast<char>((v >> 8) & 255);
    if (pad < 1) out += static_cast<char>(v & 255);
  }
  return out;
}

bool WaitPoolFull(Client& client, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    Response r = client.Get("/metrics");
    long ready = -1;
    long size = -2;
    long ahead = -1;
    std::istringstream lines(r.body);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("nsbox_pool_ready ", 0) == 0)
        ready = std::strtol(line.c_str() + 17, nullptr, 10);
      if (line.rfind("nsbox_pool_size ", 0) == 0)
        size = std::strtol(line.c_str() + 16, nullptr, 10);
      if (line.rfind("nsbox_pool_adopted_ahead ", 0) == 0)
        ahead = std::strtol(line.c_str() + 25, nullptr, 10);
    }
    // With a pool, one jail is also adopted ahead for the next creation's directory.
    if (ready == size && ahead == (size > 0 ? 1 : 0)) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
}

}  // namespace nsbox::e2e

#pragma once

// The e2e tier's own HTTP client, written against api.md and nothing of the daemon's code: a
// keep-alive client for plain requests, an NDJSON stream reader, and a raw connection that sends
// whatever bytes a test wants (malformed requests, truncated bodies, hang-ups mid-request).
//
// Every call has a deadline: a daemon that never answers fails the test instead of hanging it.
// Boost.Beast over Boost.Asio, driven synchronously (each call runs the io_context until the
// operation completes or the deadline passes, then closes the socket).

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json.hpp>

namespace nsbox::e2e {

namespace json = boost::json;
using std::chrono::milliseconds;

// NSBOX_E2E_TIME_SCALE (a positive number, default 1): how much slower than the host the machine
// the tier runs on is (tests/vm/ boots a VM under qemu TCG, 15-20x slower for CPU work). Every
// wait of the harness's own, and every deadline a test sets with Scaled(), is multiplied by it.
// Read once; a value that is not a positive number ends the test binary (exit 2), so a typo does
// not silently run with the host's waits.
inline double TimeScale() {
  static const double scale = [] {
    const char* text = std::getenv("NSBOX_E2E_TIME_SCALE");
    if (text == nullptr || *text == '\0') return 1.0;
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (*end != '\0' || !(value > 0) || value > 1000) {
      std::fprintf(stderr, "e2e: NSBOX_E2E_TIME_SCALE=%s is not a positive number (up to 1000)\n",
                   text);
      std::exit(2);
    }
    return value;
  }();
  return scale;
}
// `wait` (a duration on the host) on this machine: times TimeScale(), rounded up.
inline milliseconds Scaled(milliseconds wait) {
  return milliseconds(
      static_cast<int64_t>(std::ceil(static_cast<double>(wait.count()) * TimeScale())));
}

// The deadline of a request that names none: 20 s on the host.
inline const milliseconds kDefaultTimeout = Scaled(milliseconds(20000));

// Where the daemon listens: a Unix socket path, or a TCP host and port (unix_path empty).
struct Endpoint {
  std::string unix_path;
  std::string host;
  uint16_t port = 0;

  static Endpoint Unix(std::string path) { return {std::move(path), "", 0}; }
  static Endpoint Tcp(std::string host, uint16_t port) { return {"", std::move(host), port}; }
  std::string Describe() const;
};

struct Response {
  // 0 when no answer came (connection refused, closed or the deadline passed): `transport_error`
  // says why.
  int status = 0;
  std::string transport_error;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;

  std::string Header(const std::string& lower_name) const;
  // The body as JSON (a null value when it is not JSON).
  json::value Json() const;
  // error.code and error.message of an error body ("" when absent).
  std::string ErrorCode() const;
  std::string ErrorMessage() const;
  // "STATUS headers body" (body cut at 2000 bytes) for assertion messages.
  std::string Describe() const;
};

using Headers = std::vector<std::pair<std::string, std::string>>;

// A keep-alive client: requests go over one connection, reopened when the daemon closed it.
// Not thread-safe: one Client per thread.
class Client {
 public:
  explicit Client(Endpoint endpoint, std::string bearer_token = "");
  ~Client();
  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;

  Response Request(std::string_view method, std::string_view target, std::string_view body = {},
                   const Headers& headers = {}, milliseconds timeout = kDefaultTimeout);
  Response Get(std::string_view target, milliseconds timeout = kDefaultTimeout) {
    return Request("GET", target, {}, {}, timeout);
  }
  Response Delete(std::string_view target, milliseconds timeout = kDefaultTimeout) {
    return Request("DELETE", target, {}, {}, timeout);
  }
  // A JSON body, with Content-Type: application/json.
  Response PostJson(std::string_view target, const json::value& body,
                    milliseconds timeout = kDefaultTimeout);
  Response PutJson(std::string_view target, const json::value& body,
                   milliseconds timeout = kDefaultTimeout);

  // Drops the connection (the next request opens a new one).
  void Disconnect();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One streaming request (Accept: application/x-ndjson): the status and headers first, then the
// body line by line as the daemon sends it.
class NdjsonStream {
 public:
  NdjsonStream(const Endpoint& endpoint, std::string_view method, std::string_view target,
               std::string_view body, milliseconds timeout = kDefaultTimeout);
  ~NdjsonStream();
  NdjsonStream(const NdjsonStream&) = delete;
  NdjsonStream& operator=(const NdjsonStream&) = delete;

  // The status (0 if no header came, with error() saying why) and the response headers.
  int status() const { return status_; }
  const std::map<std::string, std::string>& headers() const { return headers_; }
  const std::string& error() const { return error_; }
  // For a non-200 answer: its whole body.
  std::string ReadRest(milliseconds timeout = kDefaultTimeout);

  // The next line, without its '\n'; nullopt at the end of the body, on an error or when the
  // deadline passes (error() says which). `timed_out` is set when the deadline passed.
  std::optional<std::string> NextLine(milliseconds timeout = kDefaultTimeout,
                                      bool* timed_out = nullptr);
  // The next line parsed as a JSON object (a failed parse is an error).
  std::optional<json::object> Next(milliseconds timeout = kDefaultTimeout);
  // Every remaining event up to the end of the body.
  std::vector<json::object> ReadAll(milliseconds timeout = kDefaultTimeout);
  bool done() const { return done_; }

  // Hangs up: closes the connection without reading further.
  void Close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int status_ = 0;
  std::map<std::string, std::string> headers_;
  std::string error_;
  std::string pending_;
  bool done_ = false;
};

// A connection that carries whatever bytes the test writes.
class RawConnection {
 public:
  explicit RawConnection(const Endpoint& endpoint, milliseconds timeout = kDefaultTimeout);
  ~RawConnection();
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const;
  const std::string& error() const { return error_; }
  // Writes all of `bytes`; false (and error()) when the daemon closed the connection.
  bool Send(std::string_view bytes, milliseconds timeout = kDefaultTimeout);
  // Closes the write side (the daemon reads EOF) but keeps reading.
  void ShutdownWrite();
  // Reads one HTTP response (status 0 and transport_error if none came in time).
  Response ReadResponse(milliseconds timeout = kDefaultTimeout);
  // True when the daemon closes the connection (EOF or reset) before the deadline; whatever it
  // sent before is appended to `*received` when given.
  bool WaitClosed(milliseconds timeout, std::string* received = nullptr);
  // Hangs up.
  void Close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string error_;
};

// Percent-encodes every byte but the unreserved ones of RFC 3986 (A-Z a-z 0-9 - . _ ~).
std::string PctEncode(std::string_view s);

// The bytes of a JSON string value (invalid UTF-8 is what the test wants to send as it is):
// `"` + escaped + `"`, escaping only '"', '\\' and control characters.
std::string JsonQuoteRaw(std::string_view s);

// Waits until the daemon's pool (docs/daemon.md "The pool") holds every jail it keeps
// (GET /metrics: nsbox_pool_ready equals nsbox_pool_size, and with a pool a jail is adopted
// ahead: nsbox_pool_adopted_ahead 1), so that a case starts from the
// daemon's standing state; false when it did not within `timeout`.
bool WaitPoolFull(Client& client, milliseconds timeout = milliseconds(10000));

// Standard base64 (RFC 4648, with padding) of bytes, and back (nullopt for invalid input).
std::string Base64Encode(std::string_view bytes);
std::optional<std::string> Base64Decode(std::string_view text);

}  // namespace nsbox::e2e

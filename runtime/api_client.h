#pragma once

// The client side of api.md: a synchronous HTTP/1.1 keep-alive connection to nsboxd over its
// Unix socket, or over TCP with a bearer token. Used by the CLI's client commands and the e2e
// tests. Transport failures are Errors; every HTTP answer, error statuses included, is an
// ApiResponse whose error() is the api.md error body.

#include <boost/json/value.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"

namespace nsbox::runtime {

// Where nsboxd listens: a Unix socket, or TCP (numeric address; "localhost" is 127.0.0.1, since
// the static binary cannot resolve names) with the token every TCP request must carry.
struct ApiEndpoint {
  std::string socket_path;  // non-empty: a Unix socket
  // Tried in turn when socket_path cannot be connected to: the CLI's default sockets, the
  // user's own and then the system's. The first that connects replaces socket_path.
  std::vector<std::string> socket_fallbacks;
  std::string host;  // numeric IPv4 or IPv6 address, for TCP
  uint16_t port = 0;
  std::string token;  // sent as "Authorization: Bearer <token>" when non-empty

  static ApiEndpoint Unix(std::string path);
  // "http://HOST[:PORT][/]"; HOST is an IPv4 address, [IPv6] or localhost. Port 80 by default.
  static Result<ApiEndpoint> FromUrl(std::string_view url, std::string token);
  // "/run/nsbox/nsboxd.sock" or "http://127.0.0.1:7711", for messages.
  std::string Describe() const;
};

// An api.md error body, {"error": {"code", "message", "path", "syscall"}}, and its HTTP status.
// A body that is not one (a proxy's page, an empty 500) still gives a readable message.
struct ApiErrorBody {
  int status = 0;
  std::string code;     // "sandbox_not_found", "ENOENT", ...
  std::string message;  // self-contained, shown to the user as is
  std::string path;     // for file-system errors

  static ApiErrorBody Parse(int status, std::string_view body);
};

struct ApiResponse {
  int status = 0;
  std::string content_type;
  // The whole body; for streamed calls only the error body (when !ok()).
  std::string body;

  bool ok() const { return status >= 200 && status < 300; }
  ApiErrorBody error() const { return ApiErrorBody::Parse(status, body); }
  // The body as JSON; an error if it is not.
  Result<boost::json::value> Json() const;
};

enum class Method { kGet, kPut, kPost, kDelete };

// RFC 3986 percent-encoding of everything but the unreserved characters, byte by byte: for ids
// and paths in URLs ("conv/42" is "conv%2F42").
std::string PercentEncode(std::string_view s);
// "/v1/sandboxes/<id>" + `suffix` ("/exec", "/fs/stat").
std::string SandboxTarget(std::string_view id, std::string_view suffix = "");
// "/v1/sandboxes/<id>/files?path=<path>".
std::string FilesTarget(std::string_view id, std::string_view path);

// True when `s` is valid UTF-8 (JSON strings must be; other paths go as pathBase64).
bool IsValidUtf8(std::string_view s);

class ApiClient {
 public:
  using ChunkFn = std::function<Status(std::string_view chunk)>;
  using LineFn = std::function<Status(std::string_view line)>;

  explicit ApiClient(ApiEndpoint endpoint);
  ~ApiClient();
  ApiClient(const ApiClient&) = delete;
  ApiClient& operator=(const ApiClient&) = delete;

  const ApiEndpoint& endpoint() const { return endpoint_; }

  // Opens the connection now if there is none (or the daemon closed the idle one). Requests do
  // it themselves; this is for callers that need socket_fd() before a request.
  Status Connect();
  // The connection's file descriptor, -1 when there is none. A signal handler may shutdown(2)
  // it to abort a blocking call (the call then fails and the connection is dropped).
  int socket_fd() const;
  void Disconnect();
  // Connects (as Connect does) and hands the connected socket over: the caller owns it, and
  // this client no longer uses it (the next request opens another). For the WebSocket upgrade,
  // which speaks its own protocol on the connection.
  Result<UniqueFd> ReleaseSocket();
  // True when the last call failed because the daemon could not be reached at all.
  bool connect_failed() const { return connect_failed_; }
  // After a failed connection to a Unix socket: each socket tried, in order, and its errno.
  struct ConnectFailure {
    std::string socket;
    int code = 0;
  };
  const std::vector<ConnectFailure>& connect_failures() const { return connect_failures_; }

  // A request without a body, or with a JSON body; the answer read whole.
  Result<ApiResponse> Call(Method method, const std::string& target);
  Result<ApiResponse> Call(Method method, const std::string& target,
                           const boost::json::value& body);
  // The answer's body is given to `on_line` one line at a time (without the newline) as it
  // arrives: for `Accept: application/x-ndjson` streams. Only a 2xx body is streamed; an error
  // body is read whole into the response. An error from `on_line` ends the call with it.
  Result<ApiResponse> StreamLines(Method method, const std::string& target,
                                  const boost::json::value& body, std::string_view accept,
                                  const LineFn& on_line);
  // A GET whose 2xx body is given to `on_chunk` piece by piece, never held whole.
  Result<ApiResponse> Download(const std::string& target, const ChunkFn& on_chunk);
  // A request whose body is read from `fd` as it is sent: with Content-Length when `fd` is a
  // regular file (its size from fstat), else with chunked transfer-encoding.
  struct UploadOptions {
    std::function<void(uint64_t bytes_sent)> on_sent;  // after each piece
    // When set, the answer is asked for as application/x-ndjson and streamed here line by line
    // (as StreamLines does).
    LineFn on_line;
  };
  Result<ApiResponse> Upload(Method method, const std::string& target, int fd,
                             const UploadOptions& options);
  Result<ApiResponse> Upload(Method method, const std::string& target, int fd) {
    return Upload(method, target, fd, UploadOptions{});
  }

 private:
  struct Connection;

  // Connects if needed and sends a request with an optional JSON body (null: none) and Accept.
  Status Send(Method method, const std::string& target, const boost::json::value& body,
              std::string_view accept);
  // Reads an answer whose request was sent: a 2xx body to `on_chunk`, an error body whole.
  Result<ApiResponse> ReadStreamed(const ChunkFn& on_chunk);
  // The same, a 2xx body given to `on_line` a line at a time.
  Result<ApiResponse> ReadLines(const LineFn& on_line);

  ApiEndpoint endpoint_;
  std::unique_ptr<Connection> conn_;
  bool connect_failed_ = false;
  std::vector<ConnectFailure> connect_failures_;
};

}  // namespace nsbox::runtime

#include "runtime/ws_exec.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "base/files.h"
#include "base/strings.h"
#include "runtime/terminal.h"

namespace nsbox::runtime {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace json = boost::json;
using Socket = asio::generic::stream_protocol::socket;
using Ws = websocket::stream<Socket>;

// Channel bytes of binary messages (docs/exec.md).
constexpr char kStdin = 0;
constexpr char kStdout = 1;
constexpr char kStderr = 2;
// stdin read ahead of what the socket has taken: the reader waits beyond this.
constexpr size_t kMaxPendingInput = 1u << 20;
constexpr size_t kInputChunk = 64u << 10;
// The daemon's messages are at most an output chunk plus a channel byte; JSON control messages
// are small. Anything larger is a broken peer.
constexpr size_t kMaxMessage = 4u << 20;

std::string Text(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string(v->get_string()) : std::string();
}

class Session {
 public:
  Session(asio::io_context& io, Ws& ws, const WsExecOptions& options)
      : io_(io), ws_(ws), options_(options), signals_(io) {}

  Result<WsExecResult> Run() {
    int wake[2];
    if (::pipe2(wake, O_CLOEXEC) < 0) return Error::Sys("pipe2", "nsbox exec", errno);
    wake_read_.reset(wake[0]);
    wake_write_.reset(wake[1]);

    signals_.add(SIGINT);
    signals_.add(SIGTERM);
    signals_.add(SIGHUP);
    if (options_.tty) signals_.add(SIGWINCH);
    WaitSignal();
    Read();
    std::thread input;
    if (options_.in_fd >= 0) input = std::thread([this] { InputLoop(); });
    io_.run();
    Stop();
    if (input.joinable()) input.join();
    if (error_) return *error_;
    return result_;
  }

 private:
  struct Outgoing {
    std::string data;
    bool binary = true;
    size_t input_bytes = 0;  // what it counts against kMaxPendingInput
  };

  void WaitSignal() {
    signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      if (sig == SIGWINCH) {
        if (auto size = TerminalSize(options_.in_fd); size) {
          json::object resize{{"type", "resize"}, {"rows", size->rows}, {"cols", size->cols}};
          Enqueue({json::serialize(resize), false, 0});
        }
        WaitSignal();
        return;
      }
      // Hanging up is what kills the command (api.md, Cancellation).
      result_.interrupted = true;
      result_.signal = sig;
      Finish();
    });
  }

  void Read() {
    ws_.async_read(buffer_, [this](const boost::system::error_code& ec, size_t) {
      if (ec) {
        // After the exit message the daemon closes the connection; either way it is over.
        if (!result_.exited && !result_.interrupted && ec != websocket::error::closed) {
          error_ = Error::Msg("the connection to nsboxd broke: " + ec.message());
        } else if (!result_.exited && !result_.interrupted) {
          error_ = Error::Msg("nsboxd closed the connection before the command ended");
        }
        Finish();
        return;
      }
      std::string message = beast::buffers_to_string(buffer_.data());
      buffer_.consume(buffer_.size());
      ReadOn(Handle(message, ws_.got_binary()));
    });
  }

  // After a message's output was written (or held): the next message, once nothing is held.
  void ReadOn(Status written) {
    if (!written.ok()) {
      error_ = std::move(written).error();
      Finish();
    } else if (!held_.empty()) {
      FlushHeld();
    } else {
      Read();
    }
  }

  // Output to our stdout or stderr. A signal interrupts a write that waits for a reader which
  // stopped reading (asio's handler has no SA_RESTART): the write ends with EINTR, or short when
  // some of it was written. The rest is then held, and written by FlushHeld once the loop has run
  // the signal's handler: Ctrl-C, SIGTERM and SIGHUP end nsbox at once, where a write retried
  // after EINTR waited for the reader.
  Status WriteOrHold(int fd, std::string_view data, std::string_view what) {
    if (data.empty()) return Ok();
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno != EINTR) return Error::Sys("write", what, errno);
    if (n > 0) data.remove_prefix(static_cast<size_t>(n));
    if (!data.empty()) {
      held_fd_ = fd;
      held_what_ = std::string(what);
      held_.assign(data);
    }
    return Ok();
  }

  // Writes what WriteOrHold held, then reads on; after two turns of the loop's reactor, by a
  // timer due at once. The reactor's turn that takes the interrupting signal from asio's pipe
  // may complete this timer before the signal's handler (both are queued in that turn, in no set
  // order); the handler has always run before the next turn.
  void FlushHeld(int turns = 2) {
    held_timer_.expires_after(std::chrono::seconds(0));
    held_timer_.async_wait([this, turns](const boost::system::error_code& ec) {
      if (ec || finished_) return;
      if (turns > 1) {
        FlushHeld(turns - 1);
        return;
      }
      const std::string data = std::move(held_);
      held_.clear();
      ReadOn(WriteOrHold(held_fd_, data, held_what_));
    });
  }

  Status Handle(std::string_view message, bool binary) {
    if (binary) {
      if (message.empty()) return Error::Msg("nsboxd sent an empty binary message");
      const char channel = message[0];
      message.remove_prefix(1);
      if (channel == kStdout) return WriteOrHold(options_.out_fd, message, "stdout");
      if (channel == kStderr) return WriteOrHold(options_.err_fd, message, "stderr");
      return Error::Msg("nsboxd sent output on an unknown channel " +
                        std::to_string(static_cast<unsigned char>(channel)));
    }
    boost::system::error_code ec;
    json::value v = json::parse(message, ec);
    if (ec || !v.is_object()) return Error::Msg("nsboxd sent a control message that is not JSON");
    const json::object& event = v.get_object();
    const std::string type = Text(event, "type");
    if (type == "exit") {
      result_.exited = true;
      result_.reason = Text(event, "reason");
      const json::value* code = event.if_contains("exitCode");
      result_.exit_code = code != nullptr && code->is_int64() ? code->get_int64() : 1;
    } else if (type == "error") {
      const json::value* err = event.if_contains("error");
      const json::object no_error;
      const json::object& e = err != nullptr && err->is_object() ? err->get_object() : no_error;
      const std::string code = Text(e, "code");
      // Keys typed while the command ends (the shell's `exit`, then more typing) reach it too
      // late: expected, and not worth a line on the user's terminal.
      if (code == "exec_ended" || code == "stdin_closed") return Ok();
      std::string text = e.empty() ? std::string("an error") : Text(e, "message");
      // Not fatal (a resize the daemon refused, say); shown where it cannot garble the output.
      std::string line = "nsbox: " + text + (options_.tty ? "\r\n" : "\n");
      (void)WriteAll(options_.err_fd, line, "stderr");
    }
    return Ok();
  }

  // On the event loop.
  void Enqueue(Outgoing out) {
    if (finished_) {
      Release(out.input_bytes);
      return;
    }
    queue_.push_back(std::move(out));
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    if (queue_.empty() || finished_) {
      writing_ = false;
      return;
    }
    writing_ = true;
    ws_.binary(queue_.front().binary);
    ws_.async_write(asio::buffer(queue_.front().data),
                    [this](const boost::system::error_code& ec, size_t) {
                      Release(queue_.front().input_bytes);
                      queue_.pop_front();
                      if (ec) {
                        // The read side reports why the connection ended.
                        writing_ = false;
                        return;
                      }
                      WriteNext();
                    });
  }

  void Release(size_t bytes) {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    pending_ -= bytes;
    cv_.notify_all();
  }

  // Reads this process's stdin on its own thread (a regular file or a pipe works the same) and
  // hands the bytes to the event loop, never more than kMaxPendingInput ahead of the socket.
  void InputLoop() {
    // The signals go to the loop's thread, whose write to a stalled stdout they must interrupt
    // (WriteOrHold); taken here, they would leave it blocked there.
    sigset_t mask;
    sigemptyset(&mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGWINCH}) sigaddset(&mask, sig);
    pthread_sigmask(SIG_BLOCK, &mask, nullptr);
    std::string buf(kInputChunk, '\0');
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || pending_ < kMaxPendingInput; });
        if (stopping_) return;
      }
      struct pollfd p[2] = {{options_.in_fd, POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[1].revents != 0) return;
      ssize_t n = ::read(options_.in_fd, buf.data(), buf.size());
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        // EOF (or a terminal that went away): the command's stdin closes (on a terminal: VEOF).
        json::object close{{"type", "stdin-close"}};
        asio::post(io_, [this, text = json::serialize(close)] { Enqueue({text, false, 0}); });
        return;
      }
      std::string message;
      message.reserve(static_cast<size_t>(n) + 1);
      message.push_back(kStdin);
      message.append(buf.data(), static_cast<size_t>(n));
      {
        std::lock_guard<std::mutex> lock(mu_);
        pending_ += static_cast<size_t>(n);
      }
      asio::post(io_, [this, m = std::move(message), size = static_cast<size_t>(n)]() mutable {
        Enqueue({std::move(m), true, size});
      });
    }
  }

  // On the event loop: ends the session. The connection is closed hard, not with a close
  // handshake: when the command is still running (an interrupt), dropping it is the cancel.
  void Finish() {
    if (finished_) return;
    finished_ = true;
    boost::system::error_code ignored;
    signals_.cancel(ignored);
    held_timer_.cancel();
    beast::get_lowest_layer(ws_).close(ignored);
    Stop();
    io_.stop();
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    if (wake_write_.valid()) (void)!::write(wake_write_.get(), "x", 1);
  }

  asio::io_context& io_;
  Ws& ws_;
  const WsExecOptions& options_;
  asio::signal_set signals_;
  asio::steady_timer held_timer_{io_};
  std::string held_;  // output a signal interrupted, still to write (WriteOrHold)
  int held_fd_ = -1;
  std::string held_what_;
  beast::flat_buffer buffer_;
  std::deque<Outgoing> queue_;
  bool writing_ = false;
  bool finished_ = false;
  WsExecResult result_;
  std::optional<Error> error_;

  std::mutex mu_;  // pending_, stopping_
  std::condition_variable cv_;
  size_t pending_ = 0;
  bool stopping_ = false;
  UniqueFd wake_read_;
  UniqueFd wake_write_;
};

}  // namespace

Result<WsExecResult> RunWsExec(const ApiEndpoint& endpoint, const std::string& sandbox_id,
                               const WsExecOptions& options) {
  const std::string what = "connect to nsboxd at " + endpoint.Describe();
  ApiClient client(endpoint);
  auto fd = client.ReleaseSocket();
  if (!fd.ok()) return std::move(fd).error();
  struct sockaddr_storage addr {};
  socklen_t len = sizeof addr;
  if (::getsockname(fd->get(), reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    return Error::Sys("getsockname", what, errno);
  }
  const int protocol = addr.ss_family == AF_UNIX ? 0 : IPPROTO_TCP;

  asio::io_context io;
  Ws ws(io);
  boost::system::error_code ec;
  beast::get_lowest_layer(ws).assign(asio::generic::stream_protocol(addr.ss_family, protocol),
                                     fd->release(), ec);
  if (ec) return Error::Msg(what + ": " + ec.message());
  ws.read_message_max(kMaxMessage);
  // A client masks what it sends through this buffer, one write per buffer's worth (4 KiB by
  // default: a 64 KiB stdin message took 16 writes): a whole input message in one.
  ws.write_buffer_bytes(kInputChunk + 1);
  ws.set_option(websocket::stream_base::decorator([&endpoint](websocket::request_type& req) {
    req.set(http::field::user_agent, "nsbox-cli");
    if (!endpoint.token.empty()) req.set(http::field::authorization, "Bearer " + endpoint.token);
  }));
  const std::string host = endpoint.socket_path.empty()
                               ? endpoint.host + ":" + std::to_string(endpoint.port)
                               : std::string("localhost");
  websocket::response_type response;
  ws.handshake(response, host, SandboxTarget(sandbox_id, "/exec"), ec);
  if (ec == websocket::error::upgrade_declined) {
    return Error::Msg(ApiErrorBody::Parse(response.result_int(), response.body()).message);
  }
  if (ec) return Error::Msg(what + ": the WebSocket handshake failed: " + ec.message());

  ws.text(true);
  ws.write(asio::buffer(json::serialize(options.body)), ec);
  if (ec) return Error::Msg(what + ": sending the exec request failed: " + ec.message());

  std::optional<RawTerminal> raw;
  if (options.tty) raw.emplace(options.in_fd);
  Session session(io, ws, options);
  return session.Run();
}

}  // namespace nsbox::runtime

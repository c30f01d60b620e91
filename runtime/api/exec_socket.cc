// The WebSocket of an exec (docs/exec.md "WebSocket"): one started, or attached to.

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

namespace {

// ---- the WebSocket of an exec (docs/exec.md "WebSocket") ----

std::string ControlError(const ApiError& error) {
  json::object e;
  e["code"] = error.code;
  e["message"] = utf8::DecodeLossy(error.message);
  json::object o;
  o["type"] = "error";
  o["error"] = std::move(e);
  return json::serialize(o);
}

}  // namespace

void Daemon::WsPush(WsState& st, ExecSession* s, std::string message) {
  // A client that floods bad control messages gets no more than this many answers queued.
  if (st.control.size() < 64) st.control.push_back(std::move(message));
  if (s != nullptr) s->Poke();
  st.wake.cancel();
}

asio::awaitable<void> Daemon::WsReader(WebSocket& ws, std::shared_ptr<WsState> st,
                                       std::shared_ptr<ExecSession> s,
                                       std::shared_ptr<SandboxEntry> entry, bool starter) {
  // One buffer for every message. Beast reads a message into it as much as its free room at a
  // time, and a new buffer's room starts at 512 bytes: a stream of 64 KiB stdin messages took
  // 27,000 reads and as many epoll_waits per 50 MB. After a message of more than 4 KiB the next
  // gets kSocketReadRoom; a bigger room (a message of up to 1 MiB) is given back, so that a
  // session idle after a burst (a shell) holds at most that.
  beast::flat_buffer buf;
  for (;;) {
    const bool large = buf.size() > 4096;
    buf.clear();
    if (buf.capacity() > kSocketReadRoom) buf = beast::flat_buffer();
    if (large) buf.reserve(kSocketReadRoom);
    auto [ec, n] = co_await ws.async_read(buf, kTuple);
    (void)n;
    if (ec) {
      if (ec == websocket::error::message_too_big) {
        log::info("sandbox={} exec={} a WebSocket message over 1 MiB: closed with 1009",
                  entry->config().id, s->id());
      }
      break;
    }
    metrics_.BytesIn(buf.size());
    std::string msg = beast::buffers_to_string(buf.data());
    if (ws.got_binary()) {
      if (msg.empty() || msg[0] != 0) {
        const std::string what =
            msg.empty() ? std::string("an empty binary message has no channel byte")
                        : "unknown channel " + std::to_string(static_cast<unsigned char>(msg[0])) +
                              ": a client's binary messages carry channel 0 (stdin)";
        WsPush(*st, s.get(), ControlError(ApiError::Invalid(what)));
        continue;
      }
      if (auto refusal = InputRefusal(*s)) {
        WsPush(*st, s.get(), ControlError(*refusal));
        continue;
      }
      std::shared_ptr<Sandbox> box = s->box.lock();
      for (size_t at = 1; at < msg.size() && box != nullptr;) {
        const size_t len = std::min<size_t>(msg.size() - at, fs::proto::kMaxInputChunk);
        fs::proto::ExecInput input;
        input.exec_tag = s->tag;
        input.data = msg.substr(at, len);
        auto written = co_await SendInput(box, std::move(input));
        if (!written.ok()) {
          WsPush(*st, s.get(), ControlError(InputError(*s, written.error())));
          break;
        }
        at += len;
      }
      continue;
    }
    boost::system::error_code jec;
    json::value v = ParseClientJson(msg, jec);
    const json::object* o = !jec && v.is_object() ? &v.get_object() : nullptr;
    const json::value* type = o != nullptr ? o->if_contains("type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      WsPush(*st, s.get(),
             ControlError(ApiError::Invalid(
                 "a text message must be a JSON object with a \"type\": \"resize\" or "
                 "\"stdin-close\"")));
      continue;
    }
    if (type->get_string() == "resize") {
      auto size = TtySizeOf(*o, "resize: ");
      if (!size.ok()) {
        WsPush(*st, s.get(), ControlError(size.error()));
        continue;
      }
      auto refused = co_await ResizeTty(s, size.value());
      if (refused) WsPush(*st, s.get(), ControlError(*refused));
    } else if (type->get_string() == "stdin-close") {
      if (auto refusal = InputRefusal(*s)) {
        WsPush(*st, s.get(), ControlError(*refusal));
        continue;
      }
      std::shared_ptr<Sandbox> box = s->box.lock();
      if (box == nullptr) continue;
      fs::proto::ExecInput input;
      input.exec_tag = s->tag;
      input.close = true;
      s->stdin_closed = true;
      auto written = co_await SendInput(box, std::move(input));
      if (!written.ok()) WsPush(*st, s.get(), ControlError(InputError(*s, written.error())));
    } else {
      WsPush(*st, s.get(),
             ControlError(ApiError::Invalid(
                 "unknown message type \"" +
                 utf8::DecodeLossy(std::string(type->get_string().subview(0, 40))) +
                 "\" (resize, stdin-close)")));
    }
  }
  st->reader_done = true;
  // The socket that started the exec is its starter: its end kills the command unless detached.
  if (starter) KillOnHangup(*entry, *s);
  s->Poke();
  st->wake.cancel();
}

asio::awaitable<bool> Daemon::ExecSocket(Ctx& c, std::shared_ptr<SandboxEntry> entry,
                                         std::shared_ptr<ExecSession> s, uint64_t offset) {
  WebSocket ws(c.socket);
  ws.read_message_max(kMaxJsonBody);
  // Each output message in one frame, written at once: Beast otherwise splits a server's messages
  // into frames of its 4 KiB write buffer, a write each.
  ws.auto_fragment(false);
  ws.set_option(websocket::stream_base::decorator([](websocket::response_type& res) {
    res.set(http::field::server, std::string("nsboxd/") + kVersion);
  }));
  {
    auto [ec] = co_await ws.async_accept(c.parser.get(), kTuple);
    if (ec) co_return false;
  }
  c.status = 101;
  auto st = std::make_shared<WsState>(io_.get_executor());
  const bool starter = s == nullptr;
  if (starter) {
    // The first message: the exec's JSON body, as POST .../exec takes it.
    beast::flat_buffer buf;
    auto [ec, n] = co_await ws.async_read(buf, kTuple);
    (void)n;
    if (ec) co_return false;
    std::optional<ApiError> refusal;
    ApiOutcome<ExecSpec> spec = ApiError::Invalid("the first message must be the exec's JSON body");
    if (ws.got_text()) {
      boost::system::error_code jec;
      json::value v = ParseClientJson(beast::buffers_to_string(buf.data()), jec);
      if (jec || !v.is_object()) {
        refusal = ApiError::Invalid("the first message must be a JSON object: the exec's body");
      } else {
        spec = ParseExecRequest(v.get_object(), *entry);
        if (!spec.ok()) refusal = spec.error();
      }
    } else {
      refusal = spec.error();
    }
    std::shared_ptr<Sandbox> box;
    if (!refusal) {
      auto running = co_await EnsureRunning(entry);
      if (running.ok()) {
        box = running.value();
      } else {
        refusal = running.error();
      }
    }
    if (refusal) {
      metrics_.Error(refusal->code);
      const std::string text = ControlError(*refusal);
      ws.text(true);
      (void)co_await ws.async_write(asio::buffer(text), kTuple);
      const websocket::close_reason why(websocket::close_code::policy_error);
      (void)co_await ws.async_close(why, kTuple);
      co_return false;
    }
    spec.value().stdin_stream = true;  // a socket's input is always streamed
    s = StartSession(entry, box, std::move(spec.value()));
    ++running_execs_;
  }
  asio::co_spawn(io_, WsReader(ws, st, s, entry, starter), asio::detached);

  bool start_sent = false;
  bool failed = false;
  bool closed = false;
  for (;;) {
    if (!start_sent && (s->started() || s->ended())) {  // as the NDJSON stream's
      json::object o;
      o["type"] = "start";
      o["execId"] = s->id();
      o["pid"] = s->pid();
      const std::string text = json::serialize(o);
      ws.text(true);
      auto [ec, n] = co_await ws.async_write(asio::buffer(text), kTuple);
      (void)n;
      if (ec) break;
      start_sent = true;
    }
    // The answers to the client's control messages come after the start (docs/exec.md: the
    // server's first message is "start"), even to one sent before the command started.
    while ((start_sent || s->ended()) && !st->control.empty() && !failed) {
      const std::string text = std::move(st->control.front());
      st->control.pop_front();
      ws.text(true);
      auto [ec, n] = co_await ws.async_write(asio::buffer(text), kTuple);
      (void)n;
      if (ec) failed = true;
    }
    if (failed || st->reader_done || s->dropped()) break;
    auto pieces = co_await s->ReadLog(offset, kStreamChunk);
    if (!pieces.empty()) {
      for (const ExecSession::Piece& p : pieces) {
        std::string frame;
        frame.reserve(p.data.size() + 1);
        frame += static_cast<char>(p.stream == 2 ? 2 : 1);
        frame += p.data;
        ws.binary(true);
        auto [ec, n] = co_await ws.async_write(asio::buffer(frame), kTuple);
        (void)n;
        if (ec) {
          failed = true;
          break;
        }
        metrics_.BytesOut(frame.size());
        offset = p.offset + p.data.size();
      }
      if (failed) break;
      continue;
    }
    if (s->ended()) {
      json::object o;
      o["type"] = "exit";
      FillExit(o, s->exit(), s->reason());
      const std::string text = json::serialize(o);
      ws.text(true);
      auto [ec, n] = co_await ws.async_write(asio::buffer(text), kTuple);
      (void)n;
      if (ec) break;
      const websocket::close_reason why(websocket::close_code::normal);
      (void)co_await ws.async_close(why, kTuple);
      closed = true;
      break;
    }
    co_await s->WaitChange();
  }
  if (!closed && !failed && !st->reader_done) {
    const websocket::close_reason why(websocket::close_code::going_away);
    (void)co_await ws.async_close(why, kTuple);
  }
  // The reader ends with the close handshake (or the socket's end); it holds `ws`, so wait.
  for (int i = 0; !st->reader_done; ++i) {
    if (i == 1) {
      boost::system::error_code ignored;
      c.socket.shutdown(asio::socket_base::shutdown_both, ignored);
      c.socket.cancel(ignored);
    }
    st->wake.expires_after(std::chrono::seconds(i == 0 ? 5 : 60));
    (void)co_await st->wake.async_wait(kTuple);
  }
  if (starter) --running_execs_;
  co_return false;
}

asio::awaitable<bool> Daemon::ExecWebSocket(Ctx& c, const RouteArgs& a) {
  if (!websocket::is_upgrade(c.parser.get())) {
    // Plain HTTP starts an exec with POST; GET is only the WebSocket's upgrade.
    const ApiError reply_error =
        ApiError::Of(405, "method_not_allowed",
                     "method GET is not allowed here; use POST (GET only with Upgrade: websocket)");
    co_return co_await ReplyError(c, reply_error, "POST");
  }
  co_return co_await ExecSocket(c, a.entry, nullptr, 0);
}

asio::awaitable<bool> Daemon::AttachExec(Ctx& c, const RouteArgs& a) {
  const std::string exec_id = a.Param("execId");
  std::shared_ptr<ExecSession> s = a.entry->FindSession(exec_id);
  if (s == nullptr || s->dropped()) {
    const ApiError reply_error = ExecNotFound(exec_id, a.Param("id"));
    co_return co_await ReplyError(c, reply_error);
  }
  auto offset = AttachOffset(a.query, *s);
  if (!offset.ok()) {
    const ApiError reply_error = offset.error();
    co_return co_await ReplyError(c, reply_error);
  }
  if (!websocket::is_upgrade(c.parser.get())) {
    const ApiError reply_error =
        ApiError::Of(426, "upgrade_required",
                     ".../attach is a WebSocket and needs Upgrade: websocket; "
                     "GET .../output re-attaches over plain HTTP");
    co_return co_await ReplyError(c, reply_error);
  }
  co_return co_await ExecSocket(c, a.entry, s, offset.value());
}

}  // namespace nsbox::runtime::api

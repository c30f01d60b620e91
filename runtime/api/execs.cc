// The routes of exec sessions over plain HTTP (docs/exec.md): start one (buffered or NDJSON),
// re-attach to its output, write to its stdin, resize its terminal; and the session's pump.

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

// Appends `bytes` to `blocks`, strings of kStreamChunk bytes each but the last, which fills: a
// command's output kept for the buffered answer costs its size, however small its writes were.
void AppendToBlocks(std::vector<std::string>& blocks, std::string_view bytes) {
  while (!bytes.empty()) {
    if (blocks.empty() || blocks.back().size() >= kStreamChunk) {
      blocks.emplace_back();
      blocks.back().reserve(kStreamChunk);
    }
    const size_t n = std::min(bytes.size(), kStreamChunk - blocks.back().size());
    blocks.back().append(bytes.data(), n);
    bytes.remove_prefix(n);
  }
}

}  // namespace

// ---- exec ----

std::shared_ptr<ExecSession> Daemon::StartSession(std::shared_ptr<SandboxEntry> entry,
                                                  std::shared_ptr<Sandbox> box, ExecSpec spec) {
  fs::proto::ExecRequest request;
  request.command = spec.command;
  request.cwd = fs::ResolvePath(entry->config().cwd, spec.cwd.value_or(""));
  request.env = policy::BuildEnvironment(
      {HostnameFor(entry->config().id, entry->hash()), box->shell(), std::move(spec.overrides)});
  if (spec.stdin_text) request.stdin_data = *spec.stdin_text;
  request.timeout_ms = spec.timeout_ms;
  if (auto cap = entry->config().limits.output_bytes) request.output_limit = *cap;
  request.stdin_stream = spec.stdin_stream;
  request.tty = spec.tty;

  const std::string exec_id = entry->NewExecId();
  auto session = std::make_shared<ExecSession>(
      io_.get_executor(), OffloadSpill(), OffloadRead(), exec_id, request.command,
      entry->execs_dir() + "/" + exec_id + ".log", log_limits_);
  session->detach = spec.detach;
  session->stdin_stream = spec.stdin_stream || spec.tty.has_value();
  session->tty = spec.tty;
  session->box = box;
  // Its log waits on the disk: the sandbox's channel waits for it (and so do its commands).
  session->on_spill_behind = [weak = std::weak_ptr<Sandbox>(box)](bool behind) {
    HoldChannel(weak, behind);
  };

  auto queue = std::make_shared<ExecQueue>(io_.get_executor());
  auto waiting = std::make_shared<QueuedOutput>(box);
  fs::InitClient::ExecCallbacks callbacks;
  callbacks.on_started = [queue](uint32_t pid) {
    queue->Push({ExecEvent::kStarted, pid, 0, {}, std::nullopt});
  };
  callbacks.on_output = [queue, waiting](int out_stream, std::string_view data) {
    queue->Push({ExecEvent::kOutput, 0, out_stream, std::string(data), std::nullopt});
    waiting->Add(data.size());
  };
  session->tag = box->client().StartExec(
      request, std::move(callbacks), [queue](fs::FsOutcome<fs::proto::ExecExit> exit) {
        queue->Push({ExecEvent::kExit, 0, 0, {}, std::move(exit)});
      });
  entry->AddSession(session);
  metrics_.ExecStarted();
  log::info("sandbox={} exec={} started{}{}{}: {}", entry->config().id, exec_id,
            spec.detach ? " detached" : "", session->stdin_stream ? " with streamed stdin" : "",
            spec.tty ? " on a terminal" : "", request.command.substr(0, 200));
  asio::co_spawn(io_, PumpExec(entry, session, queue, waiting, Clock::now()), asio::detached);
  return session;
}

asio::awaitable<void> Daemon::PumpExec(std::shared_ptr<SandboxEntry> entry,
                                       std::shared_ptr<ExecSession> s,
                                       std::shared_ptr<ExecQueue> queue,
                                       std::shared_ptr<QueuedOutput> waiting,
                                       Clock::time_point started) {
  const auto ex = co_await asio::this_coro::executor;
  std::optional<fs::FsOutcome<fs::proto::ExecExit>> exit;
  while (!exit) {
    auto events = co_await queue->Next();
    // The readers that were woken (the buffered answer, a client that keeps up) run before the
    // log's ring can turn over: they then never fall behind its window. A yield after every
    // piece, as before, let the channel bring more in each turn than was appended: under load
    // the pieces waiting here grew to 25 MB beside the answer's 64 MiB.
    uint64_t since_yield = 0;
    for (ExecEvent& e : events) {
      if (e.kind == ExecEvent::kStarted) {
        s->Started(e.pid);
      } else if (e.kind == ExecEvent::kOutput) {
        if (since_yield > 0 && since_yield + e.data.size() > s->ring_bytes()) {
          co_await asio::post(ex, asio::use_awaitable);
          since_yield = 0;
        }
        s->Append(e.stream == 2 ? 2 : 1, e.data);
        since_yield += e.data.size();
        waiting->Taken(e.data.size());
        std::string().swap(e.data);  // in the log now
      } else {
        exit = std::move(e.exit);
      }
    }
    if (since_yield > 0) co_await asio::post(ex, asio::use_awaitable);
  }
  fs::proto::ExecExit x;
  if (exit->ok()) {
    x = exit->value();
  } else {
    // nsbox-init went away under the command (the sandbox was stopped, or died): the command
    // went with its PID namespace.
    x.exit_code = 128 + SIGKILL;
    x.signal = SIGKILL;
    x.reason = static_cast<uint8_t>(exec::EndReason::kStopped);
    // How long it ran as the daemon saw it: nsbox-init's own figure went with it. Its usage
    // stays unknown (null), never a made-up zero.
    x.duration_ms = static_cast<uint64_t>(SecondsSince(started) * 1000);
  }
  const std::string reason(exec::EndReasonName(static_cast<exec::EndReason>(x.reason)));
  metrics_.ExecFinished(reason, SecondsSince(started));
  if (x.reason == static_cast<uint8_t>(exec::EndReason::kTimeout)) metrics_.Kill("timeout");
  if (x.reason == static_cast<uint8_t>(exec::EndReason::kOutputLimit)) {
    metrics_.Kill("output_limit");
  }
  if (x.reason == static_cast<uint8_t>(exec::EndReason::kStopped)) metrics_.Kill("stopped");
  s->Ended(x, reason);
  // Its log line after the answer: the waiting request, woken by Ended, runs first.
  co_await asio::post(ex, asio::use_awaitable);
  log::info("sandbox={} exec={} ended: {} exit code {} in {} ms; {} bytes of output",
            entry->config().id, s->id(), reason, x.exit_code, x.duration_ms, s->end());
  KeepEndedRing(s);
  // Kept for re-attach for the retention time (or until the sandbox is deleted: Drop cancels).
  // Thousands may be kept: by a handler on its timer, not by this coroutine's frame, which goes
  // now with what only the running exec needed (about 1 KiB each).
  metrics_.ExecSessionsRetained(+1);
  auto expired = [this, entry, s](boost::system::error_code) {
    metrics_.ExecSessionsRetained(-1);
    entry->RemoveSession(s.get(), s->id());
    DropSession(*s);
  };
  if (s->dropped()) {
    expired({});
  } else {
    s->expiry().expires_after(retention_);
    s->expiry().async_wait(std::move(expired));
  }
}

void Daemon::KillOnHangup(SandboxEntry& entry, ExecSession& s) {
  if (s.ended()) return;
  if (s.detach) {
    log::info("sandbox={} exec={} its starter hung up; detached, it keeps running",
              entry.config().id, s.id());
    return;
  }
  std::shared_ptr<Sandbox> box = s.box.lock();
  if (box == nullptr) return;
  metrics_.Kill("cancelled");
  log::info("sandbox={} exec={} the client hung up: killing the command", entry.config().id,
            s.id());
  box->client().KillExec(s.tag, static_cast<uint8_t>(exec::EndReason::kCancelled));
}

void Daemon::WatchHangup(Ctx& c, std::shared_ptr<HangupWatch> watch,
                         std::function<void()> on_hangup) {
  const int fd = c.socket.native_handle();
  c.socket.async_wait(Socket::wait_read, [watch, fd, on_hangup](boost::system::error_code ec) {
    if (watch->finished || ec == asio::error::operation_aborted) return;
    char byte;
    ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    // 0: the client closed its end. Bytes: a pipelined request, which is not a hang-up.
    if (ec || n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) on_hangup();
  });
}

asio::awaitable<Daemon::LogSent> Daemon::SendLog(Ctx& c, std::shared_ptr<ExecSession> s,
                                                 uint64_t offset, bool follow, bool base64,
                                                 std::shared_ptr<HangupWatch> watch) {
  EventEncoder encoder(base64);
  if (!base64 && offset > s->oldest()) {
    // Each stream starts with the character it began before `offset`, if it did: a client that
    // re-attaches at the `end` of the last event it has gets it whole, as it would have.
    for (int stream : {1, 2}) {
      std::vector<ExecSession::Piece> tail;
      for (const ExecSession::Span& span : s->StreamTail(stream, offset, 3)) {
        for (auto& p : co_await s->ReadLog(span.offset, span.len)) tail.push_back(std::move(p));
      }
      encoder.Resume(stream, tail);
    }
  }
  bool start_sent = false;
  std::string lines;  // the events not yet sent
  auto add = [&lines](const json::object& event) {
    lines += json::serialize(event);
    lines += '\n';
  };
  for (;;) {
    // A dropped session (its sandbox deleted) still ends, "stopped", and that end is sent: its
    // log reads empty from then on.
    if (watch->hung_up) co_return LogSent{};
    // The start comes first (api.md), also for an exec that ended without one (its nsbox-init
    // went away before it started: pid 0).
    if (!start_sent && (s->started() || s->ended())) {
      json::object o;
      o["type"] = "start";
      o["execId"] = s->id();
      o["pid"] = s->pid();
      add(o);
      start_sent = true;
    }
    auto pieces = co_await s->ReadLog(offset, kStreamChunk);
    if (!pieces.empty()) {
      for (const ExecSession::Piece& p : pieces) {
        offset = p.offset + p.data.size();
        if (auto event = encoder.Encode(p)) add(*event);
        if (lines.size() >= kSocketReadRoom && !co_await SendChunk(c, lines, /*last=*/false)) {
          co_return LogSent{};
        }
      }
      continue;
    }
    if (s->ended() || !follow) {
      for (const json::object& event : encoder.Finish()) add(event);
      if (s->ended()) {
        json::object o;
        o["type"] = "exit";
        FillExit(o, s->exit(), s->reason());
        add(o);
      }
      // The client may close its end as soon as it has the end: not a hang-up.
      watch->finished = true;
      LogSent sent;
      sent.done = co_await SendChunk(c, lines, /*last=*/true);
      sent.keep = sent.done && c.parser.get().keep_alive() && !shutting_down_;
      co_return sent;
    }
    if (!lines.empty()) {
      // Sent before waiting; what changed during the write is looked at again first.
      if (!co_await SendChunk(c, lines, /*last=*/false)) co_return LogSent{};
      continue;
    }
    co_await s->WaitChange();
  }
}

asio::awaitable<bool> Daemon::Exec(Ctx& c, const RouteArgs& a) {
  std::shared_ptr<SandboxEntry> entry = a.entry;
  auto body = co_await ReadJson(c, /*optional=*/false);
  if (!body.ok()) {
    const ApiError reply_error = body.error();
    co_return co_await ReplyError(c, reply_error);
  }
  auto parsed = ParseExecRequest(body.value(), *entry);
  if (!parsed.ok()) {
    const ApiError reply_error = parsed.error();
    co_return co_await ReplyError(c, reply_error);
  }
  const bool stream = WantsNdjson(c.parser.get()[http::field::accept]);
  const bool base64 = parsed.value().base64;
  auto running = co_await EnsureRunning(entry);
  if (!running.ok()) {
    const ApiError reply_error = running.error();
    co_return co_await ReplyError(c, reply_error);
  }
  std::shared_ptr<ExecSession> s = StartSession(entry, running.value(), std::move(parsed.value()));
  ++running_execs_;

  // A client that hangs up before the answer cancels the command (api.md "Cancellation"),
  // unless it was started with "detach": true: watch the socket while the command runs.
  auto watch = std::make_shared<HangupWatch>();
  auto on_hangup = [this, watch, s, entry] {
    if (watch->hung_up || watch->finished) return;
    watch->hung_up = true;
    KillOnHangup(*entry, *s);
    s->Poke();
  };
  WatchHangup(c, watch, on_hangup);

  bool keep = false;
  bool answered = false;
  if (stream) {
    const bool head_sent = co_await StartNdjson(c);
    LogSent sent;
    if (head_sent) sent = co_await SendLog(c, s, 0, /*follow=*/true, base64, watch);
    if (!sent.done) {
      on_hangup();
    } else {
      answered = true;
      keep = sent.keep;
    }
  } else {
    // The buffered answer: the whole output, taken from the session as it arrives (its tap, set
    // before any output can come), kept in blocks (one string grown to 64 MiB, then decoded,
    // escaped and serialized whole, held five copies of it at once: 371 MB of daemon for one
    // answer of 60 MiB, most of its time page faults). Read from the log instead, with a ring
    // and a spill smaller than the output (--output-ring, --output-spill), bytes that left both
    // between two of this reader's turns were missing from an answer that said it was whole.
    auto output = std::make_shared<std::array<std::vector<std::string>, 2>>();
    s->tap = [output](int from, std::string_view data) {
      AppendToBlocks((*output)[from == 2 ? 1 : 0], data);
    };
    for (;;) {
      // The end first: a DELETE drops the sessions of its sandbox once they have ended, which may
      // come before this turn (the answer was lost: the connection closed without one). A
      // session dropped before its end still ends, "stopped".
      if (s->ended()) {
        answered = true;
        break;
      }
      if (watch->hung_up) break;
      co_await s->WaitChange();
    }
    s->tap = nullptr;
    if (answered) {
      // The answer's ≈ 20 keys and strings from one arena, not an allocation each.
      json::monotonic_resource arena;
      json::object o(&arena);
      FillExit(o, s->exit(), s->reason());
      watch->finished = true;
      {
        boost::system::error_code ignored;
        c.socket.cancel(ignored);
      }
      keep = co_await SendBufferedExec(c, *output, base64, o);
      output.reset();
      // The pieces are freed, but glibc keeps a heap's free pages: after a large answer they go
      // back, so that the daemon does not keep the size of its largest answer for good.
      if (s->end() > (8u << 20)) ::malloc_trim(0);
    }
  }
  watch->finished = true;
  {
    boost::system::error_code ignored;
    c.socket.cancel(ignored);
  }
  --running_execs_;
  if (!answered) co_return false;  // nobody to answer
  co_return keep;
}

// GET /v1/sandboxes/{id}/execs/{execId}/output?offset=N&follow=1&encoding=base64
asio::awaitable<bool> Daemon::ListExecs(Ctx& c, const RouteArgs& a) {
  const std::string_view query = a.query;
  json::array list;
  // api.md: the commands running now; with all=1 also the ended ones kept for re-attach.
  auto all_flag = QueryBool(query, "all");
  if (!all_flag.ok()) {
    const ApiError reply_error = all_flag.error();
    co_return co_await ReplyError(c, reply_error);
  }
  const bool all = all_flag.value();
  for (const auto& s : a.entry->Sessions()) {
    if (!s->dropped() && (all || !s->ended())) list.push_back(ExecJson(*s));
  }
  json::object o;
  o["execs"] = std::move(list);
  co_return co_await ReplyJson(c, 200, o);
}

asio::awaitable<bool> Daemon::CancelExec(Ctx& c, const RouteArgs& a) {
  const std::string id = a.Param("id");
  const std::string exec_id = a.Param("execId");
  std::shared_ptr<ExecSession> s = a.entry->FindSession(exec_id);
  std::shared_ptr<Sandbox> box = s != nullptr && !s->ended() ? s->box.lock() : nullptr;
  if (box == nullptr) {
    {
      // exec.md: exec_not_found ("not_found" is api.md's unknown route).
      const ApiError reply_error =
          ApiError::Of(404, "exec_not_found",
                       "no running exec '" + utf8::DecodeLossy(exec_id.substr(0, 64)) +
                           "' in sandbox '" + utf8::DecodeLossy(id) + "'");
      co_return co_await ReplyError(c, reply_error);
    }
  }
  box->client().KillExec(s->tag, static_cast<uint8_t>(exec::EndReason::kCancelled));
  metrics_.Kill("cancelled");
  log::info("sandbox={} exec={} cancelled by DELETE", id, exec_id);
  json::object o;
  o["execId"] = exec_id;
  co_return co_await ReplyJson(c, 202, o);
}

asio::awaitable<bool> Daemon::ExecOutput(Ctx& c, const RouteArgs& a) {
  std::shared_ptr<SandboxEntry> entry = a.entry;
  const std::string exec_id = a.Param("execId");
  const std::string_view query = a.query;
  std::shared_ptr<ExecSession> s = entry->FindSession(exec_id);
  if (s == nullptr || s->dropped()) {
    const ApiError reply_error = ExecNotFound(exec_id, entry->config().id);
    co_return co_await ReplyError(c, reply_error);
  }
  auto offset = AttachOffset(query, *s);
  if (!offset.ok()) {
    const ApiError reply_error = offset.error();
    co_return co_await ReplyError(c, reply_error);
  }
  bool base64 = false;
  if (auto encoding = QueryValue(query, "encoding")) {
    if (*encoding == "base64") {
      base64 = true;
    } else if (*encoding != "utf8" && *encoding != "utf-8") {
      const ApiError reply_error = ApiError::Invalid("\"encoding\" must be \"utf8\" or \"base64\"");
      co_return co_await ReplyError(c, reply_error);
    }
  }
  auto follow_flag = QueryBool(query, "follow");
  if (!follow_flag.ok()) {
    const ApiError reply_error = follow_flag.error();
    co_return co_await ReplyError(c, reply_error);
  }
  const bool follow = follow_flag.value();
  // A re-attach never kills: its hang-up only ends this reader.
  auto watch = std::make_shared<HangupWatch>();
  auto on_hangup = [watch, s] {
    if (watch->hung_up || watch->finished) return;
    watch->hung_up = true;
    s->Poke();
  };
  WatchHangup(c, watch, on_hangup);
  const bool head_sent = co_await StartNdjson(c);
  LogSent sent;
  if (head_sent) sent = co_await SendLog(c, s, offset.value(), follow, base64, watch);
  watch->finished = true;
  {
    boost::system::error_code ignored;
    c.socket.cancel(ignored);
  }
  co_return sent.keep;
}

// readFile through nsbox-init, resumed on the loop by the answer itself: no pool thread waits
// for it (two thread hand-offs fewer than Blocking, each a cross-CPU wake-up here).
asio::awaitable<fs::FsOutcome<fs::InitClient::OpenedRead>> Daemon::OpenRead(
    std::shared_ptr<Sandbox> box, std::string path) {
  using Opened = fs::FsOutcome<fs::InitClient::OpenedRead>;
  auto initiation = [this, box, path = std::move(path)](auto handler) mutable {
    auto ex = asio::get_associated_executor(handler, io_.get_executor());
    auto h = std::make_shared<decltype(handler)>(std::move(handler));
    box->client().StartOpenRead(path, [h, ex](Opened result) {
      asio::post(ex,
                 [h, result = std::move(result)]() mutable { std::move (*h)(std::move(result)); });
    });
  };
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(Opened)>(initiation,
                                                                            asio::use_awaitable);
}

// Hands `input` to nsbox-init and resumes on the loop once it was written (or refused).
asio::awaitable<fs::FsOutcome<fs::Unit>> Daemon::SendInput(std::shared_ptr<Sandbox> box,
                                                           fs::proto::ExecInput input) {
  auto initiation = [this, box, input = std::move(input)](auto handler) mutable {
    auto ex = asio::get_associated_executor(handler, io_.get_executor());
    auto h = std::make_shared<decltype(handler)>(std::move(handler));
    box->client().SendInput(input, [h, ex](fs::FsOutcome<fs::Unit> result) {
      asio::post(ex,
                 [h, result = std::move(result)]() mutable { std::move (*h)(std::move(result)); });
    });
  };
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(fs::FsOutcome<fs::Unit>)>(
      initiation, asio::use_awaitable);
}

namespace {

// A write into a command's stdin that found its pipe closed (EPIPE) may have met a command that
// exited, whose end the session has not heard of yet: gives the end a moment to arrive, so that
// the answer says exec_ended rather than that the command closed its stdin.
asio::awaitable<void> AwaitEndAfterEpipe(std::shared_ptr<ExecSession> s, const fs::FsError& error) {
  if (error.err != EPIPE) co_return;
  // The session's own wake-ups (its end among them), and one more at the limit.
  const auto give_up = Clock::now() + std::chrono::milliseconds(200);
  asio::steady_timer limit(co_await asio::this_coro::executor, give_up);
  limit.async_wait([s](boost::system::error_code ec) {
    if (!ec) s->Poke();
  });
  while (!s->ended() && !s->dropped() && Clock::now() < give_up) co_await s->WaitChange();
  limit.cancel();
}

}  // namespace

// POST /v1/sandboxes/{id}/execs/{execId}/stdin[?close=1]: the raw body, relayed a piece at a time.
asio::awaitable<bool> Daemon::ExecStdin(Ctx& c, const RouteArgs& a) {
  std::shared_ptr<SandboxEntry> entry = a.entry;
  const std::string exec_id = a.Param("execId");
  const std::string_view query = a.query;
  std::shared_ptr<ExecSession> s = entry->FindSession(exec_id);
  if (s == nullptr || s->dropped()) {
    const ApiError reply_error = ExecNotFound(exec_id, entry->config().id);
    co_return co_await ReplyError(c, reply_error);
  }
  auto close_flag = QueryBool(query, "close");
  if (!close_flag.ok()) {
    const ApiError reply_error = close_flag.error();
    co_return co_await ReplyError(c, reply_error);
  }
  const bool close = close_flag.value();
  if (auto refusal = InputRefusal(*s)) {
    const ApiError reply_error = *refusal;
    co_return co_await ReplyError(c, reply_error);
  }
  std::shared_ptr<Sandbox> box = s->box.lock();
  if (box == nullptr) {
    const ApiError reply_error =
        ApiError::Of(409, "exec_ended", "exec '" + s->id() + "' has ended; its stdin is gone");
    co_return co_await ReplyError(c, reply_error);
  }
  const bool go_on = co_await SendContinue(c);
  if (!go_on) co_return false;
  std::vector<char> buf(fs::proto::kMaxInputChunk);
  uint64_t total = 0;
  while (!c.parser.is_done()) {
    std::string hangup;
    const std::optional<size_t> piece = co_await ReadBodyPiece(c, buf, &hangup);
    if (!piece) co_return false;  // the client went away mid-body
    const size_t got = *piece;
    if (got == 0) continue;
    fs::proto::ExecInput input;
    input.exec_tag = s->tag;
    input.data.assign(buf.data(), got);
    auto written = co_await SendInput(box, std::move(input));
    if (!written.ok()) {
      c.must_close = !c.parser.is_done();
      co_await AwaitEndAfterEpipe(s, written.error());
      const ApiError reply_error = InputError(*s, written.error());
      co_return co_await ReplyError(c, reply_error);
    }
    total += got;
  }
  c.body_done = true;
  if (close) {
    if (auto refusal = InputRefusal(*s)) {
      const ApiError reply_error = *refusal;
      co_return co_await ReplyError(c, reply_error);
    }
    fs::proto::ExecInput input;
    input.exec_tag = s->tag;
    input.close = true;
    s->stdin_closed = true;
    auto written = co_await SendInput(box, std::move(input));
    if (!written.ok()) {
      co_await AwaitEndAfterEpipe(s, written.error());
      const ApiError reply_error = InputError(*s, written.error());
      co_return co_await ReplyError(c, reply_error);
    }
  }
  log::debug("sandbox={} exec={} stdin: {} bytes{}", entry->config().id, s->id(), total,
             close ? ", closed" : "");
  co_return co_await ReplyNoContent(c);
}

// A terminal exec's new size; the error (or nullopt) as the HTTP and WebSocket answers share it.
asio::awaitable<std::optional<ApiError>> Daemon::ResizeTty(std::shared_ptr<ExecSession> s,
                                                           fs::proto::TtySize size) {
  if (!s->tty) {
    co_return ApiError::Of(409, "not_a_terminal",
                           "exec '" + s->id() + "' does not run on a terminal (\"tty\")");
  }
  if (s->ended()) {
    co_return ApiError::Of(409, "exec_ended", "exec '" + s->id() + "' has ended");
  }
  std::shared_ptr<Sandbox> box = s->box.lock();
  if (box == nullptr) co_return ApiError::Of(409, "exec_ended", "exec '" + s->id() + "' has ended");
  fs::proto::ExecResize resize{s->tag, size};
  auto work = [box, resize] { return box->client().Resize(resize); };
  auto done = co_await Blocking(std::move(work));
  if (!done.ok()) {
    if (done.error().err == ESRCH) {
      co_return ApiError::Of(409, "exec_ended", "exec '" + s->id() + "' has ended");
    }
    co_return ApiError::FromFs(done.error());
  }
  s->tty = size;
  co_return std::nullopt;
}

// POST /v1/sandboxes/{id}/execs/{execId}/resize {"rows": R, "cols": C}
asio::awaitable<bool> Daemon::ExecResize(Ctx& c, const RouteArgs& a) {
  std::shared_ptr<SandboxEntry> entry = a.entry;
  const std::string exec_id = a.Param("execId");
  auto body = co_await ReadJson(c, /*optional=*/false);
  if (!body.ok()) {
    const ApiError reply_error = body.error();
    co_return co_await ReplyError(c, reply_error);
  }
  std::shared_ptr<ExecSession> s = entry->FindSession(exec_id);
  if (s == nullptr || s->dropped()) {
    const ApiError reply_error = ExecNotFound(exec_id, entry->config().id);
    co_return co_await ReplyError(c, reply_error);
  }
  static constexpr std::string_view kResizeKeys[] = {"rows", "cols"};
  if (auto unknown = UnknownKey(body.value(), kResizeKeys, "a resize")) {
    const ApiError reply_error = *unknown;
    co_return co_await ReplyError(c, reply_error);
  }
  auto size = TtySizeOf(body.value(), "");
  if (!size.ok()) {
    const ApiError reply_error = size.error();
    co_return co_await ReplyError(c, reply_error);
  }
  auto refused = co_await ResizeTty(s, size.value());
  if (refused) {
    const ApiError reply_error = *refused;
    co_return co_await ReplyError(c, reply_error);
  }
  co_return co_await ReplyNoContent(c);
}

}  // namespace nsbox::runtime::api

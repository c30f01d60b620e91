#pragma once

// nsboxd: the HTTP API of api.md over a Unix socket (and TCP with a bearer token).
//
// One thread runs the event loop (Boost.Asio, C++20 coroutines, one per connection): it parses
// requests (Boost.Beast), streams bodies and exec output, and never blocks on a client. What may
// block (starting a jail, a file verb waiting for nsbox-init's answer, fsync) runs on a worker
// pool and resumes the connection's coroutine when it is done. Exec output arrives on the
// sandbox's control-channel reader thread and is handed to the loop through a queue.
//
// GCC 12 miscompiles some temporaries in co_await expressions (docs/daemon.md): every awaited
// call here takes named locals (reply_error, reply_json, reply_body, work) or trivial values.
//
// The class is defined here; its members live in the files of runtime/api/, a group of routes a
// file (docs/architecture.md), and `nsbox serve` (runtime/serve.cc) runs it.

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
#include "runtime/api/exec_queue.h"
#include "runtime/api/exec_request.h"
#include "runtime/api/http.h"
#include "runtime/api/json_shapes.h"
#include "runtime/api/proxy_auth.h"
#include "runtime/api/route_table.h"
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

// How often the idle stop looks at the sandboxes with idleStopMs (docs/daemon.md "Idle stop").
constexpr auto kIdleCheckPeriod = std::chrono::seconds(1);

// A request's use of what runs in a sandbox (SandboxEntry::BeginUse), from its routing to the end
// of its answer. Only an idle stop reads it: a sandbox without one is not locked for it.
class SandboxUse {
 public:
  explicit SandboxUse(std::shared_ptr<SandboxEntry> entry) {
    if (entry->idle_stop_ms() == 0) return;
    entry_ = std::move(entry);
    entry_->BeginUse();
  }
  ~SandboxUse() {
    if (entry_ != nullptr) entry_->EndUse();
  }
  SandboxUse(const SandboxUse&) = delete;
  SandboxUse& operator=(const SandboxUse&) = delete;

 private:
  std::shared_ptr<SandboxEntry> entry_;
};

// What the memory rings of ended exec sessions hold in all before the oldest go to disk
// (docs/exec.md): without a bound, 100 commands of 2.7 MB of output each kept 220 MB of daemon
// memory for the retention's 10 minutes.
constexpr uint64_t kEndedRingBudget = 64u << 20;
constexpr size_t kWorkerThreads = 32;

// TCP connections that have not yet sent a request with a valid token, at most this many at once:
// beyond it a new one is closed at once, so that a peer without the token cannot take the fds
// that the daemon's sandboxes and its Unix socket need (docs/security.md).
constexpr size_t kMaxUnauthenticatedTcp = 1024;

using WebSocket = websocket::stream<Socket&>;

// What the router (routes.cc) hands a route's handler.
struct RouteArgs {
  const std::vector<std::string>& segs;  // the path's segments, percent-decoded
  std::string_view query;                // the raw query
  std::string_view pattern;              // the route's (routes.inc)
  std::shared_ptr<SandboxEntry> entry;   // with RouteNeeds::kEntry and kEntryInUse
  // The segment that the pattern's "{name}" captured.
  std::string Param(std::string_view name) const {
    return std::string(PatternParam(pattern, segs, name));
  }
};

class Daemon {
 public:
  Daemon(asio::io_context& io, Registry& registry, std::string token, ExecLogLimits log_limits,
         std::chrono::seconds retention, std::chrono::seconds auth_timeout,
         ImageImportOptions image_imports)
      : io_(io),
        registry_(registry),
        token_(std::move(token)),
        log_limits_(log_limits),
        retention_(retention),
        auth_timeout_(auth_timeout),
        import_lane_(std::move(image_imports)),
        ports_(io, metrics_, [this](std::shared_ptr<SandboxEntry> entry) {
          return InnerSocket(std::move(entry));
        }) {}

  asio::awaitable<void> AcceptLoop(Acceptor& acceptor, bool tcp);
  void Shutdown(std::vector<Acceptor*> acceptors);
  // Re-opens the exposed ports of every sandbox (ports.json) at the start; blocks.
  void RestorePorts();
  // The end of a session's retention, or of its sandbox: its ring no longer counted against the
  // bound on ended sessions' rings (KeepEndedRing), then ExecSession::Drop.
  void DropSession(ExecSession& s) {
    ForgetRing(s);
    s.Drop();
  }
  // After the loop has ended and every session is dropped: waits for their spill files' removal.
  void FinishSpills() { spill_pool_.join(); }
  // The idle stop (docs/daemon.md "Idle stop"): while any sandbox has idleStopMs, once every
  // kIdleCheckPeriod the running ones idle for that long are stopped (Registry::StopIfIdle).
  // Started at the daemon's start and by each PUT of such a sandbox; ends when none is left.
  void ArmIdleStops();

 private:
  // What one request's handler works with.
  struct Ctx {
    Socket& socket;
    beast::flat_buffer& buffer;
    http::request_parser<http::buffer_body>& parser;
    bool tcp = false;
    bool body_done = false;  // the request's body was read to its end
    bool continue_sent = false;
    bool must_close = false;      // the answer ends the connection, whatever else holds
    int status = 0;               // of the answer, for the metrics
    std::string sandbox_id;       // for the logs
    PendingAuth* auth = nullptr;  // TCP, until a request has shown the token
    int retry_after = 0;          // seconds: the answer carries Retry-After (ApiError's)
  };

  asio::awaitable<void> Session(Socket socket, bool tcp);
  asio::awaitable<bool> Handle(Ctx& c);
  asio::awaitable<bool> Route(Ctx& c, const std::vector<std::string>& segs, std::string_view query);
  // The routes of routes.inc with their handlers, each a member below.
  using RouteHandler = asio::awaitable<bool> (Daemon::*)(Ctx& c, const RouteArgs& a);
  struct Handler {
    RouteSpec spec;
    RouteHandler handler;
  };
  static std::span<const Handler> Handlers();

  // Runs `fn` on the worker pool and resumes on the loop with its result. Callers pass a named
  // lambda (auto work = [...]; co_await Blocking(std::move(work))), never a lambda temporary:
  // GCC 12 destroys the captures of a closure temporary in a co_await expression twice (checked
  // with ASan on a ten-line program; named closures and other temporaries are fine).
  template <typename F>
  asio::awaitable<std::invoke_result_t<F&>> Blocking(F fn);
  // Runs an exec log's spill writes (ExecSession) on a thread of their own: never behind
  // requests that wait for a sandbox's channel, which the spill may hold (HoldReads).
  ExecSession::Offload OffloadSpill() {
    return [this](std::function<void()> job) { asio::post(spill_pool_, std::move(job)); };
  }
  // The memory rings that ended sessions keep for re-attach, bounded in all (kEndedRingBudget):
  // over it, the rings of the sessions that ended first move to their spill files. Called when
  // a session ends.
  void KeepEndedRing(const std::shared_ptr<ExecSession>& s);
  // A session's ring no longer counted against that bound.
  void ForgetRing(ExecSession& s) {
    ended_ring_bytes_ -= s.counted_ring;
    s.counted_ring = 0;
  }

  // Runs the reads of an exec log's spill that must wait for the disk on the worker pool.
  ExecSession::Offload OffloadRead() {
    return [this](std::function<void()> job) { asio::post(pool_, std::move(job)); };
  }
  // Removes a file of the daemon's own on the worker pool: freeing a large file's blocks took
  // 60-140 ms for 512 MiB here, which must not hold up the loop. Close it first.
  asio::awaitable<void> RemoveFile(std::string path);

  // Answers. Each returns whether the connection may serve another request.
  asio::awaitable<bool> Reply(Ctx& c, unsigned status, std::string body,
                              std::string_view content_type = "application/json",
                              std::string_view allow = {});
  asio::awaitable<bool> ReplyJson(Ctx& c, unsigned status, const json::value& value);
  asio::awaitable<bool> ReplyError(Ctx& c, const ApiError& error, std::string_view allow = {});
  asio::awaitable<bool> ReplyNoContent(Ctx& c, unsigned status = 204);
  asio::awaitable<bool> MethodNotAllowed(Ctx& c, std::string_view allow);

  asio::awaitable<bool> SendContinue(Ctx& c);
  // An answer streamed as NDJSON (api.md: Accept: application/x-ndjson): the head of a chunked
  // 200, then the events a line each, in chunks (SendChunk), the last with the answer's end.
  // Each returns false once the client is gone.
  asio::awaitable<bool> StartNdjson(Ctx& c);
  // The head of a chunked 200 of `content_type`; the chunks follow.
  asio::awaitable<bool> StartChunked(Ctx& c, std::string_view content_type, bool keep_alive);
  // The buffered exec answer, {"stdout":"…","stderr":"…",<exit>}, a chunked 200 from the blocks
  // of output collected (AppendToBlocks), each decoded, escaped and sent on its own (never the
  // whole output, nor its escaped copy, in one string). `exit` holds the other keys. Whether the
  // connection may serve another request.
  asio::awaitable<bool> SendBufferedExec(Ctx& c, std::array<std::vector<std::string>, 2>& output,
                                         bool base64, const json::object& exit);
  // `bytes` of a chunked answer sent as one chunk (nothing when empty) and cleared, and with
  // `last` the answer's end in the same write. False once the client is gone.
  asio::awaitable<bool> SendChunk(Ctx& c, std::string& bytes, bool last);
  // The request's body, to its end, written into `fd` a piece at a time as it arrives (never
  // held whole). Stops at the first write error (its errno) or when the connection fails (why).
  // `check`, when given, is asked before each piece is written (on the worker pool, with its
  // size); its error stops the copy as a write error would.
  struct BodyCopy {
    uint64_t bytes = 0;
    int write_error = 0;
    std::string hangup;
  };
  using WriteCheck = std::function<Status(size_t)>;
  asio::awaitable<BodyCopy> CopyBodyTo(Ctx& c, int fd, std::string_view what,
                                       const WriteCheck* check = nullptr);
  // `len` bytes at `data` written into `fd` on the worker pool: 0, or the errno of the failure.
  asio::awaitable<int> WritePiece(int fd, const char* data, size_t len, const std::string& what,
                                  const WriteCheck* check);
  // The next piece of a request body into `buf` (at most its size; 0 bytes is possible before
  // the end): its size, or nullopt when the client went away (`*hangup` says how).
  asio::awaitable<std::optional<size_t>> ReadBodyPiece(Ctx& c, std::vector<char>& buf,
                                                       std::string* hangup);
  // The whole body of a JSON request (up to 1 MiB); an empty body is an empty
  // object when `optional`.
  asio::awaitable<ApiOutcome<json::object>> ReadJson(Ctx& c, bool optional);
  // The raw body, up to 1 MiB (read and dropped by the routes that take none, so that a
  // malformed body is an error and the connection stays usable).
  asio::awaitable<ApiOutcome<std::string>> ReadBody(Ctx& c);
  asio::awaitable<ApiOutcome<std::shared_ptr<SandboxEntry>>> FindEntry(const std::string& id);
  // The sandbox's running nsbox-init: found on the loop when it runs, started on the pool when not.
  asio::awaitable<ApiOutcome<std::shared_ptr<Sandbox>>> EnsureRunning(
      std::shared_ptr<SandboxEntry> entry);

  // The routes (routes.inc), each answering one endpoint of api.md.
  asio::awaitable<bool> Health(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> MetricsText(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> ListSandboxes(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> GetSandbox(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> PutSandbox(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> StopSandbox(Ctx& c, const RouteArgs& a);
  // GET and PUT /v1/sandboxes/{id}/network (docs/network.md).
  asio::awaitable<bool> SandboxNetwork(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> DeleteSandbox(Ctx& c, const RouteArgs& a);
  // Exec sessions (docs/exec.md). StartSession starts the command and the session's pump
  // (PumpExec: the control channel's events into the session's log, then the retention time).
  asio::awaitable<bool> Exec(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> ListExecs(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> CancelExec(Ctx& c, const RouteArgs& a);
  std::shared_ptr<ExecSession> StartSession(std::shared_ptr<SandboxEntry> entry,
                                            std::shared_ptr<Sandbox> box, ExecSpec spec);
  asio::awaitable<void> PumpExec(std::shared_ptr<SandboxEntry> entry,
                                 std::shared_ptr<ExecSession> s, std::shared_ptr<ExecQueue> queue,
                                 std::shared_ptr<QueuedOutput> waiting, Clock::time_point started);
  // The end of a request that watches its client while an exec runs.
  struct HangupWatch {
    bool finished = false;
    bool hung_up = false;
  };
  void WatchHangup(Ctx& c, std::shared_ptr<HangupWatch> watch, std::function<void()> on_hangup);
  // The starter of `s` went away: kill it unless it is detached.
  void KillOnHangup(SandboxEntry& entry, ExecSession& s);
  // The log of `s` from `offset` as NDJSON events (start, stdout/stderr, exit); with `follow`
  // until the exit, else what there is now; then the answer's end. What the log has at once goes
  // in one write (the last events with the end), so that a short command's answer does not wake
  // the client once per line. `done` false once the client is gone; `keep` whether the
  // connection may serve another request.
  struct LogSent {
    bool done = false;
    bool keep = false;
  };
  asio::awaitable<LogSent> SendLog(Ctx& c, std::shared_ptr<ExecSession> s, uint64_t offset,
                                   bool follow, bool base64, std::shared_ptr<HangupWatch> watch);
  asio::awaitable<bool> ExecOutput(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> ExecStdin(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> ExecResize(Ctx& c, const RouteArgs& a);
  asio::awaitable<fs::FsOutcome<fs::InitClient::OpenedRead>> OpenRead(std::shared_ptr<Sandbox> box,
                                                                      std::string path);
  asio::awaitable<fs::FsOutcome<fs::Unit>> SendInput(std::shared_ptr<Sandbox> box,
                                                     fs::proto::ExecInput input);
  asio::awaitable<std::optional<ApiError>> ResizeTty(std::shared_ptr<ExecSession> s,
                                                     fs::proto::TtySize size);
  // The WebSocket: `s` null starts an exec (its first message is the body), else attaches.
  struct WsState {
    explicit WsState(asio::any_io_executor ex) : wake(ex) {}
    std::deque<std::string> control;  // text messages for the client
    bool reader_done = false;
    asio::steady_timer wake;
  };
  asio::awaitable<bool> ExecSocket(Ctx& c, std::shared_ptr<SandboxEntry> entry,
                                   std::shared_ptr<ExecSession> s, uint64_t offset);
  // GET .../exec and GET .../execs/{execId}/attach: ExecSocket, once the upgrade is there.
  asio::awaitable<bool> ExecWebSocket(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> AttachExec(Ctx& c, const RouteArgs& a);
  asio::awaitable<void> WsReader(WebSocket& ws, std::shared_ptr<WsState> st,
                                 std::shared_ptr<ExecSession> s,
                                 std::shared_ptr<SandboxEntry> entry, bool starter);
  void WsPush(WsState& st, ExecSession* s, std::string message);
  asio::awaitable<bool> GetFile(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> PutFile(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> FsVerb(Ctx& c, const RouteArgs& a);
  // fs/readdir's answer, passed on as nsbox-init sends it (runtime/listing.h).
  asio::awaitable<bool> Readdir(Ctx& c, std::shared_ptr<Sandbox> box, std::string path, bool typed);
  // GET /v1/images, and GET, POST and DELETE /v1/images/{name}.
  asio::awaitable<bool> ListImages(Ctx& c, const RouteArgs& a);
  asio::awaitable<bool> Images(Ctx& c, const RouteArgs& a);
  // `max_bytes`: the request's maxBytes, which lowers the daemon's --image-max-bytes.
  asio::awaitable<bool> ImportImage(Ctx& c, const std::string& name, bool replace,
                                    std::optional<uint64_t> max_bytes);
  // Exposed ports (runtime/ports.h): GET/POST .../ports, DELETE .../ports/{port}.
  asio::awaitable<bool> Ports(Ctx& c, const RouteArgs& a);
  asio::awaitable<void> SavePorts(std::shared_ptr<SandboxEntry> entry);
  // .../ports/{port}/http/{rest}: a reverse proxy to 127.0.0.1:port inside (WebSocket upgrades
  // too). Always ends the client's connection.
  asio::awaitable<bool> HttpProxy(Ctx& c, const RouteArgs& a);
  // A fresh TCP socket in the sandbox's network namespace (started when stopped).
  asio::awaitable<ApiOutcome<int>> InnerSocket(std::shared_ptr<SandboxEntry> entry);

  asio::io_context& io_;
  Registry& registry_;
  const std::string token_;  // empty: no TCP listener
  // Shared with the answers under way, whose frames the io_context may destroy after the daemon.
  std::shared_ptr<ListingBudget> listings_ =
      std::make_shared<ListingBudget>(io_.get_executor(), ListingLimits{});
  // Before the pools: their threads may still run jobs that count (the /metrics scrape renders
  // on a worker) while the daemon is destroyed, and a pool joins its threads in its destructor.
  Metrics metrics_;
  asio::thread_pool pool_{kWorkerThreads};
  asio::thread_pool spill_pool_{1};
  std::atomic<int> running_execs_{0};    // requests and sockets that started an exec, still on
  std::atomic<int> running_imports_{0};  // image imports not yet answered
  const ExecLogLimits log_limits_;
  const std::chrono::seconds retention_;
  const std::chrono::seconds auth_timeout_;  // for TCP connections to show the token
  // TCP connections not yet past the token, counted on the loop only.
  std::shared_ptr<size_t> unauthenticated_tcp_ = std::make_shared<size_t>(0);
  // Image imports: their own threads, at most so many at once (runtime/image_imports.h). After
  // the pools: its destructor waits for the imports under way, whose answers go to the loop.
  ImportLane import_lane_;
  Clock::time_point refused_logged_{};  // the last warning about kMaxUnauthenticatedTcp
  bool shutting_down_ = false;
  bool idle_stops_armed_ = false;  // IdleStops runs (on the loop only)
  asio::awaitable<void> IdleStops();
  PortForwarder ports_;
  // KeepEndedRing's: the ended sessions in the order they ended, and their rings' bytes counted.
  std::deque<std::weak_ptr<ExecSession>> ended_rings_;
  uint64_t ended_ring_bytes_ = 0;
};

// Unlinks a file of the daemon's own; a failure other than ENOENT is logged.
void UnlinkLogged(const std::string& path);

template <typename F>
asio::awaitable<std::invoke_result_t<F&>> Daemon::Blocking(F fn) {
  // Not a coroutine itself: the awaitable async_initiate returns starts the work when awaited.
  using T = std::invoke_result_t<F&>;
  auto work = std::make_shared<F>(std::move(fn));
  auto initiation = [this, work](auto handler) {
    auto ex = asio::get_associated_executor(handler, io_.get_executor());
    asio::post(pool_, [work, handler = std::move(handler), ex]() mutable {
      auto result = std::make_shared<T>((*work)());
      asio::post(ex, [handler = std::move(handler), result]() mutable {
        std::move(handler)(std::move(*result));
      });
    });
  };
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(T)>(initiation,
                                                                       asio::use_awaitable);
}

}  // namespace nsbox::runtime::api

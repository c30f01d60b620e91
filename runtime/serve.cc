// `nsbox serve`: nsboxd's listeners and its start and end; the daemon itself is runtime/api/
// (daemon.h, and a file for each group of routes: docs/architecture.md).

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
#include "runtime/serve.h"
#include "runtime/units.h"
#include "runtime/version.h"

namespace nsbox::runtime::api {

namespace {

// ---- images ----

}  // namespace

asio::awaitable<bool> Daemon::Images(Ctx& c, const std::vector<std::string>& segs,
                                     std::string_view query) {
  const http::verb method = c.parser.get().method();
  if (segs.size() == 2) {
    if (method != http::verb::get) co_return co_await MethodNotAllowed(c, "GET");
    if (auto bad = QueryCheck(query, segs, method)) {
      const ApiError reply_error = *bad;
      co_return co_await ReplyError(c, reply_error);
    }
    json::array list;
    for (const auto& info : registry_.images().List()) {
      list.push_back(ImageJson(info, registry_.SandboxesOfImage(info.name)));
    }
    json::object o;
    o["images"] = std::move(list);
    co_return co_await ReplyJson(c, 200, o);
  }
  const std::string& name = segs[2];
  if (method != http::verb::get && method != http::verb::post && method != http::verb::delete_) {
    co_return co_await MethodNotAllowed(c, "GET, POST, DELETE");
  }
  if (auto bad = QueryCheck(query, segs, method)) {
    const ApiError reply_error = *bad;
    co_return co_await ReplyError(c, reply_error);
  }
  if (auto reason = images::InvalidImageNameReason(name)) {
    const ApiError reply_error = ApiError::Invalid(*reason);
    co_return co_await ReplyError(c, reply_error);
  }
  if (method == http::verb::post) {
    auto replace = QueryBool(query, "replace");
    if (!replace.ok()) {
      const ApiError reply_error = replace.error();
      co_return co_await ReplyError(c, reply_error);
    }
    auto max_bytes = QueryMaxBytes(QueryValue(query, "maxBytes"));
    if (!max_bytes.ok()) {
      const ApiError reply_error = max_bytes.error();
      co_return co_await ReplyError(c, reply_error);
    }
    co_return co_await ImportImage(c, name, replace.value(), max_bytes.value());
  }
  if (method == http::verb::delete_) {
    auto work = [this, name] { return registry_.RemoveImage(name); };
    auto removed = co_await Blocking(std::move(work));
    if (!removed.ok()) {
      const ApiError reply_error = removed.error();
      co_return co_await ReplyError(c, reply_error);
    }
    co_return co_await ReplyNoContent(c);
  }
  auto info = registry_.images().Find(name);
  if (!info) {
    const ApiError reply_error = ApiError::ImageNotFound(name);
    co_return co_await ReplyError(c, reply_error);
  }
  const json::value reply_json = ImageJson(*info, registry_.SandboxesOfImage(name));
  co_return co_await ReplyJson(c, 200, reply_json);
}

// The tarball is spooled to the state dir as it comes (an OCI or docker archive must be read
// out of order, and a slow client must not hold an import half-done), then imported on a thread
// of the import lane, within the import's budget (runtime/image_imports.h). With Accept:
// application/x-ndjson the answer is a stream of progress events ending with the image or the
// error.
asio::awaitable<bool> Daemon::ImportImage(Ctx& c, const std::string& name, bool replace,
                                          std::optional<uint64_t> max_bytes) {
  if (!replace && registry_.images().Find(name)) {
    const ApiError reply_error =
        ApiError::Of(409, "image_exists",
                     "an image named '" + name + "' exists already (replace it with ?replace=1)");
    co_return co_await ReplyError(c, reply_error);
  }
  // A place in the import lane from the first byte spooled until the import's job has ended
  // (docs/images.md "Limits"); none left: 429, before the body is read.
  std::shared_ptr<void> ticket = import_lane_.TryEnter();
  if (!ticket) {
    const ApiError reply_error = LaneFull(import_lane_);
    co_return co_await ReplyError(c, reply_error);
  }
  std::shared_ptr<images::ImportBudget> budget =
      import_lane_.NewBudget(registry_.images().dir(), max_bytes);
  if (auto length = c.parser.content_length(); length && *length > budget->limits().max_bytes) {
    const ApiError reply_error = UploadTooLarge(*budget, *length);
    co_return co_await ReplyError(c, reply_error);
  }
  const std::string spool = registry_.NewUploadPath();
  // Made on the worker pool: a file's creation waits for the file system's journal. A file system
  // already short of the free space imports keep is refused first.
  auto make_spool = [spool, budget]() -> Result<UniqueFd> {
    NSBOX_TRY(budget->CheckFreeSpace());
    UniqueFd made(::open(spool.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!made.valid()) return Error::Sys("open", spool, errno).Context("spool the upload");
    return made;
  };
  Result<UniqueFd> made = co_await Blocking(std::move(make_spool));
  if (!made.ok()) {
    const auto refused = BudgetError(*budget, made.error());
    const ApiError reply_error = refused ? *refused : ApiError::Internal(made.error().message());
    co_return co_await ReplyError(c, reply_error);
  }
  UniqueFd fd = std::move(made.value());
  // Removed before the answer, on the worker pool (freeing a large file's blocks took 60-140 ms
  // for 512 MiB here); here only if this ends otherwise, before a byte was spooled.
  struct Unlink {
    std::string path;
    ~Unlink() { ::unlink(path.c_str()); }
  } unlink_spool{spool};

  if (!co_await SendContinue(c)) co_return false;
  // Each piece is counted against the budget before it is written (a chunked body has no length).
  const WriteCheck charge = [budget](size_t n) {
    return budget->Charge(images::ImportBudget::Step::kUpload, n, "the upload");
  };
  const BodyCopy copied = co_await CopyBodyTo(c, fd.get(), spool, &charge);
  fd.reset();  // still linked: its blocks stay until the unlink
  if (!copied.hangup.empty() || copied.write_error != 0 || copied.bytes == 0) {
    co_await RemoveFile(spool);
  }
  if (!copied.hangup.empty()) {
    log::info("image={} the upload ended early after {} bytes ({}); nothing imported", name,
              copied.bytes, copied.hangup);
    co_return false;
  }
  if (copied.write_error != 0) {
    const int err = copied.write_error;
    const auto refused = BudgetError(*budget, Error(err, budget->stop_message()));
    const ApiError reply_error =
        refused ? *refused
                : ApiError::Of(
                      StatusForErrno(err), ErrnoName(err),
                      Error::Sys("write", spool, err).Context("spool the image upload").message());
    co_return co_await ReplyError(c, reply_error);
  }
  const uint64_t total = copied.bytes;
  if (total == 0) {
    const ApiError reply_error =
        ApiError::Of(400, "invalid_image", "the request has no body: send the image's tarball");
    co_return co_await ReplyError(c, reply_error);
  }
  log::info("image={} received {} bytes; importing", name, total);
  ++running_imports_;
  struct Answered {
    std::atomic<int>& n;
    ~Answered() { --n; }
  } answered{running_imports_};

  const bool stream = WantsNdjson(c.parser.get()[http::field::accept]);
  struct ImportEvent {
    std::optional<images::ImportProgress> progress;
    std::optional<ApiOutcome<images::ImageInfo>> done;
  };
  auto queue = std::make_shared<LoopQueue<ImportEvent>>(io_.get_executor());
  images::ProgressFn progress;
  if (stream) {
    progress = [queue](const images::ImportProgress& update) {
      queue->Push(ImportEvent{update, std::nullopt});
    };
  }
  const bool existed = registry_.images().Find(name).has_value();
  auto import_work = [this, name, spool, replace, progress, queue, budget, ticket] {
    auto done = registry_.ImportImage(name, spool, replace, progress, budget.get());
    UnlinkLogged(spool);
    if (!done.ok()) {
      // The client sent a body, not a file: its errors name it so, not the daemon's spool.
      ApiError error = done.error();
      for (size_t at = error.message.find(spool); at != std::string::npos;
           at = error.message.find(spool, at)) {
        error.message.replace(at, spool.size(), "the uploaded image");
      }
      done = std::move(error);
    }
    queue->Push(ImportEvent{std::nullopt, std::move(done)});
  };
  // On a thread of the import lane, never one of the worker pool's; its result arrives through
  // the queue. A client that hangs up ends it at its next read or write, and it publishes
  // nothing (what it wrote is removed).
  import_lane_.Run(std::move(import_work));
  auto watch = std::make_shared<HangupWatch>();
  WatchHangup(c, watch, [watch, budget] {
    watch->hung_up = true;
    budget->ClientGone();
  });
  auto end_watch = [&c, watch] {
    watch->finished = true;
    boost::system::error_code ignored;
    c.socket.cancel(ignored);
  };

  if (!stream) {
    for (;;) {
      for (auto& event : co_await queue->Next()) {
        if (!event.done) continue;
        end_watch();
        if (watch->hung_up) co_return false;  // nobody to answer
        if (!event.done->ok()) {
          const ApiError reply_error = event.done->error();
          co_return co_await ReplyError(c, reply_error);
        }
        const json::value reply_json =
            ImageJson(event.done->value(), registry_.SandboxesOfImage(name));
        co_return co_await ReplyJson(c, existed ? 200 : 201, reply_json);
      }
    }
  }

  bool alive = co_await StartNdjson(c);
  if (!alive) budget->ClientGone();
  std::string lines;  // the events of one wake-up, sent in one write
  for (;;) {
    for (auto& event : co_await queue->Next()) {
      json::object o;
      if (event.progress) {
        const images::ImportProgress& update = *event.progress;
        o["type"] = "progress";
        o["phase"] = update.phase;
        o["layer"] = update.layer;
        o["layers"] = update.layers;
        o["bytesRead"] = update.bytes_read;
        o["bytesTotal"] = update.bytes_total;
      } else if (event.done->ok()) {
        o["type"] = "image";
        o["image"] = ImageJson(event.done->value(), registry_.SandboxesOfImage(name));
      } else {
        const ApiError& error = event.done->error();
        o["type"] = "error";
        json::object e;
        e["code"] = error.code;
        e["message"] = utf8::DecodeLossy(error.message);
        o["error"] = std::move(e);
        o["status"] = error.status;
      }
      lines += json::serialize(o);
      lines += '\n';
      if (event.done) {
        end_watch();
        if (!alive || watch->hung_up || !co_await SendChunk(c, lines, /*last=*/true)) {
          co_return false;
        }
        co_return c.parser.get().keep_alive() && !shutting_down_;
      }
    }
    if (alive && !watch->hung_up) {
      alive = co_await SendChunk(c, lines, /*last=*/false);
      if (!alive) budget->ClientGone();  // the import ends; its end is still awaited
    } else {
      lines.clear();
    }
  }
}

}  // namespace nsbox::runtime::api

namespace nsbox::runtime {

namespace {

namespace asio = boost::asio;
using api::Acceptor;
using api::Daemon;
using api::SignalName;

// ---- listeners ----

// A daemon SIGKILLed while it cloned a jail leaves the clone with copies of its listening
// sockets until the clone dies too (of PR_SET_PDEATHSIG, well under a millisecond here): a socket
// that still answers, or a port still in use, is looked at again for this long before a new
// daemon gives up on it, so that a restart at once (systemd, a script) is not refused.
constexpr auto kPredecessorGrace = std::chrono::milliseconds(1000);
constexpr auto kPredecessorRetry = std::chrono::milliseconds(10);

Result<std::unique_ptr<Acceptor>> ListenUnix(asio::io_context& io, const std::string& path) {
  std::error_code fec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), fec);
  if (fec)
    return Error(fec.value(), "create the socket's directory for " + path + ": " + fec.message());
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Error(EEXIST, path + " exists and is not a socket; refusing to replace it");
    }
    // A live daemon answers; a dead one's socket is only a name.
    const auto give_up = std::chrono::steady_clock::now() + kPredecessorGrace;
    for (;;) {
      asio::local::stream_protocol::socket probe(io);
      boost::system::error_code ec;
      probe.connect(asio::local::stream_protocol::endpoint(path), ec);
      if (ec) break;
      if (std::chrono::steady_clock::now() >= give_up) {
        return Error(EADDRINUSE, "another nsboxd is already listening on " + path);
      }
      std::this_thread::sleep_for(kPredecessorRetry);
    }
    if (::unlink(path.c_str()) != 0) return Error::Sys("unlink", path, errno);
  }
  auto acceptor = std::make_unique<Acceptor>(io);
  asio::generic::stream_protocol::endpoint ep{asio::local::stream_protocol::endpoint(path)};
  boost::system::error_code ec;
  acceptor->open(ep.protocol(), ec);
  if (!ec) acceptor->bind(ep, ec);
  if (ec) return Error(ec.value(), "listen on " + path + ": " + ec.message());
  // api.md: mode 0660; access to the socket is the authorisation.
  if (::chmod(path.c_str(), 0660) != 0) return Error::Sys("chmod", path, errno);
  acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Error(ec.value(), "listen on " + path + ": " + ec.message());
  return acceptor;
}

Result<std::unique_ptr<Acceptor>> ListenTcp(asio::io_context& io, const std::string& listen) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return Error(EINVAL, "--listen takes HOST:PORT, like 127.0.0.1:7711, not '" + listen + "'");
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  boost::system::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (ec) return Error(EINVAL, "--listen: '" + host + "' is not an IP address");
  unsigned long port = 0;
  try {
    size_t used = 0;
    port = std::stoul(listen.substr(colon + 1), &used);
    if (used != listen.size() - colon - 1 || port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    return Error(EINVAL, "--listen: '" + listen.substr(colon + 1) + "' is not a port number");
  }
  asio::ip::tcp::endpoint tcp_ep(address, static_cast<unsigned short>(port));
  asio::generic::stream_protocol::endpoint ep{tcp_ep};
  auto acceptor = std::make_unique<Acceptor>(io);
  acceptor->open(ep.protocol(), ec);
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  const auto give_up = std::chrono::steady_clock::now() + kPredecessorGrace;
  while (!ec) {
    acceptor->bind(ep, ec);
    if (ec != asio::error::address_in_use || std::chrono::steady_clock::now() >= give_up) break;
    ec.clear();
    std::this_thread::sleep_for(kPredecessorRetry);
  }
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Error(ec.value(), "listen on " + listen + ": " + ec.message());
  return acceptor;
}

Result<std::string> ReadToken(const std::string& file) {
  NSBOX_ASSIGN_OR_RETURN(auto text, ReadFile(file));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) {
    text.pop_back();
  }
  if (text.empty()) return Error(EINVAL, "the token file " + file + " is empty");
  if (text.size() < 16) {
    return Error(EINVAL, "the token in " + file + " is too short: use at least 16 characters");
  }
  return text;
}

}  // namespace

int Serve(const ServeOptions& options) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "nsbox serve: %s\n", what.c_str());
    return 1;
  };
  if (!options.listen.empty() && options.token_file.empty()) {
    return fail(
        "--listen needs --token-file: a TCP listener never runs "
        "without a token");
  }
  if (options.listen.empty() && !options.token_file.empty()) {
    return fail("--token-file is only used with --listen");
  }
  if (::geteuid() != 0) {
    // Refused at once rather than a daemon that fails every creation (chown of a workspace to
    // the jail's uid is EPERM, and so are the uid maps and the cgroups).
    return fail(
        "needs root: nsboxd writes the uid/gid maps of its jails' user namespaces, chowns their "
        "workspaces to the jails' uids and manages their cgroups, none of which a normal user "
        "may do (running as uid " +
        std::to_string(::geteuid()) +
        "). Run it as root: `sudo nsbox serve`, or the systemd unit deploy/nsboxd.service");
  }
  std::string token;
  if (!options.token_file.empty()) {
    auto t = ReadToken(options.token_file);
    if (!t.ok()) return fail(t.error().message());
    token = std::move(t).value();
  }
  ::signal(SIGPIPE, SIG_IGN);
  // Thousands of keep-alive connections need fds: the soft limit may rise to
  // the hard one without any privilege.
  struct rlimit nofile;
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &nofile);
  }

  RegistryOptions ro;
  ro.state_dir = options.state_dir.empty() ? DefaultStateDir() : options.state_dir;
  if (!ro.state_dir.empty() && ro.state_dir[0] != '/') {
    std::error_code ec;
    ro.state_dir = std::filesystem::absolute(ro.state_dir, ec).string();
  }
  ro.init_binary = options.init_binary;
  ro.network_range = options.network_range;
  ro.dns_upstreams = options.dns_upstreams;
  ro.net_binary = options.net_binary;
  ro.log_level = options.log_level;
  ro.pool_size = options.pool_size;
  ro.idle_stop_ms = options.idle_stop_ms;
  // The loop, and what reads the sandboxes' control channels on it, outlive the registry: the
  // sandboxes that the final StopAll ends are still answered.
  asio::io_context io(1);
  ChannelWatch channels(io);
  ro.watch_channel = [&channels](std::shared_ptr<fs::InitClient> client) {
    channels.Watch(std::move(client));
  };
  // The TCP listener first: a bad --listen (or a port in use) fails before the state directory
  // or the socket file is made.
  std::unique_ptr<Acceptor> tcp_acceptor;
  if (!options.listen.empty()) {
    auto t = ListenTcp(io, options.listen);
    if (!t.ok()) return fail(t.error().message());
    tcp_acceptor = std::move(t).value();
  }
  // Before the registry's pool starts its jails: where the sandboxes' cgroups are made (on a pure
  // v2 host, a leaf of a delegated cgroup for the daemon itself; docs/cgroups.md "Placement").
  // A failure is logged, and tried again by the next creation that needs it.
  (void)isolate::PlaceSelf("nsboxd", "nsboxd-" + std::to_string(::getpid()) + ".scope", false);
  // Each jail is moved into its v1 cgroups (a hybrid host), as is every command's child.
  if (!options.leave_cgroup_mount) {
    if (auto layout = isolate::LoadCgroupLayout(); layout.ok()) isolate::FavorMovesIntoV1(*layout);
  }
  auto registry = Registry::Open(ro);
  if (!registry.ok()) return fail(registry.error().message());

  const std::string socket_path = options.socket.empty() ? DefaultSocketPath() : options.socket;
  auto unix_acceptor = ListenUnix(io, socket_path);
  if (!unix_acceptor.ok()) return fail(unix_acceptor.error().message());

  // Exec sessions live in memory only: what a previous daemon spilled is of no use now.
  for (const auto& entry : (*registry)->List()) {
    std::error_code ec;
    std::filesystem::remove_all(entry->execs_dir(), ec);
    if (ec)
      log::warn("sandbox={} remove {}: {}", entry->config().id, entry->execs_dir(), ec.message());
  }
  ExecLogLimits log_limits;
  log_limits.ring_bytes = options.output_ring;
  log_limits.spill_bytes = options.output_spill;
  int exit_code = 0;
  {
    Daemon daemon(io, **registry, token, log_limits,
                  std::chrono::seconds(options.exec_retention_seconds),
                  std::chrono::seconds(options.auth_timeout_seconds), options.image_imports);
    daemon.RestorePorts();
    daemon.ArmIdleStops();
    std::vector<Acceptor*> acceptors{unix_acceptor->get()};
    asio::co_spawn(io, daemon.AcceptLoop(**unix_acceptor, false), asio::detached);
    if (tcp_acceptor) {
      acceptors.push_back(tcp_acceptor.get());
      asio::co_spawn(io, daemon.AcceptLoop(*tcp_acceptor, true), asio::detached);
    }
    asio::signal_set signals(io, SIGTERM, SIGINT);
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      log::info("{} received", SignalName(sig));
      daemon.Shutdown(acceptors);
    });
    if (options.idle_stop_ms != 0) {
      log::info("sandboxes that do not say are stopped once idle for {} ms (--idle-stop)",
                options.idle_stop_ms);
    }
    log::info("nsboxd {} listening on {}{}; state in {}", kVersion, socket_path,
              options.listen.empty() ? "" : " and tcp " + options.listen, (*registry)->state_dir());
    try {
      io.run();
    } catch (const std::exception& e) {
      log::error("the event loop failed: {}", e.what());
      exit_code = 1;
    }
    channels.LoopEnded();
    // The sessions' timers belong to the loop: gone before it, spill files removed.
    for (const auto& entry : (*registry)->List()) {
      for (const auto& s : entry->TakeSessions()) daemon.DropSession(*s);
    }
    daemon.FinishSpills();
  }
  (*registry)->StopAll();
  ::unlink(socket_path.c_str());
  log::info("nsboxd stopped");
  return exit_code;
}

}  // namespace nsbox::runtime
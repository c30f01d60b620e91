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
#include "runtime/host_prerequisites.h"
#include "runtime/image_imports.h"
#include "runtime/listener_probe.h"
#include "runtime/listing.h"
#include "runtime/metrics.h"
#include "runtime/netns.h"
#include "runtime/paths.h"
#include "runtime/ports.h"
#include "runtime/registry.h"
#include "runtime/serve.h"
#include "runtime/socket_group.h"
#include "runtime/units.h"
#include "runtime/version.h"

namespace nsbox::runtime {

namespace {

namespace asio = boost::asio;
using api::Acceptor;
using api::Daemon;
using api::SignalName;

// ---- listeners ----

// A daemon SIGKILLed while it cloned a jail leaves the clone with copies of its listening
// sockets until the clone dies too (of PR_SET_PDEATHSIG, well under a millisecond here): a socket
// that still takes connections, or a port still in use, is looked at again for this long before
// a new daemon gives up on it, so that a restart at once (systemd, a script) is not refused. What
// answers HTTP there is a live daemon (a clone's copy only queues the connection): that is said at
// once, without the wait.
constexpr auto kPredecessorGrace = std::chrono::milliseconds(1000);
constexpr auto kPredecessorRetry = std::chrono::milliseconds(10);
// How long a listener has to begin an answer to GET /v1/health (runtime/listener_probe.h). A
// daemon's accept loop answers within a millisecond or two; a listener that is not accepting
// never does.
constexpr auto kAnswerWait = std::chrono::milliseconds(100);

// Refuses `path` when a daemon answers there, or something takes connections there without
// answering for longer than a dead daemon's clone would; ok when nothing listens (a dead daemon's
// socket file is left for ListenUnix to replace). Said before the daemon changes anything on the
// host, and again by ListenUnix when it makes the socket.
Status RefuseSocketInUse(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return {};
  if (!S_ISSOCK(st.st_mode)) {
    return Error(EEXIST, path + " exists and is not a socket; refusing to replace it");
  }
  // A live daemon answers; a dead one's socket is only a name.
  const auto give_up = std::chrono::steady_clock::now() + kPredecessorGrace;
  for (;;) {
    NSBOX_ASSIGN_OR_RETURN(ListenerFound found, ProbeUnixListener(path, kAnswerWait));
    if (found == ListenerFound::kNothing) return {};
    if (found == ListenerFound::kAnswers) {
      return Error(EADDRINUSE, "another nsboxd is already listening on " + path +
                                   ": a daemon answers there. Stop it first, or give this one "
                                   "another --socket (and --state-dir)");
    }
    if (std::chrono::steady_clock::now() >= give_up) {
      return Error(EADDRINUSE, "another nsboxd is already listening on " + path +
                                   ": something takes connections there but does not answer");
    }
    std::this_thread::sleep_for(kPredecessorRetry);
  }
}

// `group`: the socket's group (root:group), or -1 for root's own.
Result<std::unique_ptr<Acceptor>> ListenUnix(asio::io_context& io, const std::string& path,
                                             gid_t group) {
  std::error_code fec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), fec);
  if (fec)
    return Error(fec.value(), "create the socket's directory for " + path + ": " + fec.message());
  NSBOX_TRY(RefuseSocketInUse(path));
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Error::Sys("unlink", path, errno);
  auto acceptor = std::make_unique<Acceptor>(io);
  asio::generic::stream_protocol::endpoint ep{asio::local::stream_protocol::endpoint(path)};
  boost::system::error_code ec;
  acceptor->open(ep.protocol(), ec);
  if (!ec) acceptor->bind(ep, ec);
  if (ec) return Error(ec.value(), "listen on " + path + ": " + ec.message());
  // api.md: mode 0660; access to the socket is the authorisation.
  if (::chmod(path.c_str(), 0660) != 0) return Error::Sys("chmod", path, errno);
  if (group != static_cast<gid_t>(-1) && ::chown(path.c_str(), 0, group) != 0) {
    return Error::Sys("chown", path, errno).Context("give the socket the group of --socket-group");
  }
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
    if (auto found =
            ProbeTcpListener(tcp_ep.data(), static_cast<socklen_t>(tcp_ep.size()), kAnswerWait);
        found.ok() && *found == ListenerFound::kAnswers) {
      return Error(EADDRINUSE, "listen on " + listen + ": " + ec.message() +
                                   ": an HTTP server (another nsboxd?) answers there");
    }
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
  // The host's kernel first: without user namespaces (or the rest of the required set) no
  // sandbox can start, and a restart would fail the same way (docs/daemon.md "As a service").
  if (auto missing = MissingPrerequisites(ProbeFeatures()); !missing.empty()) {
    std::fprintf(stderr,
                 "nsbox serve: this host cannot run sandboxes; `nsbox doctor` says the same:\n"
                 "%s\n",
                 DescribeMissing(missing).c_str());
    return kExitHostUnfit;
  }
  gid_t socket_gid = static_cast<gid_t>(-1);
  if (!options.socket_group.empty()) {
    auto gid = SocketGroupId(options.socket_group);
    if (!gid.ok()) return fail(gid.error().message());
    socket_gid = *gid;
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
  // A bad --listen, a port in use or a socket where a daemon answers fails before anything
  // changes the host: before the daemon moves into a cgroup of its own, before the state
  // directory is made or opened and before the pool starts a jail (issue 52: a second daemon on
  // a socket in use waited for its pool's first jail). The TCP listener is made here (a client
  // that connects waits in its backlog until the daemon accepts); the socket is only looked at:
  // its file appears once the daemon can serve, as scripts and tests wait for it to.
  std::unique_ptr<Acceptor> tcp_acceptor;
  if (!options.listen.empty()) {
    auto t = ListenTcp(io, options.listen);
    if (!t.ok()) return fail(t.error().message());
    tcp_acceptor = std::move(t).value();
  }
  const std::string socket_path = options.socket.empty() ? DefaultSocketPath() : options.socket;
  if (auto in_use = RefuseSocketInUse(socket_path); !in_use.ok()) {
    return fail(in_use.error().message());
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
  auto unix_acceptor = ListenUnix(io, socket_path, socket_gid);
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
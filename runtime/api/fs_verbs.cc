// The file verbs of api/files.md (POST .../fs/{stat,readdir,exists,mkdir,rm}) through nsbox-init.

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

asio::awaitable<bool> Daemon::FsVerb(Ctx& c, const RouteArgs& a) {
  std::shared_ptr<SandboxEntry> entry = a.entry;
  const std::string& verb = a.segs[4];  // the pattern's last segment: stat, readdir, ...
  auto body = co_await ReadJson(c, /*optional=*/false);
  if (!body.ok()) {
    const ApiError reply_error = body.error();
    co_return co_await ReplyError(c, reply_error);
  }
  static constexpr std::string_view kPathKeys[] = {"path", "pathBase64"};
  static constexpr std::string_view kReaddirKeys[] = {"path", "pathBase64", "withTypes"};
  static constexpr std::string_view kMkdirKeys[] = {"path", "pathBase64", "recursive"};
  static constexpr std::string_view kRmKeys[] = {"path", "pathBase64", "recursive", "force"};
  using Keys = std::span<const std::string_view>;
  const Keys known = verb == "readdir" ? Keys(kReaddirKeys)
                     : verb == "mkdir" ? Keys(kMkdirKeys)
                     : verb == "rm"    ? Keys(kRmKeys)
                                       : Keys(kPathKeys);
  if (auto unknown = UnknownKey(body.value(), known, "fs/" + verb)) {
    const ApiError reply_error = *unknown;
    co_return co_await ReplyError(c, reply_error);
  }
  Fields f(body.value());
  auto path_text = f.String("path");
  if (!path_text.ok()) {
    const ApiError reply_error = path_text.error();
    co_return co_await ReplyError(c, reply_error);
  }
  auto path_b64 = f.String("pathBase64");
  if (!path_b64.ok()) {
    const ApiError reply_error = path_b64.error();
    co_return co_await ReplyError(c, reply_error);
  }
  auto raw = RawPath(path_text.value(), path_b64.value());
  if (!raw.ok()) {
    const ApiError reply_error = raw.error();
    co_return co_await ReplyError(c, reply_error);
  }
  auto with_types = f.Bool("withTypes");
  auto recursive = f.Bool("recursive");
  auto force = f.Bool("force");
  for (const auto* b : {&with_types, &recursive, &force}) {
    if (!b->ok()) {
      const ApiError reply_error = b->error();
      co_return co_await ReplyError(c, reply_error);
    }
  }
  const std::string_view syscall = verb == "readdir" ? "scandir"
                                   : verb == "rm"    ? "lstat"
                                                     : std::string_view(verb);
  auto path = SandboxPath(*entry, raw.value(), syscall);
  if (verb == "exists" && !path.ok() && path.error().status != 503) {
    // exists never fails for the path itself (api.md): a NUL byte or "" is
    // simply not there.
    json::object o;
    o["exists"] = false;
    co_return co_await ReplyJson(c, 200, o);
  }
  if (verb == "rm" && force.value() && !path.ok() && path.error().code == "ENOENT") {
    co_return co_await ReplyNoContent(c);  // Node's rm with force: nothing there is no error
  }
  if (!path.ok()) {
    const ApiError reply_error = path.error();
    co_return co_await ReplyError(c, reply_error);
  }
  auto running = co_await EnsureRunning(entry);
  if (!running.ok()) {
    const ApiError reply_error = running.error();
    co_return co_await ReplyError(c, reply_error);
  }
  std::shared_ptr<Sandbox> box = running.value();
  const std::string p = path.value();
  const bool typed = with_types.value();
  if (verb == "readdir") {
    const auto start = Clock::now();
    const bool kept = co_await Readdir(c, box, p, typed);
    metrics_.FileVerb(verb, SecondsSince(start));
    co_return kept;
  }
  const bool rec = recursive.value();
  const bool frc = force.value();
  // The verb and the shaping of its answer run on the pool; one path below answers them all.
  // The answer is the JSON body, or none for 204.
  using Answer = ApiOutcome<std::optional<json::object>>;
  std::function<Answer()> work = [box, p, verb, rec, frc]() -> Answer {
    auto fail = [](const fs::FsError& e) { return ApiError::FromFs(e); };
    json::object o;
    if (verb == "stat") {
      auto r = box->client().Stat(p);
      if (!r.ok()) return fail(r.error());
      o["isFile"] = r.value().is_file;
      o["isDirectory"] = r.value().is_directory;
      o["isSymbolicLink"] = r.value().is_symbolic_link;
      o["size"] = r.value().size;
      o["mtimeMs"] = r.value().mtime_ms;
      o["mode"] = r.value().mode;  // Node's Stats.mode: the type and permission bits
      return std::optional<json::object>(std::move(o));
    }
    if (verb == "exists") {
      auto r = box->client().Exists(p);
      if (!r.ok()) return fail(r.error());
      o["exists"] = r.value();
      return std::optional<json::object>(std::move(o));
    }
    auto r = verb == "mkdir" ? box->client().Mkdir(p, rec) : box->client().Rm(p, rec, frc);
    if (!r.ok()) return fail(r.error());
    return std::optional<json::object>();
  };
  auto start = Clock::now();
  auto answer = co_await Blocking(std::move(work));
  metrics_.FileVerb(verb, SecondsSince(start));
  if (!answer.ok()) {
    const ApiError reply_error = answer.error();
    co_return co_await ReplyError(c, reply_error);
  }
  if (!answer.value()) co_return co_await ReplyNoContent(c);
  {
    const json::value reply_json = std::move(*answer.value());
    co_return co_await ReplyJson(c, 200, reply_json);
  }
}

asio::awaitable<bool> Daemon::Readdir(Ctx& c, std::shared_ptr<Sandbox> box, std::string path,
                                      bool typed) {
  const std::shared_ptr<ListingBudget> budget = listings_;
  if (!co_await budget->Enter()) {
    const ApiError reply_error =
        ApiError::Of(503, "busy",
                     "the daemon is passing on " + std::to_string(budget->max_in_flight()) +
                         " directory listings at once, its bound, and none ended within " +
                         std::to_string(budget->limits().admission.count()) + " ms; try again");
    co_return co_await ReplyError(c, reply_error);
  }
  auto hold = [box] { box->client().HoldReads(); };
  auto release = [box] { box->client().ReleaseReads(); };
  auto listing = std::make_shared<ListingStream>(io_.get_executor(), typed, budget->limits(),
                                                 std::move(hold), std::move(release));
  // A client that takes nothing while the sandbox's channel waits for it loses its connection.
  listing->on_stall = [&c] {
    boost::system::error_code ec;
    c.socket.shutdown(Socket::shutdown_both, ec);
    c.socket.cancel(ec);
  };
  struct Done {
    std::shared_ptr<ListingBudget> budget;
    std::shared_ptr<ListingStream> listing;
    ~Done() {
      listing->on_stall = nullptr;
      listing->Abandon();
      budget->Leave();
    }
  } done{budget, listing};
  box->client().StartReaddir(
      path, typed, [listing](std::string part) { listing->Part(std::move(part)); },
      [listing](fs::FsOutcome<fs::Unit> end) { listing->Done(std::move(end)); });
  while (!listing->started()) co_await listing->WaitChange();
  if (!listing->any_part()) {
    // nsbox-init's error is the answer: ENOENT, ENOTDIR, E2BIG (more than the API carries).
    fs::FsError e;
    e.err = EPROTO;
    e.message = "nsbox-init ended the listing of '" + path + "' without an answer";
    if (auto error = listing->failed()) e = *error;
    ApiError reply_error = ApiError::FromFs(e);
    if (e.err == E2BIG) {
      reply_error.status = 422;
      reply_error.code = "unsupported";
    }
    co_return co_await ReplyError(c, reply_error);
  }
  std::string out = "{\"entries\":[";
  // Most directories: the listing came whole in its first frame, and goes in one write.
  if (listing->single() && listing->bytes() <= kSocketReadRoom) {
    out += listing->TakeJson(std::numeric_limits<size_t>::max());
    if (auto bad = listing->failed()) {
      const ApiError reply_error = ApiError::FromFs(*bad);
      co_return co_await ReplyError(c, reply_error);
    }
    out += "]}";
    co_return co_await Reply(c, 200, std::move(out));
  }
  const bool keep_alive =
      c.parser.get().keep_alive() && c.body_done && !c.must_close && !shutting_down_;
  if (!co_await StartChunked(c, "application/json", keep_alive)) co_return false;
  for (;;) {
    out += listing->TakeJson(kSocketReadRoom);
    if (auto bad = listing->failed()) {
      // Cut short: no last chunk, and the connection ends, so that no client takes what it got
      // for the whole listing.
      log::warn("sandbox={} readdir '{}' cut short: {}", c.sandbox_id, utf8::DecodeLossy(path),
                bad->message);
      co_return false;
    }
    if (listing->finished()) break;
    if (!out.empty()) {
      // What arrives during the write is looked at again before waiting: its wake-up is gone.
      if (!co_await SendChunk(c, out, /*last=*/false)) co_return false;
      continue;
    }
    co_await listing->WaitChange();
  }
  out += "]}";
  const bool sent = co_await SendChunk(c, out, /*last=*/true);
  // The heap keeps what a large listing freed unless asked (the exec answer does the same).
  if (listing->bytes() > (8u << 20)) ::malloc_trim(0);
  co_return sent&& keep_alive;
}

}  // namespace nsbox::runtime::api

// The routes of images (api/images.md): list, look up, import, delete.

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

// ---- images ----

asio::awaitable<bool> Daemon::ListImages(Ctx& c, const RouteArgs& a) {
  (void)a;
  json::array list;
  for (const auto& info : registry_.images().List()) {
    list.push_back(ImageJson(info, registry_.SandboxesOfImage(info.name)));
  }
  json::object o;
  o["images"] = std::move(list);
  co_return co_await ReplyJson(c, 200, o);
}

// The method, the query and the name were checked by the router (routes.cc).
asio::awaitable<bool> Daemon::Images(Ctx& c, const RouteArgs& a) {
  const http::verb method = c.parser.get().method();
  const std::string_view query = a.query;
  const std::string name = a.Param("name");
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

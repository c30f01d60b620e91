// The routes of whole files (api/files.md): GET and PUT .../files.

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

// `mode` of an upload (PUT .../files?path=P&mode=755): permission bits in octal, at most 7777;
// absent: an existing file keeps its mode and a new one gets 0644 (api.md).
ApiOutcome<std::optional<uint32_t>> QueryMode(std::string_view query) {
  auto text = QueryValue(query, "mode");
  if (!text) return std::optional<uint32_t>();
  const bool octal =
      !text->empty() && text->size() <= 5 &&
      std::all_of(text->begin(), text->end(), [](char ch) { return ch >= '0' && ch <= '7'; });
  const uint32_t mode = octal ? static_cast<uint32_t>(std::stoul(*text, nullptr, 8)) : 0;
  if (!octal || mode > 07777) {
    return ApiError::Invalid(
        "\"mode\" must be permission bits in octal, 0 to 7777 (e.g. 755), not \"" +
        utf8::DecodeLossy(text->substr(0, 40)) + "\"");
  }
  return std::optional<uint32_t>(mode);
}

// ---- files ----

// The `path` or `pathBase64` query parameter.
ApiOutcome<std::string> QueryPath(std::string_view query) {
  std::optional<std::string> path;
  std::optional<std::string> path_base64;
  auto bad = ForEachQueryParam(query, [&](const std::string& key, std::string value) {
    if (key == "path") path = std::move(value);
    if (key == "pathBase64") path_base64 = std::move(value);
    return std::optional<ApiError>();
  });
  if (bad) return *bad;
  return RawPath(path, path_base64);
}

// The `path` or `pathBase64` query parameter, resolved in the sandbox.
ApiOutcome<std::string> ResolveQueryPath(const SandboxEntry& entry, std::string_view query) {
  auto raw = QueryPath(query);
  if (!raw.ok()) return raw.error();
  return SandboxPath(entry, raw.value(), "open");
}

}  // namespace

asio::awaitable<bool> Daemon::GetFile(Ctx& c, const RouteArgs& a) {
  std::shared_ptr<SandboxEntry> entry = a.entry;
  const std::string_view query = a.query;
  auto target = ResolveQueryPath(*entry, query);
  if (!target.ok()) {
    const ApiError reply_error = target.error();
    co_return co_await ReplyError(c, reply_error);
  }
  const std::string& path = target.value();
  auto running = co_await EnsureRunning(entry);
  if (!running.ok()) {
    const ApiError reply_error = running.error();
    co_return co_await ReplyError(c, reply_error);
  }
  auto start = Clock::now();
  auto opened = co_await OpenRead(running.value(), path);
  metrics_.FileVerb("readFile", SecondsSince(start));
  if (!opened.ok()) {
    const ApiError reply_error = ApiError::FromFs(opened.error());
    co_return co_await ReplyError(c, reply_error);
  }
  fs::InitClient::OpenedRead& file = opened.value();
  if (!file.fd.valid()) {
    {
      std::string reply_body = std::move(file.data);
      co_return co_await Reply(c, 200, std::move(reply_body), "application/octet-stream");
    }
  }
  // A large file streams from the fd nsbox-init opened inside the jail: a piece
  // at a time, never whole in memory.
  http::response<http::empty_body> res{http::status::ok, 11};
  res.set(http::field::server, std::string("nsboxd/") + kVersion);
  res.set(http::field::content_type, "application/octet-stream");
  res.content_length(file.size);
  res.keep_alive(c.parser.get().keep_alive() && c.body_done);
  http::response_serializer<http::empty_body> sr{res};
  c.status = 200;
  auto [ec, n] = co_await http::async_write_header(c.socket, sr, kTuple);
  (void)n;
  if (ec) co_return false;
  std::vector<char> buf(kStreamChunk);
  uint64_t left = file.size;
  while (left > 0) {
    const size_t want = std::min<uint64_t>(left, buf.size());
    // What the page cache holds is read on the loop; what must come from the disk is read on the
    // worker pool, so that a cold file (or a slow disk) never holds up the loop's other clients.
    struct iovec iov = {buf.data(), want};
    ssize_t got = ::preadv2(file.fd.get(), &iov, 1, -1, RWF_NOWAIT);
    int err = got < 0 ? errno : 0;
    if (err == EAGAIN || err == EOPNOTSUPP) {
      auto read_from_disk = [fd = file.fd.get(), data = buf.data(), want] {
        ssize_t r;
        do {
          r = ::read(fd, data, want);
        } while (r < 0 && errno == EINTR);
        return r < 0 ? static_cast<ssize_t>(-errno) : r;
      };
      got = co_await Blocking(std::move(read_from_disk));
      err = got < 0 ? static_cast<int>(-got) : 0;
    }
    if (err == EINTR) continue;
    if (got <= 0) {
      // Shorter than when it was opened (truncated meanwhile): the client sees
      // the body end early, never bytes that are not the file's.
      log::warn("sandbox={} readFile {}: {}", entry->config().id, path,
                got < 0 ? ErrnoText(err) : "the file shrank while it was sent");
      co_return false;
    }
    auto [wec, wn] = co_await asio::async_write(
        c.socket, asio::buffer(buf.data(), static_cast<size_t>(got)), kTuple);
    (void)wn;
    if (wec) co_return false;
    metrics_.BytesOut(static_cast<uint64_t>(got));
    left -= static_cast<uint64_t>(got);
  }
  co_return res.keep_alive() && !shutting_down_;
}

asio::awaitable<bool> Daemon::PutFile(Ctx& c, const RouteArgs& a) {
  std::shared_ptr<SandboxEntry> entry = a.entry;
  const std::string_view query = a.query;
  auto target = ResolveQueryPath(*entry, query);
  if (!target.ok()) {
    const ApiError reply_error = target.error();
    co_return co_await ReplyError(c, reply_error);
  }
  const std::string& path = target.value();
  auto mode = QueryMode(query);
  if (!mode.ok()) {
    const ApiError reply_error = mode.error();
    co_return co_await ReplyError(c, reply_error);
  }
  auto running = co_await EnsureRunning(entry);
  if (!running.ok()) {
    const ApiError reply_error = running.error();
    co_return co_await ReplyError(c, reply_error);
  }
  std::shared_ptr<Sandbox> box = running.value();
  auto start = Clock::now();
  auto work9 = [box, p = path, m = mode.value()] { return box->client().BeginWrite(p, m); };
  auto begun = co_await Blocking(std::move(work9));
  if (!begun.ok()) {
    const ApiError reply_error = ApiError::FromFs(begun.error());
    co_return co_await ReplyError(c, reply_error);
  }
  UniqueFd fd = std::move(begun.value().fd);
  const uint64_t tag = begun.value().tag;
  auto abort = [this, box, tag]() -> asio::awaitable<void> {
    auto work10 = [box, tag] {
      box->client().AbortWrite(tag);
      return true;
    };
    co_await Blocking(std::move(work10));
  };

  // The body goes straight to the temp file, a piece at a time (page-cache
  // writes; the fsync happens at commit, on the worker pool).
  if (!co_await SendContinue(c)) {
    co_await abort();
    co_return false;
  }
  const BodyCopy copied = co_await CopyBodyTo(c, fd.get(), path);
  if (!copied.hangup.empty()) {
    // The client hung up or the body was cut short: nothing changes in the sandbox.
    log::info("sandbox={} writeFile {}: the upload ended early ({}); nothing written",
              entry->config().id, path, copied.hangup);
    co_await abort();
    co_return false;
  }
  if (copied.write_error != 0) {
    co_await abort();
    // Node's wording, as every other file error ("ENOSPC: no space left on device, write ...").
    const ApiError reply_error =
        ApiError::FromFs(fs::MakeFsError(copied.write_error, "write", path));
    co_return co_await ReplyError(c, reply_error);
  }
  const uint64_t total = copied.bytes;
  fd.reset();
  auto work11 = [box, tag] { return box->client().CommitWrite(tag); };
  auto committed = co_await Blocking(std::move(work11));
  metrics_.FileVerb("writeFile", SecondsSince(start));
  if (!committed.ok()) {
    const ApiError reply_error = ApiError::FromFs(committed.error());
    co_return co_await ReplyError(c, reply_error);
  }
  log::debug("sandbox={} wrote {} bytes to {}", entry->config().id, total, path);
  co_return co_await ReplyNoContent(c);
}

}  // namespace nsbox::runtime::api

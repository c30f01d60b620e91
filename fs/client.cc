#include "fs/client.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "base/files.h"
#include "fs/fs_error.h"

namespace nsbox::fs {

namespace {

using proto::Type;

constexpr size_t kReadBufferSize = 1 << 20;
// A partial frame kept between two ReadReady calls: its string's memory is given back above this.
constexpr size_t kKeptPartial = 64 << 10;
// ReadReady's reads before it returns to the caller's loop.
constexpr int kReadsPerReady = 4;

// What one thread reads into: a reader thread's own, or that of a caller's loop, shared by every
// client the loop reads (one at a time). It grows for a frame larger than it, and stays grown.
struct ReadBuffer {
  std::unique_ptr<char[]> data;
  size_t capacity = 0;
  // At least `size` bytes; when it grows, the `count` bytes at `from` move to the front.
  void Reserve(size_t size, size_t from = 0, size_t count = 0) {
    if (capacity >= size) return;
    std::unique_ptr<char[]> bigger(new char[size]);
    if (count > 0) std::memcpy(bigger.get(), data.get() + from, count);
    data = std::move(bigger);
    capacity = size;
  }
};
thread_local ReadBuffer t_read_buffer;

// Waits until `fd` is ready for `events` (or has hung up); false when poll fails.
bool WaitFor(int fd, short events) {
  struct pollfd p = {fd, events, 0};
  for (;;) {
    if (::poll(&p, 1, -1) >= 0) return true;
    if (errno != EINTR) return false;
  }
}

FsError TransportError(std::string_view what) {
  FsError e;
  e.err = EPIPE;
  e.message = "nsbox-init: " + std::string(what);
  return e;
}

// One response, handed from the reader thread to a waiting caller.
struct Slot {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  FsOutcome<InitClient::RawReply> reply{FsError{}};
  UniqueFd fd;
};

// The handler that hands a response, and the fd that came with it, to `slot`'s waiter.
auto FillSlot(std::shared_ptr<Slot> slot) {
  return [slot](const proto::FrameReader::FrameView& frame, UniqueFd received) {
    std::lock_guard<std::mutex> lock(slot->mu);
    slot->reply = InitClient::RawReply{frame.header.type, std::string(frame.payload)};
    slot->fd = std::move(received);
    slot->done = true;
    slot->cv.notify_all();
    return true;
  };
}

}  // namespace

FsError ReplyError(const InitClient::RawReply& reply, std::string_view expected) {
  if (reply.type == Type::kError) {
    proto::ErrorReply er;
    if (proto::Decode(reply.payload, &er)) {
      return FsError{er.err, er.syscall, er.path, er.message, er.err_fs_eisdir};
    }
  }
  FsError e;
  e.err = EPROTO;
  e.message = "nsbox-init answered " + std::string(proto::TypeName(reply.type)) + " where " +
              std::string(expected) + " was expected";
  return e;
}

namespace {

// The answer to a ping: a pong, or the error it carries.
FsOutcome<Unit> ExpectPong(const FsOutcome<InitClient::RawReply>& r) {
  if (!r.ok()) return r.error();
  if (r.value().type != Type::kPong) return ReplyError(r.value(), "pong");
  return Unit{};
}

}  // namespace

InitClient::InitClient(UniqueFd control) : control_(std::move(control)) {
  reader_ = std::thread([this] { Receive(true); });
}

InitClient::InitClient(UniqueFd control, CallerReads) : control_(std::move(control)) {}

InitClient::~InitClient() {
  Close();
  // With CallerReads, the loop may not have seen the channel close: the pending calls fail here.
  // Nothing reads any more (the owner has stopped watching before destroying the client).
  if (connected()) FailAll(TransportError("the control channel is closed"));
}

void InitClient::Close() {
  std::lock_guard<std::mutex> lock(close_mu_);
  // shutdown wakes the reader's recvmsg; nsbox-init sees the channel close. The fd stays open
  // until the destructor, so a concurrent send fails with EPIPE and never reaches a reused fd.
  ::shutdown(control_.get(), SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
  // A loop parked by a hold watches again, and sees the channel closed.
  if (auto resume = TakeParked()) resume();
}

void InitClient::ReadOnOwnThread() {
  std::function<void()> parked;  // the loop's re-arm, dropped (the loop has ended)
  {
    std::lock_guard<std::mutex> hold(hold_mu_);
    own_reader_ = true;
    parked.swap(parked_);
  }
  std::lock_guard<std::mutex> lock(close_mu_);
  if (reader_.joinable() || !connected()) return;
  reader_ = std::thread([this] { Receive(true); });
}

void InitClient::HoldReads() {
  std::lock_guard<std::mutex> lock(hold_mu_);
  ++holds_;
}

void InitClient::ReleaseReads() {
  std::function<void()> resume;
  {
    std::lock_guard<std::mutex> lock(hold_mu_);
    if (holds_ == 0) return;
    if (--holds_ == 0) resume.swap(parked_);
  }
  if (resume) resume();
}

bool InitClient::ParkReadsIfHeld(std::function<void()> resume) {
  std::lock_guard<std::mutex> lock(hold_mu_);
  if (holds_ == 0 || own_reader_) return false;
  parked_ = std::move(resume);
  return true;
}

bool InitClient::ReadsParked() const {
  std::lock_guard<std::mutex> lock(hold_mu_);
  return parked_ != nullptr;
}

std::function<void()> InitClient::TakeParked() {
  std::function<void()> out;
  std::lock_guard<std::mutex> lock(hold_mu_);
  out.swap(parked_);
  return out;
}

bool InitClient::ReadReady() { return Receive(false); }

bool InitClient::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !closed_;
}

Status InitClient::Send(Type type, uint64_t tag, std::string_view payload) {
  return SendRaw(proto::EncodeFrame(type, tag, payload));
}

Status InitClient::SendRaw(std::string_view bytes) {
  std::lock_guard<std::mutex> lock(send_mu_);
  while (!bytes.empty()) {
    ssize_t n = ::send(control_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      // The fd is non-blocking when a caller's loop watches it (CallerReads): wait here.
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && WaitFor(control_.get(), POLLOUT)) continue;
      return Error::Sys("send", "nsbox-init control channel", errno);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return Ok();
}

void InitClient::Register(uint64_t tag, Handler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  handlers_[tag] = std::make_shared<Handler>(std::move(handler));
}

uint64_t InitClient::Register(Handler handler) {
  uint64_t tag = NextTag();
  Register(tag, std::move(handler));
  return tag;
}

FsOutcome<InitClient::RawReply> InitClient::Call(Type type, std::string_view payload, UniqueFd* fd,
                                                 uint64_t tag, PartHandler part) {
  auto slot = std::make_shared<Slot>();
  Handler handler = FillSlot(slot);
  if (part != nullptr) {
    handler = [part = std::move(part), last = std::move(handler)](
                  const proto::FrameReader::FrameView& frame, UniqueFd received) {
      return !part(frame) && last(frame, std::move(received));
    };
  }
  if (tag == 0) {
    tag = Register(std::move(handler));
  } else {
    Register(tag, std::move(handler));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      handlers_.erase(tag);
      return TransportError("the control channel is closed");
    }
  }
  if (auto st = Send(type, tag, payload); !st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    handlers_.erase(tag);
    return TransportError(st.error().message());
  }
  std::unique_lock<std::mutex> lock(slot->mu);
  slot->cv.wait(lock, [&] { return slot->done; });
  if (fd != nullptr) *fd = std::move(slot->fd);
  return std::move(slot->reply);
}

InitClient::ReplyWait InitClient::ExpectReply(uint64_t tag) {
  auto slot = std::make_shared<Slot>();
  Register(tag, FillSlot(slot));
  return [slot, tag](std::chrono::milliseconds timeout) -> FsOutcome<RawReply> {
    std::unique_lock<std::mutex> lock(slot->mu);
    if (!slot->cv.wait_for(lock, timeout, [&] { return slot->done; })) {
      FsError e;
      e.err = ETIMEDOUT;
      e.message = "nsbox-init: no answer to tag " + std::to_string(tag) + " within " +
                  std::to_string(timeout.count()) + " ms";
      return e;
    }
    return std::move(slot->reply);
  };
}

void InitClient::FailAll(const FsError& error) {
  std::map<uint64_t, std::shared_ptr<Handler>> handlers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    handlers.swap(handlers_);
  }
  // A synthetic error frame for each: Call's slots and exec handlers both understand it.
  proto::ErrorReply er{error.err, error.syscall, error.path, error.message, false};
  std::string payload = proto::Encode(er);
  for (auto& [tag, handler] : handlers) {
    proto::FrameReader::FrameView frame{{0, Type::kError, tag}, payload, false};
    (*handler)(frame, UniqueFd());
  }
}

bool InitClient::Receive(bool wait) {
  ReadBuffer& buf = t_read_buffer;
  // Frames are parsed where they were received; only the partial frame at the end of a read is
  // moved to the front (the capture path's bytes are otherwise copied once more per frame).
  size_t have = partial_.size();
  buf.Reserve(std::max(kReadBufferSize, have + proto::kHeaderSize));
  std::memcpy(buf.data.get(), partial_.data(), have);
  partial_.clear();
  if (partial_.capacity() > kKeptPartial) std::string().swap(partial_);
  // Without waiting, a few reads at most: a sandbox that writes without pause must not hold the
  // caller's loop from its other work. The loop comes back, since the channel is still readable.
  for (int reads = 0;; ++reads) {
    if (!wait && reads == kReadsPerReady) {
      partial_.assign(buf.data.get(), have);
      return true;
    }
    struct iovec iov {
      buf.data.get() + have, buf.capacity - have
    };
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
    struct msghdr msg {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(control_.get(), &msg, MSG_CMSG_CLOEXEC | (wait ? 0 : MSG_DONTWAIT));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait) {
        partial_.assign(buf.data.get(), have);
        return true;
      }
      // A reader thread on an fd a loop made non-blocking (ReadOnOwnThread): wait here.
      if (WaitFor(control_.get(), POLLIN)) continue;
    }
    if (n <= 0) {
      FailAll(TransportError(n == 0 ? "the control channel closed (nsbox-init exited)"
                                    : "reading the control channel failed: " + ErrnoText(errno)));
      return false;
    }
    // Only now: a recvmsg that failed (ECONNRESET when nsbox-init ended with requests unread)
    // leaves `control` and its length as they were, and the stack there may still hold an
    // earlier read's fds, whose numbers may belong to anything by now.
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        fds_.emplace_back(fd);
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      // The kernel closed the fds that did not fit: which frame each fd belongs to can no longer
      // be told. nsbox-init sends at most one per frame.
      FailAll(TransportError("nsbox-init sent more file descriptors than one read takes"));
      return false;
    }
    have += static_cast<size_t>(n);
    size_t pos = 0;
    size_t partial_frame = 0;  // the size of the frame that has not wholly arrived
    while (have - pos >= proto::kHeaderSize) {
      proto::Header header = proto::DecodeHeader(buf.data.get() + pos);
      if (header.size > proto::kMaxPayload) {
        // nsbox-init never sends one: the stream cannot be trusted any more.
        FailAll(TransportError("nsbox-init sent a frame of " + std::to_string(header.size) +
                               " bytes, over the limit"));
        return false;
      }
      size_t whole = proto::kHeaderSize + header.size;
      if (have - pos < whole) {
        partial_frame = whole;
        break;
      }
      proto::FrameReader::FrameView frame{
          header, std::string_view(buf.data.get() + pos + proto::kHeaderSize, header.size), false};
      pos += whole;
      Dispatch(frame);
    }
    if (partial_frame > buf.capacity) {
      // A frame larger than the buffer (up to kMaxPayload): grow once for it.
      buf.Reserve(partial_frame, pos, have - pos);
    } else if (pos > 0) {
      std::memmove(buf.data.get(), buf.data.get() + pos, have - pos);
    }
    have -= pos;
  }
}

void InitClient::Dispatch(const proto::FrameReader::FrameView& frame) {
  UniqueFd fd;
  if ((frame.header.type == Type::kFileFd || frame.header.type == Type::kWriteReady) &&
      !fds_.empty()) {
    fd = std::move(fds_.front());
    fds_.pop_front();
  }
  std::shared_ptr<Handler> handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handlers_.find(frame.header.tag);
    if (it != handlers_.end()) handler = it->second;
  }
  if (handler == nullptr) return;  // a late frame for an abandoned request
  if ((*handler)(frame, std::move(fd))) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handlers_.find(frame.header.tag);
    if (it != handlers_.end() && it->second == handler) handlers_.erase(it);
  }
}

Result<InitClient::StartWait> InitClient::SendHello(const proto::Hello& hello,
                                                    const std::vector<int>& fds) {
  auto slot = std::make_shared<Slot>();
  const uint64_t tag = Register(FillSlot(slot));
  StartWait wait = [slot](std::chrono::milliseconds limit) -> FsOutcome<Unit> {
    std::unique_lock<std::mutex> lock(slot->mu);
    // A start takes a millisecond or two, far less than this even on a loaded host; an
    // nsbox-init that is alive but never answers (stopped, stuck) must not hold its caller, a
    // sandbox's lifecycle lock with it, for ever. Its caller stops it (SIGKILL after 3 s).
    if (!slot->cv.wait_for(lock, limit, [&] { return slot->done; })) {
      FsError e;
      e.err = ETIMEDOUT;
      const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(limit);
      e.message = "no answer to its hello in " + std::to_string(seconds.count()) + " s";
      return e;
    }
    return ExpectPong(slot->reply);
  };
  auto unregister = [this, tag] {
    std::lock_guard<std::mutex> lock(mu_);
    handlers_.erase(tag);
  };
  bool closed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed = closed_;
  }
  if (closed) {
    unregister();
    return Error(EPIPE, "the control channel is closed");
  }
  const std::string frames = proto::EncodeFrame(Type::kHello, 0, proto::Encode(hello)) +
                             proto::EncodeFrame(Type::kPing, tag, "");
  if (auto st = SendFirstFrames(frames, fds); !st.ok()) {
    unregister();
    return st.error();
  }
  return wait;
}

Status InitClient::SendFirstFrames(std::string_view frames, const std::vector<int>& fds) {
  if (fds.empty()) return SendRaw(frames);
  constexpr size_t kMaxFds = 4;  // what nsbox-init receives with its hello
  if (fds.size() > kMaxFds) return Error(EINVAL, "too many fds for the hello");
  alignas(struct cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))] = {};
  struct iovec iov {
    const_cast<char*>(frames.data()), 1
  };
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  {
    // The first byte carries the fds; the rest follows in one write. Nothing else is sent
    // before a hello, so nothing can come between the two.
    std::lock_guard<std::mutex> lock(send_mu_);
    ssize_t n;
    do {
      n = ::sendmsg(control_.get(), &msg, MSG_NOSIGNAL);
    } while (n < 0 && (errno == EINTR || ((errno == EAGAIN || errno == EWOULDBLOCK) &&
                                          WaitFor(control_.get(), POLLOUT))));
    if (n < 0) return Error::Sys("sendmsg", "nsbox-init control channel", errno);
  }
  return SendRaw(frames.substr(1));
}

uint64_t InitClient::StartExec(const proto::ExecRequest& request, ExecCallbacks callbacks,
                               std::function<void(FsOutcome<proto::ExecExit>)> done) {
  auto cb = std::make_shared<ExecCallbacks>(std::move(callbacks));
  auto finish = std::make_shared<std::function<void(FsOutcome<proto::ExecExit>)>>(std::move(done));
  uint64_t tag = Register([cb, finish](const proto::FrameReader::FrameView& frame, UniqueFd) {
    switch (frame.header.type) {
      case Type::kExecStarted: {
        proto::ExecStarted m;
        if (proto::Decode(frame.payload, &m) && cb->on_started) cb->on_started(m.pid);
        return false;
      }
      case Type::kExecOutput: {
        uint8_t stream = 0;
        std::string_view data;
        if (proto::DecodeExecOutputView(frame.payload, &stream, &data) && cb->on_output) {
          cb->on_output(stream, data);
        }
        return false;
      }
      case Type::kExecExit: {
        proto::ExecExit m;
        if (proto::Decode(frame.payload, &m)) {
          (*finish)(m);
        } else {
          (*finish)(ReplyError({frame.header.type, std::string(frame.payload)}, "exec-exit"));
        }
        return true;
      }
      default:
        (*finish)(ReplyError({frame.header.type, std::string(frame.payload)}, "exec events"));
        return true;
    }
  });
  bool closed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed = closed_;
    if (closed) handlers_.erase(tag);
  }
  if (closed) {
    (*finish)(TransportError("the control channel is closed"));
  } else if (auto st = Send(Type::kExec, tag, proto::Encode(request)); !st.ok()) {
    std::shared_ptr<Handler> handler;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = handlers_.find(tag);
      if (it != handlers_.end()) {
        handler = it->second;
        handlers_.erase(it);
      }
    }
    if (handler != nullptr) (*finish)(TransportError(st.error().message()));
  }
  return tag;
}

FsOutcome<proto::ExecExit> InitClient::Exec(const proto::ExecRequest& request,
                                            ExecCallbacks callbacks) {
  auto slot = std::make_shared<Slot>();
  auto result = std::make_shared<FsOutcome<proto::ExecExit>>(FsError{});
  StartExec(request, std::move(callbacks), [slot, result](FsOutcome<proto::ExecExit> r) {
    std::lock_guard<std::mutex> lock(slot->mu);
    *result = std::move(r);
    slot->done = true;
    slot->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(slot->mu);
  slot->cv.wait(lock, [&] { return slot->done; });
  return std::move(*result);
}

void InitClient::KillExec(uint64_t tag, uint8_t reason) {
  (void)Send(Type::kExecKill, tag, proto::Encode(proto::ExecKill{reason}));
}

namespace {

// The answer to a readFile: the bytes inline, or the fd of a large file and its size.
FsOutcome<InitClient::OpenedRead> DecodeOpenedRead(const InitClient::RawReply& reply, UniqueFd fd) {
  InitClient::OpenedRead opened;
  if (reply.type == Type::kFileData) {
    opened.size = reply.payload.size();
    opened.data = reply.payload;
    return opened;
  }
  if (reply.type != Type::kFileFd || !proto::DecodeU64(reply.payload, &opened.size) ||
      !fd.valid()) {
    return ReplyError(reply, "file-data");
  }
  opened.fd = std::move(fd);
  return opened;
}

// A path longer than a frame carries (kMaxPathBytes) is answered here, as nsbox-init answers any
// path of PATH_MAX bytes or more (fs::CheckPath, with the verb's syscall): sent, it would be
// refused as a malformed frame.
std::optional<FsError> TooLongToSend(const std::string& path, std::string_view syscall) {
  if (path.size() <= proto::kMaxPathBytes) return std::nullopt;
  return CheckPath(path, syscall);
}

}  // namespace

FsOutcome<InitClient::OpenedRead> InitClient::OpenRead(const std::string& path) {
  if (auto bad = TooLongToSend(path, "open")) return *bad;
  UniqueFd fd;
  auto r = Call(Type::kReadFile, proto::Encode(proto::PathRequest{path}), &fd);
  if (!r.ok()) return r.error();
  return DecodeOpenedRead(r.value(), std::move(fd));
}

void InitClient::StartOpenRead(const std::string& path,
                               std::function<void(FsOutcome<OpenedRead>)> done) {
  if (auto bad = TooLongToSend(path, "open")) {
    done(*bad);
    return;
  }
  auto callback = std::make_shared<std::function<void(FsOutcome<OpenedRead>)>>(std::move(done));
  SendAsync(
      Type::kReadFile, proto::Encode(proto::PathRequest{path}),
      [callback](const proto::FrameReader::FrameView& frame, UniqueFd fd) {
        (*callback)(
            DecodeOpenedRead({frame.header.type, std::string(frame.payload)}, std::move(fd)));
        return true;
      },
      [callback](const FsError& e) { (*callback)(e); });
}

void InitClient::SendAsync(Type type, std::string_view payload, Handler handler,
                           const std::function<void(const FsError&)>& fail) {
  const uint64_t tag = Register(std::move(handler));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      handlers_.erase(tag);
      fail(TransportError("the control channel is closed"));
      return;
    }
  }
  if (auto st = Send(type, tag, payload); !st.ok()) {
    bool registered = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      registered = handlers_.erase(tag) > 0;
    }
    // Not registered any more: FailAll has answered it already.
    if (registered) fail(TransportError(st.error().message()));
  }
}

FsOutcome<std::string> InitClient::ReadFile(const std::string& path) {
  auto opened = OpenRead(path);
  if (!opened.ok()) return opened.error();
  if (!opened.value().fd.valid()) return std::move(opened.value().data);
  // A large file: read it here, through the fd nsbox-init opened inside the jail.
  std::string out;
  out.reserve(static_cast<size_t>(opened.value().size));
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(opened.value().fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FsError{errno, "read", path, ErrnoText(errno) + ", read '" + path + "'"};
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

FsOutcome<InitClient::OpenedWrite> InitClient::BeginWrite(const std::string& path,
                                                          std::optional<uint32_t> mode) {
  if (auto bad = TooLongToSend(path, "open")) return *bad;
  OpenedWrite opened;
  opened.tag = NextTag();
  proto::WriteRequest req{path, mode.value_or(proto::WriteRequest::kKeepMode)};
  auto r = Call(Type::kWriteBegin, proto::Encode(req), &opened.fd, opened.tag);
  if (!r.ok()) return r.error();
  if (r.value().type != Type::kWriteReady || !opened.fd.valid()) {
    return ReplyError(r.value(), "write-ready");
  }
  return opened;
}

FsOutcome<Unit> InitClient::CommitWrite(uint64_t tag) {
  auto c = Call(Type::kWriteCommit, "", nullptr, tag);
  if (!c.ok()) return c.error();
  if (c.value().type != Type::kOk) return ReplyError(c.value(), "ok");
  return Unit{};
}

void InitClient::AbortWrite(uint64_t tag) { (void)Call(Type::kWriteAbort, "", nullptr, tag); }

FsOutcome<Unit> InitClient::WriteFile(const std::string& path, std::string_view data) {
  auto opened = BeginWrite(path);
  if (!opened.ok()) return opened.error();
  if (auto st = WriteAll(opened.value().fd.get(), data, path); !st.ok()) {
    AbortWrite(opened.value().tag);
    return FsError{st.error().code(), "write", path, st.error().message()};
  }
  opened.value().fd.reset();
  return CommitWrite(opened.value().tag);
}

FsOutcome<proto::StatReply> InitClient::Stat(const std::string& path) {
  if (auto bad = TooLongToSend(path, "stat")) return *bad;
  auto r = Call(Type::kStat, proto::Encode(proto::PathRequest{path}));
  if (!r.ok()) return r.error();
  proto::StatReply s;
  if (r.value().type != Type::kStatResult || !proto::Decode(r.value().payload, &s)) {
    return ReplyError(r.value(), "stat-result");
  }
  return s;
}

FsOutcome<proto::ReaddirReply> InitClient::Readdir(const std::string& path, bool with_types) {
  if (auto bad = TooLongToSend(path, "scandir")) return *bad;
  // A large directory comes in parts (kReaddirPart frames, then the kReaddirResult), gathered on
  // the thread that reads the channel; the caller adds the last once it has come. Bytes from
  // inside the sandbox: within the listing's bounds, or refused.
  struct Parts {
    proto::ReaddirGatherer listing;
    bool malformed = false;
  };
  auto parts = std::make_shared<Parts>();
  auto r = Call(Type::kReaddir, proto::Encode(proto::ReaddirRequest{path, with_types}), nullptr, 0,
                [parts](const proto::FrameReader::FrameView& frame) {
                  if (frame.header.type != Type::kReaddirPart) return false;
                  if (!parts->malformed) parts->malformed = !parts->listing.Add(frame.payload);
                  return true;
                });
  if (!r.ok()) return r.error();
  if (r.value().type != Type::kReaddirResult) return ReplyError(r.value(), "readdir-result");
  if (parts->malformed || !parts->listing.Add(r.value().payload)) {
    FsError e;
    e.err = EPROTO;
    e.message = "nsbox-init sent a malformed or oversized listing of '" + path + "'";
    return e;
  }
  return parts->listing.Take();
}

void InitClient::StartReaddir(const std::string& path, bool with_types,
                              std::function<void(std::string payload)> part,
                              std::function<void(FsOutcome<Unit>)> done) {
  if (auto bad = TooLongToSend(path, "scandir")) {
    done(*bad);
    return;
  }
  struct State {
    std::function<void(std::string)> part;
    std::function<void(FsOutcome<Unit>)> done;
    size_t bytes = 0;
    bool over = false;  // done has run with EPROTO; the rest is swallowed
  };
  auto state = std::make_shared<State>(State{std::move(part), std::move(done)});
  SendAsync(
      Type::kReaddir, proto::Encode(proto::ReaddirRequest{path, with_types}),
      [state, path](const proto::FrameReader::FrameView& frame, UniqueFd) {
        const Type type = frame.header.type;
        const bool last = type != Type::kReaddirPart;
        if (state->over) return last;
        if (type != Type::kReaddirPart && type != Type::kReaddirResult) {
          state->done(ReplyError({type, std::string(frame.payload)}, "readdir-result"));
          return true;
        }
        // Bytes from inside the sandbox: within the listing's bounds, or refused.
        state->bytes += frame.payload.size();
        if (state->bytes > proto::kMaxReaddirBytes) {
          state->over = true;
          FsError e;
          e.err = EPROTO;
          e.message = "nsbox-init sent an oversized listing of '" + path + "'";
          state->done(e);
          return last;
        }
        state->part(std::string(frame.payload));
        if (last) state->done(Unit{});
        return last;
      },
      [state](const FsError& e) { state->done(e); });
}

FsOutcome<bool> InitClient::Exists(const std::string& path) {
  if (TooLongToSend(path, "access")) return false;  // as nsbox-init: never an error
  auto r = Call(Type::kExists, proto::Encode(proto::PathRequest{path}));
  if (!r.ok()) return r.error();
  bool b = false;
  if (r.value().type != Type::kBool || !proto::DecodeBool(r.value().payload, &b)) {
    return ReplyError(r.value(), "bool");
  }
  return b;
}

namespace {

FsOutcome<Unit> ExpectOk(FsOutcome<InitClient::RawReply> r) {
  if (!r.ok()) return r.error();
  if (r.value().type != Type::kOk) return ReplyError(r.value(), "ok");
  return Unit{};
}

}  // namespace

FsOutcome<Unit> InitClient::Mkdir(const std::string& path, bool recursive) {
  if (auto bad = TooLongToSend(path, "mkdir")) return *bad;
  return ExpectOk(Call(Type::kMkdir, proto::Encode(proto::MkdirRequest{path, recursive})));
}

FsOutcome<Unit> InitClient::Rm(const std::string& path, bool recursive, bool force) {
  if (auto bad = TooLongToSend(path, "lstat")) return *bad;  // Node's rm looks first
  return ExpectOk(Call(Type::kRm, proto::Encode(proto::RmRequest{path, recursive, force})));
}

FsOutcome<Unit> InitClient::Ping() { return ExpectPong(Call(Type::kPing, "")); }

FsOutcome<Unit> InitClient::StopAll() { return ExpectOk(Call(Type::kStopAll, "")); }

void InitClient::SendInput(const proto::ExecInput& input,
                           std::function<void(FsOutcome<Unit>)> done) {
  auto callback = std::make_shared<std::function<void(FsOutcome<Unit>)>>(std::move(done));
  SendAsync(
      Type::kExecInput, proto::Encode(input),
      [callback](const proto::FrameReader::FrameView& frame, UniqueFd) {
        RawReply reply{frame.header.type, std::string(frame.payload)};
        if (reply.type == Type::kOk) {
          (*callback)(Unit{});
        } else {
          (*callback)(ReplyError(reply, "ok"));
        }
        return true;
      },
      [callback](const FsError& e) { (*callback)(e); });
}

FsOutcome<Unit> InitClient::Input(const proto::ExecInput& input) {
  return ExpectOk(Call(Type::kExecInput, proto::Encode(input)));
}

FsOutcome<Unit> InitClient::Resize(const proto::ExecResize& resize) {
  return ExpectOk(Call(Type::kExecResize, proto::Encode(resize)));
}

}  // namespace nsbox::fs

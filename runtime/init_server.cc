#include "runtime/init_server.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/files.h"
#include "base/log.h"
#include "base/stack.h"
#include "base/syscalls.h"
#include "base/worker_pool.h"
#include "exec/command.h"
#include "exec/direct.h"
#include "exec/spawn.h"
#include "isolate/mount_plan.h"
#include "runtime/init_guard.h"

namespace nsbox::runtime {

namespace proto = fs::proto;
using proto::Type;

namespace {
constexpr size_t kReadBufSize = 128 * 1024;
// A file-verb worker thread ends after this long without work (an idle sandbox keeps none).
constexpr std::chrono::milliseconds kWorkerIdleExit{2000};
// The largest file a readFile reads on the loop itself (only when nothing of it would block).
constexpr size_t kLoopReadLimit = 64 * 1024;
static_assert(kLoopReadLimit <= proto::kInlineFileLimit);
}  // namespace

// ---- What every command gets before execve -----------------------------------------------

struct InitServer::ChildSecurity {
  std::optional<isolate::SeccompProgram> seccomp;
  struct Limit {
    int resource;
    struct rlimit value;
  };
  std::vector<Limit> rlimits;

  // exec::ChildHooks::pre_exec: async-signal-safe, runs in the vfork-like child.
  static int PreExec(const void* ctx) {
    const auto* self = static_cast<const ChildSecurity*>(ctx);
    for (const auto& l : self->rlimits) {
      if (::setrlimit(static_cast<__rlimit_resource>(l.resource), &l.value) < 0) return errno;
    }
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return errno;
    // The capabilities are nsbox-init's own, already reduced to the commands' set (InitMain):
    // a uid-0 command execs with exactly that set, without paying for the drops each time.
    // Last: the filter would otherwise have to allow the steps above.
    if (self->seccomp) return isolate::LoadSeccomp(*self->seccomp);
    return 0;
  }
};

namespace {

Result<isolate::SeccompProgram> ProgramFromBytes(const std::string& bytes) {
  if (bytes.size() % sizeof(struct sock_filter) != 0 || bytes.empty() ||
      bytes.size() / sizeof(struct sock_filter) > 4096) {
    return Error::Msg("a seccomp program of " + std::to_string(bytes.size()) +
                      " bytes is not a whole number of BPF instructions (1 to 4096)");
  }
  std::vector<struct sock_filter> insns(bytes.size() / sizeof(struct sock_filter));
  std::memcpy(insns.data(), bytes.data(), bytes.size());
  return isolate::SeccompProgram(std::move(insns));
}

// Whether the sandbox's memory is limited: its v1 memory directory's memory.limit_in_bytes (a
// hybrid host) or its v2 directory's memory.max is set. Unreadable counts as limited: the runner
// then only gives up its children made ahead.
bool MemoryLimited(int v2_dir, int v1_memory_dir) {
  if (v1_memory_dir >= 0) {
    auto text = ReadFileAt(v1_memory_dir, "memory.limit_in_bytes");
    if (!text.ok()) return true;
    // No limit reads as the page counter's maximum, 2^63 less a page on 64-bit hosts.
    return std::strtoull(text->c_str(), nullptr, 10) < (1ULL << 62);
  }
  if (v2_dir >= 0) {
    auto text = ReadFileAt(v2_dir, "memory.max");
    if (!text.ok()) return text.error().code() != ENOENT;  // no memory controller: no limit
    return text->rfind("max", 0) != 0;
  }
  return false;
}

// What bash's PATH search accepts: a file that exists, is not a directory and may be executed.
bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

// argv[0] as execvp finds it in the PATH of the command's own environment; the name itself when
// nothing executable is found, so that the runner reports execve's error for it.
std::string FindExecutable(const std::string& name, const std::vector<std::string>& env) {
  for (const auto& candidate : exec::CommandCandidates(name, exec::PathOf(env))) {
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return name;
}

}  // namespace

// ---- The server ----------------------------------------------------------------------------

InitServer::InitServer(exec::Reactor& reactor, UniqueFd control, int cgroup_dir, UniqueFd root,
                       proto::Hello hello, proto::FrameReader frames,
                       exec::RunnerV1Cgroups v1_cgroups, exec::PremadeCgroups premade)
    : reactor_(reactor),
      control_(std::move(control)),
      cgroup_dir_(cgroup_dir),
      v1_cgroups_(v1_cgroups),
      premade_(std::move(premade)),
      root_(std::move(root)),
      hello_(std::move(hello)),
      security_(std::make_unique<ChildSecurity>()),
      workers_(std::make_unique<WorkerPool>(4, kWorkerIdleExit)),
      frames_(std::move(frames)) {
  read_buf_.reset(new char[kReadBufSize]);
}

InitServer::~InitServer() = default;

Status InitServer::Run() {
  if (!hello_.command_seccomp.empty()) {
    NSBOX_ASSIGN_OR_RETURN(auto program, ProgramFromBytes(hello_.command_seccomp));
    security_->seccomp = std::move(program);
  }
  for (const auto& r : hello_.rlimits) {
    security_->rlimits.push_back(
        {static_cast<int>(r.resource), {static_cast<rlim_t>(r.soft), static_cast<rlim_t>(r.hard)}});
  }
  runner_ = std::make_unique<exec::Runner>(
      reactor_, cgroup_dir_, exec::ChildHooks{&ChildSecurity::PreExec, security_.get()},
      v1_cgroups_, std::move(premade_));
  // A sandbox that can run out of its own memory keeps nsbox-init's OOM score below its
  // commands' (exec/spawn.cc): no child made ahead shares nsbox-init's memory map and score.
  if (MemoryLimited(cgroup_dir_, v1_cgroups_.memory_dir)) runner_->NoChildrenMadeAhead();

  // Orphans re-parented to PID 1 are reaped on SIGCHLD; commands' own main processes are
  // reaped by the runner through their pidfds.
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, nullptr);
  sigchld_.reset(::signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!sigchld_.valid()) return Error::Sys("signalfd", "SIGCHLD", errno);
  std::function<void(ssize_t)> on_sigchld = [this, &on_sigchld](ssize_t n) {
    if (n == -ECANCELED || closed_) return;
    // At once, also when the SIGCHLD is a command's own exit that is about to be answered: an
    // orphan reaped later would be a zombie that `kill -0` still finds (a 5 ms delay was tried;
    // adversarial case KillMinusOneStaysInItsSandbox caught it).
    ReapOrphans();
    reactor_.Read(sigchld_.get(), sigchld_buf_, sizeof sigchld_buf_, on_sigchld);
  };
  reactor_.Read(sigchld_.get(), sigchld_buf_, sizeof sigchld_buf_, on_sigchld);

  // Requests that arrived with the hello.
  while (auto frame = frames_.Next()) OnFrame(std::move(*frame));
  ReadControl();
  // A sandbox starts because a request needs it, most often a command: the first one finds its
  // child made ahead, as commands in a row do (a jail of the pool, whose cgroups are made; not in
  // a sandbox with a memory limit, above).
  runner_->Anticipate(hello_.adoption.has_value() && hello_.adoption->ahead);
  // Start-up ran deeper than the loop goes: its stack pages go back (8 of the 24 KiB of dirty
  // stack an idle nsbox-init held; the rest is above the loop's frame, docs/perf-notes.md).
  ReleaseUnusedMainStack();
  while (!closed_) {
    NSBOX_TRY(reactor_.RunOnce(std::nullopt));
  }
  // The host side is gone: end every process of the sandbox. The workspace stays.
  runner_->KillAll(exec::EndReason::kStopped);
  runner_.reset();
  workers_.reset();
  // Uploads the host never committed leave nothing behind.
  for (auto& [tag, write] : writes_) fs::AbortWrite(write);
  writes_.clear();
  return Ok();
}

void InitServer::ReadControl() {
  reactor_.Read(control_.get(), read_buf_.get(), kReadBufSize, [this](ssize_t n) {
    if (n <= 0) {
      if (n == -EINTR || n == -EAGAIN) {
        ReadControl();
        return;
      }
      closed_ = true;
      return;
    }
    frames_.Feed(std::string_view(read_buf_.get(), static_cast<size_t>(n)));
    while (auto frame = frames_.Next()) OnFrame(std::move(*frame));
    if (!closed_) ReadControl();
  });
}

void InitServer::ReapOrphans() {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/children", static_cast<int>(::gettid()));
  auto children = ReadFile(path);
  if (!children.ok()) return;
  for (pid_t pid : exec::ParsePids(*children)) {
    if (command_pids_.count(pid) != 0) continue;
    if (runner_ != nullptr && runner_->OwnsIdleChild(pid)) continue;
    siginfo_t info{};
    ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG);
  }
}

void InitServer::Send(Type type, uint64_t tag, std::string_view payload, UniqueFd fd) {
  if (closed_) return;
  Queue({proto::EncodeFrame(type, tag, payload), std::move(fd), 0});
}

void InitServer::Queue(Outgoing o) {
  out_bytes_ += o.bytes.size();
  out_.push_back(std::move(o));
  if (out_.size() == 1) Flush();
  if (!output_paused_ && out_bytes_ > kOutHigh && runner_ != nullptr) {
    output_paused_ = true;
    runner_->PauseOutput(true);
  }
}

void InitServer::SendError(uint64_t tag, const fs::FsError& e) {
  Send(Type::kError, tag,
       proto::Encode(proto::ErrorReply{e.err, e.syscall, e.path, e.message, e.node_err_fs_eisdir}));
}

void InitServer::SendProtocolError(uint64_t tag, int err, std::string message) {
  Send(Type::kError, tag, proto::Encode(proto::ErrorReply{err, "", "", std::move(message), false}));
}

void InitServer::Flush() {
  while (!out_.empty() && !waiting_writable_) {
    Outgoing& o = out_.front();
    struct iovec iov {
      o.bytes.data() + o.sent, o.bytes.size() - o.sent
    };
    struct msghdr msg {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    sys::FdControl control;
    if (o.sent == 0 && o.fd.valid()) {
      // The fd rides with the frame's first byte; the host takes it for this frame.
      sys::AttachFd(&msg, &control, o.fd.get());
    }
    ssize_t n = ::sendmsg(control_.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        waiting_writable_ = true;
        reactor_.PollOut(control_.get(), [this](int) {
          waiting_writable_ = false;
          Flush();
        });
        return;
      }
      closed_ = true;  // EPIPE, ECONNRESET: the host side is gone
      out_.clear();
      out_bytes_ = 0;
      return;
    }
    o.sent += static_cast<size_t>(n);
    if (o.sent == o.bytes.size()) {
      out_bytes_ -= o.bytes.size();
      out_.pop_front();
    }
  }
  if (output_paused_ && out_bytes_ <= kOutLow && runner_ != nullptr) {
    output_paused_ = false;
    runner_->PauseOutput(false);  // its reads complete later, from the reactor: no re-entry
  }
}

void InitServer::OnFrame(proto::FrameReader::Frame frame) {
  const uint64_t tag = frame.header.tag;
  if (frame.oversized) {
    SendProtocolError(tag, E2BIG,
                      "request of " + std::to_string(frame.header.size) + " bytes exceeds the " +
                          std::to_string(proto::kMaxPayload) + "-byte limit");
    return;
  }
  switch (frame.header.type) {
    case Type::kPing:
      Send(Type::kPong, tag, "");
      return;
    case Type::kHello:
      SendProtocolError(tag, EINVAL, "hello may be sent once, first");
      return;
    case Type::kExec:
      HandleExec(tag, frame.payload);
      return;
    case Type::kExecKill: {
      proto::ExecKill kill;
      if (!proto::Decode(frame.payload, &kill) ||
          (kill.reason != static_cast<uint8_t>(exec::EndReason::kCancelled) &&
           kill.reason != static_cast<uint8_t>(exec::EndReason::kStopped))) {
        SendProtocolError(tag, EINVAL, "malformed exec-kill request");
        return;
      }
      auto it = execs_.find(tag);
      if (it != execs_.end()) runner_->Kill(it->second, static_cast<exec::EndReason>(kill.reason));
      return;
    }
    case Type::kExecInput:
      HandleExecInput(tag, frame.payload);
      return;
    case Type::kExecResize:
      HandleExecResize(tag, frame.payload);
      return;
    case Type::kStopAll:
      if (execs_.empty()) {
        Send(Type::kOk, tag, "");
      } else {
        stop_all_tags_.push_back(tag);
        runner_->KillAll(exec::EndReason::kStopped);
      }
      return;
    case Type::kReadFile:
    case Type::kWriteBegin:
    case Type::kWriteCommit:
    case Type::kWriteAbort:
    case Type::kStat:
    case Type::kReaddir:
    case Type::kExists:
    case Type::kMkdir:
    case Type::kRm:
      HandleFileVerb(frame);
      return;
    default:
      SendProtocolError(
          tag, EINVAL,
          "unknown request type " + std::to_string(static_cast<unsigned>(frame.header.type)));
      return;
  }
}

void InitServer::HandleExec(uint64_t tag, std::string_view payload) {
  proto::ExecRequest req;
  if (!proto::Decode(payload, &req)) {
    SendProtocolError(tag, EINVAL, "malformed exec request");
    return;
  }
  if (execs_.count(tag) != 0) {
    SendProtocolError(tag, EEXIST, "an exec with tag " + std::to_string(tag) + " is running");
    return;
  }
  exec::CommandSpec spec;
  if (req.argv.empty()) {
    // A plain command runs without bash, as bash would run it (exec/direct.h). Not on a
    // terminal: a session there is long and interactive, the millisecond saved is nothing.
    std::optional<exec::DirectCommand> direct;
    if (!req.tty.has_value()) {
      direct = exec::DirectForm(req.command, hello_.shell, req.env, IsExecutableFile);
    }
    spec.argv = {hello_.shell, "-c", std::move(req.command)};
    spec.shell_line = true;
    if (direct.has_value()) {
      spec.file = std::move(direct->file);
      spec.fallback_argv = std::exchange(spec.argv, std::move(direct->argv));
      spec.fallback_env = req.env;
      req.env = std::move(direct->env);
    }
  } else {
    spec.argv = std::move(req.argv);
    spec.argv[0] = FindExecutable(spec.argv[0], req.env);
  }
  spec.env = std::move(req.env);
  spec.cwd = std::move(req.cwd);
  spec.stdin_data = std::move(req.stdin_data);
  spec.stdin_stream = req.stdin_stream;
  if (req.tty.has_value()) {
    spec.tty = exec::TerminalSize{req.tty->rows, req.tty->cols};
    // What a terminal program needs to know to draw: a default the request can override.
    bool has_term = false;
    for (const auto& e : spec.env) has_term = has_term || e.rfind("TERM=", 0) == 0;
    if (!has_term) spec.env.push_back("TERM=xterm-256color");
  }
  spec.timeout = std::chrono::milliseconds(req.timeout_ms);
  spec.output_limit = req.output_limit;

  auto pid = std::make_shared<pid_t>(0);
  exec::CommandEvents events;
  events.on_start = [this, tag, pid](pid_t p) {
    *pid = p;
    command_pids_.insert(p);
    Send(Type::kExecStarted, tag, proto::Encode(proto::ExecStarted{static_cast<uint32_t>(p)}));
  };
  events.on_output = [this, tag](int stream, std::string_view bytes) {
    while (!bytes.empty() && !closed_) {
      size_t n = std::min<size_t>(bytes.size(), proto::kMaxOutputChunk);
      Queue({proto::EncodeExecOutputFrame(tag, static_cast<uint8_t>(stream), bytes.substr(0, n)),
             UniqueFd(), 0});
      bytes.remove_prefix(n);
    }
  };
  events.on_exit = [this, tag, pid](const exec::CommandResult& r) {
    command_pids_.erase(*pid);
    execs_.erase(tag);
    RememberEnded(tag);
    proto::ExecExit exit{r.exit_code,   r.signal,    static_cast<uint8_t>(r.reason),
                         r.timed_out,   r.truncated, r.cancelled,
                         r.duration_ms, {}};
    exit.usage = {r.usage.cpu_user_us, r.usage.cpu_system_us, r.usage.memory_peak_bytes,
                  r.usage.pids_peak,   r.usage.io_read_bytes, r.usage.io_write_bytes};
    Send(Type::kExecExit, tag, proto::Encode(exit));
    if (execs_.empty()) {
      for (uint64_t t : stop_all_tags_) Send(Type::kOk, t, "");
      stop_all_tags_.clear();
    }
  };
  ForgetEnded(tag);
  auto id = runner_->Start(spec, std::move(events));
  if (!id.ok()) {
    EndUnstarted(tag, id.error());
    return;
  }
  // on_exit may already have run (a spawn failure completes at once); keep the map true.
  if (*pid == 0 || command_pids_.count(*pid) != 0) execs_[tag] = *id;
}

// api.md: a command that cannot be started is still an exec that ends, with exit code 1 and the
// reason on stderr, as one whose cwd is missing: here its process could not be made (the
// sandbox's pids limit reached: clone's EAGAIN; its pipes or cgroups could not be made).
void InitServer::EndUnstarted(uint64_t tag, const Error& error) {
  RememberEnded(tag);
  if (closed_) return;
  Send(Type::kExecStarted, tag, proto::Encode(proto::ExecStarted{0}));
  std::string line = "nsbox: the command could not be started: " + error.message();
  if (error.code() == EAGAIN) line += " (the sandbox may have as many processes as its pids limit)";
  line += "\n";
  Queue({proto::EncodeExecOutputFrame(tag, 2, line), UniqueFd(), 0});
  proto::ExecExit exit;
  exit.exit_code = 1;
  exit.reason = static_cast<uint8_t>(exec::EndReason::kExited);
  Send(Type::kExecExit, tag, proto::Encode(exit));
}

void InitServer::RememberEnded(uint64_t tag) {
  if (ended_.insert(tag).second) ended_order_.push_back(tag);
  while (ended_order_.size() > kRememberedEnded) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

void InitServer::ForgetEnded(uint64_t tag) {
  if (ended_.erase(tag) == 0) return;
  ended_order_.erase(std::find(ended_order_.begin(), ended_order_.end(), tag));
}

void InitServer::HandleExecInput(uint64_t tag, std::string_view payload) {
  proto::ExecInput input;
  if (!proto::Decode(payload, &input)) {
    SendProtocolError(tag, EINVAL, "malformed exec-input request");
    return;
  }
  auto it = execs_.find(input.exec_tag);
  if (it == execs_.end()) {
    if (ended_.count(input.exec_tag) != 0) {
      SendProtocolError(
          tag, EPIPE, "exec " + std::to_string(input.exec_tag) + " has ended: its stdin is closed");
    } else {
      SendProtocolError(tag, ESRCH, "no running exec with tag " + std::to_string(input.exec_tag));
    }
    return;
  }
  // Answered once the bytes are written (the sender's flow control), or refused.
  runner_->Input(it->second, std::move(input.data), input.close,
                 [this, tag, exec_tag = input.exec_tag](int err, std::string_view why) {
                   if (err == 0) {
                     Send(Type::kOk, tag, "");
                   } else {
                     SendProtocolError(
                         tag, err, "exec " + std::to_string(exec_tag) + ": " + std::string(why));
                   }
                 });
}

void InitServer::HandleExecResize(uint64_t tag, std::string_view payload) {
  proto::ExecResize resize;
  if (!proto::Decode(payload, &resize)) {
    // Also a size out of range: each of rows and cols must be 1..kMaxTtyDimension.
    SendProtocolError(tag, EINVAL,
                      "malformed exec-resize request (rows and cols must each be 1 to " +
                          std::to_string(proto::kMaxTtyDimension) + ")");
    return;
  }
  auto it = execs_.find(resize.exec_tag);
  if (it == execs_.end()) {
    SendProtocolError(tag, ESRCH, "no running exec with tag " + std::to_string(resize.exec_tag));
    return;
  }
  auto done = runner_->Resize(it->second, {resize.size.rows, resize.size.cols});
  if (!done.ok()) {
    SendProtocolError(tag, done.error().code(),
                      "exec " + std::to_string(resize.exec_tag) + ": " + done.error().message());
    return;
  }
  Send(Type::kOk, tag, "");
}

void InitServer::HandleFileVerb(const proto::FrameReader::Frame& frame) {
  const uint64_t tag = frame.header.tag;
  const int root = root_.get();
  auto reply = [this](std::function<void()> fn) { reactor_.Post(std::move(fn)); };

  switch (frame.header.type) {
    case Type::kReadFile: {
      proto::PathRequest req;
      if (!proto::Decode(frame.payload, &req)) break;
      // A small file whose lookup and bytes are all in memory is answered here: two thread
      // hand-offs (≈ 30 µs each across vCPUs here) cost more than reading it.
      if (auto data = fs::ReadCachedFile(root, req.path, kLoopReadLimit)) {
        Send(Type::kFileData, tag, *data);
        return;
      }
      workers_->Submit([this, tag, root, reply, path = std::move(req.path)] {
        auto opened = fs::OpenForRead(root, path);
        if (!opened.ok()) {
          reply([this, tag, e = opened.error()] { SendError(tag, e); });
          return;
        }
        auto& f = opened.value();
        if (f.size > proto::kInlineFileLimit) {
          reply([this, tag, size = f.size, fd = std::make_shared<UniqueFd>(std::move(f.fd))] {
            Send(Type::kFileFd, tag, proto::EncodeU64(size), std::move(*fd));
          });
          return;
        }
        // Small: inline. Read to EOF (the file may have changed since the stat), but never
        // more than the inline limit; a file that grew past it goes by fd after all.
        std::string data;
        data.resize(static_cast<size_t>(f.size) + 1);
        size_t have = 0;
        for (;;) {
          if (have == data.size()) {
            if (data.size() > proto::kInlineFileLimit) break;
            data.resize(std::min<size_t>(data.size() * 2 + 4096, proto::kInlineFileLimit + 1));
          }
          ssize_t n =
              ::pread(f.fd.get(), data.data() + have, data.size() - have, static_cast<off_t>(have));
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) {
            fs::FsError e{errno, "read", path, ErrnoName(errno) + ": " + strerror(errno) + ", read",
                          false};
            reply([this, tag, e] { SendError(tag, e); });
            return;
          }
          if (n == 0) break;
          have += static_cast<size_t>(n);
        }
        if (have > proto::kInlineFileLimit) {
          reply([this, tag, fd = std::make_shared<UniqueFd>(std::move(f.fd)), have] {
            Send(Type::kFileFd, tag, proto::EncodeU64(have), std::move(*fd));
          });
          return;
        }
        data.resize(have);
        reply([this, tag, data = std::move(data)] { Send(Type::kFileData, tag, data); });
      });
      return;
    }
    case Type::kWriteBegin: {
      proto::WriteRequest req;
      if (!proto::Decode(frame.payload, &req)) break;
      if (writes_.count(tag) != 0) {
        SendProtocolError(tag, EEXIST, "a write with tag " + std::to_string(tag) + " is open");
        return;
      }
      std::optional<uint32_t> mode;
      if (req.mode != proto::WriteRequest::kKeepMode) mode = req.mode;
      workers_->Submit([this, tag, root, reply, path = std::move(req.path), mode] {
        auto begun = fs::BeginWrite(root, path, mode);
        if (!begun.ok()) {
          reply([this, tag, e = begun.error()] { SendError(tag, e); });
          return;
        }
        auto pending = std::make_shared<fs::PendingWrite>(std::move(begun.value()));
        reply([this, tag, pending] {
          UniqueFd for_host(::fcntl(pending->fd.get(), F_DUPFD_CLOEXEC, 0));
          if (!for_host.valid()) {
            fs::AbortWrite(*pending);
            SendProtocolError(tag, errno, "dup the temp file: " + ErrnoText(errno));
            return;
          }
          writes_.emplace(tag, std::move(*pending));
          Send(Type::kWriteReady, tag, "", std::move(for_host));
        });
      });
      return;
    }
    case Type::kWriteCommit:
    case Type::kWriteAbort: {
      if (!frame.payload.empty()) break;
      auto it = writes_.find(tag);
      if (it == writes_.end()) {
        SendProtocolError(tag, ENOENT, "no open write with tag " + std::to_string(tag));
        return;
      }
      auto pending = std::make_shared<fs::PendingWrite>(std::move(it->second));
      writes_.erase(it);
      bool commit = frame.header.type == Type::kWriteCommit;
      workers_->Submit([this, tag, reply, pending, commit] {
        if (!commit) {
          fs::AbortWrite(*pending);
          reply([this, tag] { Send(Type::kOk, tag, ""); });
          return;
        }
        auto done = fs::CommitWrite(*pending);
        if (!done.ok()) {
          fs::AbortWrite(*pending);
          reply([this, tag, e = done.error()] { SendError(tag, e); });
        } else {
          reply([this, tag] { Send(Type::kOk, tag, ""); });
        }
      });
      return;
    }
    case Type::kStat: {
      proto::PathRequest req;
      if (!proto::Decode(frame.payload, &req)) break;
      workers_->Submit([this, tag, root, reply, path = std::move(req.path)] {
        auto st = fs::Stat(root, path);
        if (!st.ok()) {
          reply([this, tag, e = st.error()] { SendError(tag, e); });
          return;
        }
        const auto& s = st.value();
        proto::StatReply r{s.is_file, s.is_directory, s.is_symbolic_link,
                           s.size,    s.mtime_ms,     s.mode};
        reply([this, tag, r] { Send(Type::kStatResult, tag, proto::Encode(r)); });
      });
      return;
    }
    case Type::kReaddir: {
      proto::ReaddirRequest req;
      if (!proto::Decode(frame.payload, &req)) break;
      workers_->Submit([this, tag, root, reply, req = std::move(req)] {
        auto entries = fs::Readdir(root, req.path);
        if (!entries.ok()) {
          reply([this, tag, e = entries.error()] { SendError(tag, e); });
          return;
        }
        const size_t n = entries.value().size();
        std::vector<proto::ReaddirReply::Entry> listing;
        listing.reserve(n);
        for (auto& e : entries.value()) {
          listing.push_back({std::move(e.name), static_cast<uint8_t>(e.type)});
        }
        // In frames of up to 1 MiB, never one over kMaxPayload; none beyond the listing's bounds.
        std::vector<std::string> parts = proto::EncodeReaddirParts(std::move(listing));
        if (parts.empty()) {
          reply([this, tag, n, path = req.path] {
            SendError(tag,
                      fs::FsError{E2BIG, "scandir", path,
                                  "E2BIG: the directory has too many entries for one listing (" +
                                      std::to_string(n) + "; at most " +
                                      std::to_string(proto::kMaxListEntries) + " names, " +
                                      std::to_string(proto::kMaxReaddirBytes >> 20) +
                                      " MiB of them), scandir '" + path +
                                      "'; list it with a command (ls, find)"});
          });
          return;
        }
        reply([this, tag, parts = std::move(parts)] {
          for (size_t i = 0; i + 1 < parts.size(); ++i) Send(Type::kReaddirPart, tag, parts[i]);
          Send(Type::kReaddirResult, tag, parts.back());
        });
      });
      return;
    }
    case Type::kExists: {
      proto::PathRequest req;
      if (!proto::Decode(frame.payload, &req)) break;
      workers_->Submit([this, tag, root, reply, path = std::move(req.path)] {
        bool exists = fs::Exists(root, path);
        reply([this, tag, exists] { Send(Type::kBool, tag, proto::EncodeBool(exists)); });
      });
      return;
    }
    case Type::kMkdir: {
      proto::MkdirRequest req;
      if (!proto::Decode(frame.payload, &req)) break;
      workers_->Submit([this, tag, root, reply, req = std::move(req)] {
        auto r = fs::Mkdir(root, req.path, req.recursive);
        if (!r.ok()) {
          reply([this, tag, e = r.error()] { SendError(tag, e); });
        } else {
          reply([this, tag] { Send(Type::kOk, tag, ""); });
        }
      });
      return;
    }
    case Type::kRm: {
      proto::RmRequest req;
      if (!proto::Decode(frame.payload, &req)) break;
      workers_->Submit([this, tag, root, reply, req = std::move(req)] {
        auto r = fs::Rm(root, req.path, req.recursive, req.force);
        if (!r.ok()) {
          reply([this, tag, e = r.error()] { SendError(tag, e); });
        } else {
          reply([this, tag] { Send(Type::kOk, tag, ""); });
        }
      });
      return;
    }
    default:
      break;
  }
  SendProtocolError(tag, EINVAL,
                    "malformed " + std::string(proto::TypeName(frame.header.type)) + " request");
}

// ---- main ----------------------------------------------------------------------------------

namespace {

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "nsbox-init: %s\n", message.c_str());
  ::_exit(1);
}

// Reads the first frame, the hello. Frames that arrived behind it stay in `frames`; fds that came
// with it (an adoption's trees) in `fds`.
Result<proto::Hello> ReadHello(int fd, proto::FrameReader& frames, std::vector<UniqueFd>* fds) {
  char buf[65536];
  for (;;) {
    if (auto frame = frames.Next()) {
      proto::Hello hello;
      if (frame->header.type != Type::kHello || frame->oversized ||
          !proto::Decode(frame->payload, &hello)) {
        return Error::Msg("the first frame is not a well-formed hello (" +
                          std::string(proto::TypeName(frame->header.type)) + ")");
      }
      if (hello.version != proto::kVersion) {
        return Error::Msg("protocol version " + std::to_string(hello.version) +
                          " (this nsbox-init speaks " + std::to_string(proto::kVersion) + ")");
      }
      return hello;
    }
    struct iovec iov {
      buf, sizeof buf
    };
    alignas(struct cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
    struct msghdr msg {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::Sys("recvmsg", "control channel", errno);
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof passed);
        fds->emplace_back(passed);
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) return Error::Msg("too many fds came with the hello");
    if (n == 0) return Error(EPIPE, "the control channel closed before the hello");
    frames.Feed(std::string_view(buf, static_cast<size_t>(n)));
  }
}

}  // namespace

int InitMain(int argc, char** argv) {
  int control_fd = -1;
  int cgroup_fd = -1;
  exec::RunnerV1Cgroups v1;
  std::optional<exec::Reactor::Backend> backend;
  bool adopt = false;   // started for nsboxd's pool: the hello brings an Adoption
  int own_etc_fd = -1;  // with it: the jail's own /etc directory (isolate::AdoptionSpec)
  if (argc == 2 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
    std::printf(
        "nsbox-init: PID 1 of every nsbox sandbox, serving its commands and file verbs over a "
        "control channel\n(docs/init.md). It is started by nsbox (nsbox serve, nsbox run) inside "
        "each jail, not by hand.\nUsage: nsbox-init --control-fd N [--cgroup-fd N] "
        "[--memory-cgroup-fd N] [--pids-cgroup-fd N]\n                  [--reactor "
        "epoll|io_uring] [--adopt 1 --own-etc-fd N]\n");
    return 0;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    std::string value = argv[i + 1];
    if (flag == "--control-fd") {
      control_fd = std::atoi(value.c_str());
    } else if (flag == "--cgroup-fd") {
      cgroup_fd = std::atoi(value.c_str());
    } else if (flag == "--memory-cgroup-fd") {
      v1.memory_dir = std::atoi(value.c_str());
    } else if (flag == "--pids-cgroup-fd") {
      v1.pids_dir = std::atoi(value.c_str());
    } else if (flag == "--adopt" && value == "1") {
      adopt = true;
    } else if (flag == "--own-etc-fd") {
      own_etc_fd = std::atoi(value.c_str());
    } else if (flag == "--reactor" && (value == "epoll" || value == "io_uring")) {
      // nsbox-init's environment is empty, so the choice of NSBOX_REACTOR comes as a flag.
      backend =
          value == "epoll" ? exec::Reactor::Backend::kEpoll : exec::Reactor::Backend::kIoUring;
    } else {
      Die("unknown argument " + flag + " " + value +
          " (expected --control-fd N [--cgroup-fd N] [--memory-cgroup-fd N] [--pids-cgroup-fd N] "
          "[--reactor epoll|io_uring] [--adopt 1 --own-etc-fd N])");
    }
  }
  if (control_fd < 0) Die("no --control-fd (nsbox-init is started by nsbox, not by hand: --help)");

  // Protect PID 1 from the commands it runs: credentials that no command matches (prlimit(2)
  // would otherwise let any command lower its limits: runtime/init_guard.h), set while this is
  // the only thread; its limits read before any command can run, for the commands' own; not
  // dumpable (its /proc entries belong to the host's
  // root, so no command reads its memory, fds or environment: CVE-2016-9962); no fd of it leaks
  // (everything is CLOEXEC and the runner closes the rest); a write to a closed pipe is an
  // error, not a death.
  auto saved_ids = GuardSavedIds();
  if (!saved_ids.ok()) Die("guard its credentials: " + saved_ids.error().message());
  if (!saved_ids->guarded()) {
    log::warn("the jail maps one uid and one gid only: commands can change nsbox-init's limits");
  }
  auto own_limits = ReadOwnLimits();
  if (!own_limits.ok()) Die(own_limits.error().message());
  RaiseOwnSoftLimits();
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  ::signal(SIGPIPE, SIG_IGN);
  ::fcntl(control_fd, F_SETFD, FD_CLOEXEC);
  for (int fd : {cgroup_fd, v1.memory_dir, v1.pids_dir, own_etc_fd}) {
    if (fd >= 0) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }

  // Made before the hello: a jail of the pool has it ready when its sandbox comes.
  auto reactor = backend ? exec::CreateReactor(*backend) : exec::CreateReactor();
  if (!reactor.ok()) Die(reactor.error().message());

  // A jail of the pool has time while it waits: its sandbox's first command will find its
  // cgroups made. Best effort: without them, that command makes them, as any.
  exec::PremadeCgroups premade;
  if (adopt) {
    auto made = exec::PremadeCgroups::Make(cgroup_fd, v1);
    if (made.ok()) {
      premade = std::move(made).value();
    } else {
      log::warn("the first command's cgroups, made ahead: {}", made.error().message());
    }
  }

  proto::FrameReader frames;
  std::vector<UniqueFd> passed;
  auto hello = ReadHello(control_fd, frames, &passed);
  // A jail of the pool that no sandbox took: the daemon stopped it, which is no error.
  if (!hello.ok() && adopt && hello.error().code() == EPIPE) ::_exit(0);
  if (!hello.ok()) Die(hello.error().message());
  if (hello->adoption.has_value() != adopt) {
    Die(adopt ? "started for the pool, but the hello adopts no sandbox"
              : "the hello adopts a sandbox, but this nsbox-init was not started for the pool");
  }
  if (adopt) {
    // Still privileged, and nothing but us runs here yet: become the sandbox's.
    if (passed.size() != 2) Die("an adoption needs 2 trees, got " + std::to_string(passed.size()));
    isolate::AdoptionSpec spec;
    spec.workspace_tree = passed[0].get();
    spec.home_tree = passed[1].get();
    spec.hostname = hello->adoption->hostname;
    spec.etc_hosts = hello->adoption->etc_hosts;
    spec.etc_hostname = hello->adoption->etc_hostname;
    spec.tmpfs_size = hello->adoption->tmpfs_size;
    spec.own_etc_dir = own_etc_fd;
    spec.ahead = hello->adoption->ahead;
    if (auto st = isolate::ApplyAdoption(spec); !st.ok()) {
      Die("adopt the sandbox: " + st.error().message());
    }
    if (::chdir("/workspace") < 0) Die("chdir /workspace: " + ErrnoText(errno));
  }
  passed.clear();
  // Every limit a command starts with is set in its child: none is inherited from nsbox-init.
  hello->rlimits = CommandRlimits(hello->rlimits, *own_limits);
  // Of use to the adoption only; adopted ahead, it is the writable clone the daemon opens through
  // /proc to write the sandbox's hosts and hostname (isolate::AdoptionSpec::ahead), kept.
  if (own_etc_fd >= 0 && !(adopt && hello->adoption->ahead)) ::close(own_etc_fd);

  int root = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) Die("open /: " + ErrnoText(errno));
  // nsbox-init keeps exactly the commands' capabilities: it needs nothing more (its cgroup is
  // delegated to it, the file verbs need what commands have), so a file verb can never do what
  // a command could not, and commands inherit the reduced bounding set.
  auto caps = isolate::PlanCapabilityMask(hello->capabilities, static_cast<int>(hello->last_cap));
  if (!caps.ok()) Die(caps.error().message());
  if (int err = isolate::ApplyCapabilities(*caps); err != 0) {
    Die("drop capabilities: " + ErrnoText(err));
  }
  if (!hello->init_seccomp.empty()) {
    auto program = ProgramFromBytes(hello->init_seccomp);
    if (!program.ok()) Die(program.error().message());
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) Die("no_new_privs: " + ErrnoText(errno));
    int err = isolate::LoadSeccomp(*program);
    if (err != 0) Die("load the seccomp filter: " + ErrnoText(err));
  }
  ::fcntl(control_fd, F_SETFL, ::fcntl(control_fd, F_GETFL) | O_NONBLOCK);
  InitServer server(**reactor, UniqueFd(control_fd), cgroup_fd, UniqueFd(root), std::move(*hello),
                    std::move(frames), v1, std::move(premade));
  auto st = server.Run();
  if (!st.ok()) Die(st.error().message());
  return 0;
}

}  // namespace nsbox::runtime

#pragma once

// The host side of the control channel: what nsboxd (and the tests) use to drive a sandbox's
// nsbox-init. Thread-safe; responses are dispatched by tag, so many requests are in flight at
// once. Files larger than the inline limit arrive as fds (SCM_RIGHTS) and are read or written
// here directly: no transfer passes whole through nsbox-init's memory.
//
// Who reads the channel: by default a thread of the client's own. A caller with an event loop
// (nsboxd) can read it there instead (CallerReads): the answers and callbacks then run on that
// loop, which saves a thread per sandbox and a hand-off between threads per answer.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "base/error.h"
#include "base/unique_fd.h"
#include "fs/file_ops.h"
#include "fs/protocol.h"

namespace nsbox::fs {

class InitClient {
 public:
  // Takes the host's end of the control channel and starts the reader thread.
  explicit InitClient(UniqueFd control);
  // Takes the host's end of the control channel, which the caller's loop reads: it watches fd()
  // and calls ReadReady() each time it is readable. The blocking calls (Ping, Stat, Exec...)
  // then wait for that loop, so they must never be made on it.
  struct CallerReads {};
  InitClient(UniqueFd control, CallerReads);
  // Closes the channel (nsbox-init then ends every process of the sandbox and exits) and joins
  // the reader thread; every pending call fails with EPIPE.
  ~InitClient();
  // Closes the channel, leaving the object in place: calls made after it (a request that still
  // holds the sandbox while it is stopped) fail with EPIPE instead of reaching a destroyed
  // client. With the client's own reader, the pending calls have failed when it returns; with
  // CallerReads, when the loop's next ReadReady sees the channel closed (or at destruction).
  // Idempotent and thread-safe.
  void Close();

  // CallerReads: the channel, to watch for reading (the client keeps it).
  int fd() const { return control_.get(); }
  // CallerReads: reads and dispatches what has arrived, without waiting, in at most four reads
  // (a channel that never runs dry must not hold the loop: it stays readable, so the loop comes
  // back to it). Never on two threads at once. False once the channel has closed (every pending
  // call then failed with EPIPE): stop watching.
  bool ReadReady();
  // CallerReads: hands the reading to a thread of the client's own, for a loop that ends while
  // the sandbox lives on. Only when no ReadReady runs or will run any more.
  void ReadOnOwnThread();
  // CallerReads, backpressure for a consumer that cannot keep up (nsboxd's exec log waiting on
  // the disk): while a hold is kept, the caller's loop stops watching the channel after its
  // current ReadReady (ParkReadsIfHeld). nsbox-init's frames then wait in the socket and in
  // nsbox-init, which stops reading its commands' pipes while 4 MiB wait there. Any thread.
  void HoldReads();
  // Drops a hold; the last one calls what ParkReadsIfHeld kept (the loop's re-arm).
  void ReleaseReads();
  // The caller's loop, after ReadReady returned true: with a hold kept, keeps `resume` and
  // returns true (stop watching until it is called: by the last ReleaseReads, or by Close, so
  // that the loop sees the channel close). Without a hold, false. ReadOnOwnThread drops it.
  bool ParkReadsIfHeld(std::function<void()> resume);
  // Whether the loop is parked by a hold now (ParkReadsIfHeld kept a resume not yet called).
  bool ReadsParked() const;
  InitClient(const InitClient&) = delete;
  InitClient& operator=(const InitClient&) = delete;

  // The first frame: the jail's configuration, and a ping right behind it, in the write of the
  // hello's last bytes. `fds` go with the hello's first byte (SCM_RIGHTS, a write of its own): an
  // adoption's trees (proto::Adoption). nsbox-init reads the ping with the end of the hello and
  // answers it as soon as the hello is carried out, before the rest of its start (the child it
  // makes ahead for a first command): the returned wait for that pong confirms the start, at
  // the earliest it can be.
  // The wait gives up after `limit` (ETIMEDOUT): kHelloAnswerLimit, more for a sandbox whose CPU
  // limit slows nsbox-init too (runtime/sandbox.cc, HelloLimit).
  using StartWait = std::function<FsOutcome<Unit>(std::chrono::milliseconds limit)>;
  static constexpr std::chrono::milliseconds kHelloAnswerLimit{10000};
  Result<StartWait> SendHello(const proto::Hello& hello, const std::vector<int>& fds = {});

  struct ExecCallbacks {
    std::function<void(uint32_t pid)> on_started;
    std::function<void(int stream, std::string_view data)> on_output;
  };
  // Starts a command; callbacks and `done` run on the reader thread. Returns the exec's tag,
  // which KillExec takes.
  uint64_t StartExec(const proto::ExecRequest& request, ExecCallbacks callbacks,
                     std::function<void(FsOutcome<proto::ExecExit>)> done);
  // Runs a command to its end (blocking), delivering output through the callbacks.
  FsOutcome<proto::ExecExit> Exec(const proto::ExecRequest& request, ExecCallbacks callbacks = {});
  // Ends a running exec (reason exec::EndReason kCancelled or kStopped); its exit follows.
  void KillExec(uint64_t tag, uint8_t reason);
  // Feeds a running exec's stdin (or terminal): `done` runs (on the reader thread, or at once
  // when the channel is closed) once nsbox-init has written the bytes, which is the caller's
  // flow control: send the next chunk after it. Errors: EPIPE (stdin closed, or the command's
  // end reported), ESRCH (unknown exec). input.data is at most proto::kMaxInputChunk.
  void SendInput(const proto::ExecInput& input, std::function<void(FsOutcome<Unit>)> done);
  // Blocking form of SendInput.
  FsOutcome<Unit> Input(const proto::ExecInput& input);
  // A new window size for a terminal exec (SIGWINCH inside). Errors: ENOTTY, ESRCH, EINVAL.
  FsOutcome<Unit> Resize(const proto::ExecResize& resize);

  FsOutcome<std::string> ReadFile(const std::string& path);
  // readFile for streaming: a small file's bytes inline, or an O_RDONLY fd of a large one
  // (opened by nsbox-init inside the jail) and its size at the time it was opened.
  struct OpenedRead {
    std::string data;  // when !fd.valid()
    UniqueFd fd;
    uint64_t size = 0;
  };
  FsOutcome<OpenedRead> OpenRead(const std::string& path);
  // OpenRead without a waiting thread: `done` runs on the reader thread with the answer (or at
  // once, on the caller, when the channel is closed).
  void StartOpenRead(const std::string& path, std::function<void(FsOutcome<OpenedRead>)> done);
  // writeFile for streaming: Begin returns a write fd of the temp file nsbox-init made and the
  // tag that Commit (atomic replace) or Abort (nothing changes) takes.
  struct OpenedWrite {
    UniqueFd fd;
    uint64_t tag = 0;
  };
  // `mode`: the file's permission bits (at most 07777); without it an existing file keeps its
  // mode and a new one gets 0644.
  FsOutcome<OpenedWrite> BeginWrite(const std::string& path,
                                    std::optional<uint32_t> mode = std::nullopt);
  FsOutcome<Unit> CommitWrite(uint64_t tag);
  void AbortWrite(uint64_t tag);
  FsOutcome<Unit> WriteFile(const std::string& path, std::string_view data);
  FsOutcome<proto::StatReply> Stat(const std::string& path);
  FsOutcome<proto::ReaddirReply> Readdir(const std::string& path, bool with_types);
  // Readdir without a waiting thread, for a caller that passes the listing on as it comes
  // (nsboxd streams it to its client): `part` takes each frame's payload in order (kReaddirPart
  // frames, then the kReaddirResult's), undecoded (proto::ReaddirCursor reads it), and `done`
  // runs once after the last, or instead of any part with nsbox-init's error, or after some with
  // EPROTO for a listing past proto::kMaxReaddirBytes (no part follows). Both run on the reader
  // thread (or at once, on the caller, when the channel is closed).
  void StartReaddir(const std::string& path, bool with_types,
                    std::function<void(std::string payload)> part,
                    std::function<void(FsOutcome<Unit>)> done);
  FsOutcome<bool> Exists(const std::string& path);
  FsOutcome<Unit> Mkdir(const std::string& path, bool recursive);
  FsOutcome<Unit> Rm(const std::string& path, bool recursive, bool force);
  FsOutcome<Unit> Ping();
  FsOutcome<Unit> StopAll();

  // For tests of hostile input: any bytes on the channel, and the next response to `tag`.
  struct RawReply {
    proto::Type type;
    std::string payload;
  };
  Status SendRaw(std::string_view bytes);
  // Registers for the next response to `tag` now (call it before SendRaw, so that the answer
  // cannot arrive unregistered and be dropped) and returns the wait for it, which gives up with
  // ETIMEDOUT after `timeout`.
  using ReplyWait = std::function<FsOutcome<RawReply>(std::chrono::milliseconds timeout)>;
  ReplyWait ExpectReply(uint64_t tag);
  uint64_t NextTag() { return next_tag_.fetch_add(1); }

  // False once the channel has closed (nsbox-init exited).
  bool connected() const;

 private:
  // Runs on the reader thread; the frame's payload is valid only during the call. Returns true
  // when the request is complete (its handler is then dropped).
  using Handler = std::function<bool(const proto::FrameReader::FrameView& frame, UniqueFd fd)>;

  uint64_t Register(Handler handler);
  // The hello's frames, `fds` with their first byte.
  Status SendFirstFrames(std::string_view frames, const std::vector<int>& fds);
  void Register(uint64_t tag, Handler handler);
  Status Send(proto::Type type, uint64_t tag, std::string_view payload);
  // Registers `handler` for the answer and sends the request; where it cannot be sent (the
  // channel is closed), `fail` runs at once with why, unless FailAll has answered it already.
  void SendAsync(proto::Type type, std::string_view payload, Handler handler,
                 const std::function<void(const FsError&)>& fail);
  // `part`: for an answer in several frames, takes each frame before the last (returns true for
  // those); the last completes the call.
  using PartHandler = std::function<bool(const proto::FrameReader::FrameView& frame)>;
  FsOutcome<RawReply> Call(proto::Type type, std::string_view payload, UniqueFd* fd = nullptr,
                           uint64_t tag = 0, PartHandler part = nullptr);
  // Reads frames and dispatches them. `wait`: until the channel closes (the reader thread); else
  // until nothing more has arrived (ReadReady). False once the channel has closed.
  bool Receive(bool wait);
  std::mutex close_mu_;  // serialises Close and ReadOnOwnThread
  // HoldReads: the holds kept, and the loop's re-arm while it is parked.
  mutable std::mutex hold_mu_;
  int holds_ = 0;
  bool own_reader_ = false;  // ReadOnOwnThread: holds no longer park anything
  std::function<void()> parked_;
  std::function<void()> TakeParked();
  void Dispatch(const proto::FrameReader::FrameView& frame);
  void FailAll(const FsError& error);

  UniqueFd control_;
  std::thread reader_;
  // What Receive keeps between two calls: the received fds not yet claimed (each belongs to the
  // next fd-carrying frame) and, with CallerReads, the start of a frame not wholly arrived.
  std::deque<UniqueFd> fds_;
  std::string partial_;
  mutable std::mutex mu_;
  std::mutex send_mu_;
  std::map<uint64_t, std::shared_ptr<Handler>> handlers_;
  bool closed_ = false;
  std::atomic<uint64_t> next_tag_{1};
};

// The FsError of a reply that was not the expected type (a kError, or a protocol violation).
FsError ReplyError(const InitClient::RawReply& reply, std::string_view expected);

}  // namespace nsbox::fs

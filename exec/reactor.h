#pragma once

// The event loop of nsbox-init: one thread, completions delivered as callbacks. Two backends
// with the same behaviour: io_uring (liburing), and epoll where io_uring is unavailable
// (kernel.io_uring_disabled, a host seccomp filter, an old kernel). conventions.md: "io_uring
// sits behind a small reactor interface with an epoll fallback (Seastar's reactor backends)".

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "base/error.h"

namespace nsbox::exec {

// Identifies a pending operation, for Cancel. 0 is never a valid id.
using OpId = uint64_t;

class Reactor {
 public:
  enum class Backend { kIoUring, kEpoll };

  virtual ~Reactor() = default;
  virtual Backend backend() const = 0;

  // Every operation completes exactly once by calling its callback from RunOnce, on the loop's
  // thread: with the result, or with -ECANCELED after Cancel (unless it had completed first).
  // Buffers passed in must stay valid until the callback has run.

  // Reads up to `len` bytes of `fd` once it has data: done(bytes read), 0 at EOF, or -errno.
  // Works on non-blocking pipes and sockets (the epoll backend waits for readiness and reads).
  virtual OpId Read(int fd, void* buf, size_t len, std::function<void(ssize_t)> done) = 0;
  // Writes up to `len` bytes (possibly fewer): done(bytes written) or -errno.
  virtual OpId Write(int fd, const void* buf, size_t len, std::function<void(ssize_t)> done) = 0;
  // Waits until `fd` is readable (a pidfd: the process exited): done(poll revents) or -errno.
  virtual OpId PollIn(int fd, std::function<void(int)> done) = 0;
  // Waits until `fd` is writable (a socket whose send buffer was full, for sendmsg with
  // SCM_RIGHTS, which Write cannot do): done(poll revents) or -errno.
  virtual OpId PollOut(int fd, std::function<void(int)> done) = 0;
  // Fires once after `delay`: done(0), or done(-ECANCELED).
  virtual OpId Timer(std::chrono::nanoseconds delay, std::function<void(int)> done) = 0;
  // Asks for the operation to end; its callback then runs with -ECANCELED (or with its result
  // if it completed first). Cancelling an id that already completed does nothing.
  virtual void Cancel(OpId id) = 0;

  // Runs `fn` on the loop's thread at the next iteration. The only call that is safe from other
  // threads (the file verbs' worker threads post their results with it).
  virtual void Post(std::function<void()> fn) = 0;

  // Waits for at least one completion (or until `timeout`), then runs every ready callback.
  virtual Status RunOnce(std::optional<std::chrono::milliseconds> timeout) = 0;
  // The number of operations not yet completed.
  virtual size_t pending() const = 0;
};

std::string_view BackendName(Reactor::Backend backend);

// The io_uring backend when the kernel allows it, else epoll. NSBOX_REACTOR=epoll (or io_uring)
// in the environment forces one, so that the whole test suite runs on both; forcing io_uring
// where it is unavailable is an error, never a silent fallback.
Result<std::unique_ptr<Reactor>> CreateReactor();
Result<std::unique_ptr<Reactor>> CreateReactor(Reactor::Backend backend);

}  // namespace nsbox::exec

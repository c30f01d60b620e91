#include "exec/reactor.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/log.h"
#include "exec/reactor_internal.h"

namespace nsbox::exec {

namespace internal {

Result<std::unique_ptr<PostQueue>> PostQueue::Create() {
  // Non-blocking: the io_uring backend reads it through the ring (which waits by polling), the
  // epoll backend reads it after readiness and must never block.
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return Error::Sys("eventfd", "", errno);
  return std::unique_ptr<PostQueue>(new PostQueue(UniqueFd(fd)));
}

void PostQueue::Post(std::function<void()> fn) {
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(mu_);
    was_empty = queue_.empty();
    queue_.push_back(std::move(fn));
  }
  if (was_empty) {
    uint64_t one = 1;
    // SAFETY: an 8-byte write to our own eventfd. It can only fail with EAGAIN when the counter
    // is at its maximum, in which case the loop is already due to wake.
    ssize_t ignored = ::write(event_fd_.get(), &one, sizeof(one));
    (void)ignored;
  }
}

void PostQueue::Take(std::vector<std::function<void()>>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out->swap(queue_);
}

void PostQueue::DrainEventFd() {
  uint64_t count;
  // SAFETY: an 8-byte read from our own non-blocking eventfd; EAGAIN (nothing posted) is fine.
  ssize_t ignored = ::read(event_fd_.get(), &count, sizeof(count));
  (void)ignored;
}

void Die(const char* what) {
  std::fprintf(stderr, "nsbox reactor: %s\n", what);
  std::abort();
}

}  // namespace internal

std::string_view BackendName(Reactor::Backend backend) {
  switch (backend) {
    case Reactor::Backend::kIoUring:
      return "io_uring";
    case Reactor::Backend::kEpoll:
      return "epoll";
  }
  return "unknown";
}

Result<std::unique_ptr<Reactor>> CreateReactor(Reactor::Backend backend) {
  switch (backend) {
    case Reactor::Backend::kIoUring:
      return internal::CreateUringReactor();
    case Reactor::Backend::kEpoll:
      return internal::CreateEpollReactor();
  }
  return Error::Msg("unknown reactor backend");
}

Result<std::unique_ptr<Reactor>> CreateReactor() {
  const char* forced = std::getenv("NSBOX_REACTOR");
  if (forced != nullptr && forced[0] != '\0') {
    std::string_view name(forced);
    if (name == BackendName(Reactor::Backend::kIoUring)) {
      return CreateReactor(Reactor::Backend::kIoUring);
    }
    if (name == BackendName(Reactor::Backend::kEpoll)) {
      return CreateReactor(Reactor::Backend::kEpoll);
    }
    return Error::Msg("NSBOX_REACTOR=" + std::string(name) + ": expected io_uring or epoll");
  }
  auto uring = internal::CreateUringReactor();
  if (uring.ok()) return uring;
  // Not an error: hosts disable io_uring on purpose (kernel.io_uring_disabled, seccomp), and
  // epoll serves the same interface. Said once per reactor, at debug level, with the reason.
  log::debug("reactor: io_uring unavailable ({}); using epoll", uring.error().message());
  return internal::CreateEpollReactor();
}

}  // namespace nsbox::exec

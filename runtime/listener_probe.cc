#include "runtime/listener_probe.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/un.h>

#include <string_view>

#include "base/unique_fd.h"

namespace nsbox::runtime {

namespace {

using Clock = std::chrono::steady_clock;

// Milliseconds left until `deadline` (0 when it has passed), for poll(2).
int LeftMs(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Waits for `events` on `fd` until `deadline`; false when they did not come (or poll failed).
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    struct pollfd pfd {
      fd, events, 0
    };
    const int n = ::poll(&pfd, 1, LeftMs(deadline));
    if (n < 0 && errno == EINTR) continue;
    return n > 0;
  }
}

Result<ListenerFound> Probe(int family, const sockaddr* addr, socklen_t len,
                            const std::string& what, std::chrono::milliseconds wait) {
  const Clock::time_point deadline = Clock::now() + wait;
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Error::Sys("socket", what, errno);
  int err = 0;
  if (::connect(fd.get(), addr, len) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      // TCP: the handshake under way; its outcome is SO_ERROR once writable.
      if (!WaitFor(fd.get(), POLLOUT, deadline)) return ListenerFound::kSilent;
      socklen_t size = sizeof err;
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &size) != 0) {
        return Error::Sys("getsockopt(SO_ERROR)", what, errno);
      }
    }
  }
  switch (err) {
    case 0:
      break;
    case ECONNREFUSED:  // nobody listens (a dead daemon's socket file, a closed port)
    case ENOENT:        // the socket file went away meanwhile
      return ListenerFound::kNothing;
    case EAGAIN:  // a Unix listener whose backlog is full: it is there, and not accepting
      return ListenerFound::kSilent;
    default:
      return Error::Sys("connect", what, err);
  }
  static constexpr std::string_view kRequest =
      "GET /v1/health HTTP/1.1\r\nHost: nsboxd\r\nConnection: close\r\n\r\n";
  if (::send(fd.get(), kRequest.data(), kRequest.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(kRequest.size())) {
    return ListenerFound::kSilent;  // reset, or no room: not an answer either way
  }
  static constexpr std::string_view kAnswer = "HTTP/";
  char got[kAnswer.size()];
  size_t have = 0;
  while (have < kAnswer.size()) {
    if (!WaitFor(fd.get(), POLLIN, deadline)) return ListenerFound::kSilent;
    const ssize_t n = ::recv(fd.get(), got + have, kAnswer.size() - have, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    // Reset or closed unanswered: a listener that went away with the connection in its
    // backlog. The next probe finds whether anything is still there.
    if (n <= 0) return ListenerFound::kSilent;
    have += static_cast<size_t>(n);
  }
  return std::string_view(got, have) == kAnswer ? ListenerFound::kAnswers : ListenerFound::kSilent;
}

}  // namespace

Result<ListenerFound> ProbeUnixListener(const std::string& path, std::chrono::milliseconds wait) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return Error(ENAMETOOLONG, "the socket path " + path + " is longer than a Unix socket takes");
  }
  ::memcpy(addr.sun_path, path.data(), path.size());
  // SAFETY: sockaddr_un is a sockaddr for connect(2); the size passed is its own.
  return Probe(AF_UNIX, reinterpret_cast<const sockaddr*>(&addr), sizeof addr, path, wait);
}

Result<ListenerFound> ProbeTcpListener(const sockaddr* addr, socklen_t len,
                                       std::chrono::milliseconds wait) {
  if (addr->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    sockaddr_in in;
    ::memcpy(&in, addr, sizeof in);
    if (in.sin_addr.s_addr == htonl(INADDR_ANY)) in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // SAFETY: sockaddr_in is a sockaddr for connect(2); the size passed is its own.
    return Probe(AF_INET, reinterpret_cast<const sockaddr*>(&in), sizeof in, "a TCP port", wait);
  }
  if (addr->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    sockaddr_in6 in6;
    ::memcpy(&in6, addr, sizeof in6);
    if (IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr)) in6.sin6_addr = in6addr_loopback;
    // SAFETY: sockaddr_in6 is a sockaddr for connect(2); the size passed is its own.
    return Probe(AF_INET6, reinterpret_cast<const sockaddr*>(&in6), sizeof in6, "a TCP port", wait);
  }
  return Error(EAFNOSUPPORT, "a TCP port: not an IPv4 or IPv6 address");
}

}  // namespace nsbox::runtime

#include "runtime/netns.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace nsbox::runtime {

namespace {

// The daemon's own network namespace, opened once, before any thread has left it.
int OwnNetns() {
  static const int fd = [] {
    int f = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (f < 0) {
      std::fprintf(stderr, "nsboxd: open /proc/thread-self/ns/net: %s\n", std::strerror(errno));
      std::abort();
    }
    return f;
  }();
  return fd;
}

}  // namespace

Result<UniqueFd> SocketInNetns(int netns_fd, int domain, int type) {
  const int own = OwnNetns();
  if (::setns(netns_fd, CLONE_NEWNET) != 0) {
    return Error::Sys("setns", "the sandbox's network namespace", errno);
  }
  UniqueFd sock(::socket(domain, type | SOCK_CLOEXEC, 0));
  const int socket_errno = errno;
  if (::setns(own, CLONE_NEWNET) != 0) {
    std::fprintf(stderr, "nsboxd: setns back to the daemon's network namespace: %s\n",
                 std::strerror(errno));
    std::abort();
  }
  if (!sock.valid())
    return Error::Sys("socket", "in the sandbox's network namespace", socket_errno);
  return sock;
}

}  // namespace nsbox::runtime

// The whole daemon, in this process: runtime::Serve on a socket and state dir of a temp dir, with
// an nsbox-init path that does not exist (a sandbox that must start answers 503 at once, no jail
// is built). Each input is the bytes of one connection: request lines, headers, bodies of every
// endpoint (JSON of PUT, exec, fs/*; raw uploads; image tarballs), pipelined or cut short. The
// fuzzer's coverage follows the daemon's thread; ASan and UBSan watch its memory.

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "base/log.h"
#include "runtime/serve.h"

namespace {

std::string g_socket;

int Connect() {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", g_socket.c_str());
  // SAFETY: sockaddr_un is the address of an AF_UNIX socket.
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char tmpl[] = "/tmp/nsbox-fuzz-http-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) std::abort();
  const std::string dir = tmpl;
  static std::string remove_at_exit = dir;
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(remove_at_exit, ec);
  });
  g_socket = dir + "/nsboxd.sock";
  (void)nsbox::log::SetLevel(std::getenv("NSBOX_FUZZ_LOG") != nullptr ? "debug" : "off");
  nsbox::runtime::ServeOptions options;
  options.socket = g_socket;
  options.state_dir = dir + "/state";
  options.init_binary = dir + "/no-nsbox-init";  // never there: no jail starts
  std::thread([options] {
    int code = nsbox::runtime::Serve(options);
    std::fprintf(stderr, "fuzz_http: the daemon returned %d\n", code);
    std::abort();
  }).detach();
  for (int i = 0; i < 500; ++i) {
    int fd = Connect();
    if (fd >= 0) {
      close(fd);
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::fprintf(stderr, "fuzz_http: the daemon did not listen on %s\n", g_socket.c_str());
  std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  int fd = Connect();
  if (fd < 0) std::abort();  // the daemon died: the crash is already reported
  // Write what the daemon reads, read what it answers, until it closes or goes quiet.
  size_t sent = 0;
  bool write_shut = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  char buf[65536];
  while (std::chrono::steady_clock::now() < deadline) {
    if (sent == size && !write_shut) {
      shutdown(fd, SHUT_WR);
      write_shut = true;
    }
    pollfd p = {fd, static_cast<short>(POLLIN | (write_shut ? 0 : POLLOUT)), 0};
    if (poll(&p, 1, 1000) <= 0) break;
    if ((p.revents & POLLOUT) != 0 && !write_shut) {
      ssize_t n = send(fd, bytes + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        shutdown(fd, SHUT_WR);
        write_shut = true;
      } else {
        sent += static_cast<size_t>(n);
      }
    }
    if ((p.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) break;
    }
  }
  close(fd);
  return 0;
}

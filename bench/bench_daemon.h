#pragma once

// What the benchmarks that drive nsboxd share: a daemon of their own on a private socket and
// state directory, and calls that must succeed. Header-only: each benchmark is one binary.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/api_client.h"

namespace nsbox::bench {

inline const char* g_program = "nsbox-bench";

[[noreturn]] inline void Die(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", g_program, message.c_str());
  std::exit(1);
}

struct Daemon {
  pid_t pid = 0;
  std::string socket, log;

  // `extra` is appended to the command line (nsbox-net-bench: the network range and upstream).
  void Start(const std::string& nsbox, const std::string& dir, const std::string& log_level,
             const std::vector<std::string>& extra = {}) {
    socket = dir + "/nsboxd.sock";
    log = dir + "/nsboxd.stderr";
    std::string state = dir + "/state";
    pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      int null = open("/dev/null", O_RDONLY);
      dup2(null, 0);
      std::vector<std::string> args = {nsbox, "serve", "--socket", socket, "--state-dir", state};
      if (!log_level.empty()) args.insert(args.end(), {"--log-level", log_level});
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    runtime::ApiClient probe(runtime::ApiEndpoint::Unix(socket));
    for (int i = 0; i < 500; ++i) {
      auto r = probe.Call(runtime::Method::kGet, "/v1/health");
      if (r.ok() && r->ok()) return;
      int status;
      if (waitpid(pid, &status, WNOHANG) == pid) Die("the daemon exited; see " + log);
      usleep(10000);
    }
    Die("the daemon did not answer on " + socket);
  }

  // SIGTERM, wait; true when it exited with 0.
  bool Stop() {
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
};

inline runtime::ApiResponse Must(Result<runtime::ApiResponse> r, const char* what, int want = 0) {
  if (!r.ok()) Die(std::string(what) + ": " + r.error().message());
  if (!r->ok() || (want != 0 && r->status != want)) {
    Die(std::string(what) + ": HTTP " + std::to_string(r->status) + " " + r->body);
  }
  return std::move(*r);
}

// Until the daemon's pool (docs/daemon.md "The pool") holds every jail it keeps, and one adopted
// ahead for the next creation (a build without that has no such line): a first use timed then is
// one of a sandbox made at a human pace, not in a burst that empties the pool.
inline void WaitPoolFull(runtime::ApiClient& api, std::chrono::seconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  for (;;) {
    auto r = Must(api.Call(runtime::Method::kGet, "/metrics"), "metrics");
    long ready = -1, size = -2, ahead = -1;
    for (size_t at = 0; at < r.body.size();) {
      size_t end = r.body.find('\n', at);
      if (end == std::string::npos) end = r.body.size();
      std::string_view line(r.body.data() + at, end - at);
      if (line.starts_with("nsbox_pool_ready ")) ready = std::atol(line.data() + 17);
      if (line.starts_with("nsbox_pool_size ")) size = std::atol(line.data() + 16);
      if (line.starts_with("nsbox_pool_adopted_ahead ")) ahead = std::atol(line.data() + 25);
      at = end + 1;
    }
    if (ready == size && (ahead < 0 || ahead == (size > 0 ? 1 : 0))) return;
    if (std::chrono::steady_clock::now() > deadline) {
      Die("the daemon's pool did not fill within " + std::to_string(within.count()) + " s");
    }
    usleep(2000);
  }
}

}  // namespace nsbox::bench

#pragma once

// What the benchmarks that drive nsboxd share: a daemon of their own on a private socket and
// state directory, and calls that must succeed. Header-only: each benchmark is one binary.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
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

}  // namespace nsbox::bench

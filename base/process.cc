#include "base/process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "base/unique_fd.h"

extern char** environ;

namespace nsbox {

Result<ProgramRun> RunProgram(const std::vector<std::string>& argv,
                              const std::vector<std::string>* env, size_t keep) {
  if (argv.empty()) return Error(EINVAL, "no program to run");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Error::Sys("pipe2", argv[0], errno);
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  if (env != nullptr) {
    for (const auto& e : *env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDERR_FILENO);
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  pid_t pid = -1;
  const int err = ::posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(),
                                env != nullptr ? envp.data() : environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return Error::Sys("posix_spawn", argv[0], err);
  write_end.reset();
  ProgramRun run;
  char chunk[4096];
  for (;;) {
    // Read to the end, keeping what fits: a program that prints more never blocks on its pipe.
    const ssize_t got = ::read(read_end.get(), chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (run.output.size() < keep) {
      run.output.append(chunk, std::min(static_cast<size_t>(got), keep - run.output.size()));
    }
  }
  while (::waitpid(pid, &run.status, 0) < 0) {
    if (errno != EINTR) return Error::Sys("waitpid", argv[0], errno);
  }
  return run;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

}  // namespace nsbox

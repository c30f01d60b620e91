#pragma once

#include <string>
#include <vector>

namespace nsbox::exec {

// The files execve tries for a command, as execvp searches: `name` itself when it has a '/',
// else each directory of `path` (the command's own PATH, never nsbox's) joined with it, an empty
// entry meaning the current directory.
std::vector<std::string> CommandCandidates(const std::string& name, const std::string& path);

// The PATH in a "K=V" environment, or the default of execvp when there is none.
std::string PathOf(const std::vector<std::string>& env);

// What a shell says and exits with when a command cannot be executed: 127 and
// "nsbox: NAME: command not found" (or "...: No such file or directory" for a path), 126 and
// "nsbox: NAME: Permission denied" for a file that is not executable, 126 for anything else.
struct ExecFailure {
  int exit_code;
  std::string message;
};
ExecFailure DescribeExecFailure(const std::string& name, int err);

}  // namespace nsbox::exec

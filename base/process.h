#pragma once

// Running a helper program to its end and reading what it printed: mkfs.ext4 for a sandbox's
// disk (isolate/disk.cc), `nsbox-net --probe` for `nsbox doctor`.

#include <cstddef>
#include <string>
#include <vector>

#include "base/error.h"

namespace nsbox {

struct ProgramRun {
  int status = 0;      // as waitpid gives it
  std::string output;  // stdout and stderr together, their first `keep` bytes
};

// Runs argv[0] (a path) with `argv`, stdin from /dev/null, stdout and stderr into one pipe that
// is read to its end, and no other fd of this process: a daemon's sockets are not all
// close-on-exec (asio's), and a listener held by a slow helper would keep a restarted daemon
// from binding it. `env` is its whole environment; nullptr passes this process's.
Result<ProgramRun> RunProgram(const std::vector<std::string>& argv,
                              const std::vector<std::string>* env, size_t keep);

// "exit code 3" or "signal 9" for a waitpid status.
std::string DescribeExit(int status);

}  // namespace nsbox

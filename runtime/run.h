#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/jail_setup.h"

namespace nsbox::runtime {

// `nsbox run`: one command in a fresh jail, on its own, like bwrap.
struct RunOptions : JailOptions {
  bool dry_run = false;  // print the plan instead of running it
  // Leave the host's cgroup2 mount as it is (isolate::FavorMovesIntoV1 not called).
  bool leave_cgroup_mount = false;
};

// Runs it and returns the exit code for nsbox itself: the command's (128 + signal for a signal
// death), 125 when nsbox could not set up the jail or the input is bad, 126/127 when the command
// cannot be executed or found. Errors are printed to stderr.
int Run(const RunOptions& options);

}  // namespace nsbox::runtime

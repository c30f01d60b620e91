#pragma once

#include <optional>
#include <string>
#include <vector>

namespace nsbox::runtime {

// `nsbox run`: one command in a fresh jail, on its own, like bwrap.
struct RunOptions {
  std::string image = "host";
  std::string workspace;  // host directory bound at /workspace; default: the current directory
  std::string cwd;        // inside; relative to /workspace; default /workspace
  std::string hostname = "nsbox";
  std::vector<std::string> env;  // "K=V"
  std::optional<std::string> memory;
  std::optional<std::string> pids;
  std::optional<std::string> cpus;
  std::optional<std::string> uid_base;
  bool tty = false;
  bool dry_run = false;  // print the plan instead of running it
  std::vector<std::string> command;
};

// Runs it and returns the exit code for nsbox itself: the command's (128 + signal for a signal
// death), 125 when nsbox could not set up the jail or the input is bad, 126/127 when the command
// cannot be executed or found. Errors are printed to stderr.
int Run(const RunOptions& options);

}  // namespace nsbox::runtime

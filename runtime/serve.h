#pragma once

// `nsbox serve`: nsboxd, the daemon that maps sandbox ids to persistent workspaces and serves
// api.md on a Unix socket (and TCP with a bearer token).

#include <cstdint>
#include <string>

namespace nsbox::runtime {

struct ServeOptions {
  std::string socket;       // default: DefaultSocketPath()
  std::string state_dir;    // default: DefaultStateDir()
  std::string listen;       // "HOST:PORT" for the optional TCP listener
  std::string token_file;   // required with `listen`
  std::string init_binary;  // nsbox-init; default: beside the running executable
  // Exec sessions (docs/exec.md): each exec's output ring in memory, what spills to the
  // sandbox's state dir beyond it, and how long an ended exec stays for re-attach.
  uint64_t output_ring = 2u << 20;
  uint64_t output_spill = 64u << 20;
  uint64_t exec_retention_seconds = 600;
};

// Runs until SIGTERM or SIGINT; returns the process's exit code.
int Serve(const ServeOptions& options);

}  // namespace nsbox::runtime

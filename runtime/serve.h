#pragma once

// `nsbox serve`: nsboxd, the daemon that maps sandbox ids to persistent workspaces and serves
// api.md on a Unix socket (and TCP with a bearer token).

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/image_imports.h"

namespace nsbox::runtime {

// `nsbox serve`'s exit status when this host lacks a layer nsbox cannot run without (user
// namespaces, the namespace set, seccomp, pidfd: the required rows of `nsbox doctor`): EX_CONFIG
// of sysexits.h, which the packaged unit names in RestartPreventExitStatus= so that systemd does
// not restart a daemon that will fail the same way.
inline constexpr int kExitHostUnfit = 78;

struct ServeOptions {
  std::string socket;  // default: DefaultSocketPath()
  // The group the socket is given (root:GROUP, mode 0660): its members use the CLI without sudo.
  // "": root's group.
  std::string socket_group;
  std::string state_dir;   // default: DefaultStateDir()
  std::string listen;      // "HOST:PORT" for the optional TCP listener
  std::string token_file;  // required with `listen`
  // A TCP connection that has not sent a request with the token this long after it was accepted
  // is closed (docs/security.md).
  uint64_t auth_timeout_seconds = 30;
  std::string init_binary;  // nsbox-init; default: beside the running executable
  // Exec sessions (docs/exec.md): each exec's output ring in memory, what spills to the
  // sandbox's state dir beyond it, and how long an ended exec stays for re-attach.
  uint64_t output_ring = 2u << 20;
  uint64_t output_spill = 64u << 20;
  uint64_t exec_retention_seconds = 600;
  // Sandbox networking (docs/network.md): the address range of this daemon's sandboxes, the
  // resolver's upstreams (default: the host's /etc/resolv.conf), nsbox-net (default: beside the
  // running executable), and the log level it is started with.
  std::string network_range = "10.213.0.0/16";
  std::vector<std::string> dns_upstreams;
  std::string net_binary;
  std::string log_level = "info";
  // Jails of the host image started ahead for new and restarted sandboxes (docs/daemon.md "The
  // pool"); 0 for none.
  size_t pool_size = 1;
  // The idle stop of sandboxes created without `idleStopMs` (docs/daemon.md "Idle stop"), in ms;
  // 0: none.
  uint64_t idle_stop_ms = 0;
  // Image imports (docs/images.md "Limits"): what one may write, its layers, the free space it
  // leaves, and how many run at once.
  ImageImportOptions image_imports;
  // Leave the host's cgroup2 mount as it is: by default, on a host that moves jails and commands
  // into v1 cgroups, it is given favordynmods (isolate::FavorMovesIntoV1).
  bool leave_cgroup_mount = false;
};

// Runs until SIGTERM or SIGINT; returns the process's exit code.
int Serve(const ServeOptions& options);

}  // namespace nsbox::runtime

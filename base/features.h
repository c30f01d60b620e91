#pragma once

#include <string>
#include <vector>

namespace nsbox {

// What the running kernel offers, probed once (conventions.md: "The kernel's features are probed
// once"). Code that can fall back tries the new call and falls back on ENOSYS alone; this probe
// is for `nsbox doctor`, for the daemon's start-up log, and for tests that must skip loudly.
struct Features {
  // A feature and, when it is missing, why and how to get it.
  struct Item {
    bool available = false;
    std::string detail;  // e.g. "kernel.unprivileged_userns_clone = 0"; empty when all is well
  };

  Item user_namespaces;  // clone(CLONE_NEWUSER) works and user.max_user_namespaces > 0
  long max_user_namespaces = 0;
  Item mount_namespaces;  // with user namespaces: the full set nsbox asks for in one clone
  Item seccomp_filter;    // SECCOMP_SET_MODE_FILTER
  Item clone3;
  Item clone_into_cgroup;  // clone3 with CLONE_INTO_CGROUP (5.7)
  Item pidfd;              // pidfd_open + pidfd_send_signal + waitid(P_PIDFD) (5.4)
  Item openat2;            // with RESOLVE_IN_ROOT (5.6)
  Item mount_setattr;      // the new mount API's recursive read-only binds (5.12)
  Item overlayfs;          // listed in /proc/filesystems
  Item io_uring;           // io_uring_setup works (not disabled by sysctl or the host's seccomp)
  std::vector<std::string> io_uring_missing_ops;  // opcodes nsbox uses that the ring lacks
  Item cgroup_v2;  // a cgroup2 mount (the unified hierarchy of a hybrid host counts)
  std::vector<std::string> cgroup_v2_controllers;  // in cgroup.controllers of our own cgroup
  Item cgroup_kill;                                // cgroup.kill in cgroup v2 (5.14)
  std::vector<std::string> cgroup_v1_controllers;  // v1 hierarchies mounted (memory, pids, cpu)
};

// Probes the kernel once per process; later calls return the same answers.
const Features& ProbeFeatures();

}  // namespace nsbox

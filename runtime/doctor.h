#pragma once

// `nsbox doctor [--json]`: which isolation layers this host gives a sandbox, and for each one
// that is missing, what exactly is missing and how to get it.

#include <sys/types.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/features.h"
#include "isolate/cgroup.h"
#include "isolate/cgroup_placement.h"

namespace nsbox::runtime {

// One line of the report.
struct DoctorLayer {
  std::string key;     // the JSON key: "user_namespaces"
  std::string name;    // the human name: "user namespaces"
  std::string status;  // "ok", "degraded" (works, less well) or "missing"
  bool required = false;
  std::string detail;                                       // what is in use, or what is missing
  std::string fix;                                          // how to get it; empty when ok
  std::vector<std::pair<std::string, std::string>> fields;  // extra JSON strings ("hierarchy")
  std::vector<std::pair<std::string, std::vector<std::string>>> lists;  // ("missing_ops")
};

// Everything the report is made from, so that it can be built from made-up hosts in tests.
struct DoctorInput {
  Features features;
  // As the sandboxes would see it once placed: the placement's base, marked delegated.
  Result<isolate::CgroupLayout> layout = Error::Msg("not loaded");
  // Where nsboxd and `nsbox run` would put their sandboxes' cgroups (docs/cgroups.md
  // "Placement"), planned, not applied.
  Result<isolate::PlacementPlan> placement = Error::Msg("not probed");
  uid_t euid = 0;
  std::vector<std::string> missing_caps;  // of CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID
  std::string kernel;                     // uname -r, for the reader only
  // What `nsbox-net --probe` printed (lines "name: ok|missing (why)"), or why it could not run:
  // sandbox networking (docs/network.md), optional.
  Result<std::string> network_probe = Error::Msg("not probed");
  // The nsbox-net that was found (net::DefaultNetBinary(): beside this nsbox, or the build tree's
  // net/), "" when there is none; its fix differs from that of one whose probe failed.
  std::string network_binary;
  // isolate::DiskSupport(): whether a sandbox can have its own disk (limits.diskBytes).
  Status disks = Error::Msg("not probed");
};

// Runs `nsbox-net --probe` and returns what it printed.
Result<std::string> ProbeNetwork();

// This process's view of the host: ProbeFeatures(), LoadCgroupLayout(), euid and capabilities.
DoctorInput ProbeDoctorInput();
std::vector<DoctorLayer> DoctorLayers(const DoctorInput& input);
// True when every required layer is "ok".
bool DoctorOk(const std::vector<DoctorLayer>& layers);
std::string DoctorText(const DoctorInput& input, const std::vector<DoctorLayer>& layers);
std::string DoctorJson(const DoctorInput& input, const std::vector<DoctorLayer>& layers);
// `s` as a JSON string literal, quotes included.
std::string JsonString(std::string_view s);

// Prints the report for this host; returns the exit code: 0 when every required layer (user
// namespaces and the namespace set, seccomp, pidfd, root privileges) is present, 1 otherwise.
int RunDoctor(bool json, std::FILE* out);

}  // namespace nsbox::runtime

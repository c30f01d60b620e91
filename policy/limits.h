#pragma once

#include <sys/resource.h>

#include <span>

namespace nsbox::policy {

// The resource limits a command starts with. Root on this kind of host lacks CAP_SYS_RESOURCE,
// so the jail clamps each value to the hard limit the host gives it (perf-baselines.md 6).
struct RlimitRule {
  int resource;  // RLIMIT_*
  const char* name;
  rlim_t soft;
  rlim_t hard;
  const char* reason;
};

std::span<const RlimitRule> DefaultRlimits();

// Clamps a rule to what the host's hard limit allows (soft <= hard <= host_hard).
struct rlimit ClampRlimit(const RlimitRule& rule, const struct rlimit& host);

}  // namespace nsbox::policy

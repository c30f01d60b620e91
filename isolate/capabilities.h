#pragma once

// Applies a policy::CapabilitySet to the process about to execve a command: planned in the parent,
// applied in the child with a few raw syscalls.

#include <cstdint>

#include "base/error.h"
#include "policy/capabilities.h"

namespace nsbox::isolate {

// Plain values prepared in the parent, so that applying them allocates nothing.
class CapabilityPlan {
 public:
  uint64_t keep() const { return keep_; }
  // The highest capability number of the running kernel (/proc/sys/kernel/cap_last_cap).
  int last_cap() const { return last_cap_; }

 private:
  friend Result<CapabilityPlan> PlanCapabilities(const policy::CapabilitySet& set, int last_cap);
  friend Result<CapabilityPlan> PlanCapabilityMask(uint64_t keep, int last_cap);
  CapabilityPlan(uint64_t keep, int last_cap) : keep_(keep), last_cap_(last_cap) {}

  uint64_t keep_;
  int last_cap_;
};

// A plan for `set` on a kernel whose last capability is `last_cap`. An error if the set names a
// capability the kernel does not have.
Result<CapabilityPlan> PlanCapabilities(const policy::CapabilitySet& set, int last_cap);
// A plan from a mask (as the host sends it to nsbox-init); an error for a bit above last_cap.
Result<CapabilityPlan> PlanCapabilityMask(uint64_t keep, int last_cap);
// The same, with last_cap read from /proc/sys/kernel/cap_last_cap. Call it in the parent.
Result<CapabilityPlan> PlanCapabilities(const policy::CapabilitySet& set);

// Reduces the calling process to the plan: drops every other capability from the bounding set
// (PR_CAPBSET_DROP, which needs CAP_SETPCAP), clears the ambient set, empties the inheritable set
// and sets permitted and effective to the kept set (capset). Returns 0 or an errno.
// Async-signal-safe (no allocation, no logging): meant for the child between clone and execve,
// as uid 0 of its own user namespace with a full set. A uid-0 command then execs with
// permitted = effective = bounding = the kept set; a non-root one (after setresuid) with none.
int ApplyCapabilities(const CapabilityPlan& plan) noexcept;

}  // namespace nsbox::isolate

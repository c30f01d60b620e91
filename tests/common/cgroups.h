#pragma once

// For the test tiers' leak checks: cgroups that nsbox made and did not remove.

#include <chrono>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace nsbox::testutil {

// Paths of the directories whose names start with `prefix` in every hierarchy under
// /sys/fs/cgroup (a walk 6 levels deep, which covers the caller's own nested cgroups).
std::set<std::string> FindCgroupsNamed(std::string_view prefix);

// Removes every cgroup FindCgroupsNamed(prefix) finds, in every hierarchy, with the cgroups
// nested in them: their processes are killed (cgroup.kill where the kernel has it, SIGKILL to
// each pid of cgroup.procs otherwise) and the directories removed deepest first, retried for up
// to `patience` while the killed processes exit. What could not be removed, each with why.
std::vector<std::string> RemoveCgroupsNamed(std::string_view prefix,
                                            std::chrono::milliseconds patience);

}  // namespace nsbox::testutil

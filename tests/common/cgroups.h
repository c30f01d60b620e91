#pragma once

// For the test tiers' leak checks: cgroups that nsbox made and did not remove.

#include <set>
#include <string>
#include <string_view>

namespace nsbox::testutil {

// Paths of the directories whose names start with `prefix` in every hierarchy under
// /sys/fs/cgroup (a walk 6 levels deep, which covers the caller's own nested cgroups).
std::set<std::string> FindCgroupsNamed(std::string_view prefix);

}  // namespace nsbox::testutil

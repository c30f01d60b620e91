#include "tests/common/cgroups.h"

#include <dirent.h>

namespace nsbox::testutil {

namespace {

void Walk(const std::string& dir, int depth, std::string_view prefix,
          std::set<std::string>* found) {
  if (depth > 6) return;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (struct dirent* e = readdir(d)) {
    if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
    std::string child = dir + "/" + e->d_name;
    if (std::string_view(e->d_name).starts_with(prefix)) found->insert(child);
    Walk(child, depth + 1, prefix, found);
  }
  closedir(d);
}

}  // namespace

std::set<std::string> FindCgroupsNamed(std::string_view prefix) {
  std::set<std::string> found;
  Walk("/sys/fs/cgroup", 0, prefix, &found);
  return found;
}

}  // namespace nsbox::testutil

#include "tests/common/cgroups.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

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

namespace {

// `dir` and every cgroup below it, deepest first.
void PostOrder(const std::string& dir, std::vector<std::string>* out) {
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      if (e->d_type == DT_DIR && e->d_name[0] != '.') PostOrder(dir + "/" + e->d_name, out);
    }
    closedir(d);
  }
  out->push_back(dir);
}

void KillAllIn(const std::string& cgroup) {
  // cgroup v2 (Linux 5.14): every process of the cgroup and its descendants at once.
  if (std::ofstream kill_file(cgroup + "/cgroup.kill"); kill_file) {
    kill_file << "1";
    kill_file.flush();
    if (kill_file) return;
  }
  std::ifstream procs(cgroup + "/cgroup.procs");
  for (pid_t pid; procs >> pid;) ::kill(pid, SIGKILL);
}

}  // namespace

std::vector<std::string> RemoveCgroupsNamed(std::string_view prefix,
                                            std::chrono::milliseconds patience) {
  const std::set<std::string> found = FindCgroupsNamed(prefix);
  std::vector<std::string> order;
  for (const std::string& top : found) {
    // One nested in another found one is taken with it.
    const bool nested = std::any_of(found.begin(), found.end(), [&](const std::string& o) {
      return top.size() > o.size() && top.starts_with(o + "/");
    });
    if (!nested) PostOrder(top, &order);
  }
  const auto deadline = std::chrono::steady_clock::now() + patience;
  std::vector<std::string> left;
  for (;;) {
    left.clear();
    for (const std::string& cg : order) {
      if (::rmdir(cg.c_str()) == 0 || errno == ENOENT) continue;
      left.push_back(cg + ": " + strerror(errno));
      KillAllIn(cg);
    }
    if (left.empty() || std::chrono::steady_clock::now() >= deadline) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace nsbox::testutil

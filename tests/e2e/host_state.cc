// What the e2e tier looks at on the host: processes (/proc), cgroups, files, ports; split from
// daemon_harness.cc, which starts and stops the daemon.
#include "tests/common/cgroups.h"
#include "tests/e2e/daemon_harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

namespace nsbox::e2e {

namespace {

int RemoveEntry(const char* path, const struct stat*, int type, struct FTW*) {
  if (type == FTW_DP) {
    if (rmdir(path) != 0 && errno != ENOENT) {
      std::fprintf(stderr, "e2e harness: rmdir %s: %s\n", path, strerror(errno));
    }
  } else if (unlink(path) != 0 && errno != ENOENT) {
    std::fprintf(stderr, "e2e harness: unlink %s: %s\n", path, strerror(errno));
  }
  return 0;
}

}  // namespace

bool ParseStat(pid_t pid, pid_t* ppid, unsigned long long* start_time, char* state,
               std::string* comm) {
  std::string stat = ReadHostFile("/proc/" + std::to_string(pid) + "/stat");
  auto open = stat.find('(');
  auto close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return false;
  if (comm != nullptr) *comm = stat.substr(open + 1, close - open - 1);
  std::istringstream rest(stat.substr(close + 1));
  std::vector<std::string> fields;
  std::string f;
  while (rest >> f) fields.push_back(f);
  // After the comm: state is field 3 of proc(5), ppid 4, starttime 22.
  if (fields.size() < 20) return false;
  if (state != nullptr) *state = fields[0][0];
  if (ppid != nullptr) *ppid = static_cast<pid_t>(std::strtol(fields[1].c_str(), nullptr, 10));
  if (start_time != nullptr) *start_time = std::strtoull(fields[19].c_str(), nullptr, 10);
  return true;
}

std::vector<pid_t> AllPids() {
  std::vector<pid_t> pids;
  DIR* d = opendir("/proc");
  if (d == nullptr) return pids;
  while (struct dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0') pids.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  return pids;
}

std::optional<std::string> E2eUnavailable() {
  if (geteuid() != 0) return "the e2e tier runs the daemon as root; run the tests as root";
  if (access(kNsboxBin, X_OK) != 0) return std::string("no nsbox binary at ") + kNsboxBin;
  if (access(kNsboxInitBin, X_OK) != 0) {
    return std::string("no nsbox-init binary at ") + kNsboxInitBin;
  }
  return std::nullopt;
}

std::string ReadHostFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {
// A "Vm...:" line of /proc/<pid>/status, in KiB; -1 when it is not there.
long StatusKib(pid_t pid, std::string_view key) {
  std::istringstream in(ReadHostFile("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::strtol(line.c_str() + key.size(), nullptr, 10);
  }
  return -1;
}
}  // namespace

long RssKib(pid_t pid) { return StatusKib(pid, "VmRSS:"); }

long PeakRssKib(pid_t pid) { return StatusKib(pid, "VmHWM:"); }

void RemoveTree(const std::string& path) {
  if (path.empty() || path == "/") return;
  nftw(path.c_str(), RemoveEntry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

int RunProgram(const std::vector<std::string>& argv, const std::string& log_path,
               std::string* output) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || null < 0) ::_exit(126);
    ::dup2(null, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  *output = ReadHostFile(log_path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

uint16_t FreeTcpPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  uint16_t port = 0;
  // SAFETY: sockaddr_in is the sockaddr of an AF_INET socket; len is its size.
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

namespace {

// Whether `pid` is in cgroups of a daemon's pool (nsbox-*-pool-N).
bool InPoolCgroup(pid_t pid) {
  std::ifstream cgroup("/proc/" + std::to_string(pid) + "/cgroup");
  std::string line;
  bool pool = false;
  while (std::getline(cgroup, line)) {
    const size_t at = line.find("/nsbox-");
    pool = pool || (at != std::string::npos && line.find("-pool-", at) != std::string::npos);
  }
  return pool;
}

}  // namespace

bool IsJailAdoptedAhead(pid_t pid) {
  if (!InPoolCgroup(pid)) return false;
  std::ifstream hostname("/proc/" + std::to_string(pid) + "/root/etc/hostname");
  std::string name;
  return std::getline(hostname, name) && name == "nsbox-ahead";
}

bool IsPooledJail(pid_t pid) {
  if (!InPoolCgroup(pid)) return false;
  std::string line;
  std::ifstream mounts("/proc/" + std::to_string(pid) + "/mountinfo");
  if (!mounts) return false;
  while (std::getline(mounts, line)) {
    // "ID PARENT MAJ:MIN ROOT MOUNTPOINT ...": the fifth field.
    std::istringstream fields(line);
    std::string field;
    for (int i = 0; i < 5 && (fields >> field); ++i) {
    }
    if (field == "/workspace") return false;
  }
  return true;
}

std::vector<ProcessId> Descendants(pid_t root, bool include_pool) {
  std::multimap<pid_t, ProcessId> children;
  for (pid_t pid : AllPids()) {
    ProcessId p;
    p.pid = pid;
    pid_t ppid = 0;
    char state = 0;
    if (!ParseStat(pid, &ppid, &p.start_time, &state, &p.comm)) continue;
    if (state == 'Z' || state == 'X') continue;
    children.emplace(ppid, p);
  }
  std::vector<ProcessId> out;
  std::vector<pid_t> todo = {root};
  while (!todo.empty()) {
    pid_t parent = todo.back();
    todo.pop_back();
    auto [begin, end] = children.equal_range(parent);
    for (auto it = begin; it != end; ++it) {
      // Not only nsbox-init: a jail being made for the pool is the daemon's clone until it
      // executes nsbox-init, and already in its pool cgroup (CLONE_INTO_CGROUP).
      if (!include_pool && (IsPooledJail(it->second.pid) || IsJailAdoptedAhead(it->second.pid))) {
        continue;
      }
      out.push_back(it->second);
      todo.push_back(it->second.pid);
    }
  }
  return out;
}

bool StillAlive(const ProcessId& p) {
  unsigned long long start = 0;
  char state = 0;
  if (!ParseStat(p.pid, nullptr, &start, &state, nullptr)) return false;
  return start == p.start_time && state != 'Z' && state != 'X';
}

std::set<std::string> FindNsboxCgroups() { return testutil::FindCgroupsNamed("nsbox"); }

namespace {

// The "nsbox-<8 hex>-pool-<n>" component of a path (empty when there is none).
std::string PoolComponent(const std::string& path) {
  const size_t at = path.find("-pool-");
  if (at == std::string::npos) return "";
  const size_t begin = path.rfind('/', at) + 1;
  const size_t end = std::min(path.find('/', at), path.size());
  return path.substr(begin, end - begin);
}

// Its "nsbox-<8 hex>-" (which daemon) and its n.
std::pair<std::string, long> PoolNumber(const std::string& component) {
  const size_t at = component.rfind("pool-");
  return {component.substr(0, at), std::strtol(component.c_str() + at + 5, nullptr, 10)};
}

}  // namespace

std::vector<std::string> NewNsboxCgroups(const std::set<std::string>& before) {
  const std::set<std::string> all = FindNsboxCgroups();
  // The jails of a daemon's pool (docs/daemon.md "The pool"): a pool's cgroups whose processes
  // include a pooled jail (IsPooledJail), in any hierarchy; and the newest pool's of each daemon
  // while they hold no process at all (its jail is being made: the directories come first).
  std::map<std::string, bool> pooled;     // pool component -> holds a pooled jail
  std::map<std::string, bool> populated;  // pool component -> holds any process
  std::map<std::string, long> newest;     // "nsbox-<8 hex>-" -> highest n
  for (const std::string& path : all) {
    const std::string pool = PoolComponent(path);
    if (pool.empty()) continue;
    const auto [daemon, n] = PoolNumber(pool);
    newest[daemon] = std::max(newest[daemon], n);
    for (const char* procs : {"/cgroup.procs", "/init/cgroup.procs"}) {  // v2: init's leaf
      std::ifstream f(path + procs);
      pid_t pid;
      while (f >> pid) {
        populated[pool] = true;
        if (IsPooledJail(pid) || IsJailAdoptedAhead(pid)) pooled[pool] = true;
      }
    }
  }
  std::vector<std::string> out;
  for (const std::string& path : all) {
    if (before.count(path) != 0) continue;
    const std::string leaf = path.substr(path.rfind('/') + 1);
    // Someone else's `nsbox run` (the integration tier may run at the same time).
    if (leaf.starts_with("nsbox-run-")) {
      std::string pid = leaf.substr(10);
      if (access(("/proc/" + pid).c_str(), F_OK) == 0) continue;
    }
    if (const std::string pool = PoolComponent(path); !pool.empty()) {
      if (pooled[pool]) continue;
      const auto [daemon, n] = PoolNumber(pool);
      if (!populated[pool] && n == newest[daemon]) continue;
    }
    // A nested cgroup of one already reported is not a second finding.
    bool nested = false;
    for (const auto& o : out) nested = nested || path.starts_with(o + "/");
    if (!nested) out.push_back(path);
  }
  return out;
}

}  // namespace nsbox::e2e

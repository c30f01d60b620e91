// nsbox-density-floor: what the kernel charges for N idle sandboxes made of nsbox's parts and
// nothing else, side by side with bwrap, in one run. The floor under issue 4's "1,000 idle
// sandboxes, ≤ 0.5 MiB each" (docs/perf-notes.md "The kernel's floor for 1,000 idle sandboxes").
//
//   sudo build/bench/nsbox-density-floor [--sandboxes N] [--first N]
//        [--kinds bare,memcg,nsbox,bwrap] [--nsbox PATH]
//
// Kinds, each made, measured and removed in turn:
// - bare: a process cloned into new user, mount, PID, network, IPC, UTS and cgroup namespaces;
//   loopback up; a tmpfs root with /proc and a new /dev/pts instance (four superblocks with the
//   IPC namespace's mqueue, as a jail of nsbox has), pivot_root into it; no_new_privs and
//   nsbox-init's own seccomp filter; then it execs a static program that waits in pause().
// - memcg: the same, each in a memory cgroup of its own (v1 on a hybrid host, v2 otherwise),
//   which it enters before it mounts anything: what every nsbox sandbox has for its limits and
//   its commands' memory figures.
// - nsbox: sandboxes of `nsbox serve` (its defaults, on a socket and state directory of its own
//   under /var/tmp), each made by a PUT and started by an exec of /bin/true, as nsbox-api-bench's
//   idle figure; the daemon's own growth counts with its nsbox-inits' PSS.
// - bwrap: `bwrap --unshare-all --die-with-parent` with the host's /usr, /proc, /dev and a /tmp
//   tmpfs, running `sleep infinity` (the row of docs/benchmarks.md's
//   "Baselines measured before nsbox" for bwrap with the host's /usr).
//
// For each kind: after the first --first sandboxes and after all N, the kernel memory held
// (SUnreclaim, SReclaimable, KernelStack, PageTables, Percpu, Shmem, after dropping the
// reclaimable dentries and inodes) and the PSS of their processes, per sandbox; and what the
// sandboxes past the first cost each. Then what one empty memory cgroup costs on this host now
// (most of it the memcg's shrinker table, which grows with the most superblocks the host has
// held at once since boot). Kernel figures are the whole machine's: run nothing else meanwhile.

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_common.h"
#include "bench/bench_daemon.h"
#include "isolate/seccomp.h"
#include "policy/seccomp_profile.h"
#include "runtime/api_client.h"

namespace nsbox::bench {
namespace {

// The child's side of a bare or memcg sandbox: waits for its id maps (and its cgroup), builds its
// root and execs the pause program. Any failure exits with the step's number, which the parent
// reports.
struct ChildArgs {
  int go_fd;         // read end: one byte once the parent is done
  int pause_fd;      // O_PATH of nsbox-density-pause
  const char* root;  // an empty directory to mount the root tmpfs on
  const isolate::SeccompProgram* filter;
};

int ChildMain(void* arg) {
  const auto* a = static_cast<const ChildArgs*>(arg);
  // Gone with the bench, should it stop half-way (its pause program keeps this across execve).
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) _exit(9);
  char byte;
  if (read(a->go_fd, &byte, 1) != 1) _exit(10);
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) _exit(11);
  if (mount("tmpfs", a->root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755") < 0) _exit(12);
  if (chdir(a->root) < 0) _exit(13);
  for (const char* dir : {"proc", "dev", "dev/pts", "old"}) {
    if (mkdir(dir, 0755) < 0) _exit(14);
  }
  if (mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0) _exit(15);
  if (mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666") <
      0) {
    _exit(16);
  }
  if (syscall(SYS_pivot_root, ".", "old") < 0) _exit(17);
  if (umount2("/old", MNT_DETACH) < 0 || rmdir("/old") < 0) _exit(18);
  int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct ifreq ifr {};
  std::strcpy(ifr.ifr_name, "lo");
  ifr.ifr_flags = IFF_UP;
  if (sock < 0 || ioctl(sock, SIOCSIFFLAGS, &ifr) < 0) _exit(19);
  close(sock);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) _exit(20);
  if (isolate::LoadSeccomp(*a->filter) != 0) _exit(21);
  char name[] = "nsbox-density-pause";
  char* argv[] = {name, nullptr};
  char* envp[] = {nullptr};
  syscall(SYS_execveat, a->pause_fd, "", argv, envp, AT_EMPTY_PATH);
  _exit(22);
}

struct Held {
  pid_t pid = -1;
  std::string cgroup;  // the memcg kind's directory
};

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  if (!out) {
    std::fprintf(stderr, "write %s: %s\n", path.c_str(), std::strerror(errno));
    std::exit(1);
  }
}

// Makes one bare or memcg sandbox; exits on a failure (with the child's failed step).
Held MakeFloor(const ChildArgs& base, const std::string& memcg_dir) {
  int go[2];
  if (pipe2(go, O_CLOEXEC) < 0) std::exit(1);
  ChildArgs args = base;
  args.go_fd = go[0];
  static thread_local std::vector<char> stack(64 * 1024);
  const int flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC |
                    CLONE_NEWUTS | CLONE_NEWCGROUP | SIGCHLD;
  pid_t pid = clone(ChildMain, stack.data() + stack.size(), flags, &args);
  if (pid < 0) {
    std::fprintf(stderr, "clone: %s\n", std::strerror(errno));
    std::exit(1);
  }
  close(go[0]);
  Held held{pid, ""};
  const std::string proc = "/proc/" + std::to_string(pid);
  WriteFile(proc + "/uid_map", "0 0 1\n");
  WriteFile(proc + "/gid_map", "0 0 1\n");
  if (!memcg_dir.empty()) {
    if (mkdir(memcg_dir.c_str(), 0755) < 0) {
      std::fprintf(stderr, "mkdir %s: %s\n", memcg_dir.c_str(), std::strerror(errno));
      std::exit(1);
    }
    held.cgroup = memcg_dir;
    WriteFile(memcg_dir + "/cgroup.procs", std::to_string(pid) + "\n");
  }
  if (write(go[1], "g", 1) != 1) std::exit(1);
  close(go[1]);
  // Ready once it runs the pause program (its executable's inode), or failed.
  struct stat pause {};
  if (fstat(base.pause_fd, &pause) < 0) std::exit(1);
  for (int i = 0; i < 5000; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      std::fprintf(stderr, "a floor sandbox failed at step %d\n",
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      std::exit(1);
    }
    struct stat exe {};
    if (stat((proc + "/exe").c_str(), &exe) == 0 && exe.st_dev == pause.st_dev &&
        exe.st_ino == pause.st_ino) {
      return held;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::fprintf(stderr, "a floor sandbox did not start in 1 s\n");
  std::exit(1);
}

Held MakeBwrap() {
  std::vector<std::string> words = {"bwrap",     "--unshare-all", "--die-with-parent",
                                    "--ro-bind", "/usr",          "/usr",
                                    "--symlink", "usr/bin",       "/bin",
                                    "--symlink", "usr/lib",       "/lib",
                                    "--symlink", "usr/lib64",     "/lib64",
                                    "--proc",    "/proc",         "--dev",
                                    "/dev",      "--tmpfs",       "/tmp",
                                    "sleep",     "infinity"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  char* envp[] = {nullptr};
  pid_t pid = -1;
  if (int err = posix_spawnp(&pid, "bwrap", nullptr, nullptr, argv.data(), envp); err != 0) {
    std::fprintf(stderr, "spawn bwrap: %s\n", std::strerror(err));
    std::exit(1);
  }
  return Held{pid, ""};
}

// The pids of `pid` and all its descendants (through /proc/PID/task/*/children).
void Tree(pid_t pid, std::vector<pid_t>* out) {
  out->push_back(pid);
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream children(task.path() / "children");
    for (pid_t child; children >> child;) Tree(child, out);
  }
}

// How many processes each sandbox of `held` has, and their PSS in KiB, summed.
std::pair<size_t, long> Processes(const std::vector<Held>& held) {
  std::vector<pid_t> pids;
  for (const auto& h : held) Tree(h.pid, &pids);
  long pss = 0;
  for (pid_t p : pids) pss += PssKb(p);
  return {pids.size(), pss};
}

// The nsbox kind: a daemon of its own, whose sandboxes are made through its API.
struct NsboxKind {
  Daemon daemon;
  std::string dir;
  std::unique_ptr<runtime::ApiClient> api;

  void Start(const std::string& nsbox) {
    dir = "/var/tmp/nsbox-density-" + std::to_string(getpid()) + "-nsbox";
    std::filesystem::create_directories(dir);
    daemon.Start(nsbox, dir, "warn");
    api = std::make_unique<runtime::ApiClient>(runtime::ApiEndpoint::Unix(daemon.socket));
    // Its pooled jail, made ahead at its start, is the daemon's and not a sandbox's.
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
  void Make(size_t i) {
    const std::string id = "density-" + std::to_string(i);
    Must(api->Call(runtime::Method::kPut, runtime::SandboxTarget(id)), "PUT", 201);
    boost::json::object body{{"command", "/bin/true"}};
    Must(api->Call(runtime::Method::kPost, runtime::SandboxTarget(id, "/exec"), body), "exec");
  }
  void Stop() {
    if (!daemon.Stop()) {
      std::fprintf(stderr, "the daemon did not exit cleanly; see %s\n", daemon.log.c_str());
    }
    std::filesystem::remove_all(dir);
  }
};

struct Point {
  size_t n = 0;
  double kernel_kb = 0;  // held, per sandbox, since before the first
  double pss_kb = 0;     // per sandbox
  size_t processes = 0;
};

// The `count` caches that grew most between `before` and `after`, per sandbox of `n`.
std::string TopGrowth(const std::map<std::string, double>& before,
                      const std::map<std::string, double>& after, size_t n, size_t count) {
  std::vector<std::pair<double, std::string>> grown;
  for (const auto& [name, kb] : after) {
    auto was = before.find(name);
    grown.emplace_back((kb - (was == before.end() ? 0 : was->second)) / static_cast<double>(n),
                       name);
  }
  std::sort(grown.rbegin(), grown.rend());
  std::string out;
  char buf[96];
  for (size_t i = 0; i < grown.size() && i < count; ++i) {
    std::snprintf(buf, sizeof buf, "%s%s %.1f", i == 0 ? "" : ", ", grown[i].second.c_str(),
                  grown[i].first);
    out += buf;
  }
  return out;
}

// `n` sandboxes, whose processes are `held`'s trees less `pss_before` KiB of them.
Point Measure(const std::vector<Held>& held, size_t n, long kernel_before, long pss_before) {
  // Idle means idle: bwrap's children finish their set-up after their parent answers, and an
  // nsbox-init gives back what only a busy sandbox needs 2-4 s after its last command.
  std::this_thread::sleep_for(std::chrono::seconds(5));
  DropReclaimableCaches();
  Point p;
  p.n = n;
  p.kernel_kb = static_cast<double>(KernelKb() - kernel_before) / static_cast<double>(n);
  auto [count, pss] = Processes(held);
  p.processes = count;
  p.pss_kb = static_cast<double>(pss - pss_before) / static_cast<double>(n);
  return p;
}

// Waits until the kernel has freed what the last kind left: a network namespace, a memory cgroup
// and a mount are freed by work items and RCU callbacks after their last process is gone, seconds
// later for a thousand. Returns the kernel memory held once it has stopped falling (less than
// 256 KiB in a second, twice in a row; 120 s at most).
long SettledKernelKb() {
  long last = -1;
  int calm = 0;
  for (int i = 0; i < 120 && calm < 2; ++i) {
    DropReclaimableCaches();
    long now = KernelKb();
    calm = last >= 0 && std::labs(now - last) < 256 ? calm + 1 : 0;
    last = now;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return last;
}

void Remove(std::vector<Held>* held) {
  for (const auto& h : *held) kill(h.pid, SIGKILL);
  for (const auto& h : *held) waitpid(h.pid, nullptr, 0);
  for (const auto& h : *held) {
    // A removed cgroup's last references go with an RCU grace period after its tasks are gone.
    for (int i = 0; !h.cgroup.empty() && rmdir(h.cgroup.c_str()) < 0 && i < 100; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  held->clear();
}

}  // namespace
}  // namespace nsbox::bench

int main(int argc, char** argv) {
  using namespace nsbox;
  using namespace nsbox::bench;
  g_program = "nsbox-density-floor";
  size_t total = 1000, first = 200;
  std::string kinds_arg = "bare,memcg,nsbox,bwrap";
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  std::string nsbox = (self / "../runtime/nsbox").lexically_normal().string();
  CLI::App app{
      "What the kernel charges for N idle sandboxes of nsbox's parts, nsbox's and bwrap's"};
  app.add_option("--sandboxes", total, "sandboxes held at the end (default 1000)")
      ->check(CLI::Range(1, 5000));
  app.add_option("--first", first, "also measured after this many (default 200)")
      ->check(CLI::Range(1, 5000));
  app.add_option("--kinds", kinds_arg, "bare, memcg, nsbox, bwrap, comma-separated");
  bool slabs = false;
  app.add_flag("--slabs", slabs, "also print the slab caches that grew most, per sandbox at N");
  app.add_option("--nsbox", nsbox, "the nsbox binary of the nsbox kind (default: this build's)");
  CLI11_PARSE(app, argc, argv);
  first = std::min(first, total);
  if (geteuid() != 0) Die("run as root: the kernel figures need drop_caches");

  auto filter = isolate::CompileSeccomp(policy::InitSeccompProfile());
  if (!filter.ok()) Die(filter.error().message());
  const std::string pause_path = self / "nsbox-density-pause";
  const int pause_fd = open(pause_path.c_str(), O_PATH | O_CLOEXEC);
  if (pause_fd < 0) Die("open " + pause_path + ": " + std::strerror(errno));
  char root_template[] = "/var/tmp/nsbox-density-XXXXXX";
  if (mkdtemp(root_template) == nullptr) Die(std::string("mkdtemp: ") + std::strerror(errno));
  const ChildArgs base{-1, pause_fd, root_template, &*filter};
  const std::string memcg_root = MemoryCgroupRoot();

  std::printf("nsbox-density-floor: %zu sandboxes of each kind, measured at %zu and %zu\n\n", total,
              first, total);
  std::printf(
      "| kind | processes each | at %zu: kernel + PSS = KiB each | at %zu | each past the first "
      "%zu |\n",
      first, total, first);
  std::printf("|---|---|---|---|---|\n");
  std::string slab_lines;
  std::stringstream kinds(kinds_arg);
  for (std::string kind; std::getline(kinds, kind, ',');) {
    if (kind != "bare" && kind != "memcg" && kind != "nsbox" && kind != "bwrap") {
      Die("unknown kind " + kind + " (--kinds bare,memcg,nsbox,bwrap)");
    }
    if (kind == "memcg" && memcg_root.empty()) {
      std::printf("| memcg | no memory controller to make cgroups in | | | |\n");
      continue;
    }
    std::vector<Held> held;
    NsboxKind daemon;
    if (kind == "nsbox") {
      daemon.Start(nsbox);
      held.push_back(Held{daemon.daemon.pid, ""});
    }
    const long before = SettledKernelKb();
    const auto slabs_before = SlabCachesKb();
    auto mem_before = MemInfo();
    const long pss_before = kind == "nsbox" ? Processes(held).second : 0;
    size_t made = 0;
    auto make = [&](size_t upto) {
      for (; made < upto; ++made) {
        if (kind == "nsbox") {
          daemon.Make(made);
        } else if (kind == "bwrap") {
          held.push_back(MakeBwrap());
        } else {
          std::string dir;
          if (kind == "memcg") {
            dir = memcg_root + "/nsbox-density-" + std::to_string(getpid()) + "-" +
                  std::to_string(made);
          }
          held.push_back(MakeFloor(base, dir));
        }
      }
    };
    make(first);
    Point a = Measure(held, made, before, pss_before);
    make(total);
    Point b = Measure(held, made, before, pss_before);
    const auto slabs_after = SlabCachesKb();
    auto mem_after = MemInfo();
    const double past = b.n > a.n ? ((b.kernel_kb + b.pss_kb) * static_cast<double>(b.n) -
                                     (a.kernel_kb + a.pss_kb) * static_cast<double>(a.n)) /
                                        static_cast<double>(b.n - a.n)
                                  : 0;
    // The nsbox kind's daemon is a process of the tree, not of a sandbox.
    const double processes =
        static_cast<double>(b.processes - (kind == "nsbox" ? 1 : 0)) / static_cast<double>(b.n);
    std::printf("| %s | %.1f | %.1f + %.1f = **%.1f** | %.1f + %.1f = **%.1f** | %.1f |\n",
                kind.c_str(), processes, a.kernel_kb, a.pss_kb, a.kernel_kb + a.pss_kb, b.kernel_kb,
                b.pss_kb, b.kernel_kb + b.pss_kb, past);
    if (slabs) {
      char parts[256];
      auto per = [&](const char* field) {
        return static_cast<double>(mem_after[field] - mem_before[field]) /
               static_cast<double>(made);
      };
      std::snprintf(parts, sizeof parts,
                    "SUnreclaim %.1f, SReclaimable %.1f, PageTables %.1f, KernelStack %.1f, "
                    "Percpu %.1f, Shmem %.1f; ",
                    per("SUnreclaim"), per("SReclaimable"), per("PageTables"), per("KernelStack"),
                    per("Percpu"), per("Shmem"));
      slab_lines +=
          "- " + kind + ": " + parts + TopGrowth(slabs_before, slabs_after, made, 40) + "\n";
    }
    std::fflush(stdout);
    if (kind == "nsbox") {
      daemon.Stop();
    } else {
      Remove(&held);
    }
  }
  if (slabs)
    std::printf("\nslab caches grown most, KiB per sandbox at %zu:\n%s", total, slab_lines.c_str());
  const double memcg = MemoryCgroupKb();
  if (memcg >= 0) std::printf("\none empty memory cgroup on this host now: %.1f KiB\n", memcg);
  rmdir(root_template);
  return 0;
}

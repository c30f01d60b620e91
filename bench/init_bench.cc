// nsbox-bench: nsbox-init's figures, side by side with the kernel floor in one run (medians).
//
//   sudo build/bench/nsbox-bench [--sandboxes N] [--runs N]
//
// - exec of /bin/true through the control channel (argv, no shell), as the command `/bin/true`
//   (run without bash, exec/direct.h) and as `'/bin/true'` (through `bash -c`), against a bare
//   vfork + execve + waitpid of /bin/true on the host;
// - a 4 KiB readFile round trip;
// - both again with the channel read by the caller's own loop, as nsboxd reads it
//   (fs::InitClient::CallerReads), instead of the client's reader thread;
// - stdout capture of 1 GiB written in 64 KiB chunks;
// - idle nsbox-init memory: PSS plus kernel memory per sandbox with N sandboxes idle.

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_common.h"
#include "isolate/idmap.h"
#include "runtime/sandbox.h"

namespace {

using nsbox::bench::Clock;
using nsbox::bench::KernelGrowth;
using nsbox::bench::Micros;
using nsbox::bench::PssKb;
using nsbox::bench::Stats;
using nsbox::bench::Summarize;
using nsbox::bench::VforkExecTrue;
using nsbox::fs::proto::ExecRequest;

void Print(const char* what, const Stats& s, const char* unit = "us") {
  std::printf("| %s | %.1f | %.1f | %.1f | %s |\n", what, s.median, s.p10, s.p90, unit);
}

// Outside the workspace (which every sandbox sees): the shared /etc, as nsboxd lays it out
// (docs/daemon.md "State on disk").
std::string StateDir() { return "/var/tmp/nsbox-bench-" + std::to_string(getpid()) + "-state"; }

// `watch_channel`: see SandboxOptions (empty: the client reads on a thread of its own).
std::unique_ptr<nsbox::runtime::Sandbox> Start(
    const std::string& workspace, const std::string& name,
    std::function<void(std::shared_ptr<nsbox::fs::InitClient>)> watch_channel = {}) {
  nsbox::runtime::SandboxOptions o;
  o.jail.workspace = workspace;
  o.jail.shared_etc_dir = StateDir() + "/host-etc";
  o.jail.warn_unwritable_workspace = false;
  o.cgroup_name = name;
  o.watch_channel = std::move(watch_channel);
  auto box = nsbox::runtime::Sandbox::Start(o);
  if (!box.ok()) {
    std::fprintf(stderr, "nsbox-bench: %s\n", box.error().message().c_str());
    std::exit(1);
  }
  return std::move(*box);
}

// Reads the channel of a CallerReads client on the calling thread until `done`, as nsboxd's
// loop does: the answer is taken where it was asked for, with no reader thread between.
void PumpUntil(nsbox::fs::InitClient& client, const bool& done) {
  while (!done) {
    pollfd p{client.fd(), POLLIN, 0};
    if (::poll(&p, 1, 1000) < 0 && errno != EINTR) std::exit(1);
    if (!client.ReadReady()) {
      std::fprintf(stderr, "nsbox-bench: the channel closed\n");
      std::exit(1);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int sandboxes = 200;
  int runs = 500;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--sandboxes") == 0) sandboxes = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--runs") == 0) runs = std::atoi(argv[i + 1]);
  }
  auto ids = nsbox::isolate::DefaultIdMapping();
  if (!ids.ok()) return 1;
  std::string workspace = "/var/tmp/nsbox-bench-" + std::to_string(getpid());
  std::filesystem::create_directories(workspace);
  chown(workspace.c_str(), ids->uid.outside, ids->gid.outside);
  std::filesystem::create_directories(StateDir());

  auto box = Start(workspace, "nsbox-bench-" + std::to_string(getpid()));
  auto& client = box->client();
  std::printf("nsbox-bench: %d runs each; machine: %ld CPUs\n\n", runs,
              sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("| operation | median | p10 | p90 | unit |\n|---|---|---|---|---|\n");

  // 1. exec /bin/true, interleaved with the bare vfork + execve of the same binary.
  ExecRequest direct;
  direct.argv = {"/bin/true"};
  direct.cwd = "/workspace";
  direct.env = {"PATH=/usr/bin:/bin"};
  // The API's form: a command. A plain one runs without bash (exec/direct.h); quoted, the same
  // program goes through `bash -c`.
  ExecRequest plain = direct;
  plain.argv.clear();
  plain.command = "/bin/true";
  ExecRequest shell = plain;
  shell.command = "'/bin/true'";
  std::vector<double> t_direct, t_plain, t_shell, t_vfork;
  for (int i = 0; i < runs; ++i) {
    auto t0 = Clock::now();
    auto r = client.Exec(direct);
    t_direct.push_back(Micros(Clock::now() - t0));
    if (!r.ok() || r.value().exit_code != 0) {
      std::fprintf(stderr, "exec failed\n");
      return 1;
    }
    t_vfork.push_back(VforkExecTrue());
    t0 = Clock::now();
    (void)client.Exec(plain);
    t_plain.push_back(Micros(Clock::now() - t0));
    t0 = Clock::now();
    (void)client.Exec(shell);
    t_shell.push_back(Micros(Clock::now() - t0));
  }
  auto s_direct = Summarize(t_direct);
  auto s_vfork = Summarize(t_vfork);
  Print("exec `/bin/true` through nsbox-init (argv)", s_direct);
  Print("exec of the command `/bin/true` (plain: no bash)", Summarize(t_plain));
  Print("exec of the command `'/bin/true'` (quoted: bash -c)", Summarize(t_shell));
  Print("bare vfork + execve + waitpid of /bin/true on the host", s_vfork);

  // The channel alone: a ping round trip (the floor under every verb).
  std::vector<double> t_ping;
  for (int i = 0; i < runs * 4; ++i) {
    auto t0 = Clock::now();
    (void)client.Ping();
    t_ping.push_back(Micros(Clock::now() - t0));
  }
  Print("ping round trip (the control channel alone)", Summarize(t_ping));

  // 2. 4 KiB readFile.
  if (!client.WriteFile("/workspace/4k", std::string(4096, 'x')).ok()) return 1;
  std::vector<double> t_read;
  for (int i = 0; i < runs * 4; ++i) {
    auto t0 = Clock::now();
    auto r = client.ReadFile("/workspace/4k");
    t_read.push_back(Micros(Clock::now() - t0));
    if (!r.ok() || r.value().size() != 4096) return 1;
  }
  Print("readFile of 4 KiB", Summarize(t_read));

  // 2b. The same two, with the channel read by the caller's own loop (fs::InitClient::CallerReads,
  // as nsboxd reads every sandbox's): no reader thread hands the answer on. A second sandbox; a
  // thread reads its channel only while it starts (its handshake waits for a reader).
  {
    std::shared_ptr<nsbox::fs::InitClient> loop_client;
    std::atomic<bool> started{false};
    std::thread starter_reader;
    auto loop_box = Start(workspace, "nsbox-bench-loop-" + std::to_string(getpid()),
                          [&](std::shared_ptr<nsbox::fs::InitClient> c) {
                            loop_client = c;
                            starter_reader = std::thread([c, &started] {
                              while (!started) {
                                pollfd p{c->fd(), POLLIN, 0};
                                if (::poll(&p, 1, 10) > 0 && !c->ReadReady()) return;
                              }
                            });
                          });
    started = true;
    starter_reader.join();
    auto& lc = *loop_client;
    std::vector<double> t_loop_exec, t_loop_vfork, t_loop_read;
    for (int i = 0; i < runs; ++i) {
      bool done = false;
      bool ok = false;
      auto t0 = Clock::now();
      lc.StartExec(direct, {}, [&](nsbox::fs::FsOutcome<nsbox::fs::proto::ExecExit> r) {
        ok = r.ok() && r.value().exit_code == 0;
        done = true;
      });
      PumpUntil(lc, done);
      t_loop_exec.push_back(Micros(Clock::now() - t0));
      if (!ok) {
        std::fprintf(stderr, "exec failed\n");
        return 1;
      }
      t_loop_vfork.push_back(VforkExecTrue());
    }
    for (int i = 0; i < runs * 4; ++i) {
      bool done = false;
      bool ok = false;
      auto t0 = Clock::now();
      lc.StartOpenRead("/workspace/4k",
                       [&](nsbox::fs::FsOutcome<nsbox::fs::InitClient::OpenedRead> r) {
                         ok = r.ok() && !r.value().fd.valid() && r.value().data.size() == 4096;
                         done = true;
                       });
      PumpUntil(lc, done);
      t_loop_read.push_back(Micros(Clock::now() - t0));
      if (!ok) return 1;
    }
    const Stats s_loop_exec = Summarize(t_loop_exec);
    const Stats s_loop_vfork = Summarize(t_loop_vfork);
    Print("exec `/bin/true` (argv), the channel read by the caller's loop (as nsboxd reads it)",
          s_loop_exec);
    Print("bare vfork + execve + waitpid of /bin/true, same loop", s_loop_vfork);
    Print("readFile of 4 KiB, the channel read by the caller's loop", Summarize(t_loop_read));
    std::printf("| exec overhead over vfork+execve, the caller's loop reading | %.1f | | | us |\n",
                s_loop_exec.median - s_loop_vfork.median);
  }

  // 3. Capture: 1 GiB written in 64 KiB chunks.
  std::vector<double> gbps;
  for (int i = 0; i < 5; ++i) {
    ExecRequest dd;
    dd.argv = {"dd", "if=/dev/zero", "bs=64k", "count=16384", "status=none"};
    dd.cwd = "/workspace";
    dd.env = {"PATH=/usr/bin:/bin"};
    dd.output_limit = 2ull << 30;
    uint64_t bytes = 0;
    nsbox::fs::InitClient::ExecCallbacks cb;
    cb.on_output = [&bytes](int stream, std::string_view data) {
      if (stream == 1) bytes += data.size();
    };
    auto t0 = Clock::now();
    auto r = client.Exec(dd, cb);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!r.ok() || bytes != (1ull << 30)) {
      std::fprintf(stderr, "capture: %llu bytes\n", static_cast<unsigned long long>(bytes));
      return 1;
    }
    gbps.push_back(static_cast<double>(bytes) / secs / 1e9);
  }
  Print("stdout capture, 1 GiB in 64 KiB writes (5 runs)", Summarize(gbps), "GB/s");
  box.reset();

  // 4. Idle memory (--sandboxes 0: skipped).
  KernelGrowth kernel;
  kernel.Start();
  std::vector<std::unique_ptr<nsbox::runtime::Sandbox>> boxes;
  for (int i = 0; i < sandboxes; ++i) {
    boxes.push_back(
        Start(workspace, "nsbox-bench-" + std::to_string(getpid()) + "-" + std::to_string(i)));
  }
  if (sandboxes > 0) sleep(2);
  long pss = 0;
  for (auto& b : boxes) pss += PssKb(b->init_pid());
  kernel.Stop(sandboxes);
  const double per_pss = static_cast<double>(pss) / std::max(sandboxes, 1);
  if (sandboxes > 0) {
    std::printf(
        "| idle nsbox-init, %d sandboxes: PSS %.1f KiB + kernel held %.1f KiB%s | %.1f | | | KiB "
        "per sandbox |\n",
        sandboxes, per_pss, kernel.held(),
        kernel.dropped() ? "" : " (reclaimable caches not dropped: not root)",
        per_pss + kernel.held());
    std::printf(
        "| the same with the dentry and inode caches their making left: kernel %.1f KiB | %.1f | | "
        "| KiB per sandbox |\n",
        kernel.grown(), per_pss + kernel.grown());
    if (const double memcg = nsbox::bench::MemoryCgroupKb(); memcg >= 0) {
      std::printf(
          "| of which one empty memory cgroup, made beside them (each sandbox holds one; its size "
          "grows with the superblocks this host has held at once since boot) | %.1f | | | KiB |\n",
          memcg);
    }
  }
  std::printf("\nexec overhead over the bare vfork+execve (medians): %.1f us\n",
              s_direct.median - s_vfork.median);
  boxes.clear();
  std::filesystem::remove_all(workspace);
  std::filesystem::remove_all(StateDir());
  return 0;
}

#pragma once

// nsbox-init's server: PID 1 of a sandbox, inside every namespace, serving the control channel
// with one event loop (exec/reactor.h). Commands run through exec::Runner; the file verbs run on
// a few worker threads (they block on the file system, the loop never does) and post their
// answers back to the loop, which is the only thread that writes to the channel.

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "base/worker_pool.h"
#include "exec/reactor.h"
#include "exec/runner.h"
#include "fs/file_ops.h"
#include "fs/protocol.h"
#include "isolate/capabilities.h"
#include "isolate/seccomp.h"

namespace nsbox::runtime {

class InitServer {
 public:
  // `control`: the channel (nsbox-init's fd 3); `cgroup_dir`: the jail's delegated cgroup v2
  // directory (fd 4) or -1; `root`: an O_DIRECTORY fd of "/", from which every file verb
  // resolves; `v1_cgroups`: the delegated v1 memory and pids directories (fds 5 and 6).
  InitServer(exec::Reactor& reactor, UniqueFd control, int cgroup_dir, UniqueFd root,
             fs::proto::Hello hello, fs::proto::FrameReader frames,
             exec::RunnerV1Cgroups v1_cgroups = {}, exec::PremadeCgroups premade = {});
  ~InitServer();
  InitServer(const InitServer&) = delete;
  InitServer& operator=(const InitServer&) = delete;

  // Serves until the channel closes; then ends every process of the sandbox.
  Status Run();

 private:
  void ReadControl();
  void OnFrame(fs::proto::FrameReader::Frame frame);
  void HandleExec(uint64_t tag, std::string_view payload);
  void HandleExecInput(uint64_t tag, std::string_view payload);
  void HandleExecResize(uint64_t tag, std::string_view payload);
  // Answers an exec whose command could not be started as one that ran and failed.
  void EndUnstarted(uint64_t tag, const Error& error);
  // Tags of execs whose end was reported: input for them is EPIPE, not ESRCH (bounded FIFO).
  void RememberEnded(uint64_t tag);
  void ForgetEnded(uint64_t tag);
  void HandleFileVerb(const fs::proto::FrameReader::Frame& frame);
  void ReapOrphans();

  // Queues a frame (and an fd to pass beside it) and writes what the socket takes now.
  void Send(fs::proto::Type type, uint64_t tag, std::string_view payload, UniqueFd fd = {});
  void SendError(uint64_t tag, const fs::FsError& error);
  void SendProtocolError(uint64_t tag, int err, std::string message);
  void Flush();

  exec::Reactor& reactor_;
  UniqueFd control_;
  int cgroup_dir_;
  exec::RunnerV1Cgroups v1_cgroups_;
  exec::PremadeCgroups premade_;  // the first command's cgroups, made while pooled
  UniqueFd root_;
  fs::proto::Hello hello_;
  // The commands' seccomp filter, capabilities and rlimits, applied by ChildHooks.
  struct ChildSecurity;
  std::unique_ptr<ChildSecurity> security_;
  std::unique_ptr<exec::Runner> runner_;
  // The file verbs block on the file system; they run here so that one slow or large
  // operation never stalls the loop or the other verbs.
  std::unique_ptr<WorkerPool> workers_;

  fs::proto::FrameReader frames_;
  // Not zero-filled: an idle sandbox touches only the pages its requests filled (density).
  std::unique_ptr<char[]> read_buf_;
  bool closed_ = false;

  struct Outgoing {
    std::string bytes;
    UniqueFd fd;
    size_t sent = 0;
  };
  std::deque<Outgoing> out_;
  bool waiting_writable_ = false;
  // Backpressure: over kOutHigh bytes waiting to go to the host (which reads slower than the
  // commands write, or has stopped reading for a while), the runner stops reading the commands'
  // pipes until they are under kOutLow again. nsbox-init's memory stays bounded, and a command
  // that writes more blocks on its pipe. Other frames (answers) are queued as ever.
  static constexpr size_t kOutHigh = 4u << 20;
  static constexpr size_t kOutLow = 1u << 20;
  size_t out_bytes_ = 0;
  bool output_paused_ = false;
  void Queue(Outgoing o);

  std::map<uint64_t, uint64_t> execs_;  // tag -> runner id
  std::set<pid_t> command_pids_;        // main processes of running commands (not orphans)
  static constexpr size_t kRememberedEnded = 1024;
  std::set<uint64_t> ended_;
  std::deque<uint64_t> ended_order_;
  std::vector<uint64_t> stop_all_tags_;
  std::map<uint64_t, fs::PendingWrite> writes_;  // tag -> an open writeFile
  UniqueFd sigchld_;
  char sigchld_buf_[128 * 8];
};

// The whole of nsbox-init: argv "--control-fd N [--cgroup-fd N] [--memory-cgroup-fd N]
// [--pids-cgroup-fd N] [--reactor epoll|io_uring]".
int InitMain(int argc, char** argv);

}  // namespace nsbox::runtime

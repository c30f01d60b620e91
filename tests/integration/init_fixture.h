#pragma once

// The shared fixture of nsbox-init's integration tests (init*_test.cc): every TEST gets a fresh
// runtime::Sandbox (a real jail whose PID 1 is nsbox-init) over a fresh TempWorkspace, and the
// helpers drive it through fs::InitClient exactly as nsboxd will.

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "base/files.h"
#include "exec/runner.h"
#include "exec/spawn.h"
#include "fs/client.h"
#include "fs/protocol.h"
#include "harness.h"
#include "runtime/sandbox.h"

namespace nsbox::itest {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

inline constexpr const char* kJailPath =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

inline uint8_t Reason(exec::EndReason r) { return static_cast<uint8_t>(r); }

inline milliseconds Since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

// An FsError for assertion messages.
inline std::string Describe(const fs::FsError& e) {
  return "FsError{err=" + ErrnoName(e.err) + ", syscall=" + e.syscall + ", path=" + e.path +
         ", message=" + e.message + "}";
}

// `r` failed with errno `err` (and, when given, exactly Node's `message`).
template <typename T>
::testing::AssertionResult FailsWith(const fs::FsOutcome<T>& r, int err,
                                     const std::string& message = "") {
  if (r.ok()) return ::testing::AssertionFailure() << "succeeded; expected " << ErrnoName(err);
  if (r.error().err != err || (!message.empty() && r.error().message != message)) {
    return ::testing::AssertionFailure()
           << "expected " << ErrnoName(err) << (message.empty() ? "" : " \"" + message + "\"")
           << ", got " << Describe(r.error());
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
::testing::AssertionResult Succeeds(const fs::FsOutcome<T>& r) {
  if (r.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << Describe(r.error());
}

// The outcome of one exec run to its end.
struct ExecRun {
  bool ok = false;  // an ExecExit arrived (else `error` says why)
  fs::FsError error;
  fs::proto::ExecExit exit;
  std::string out;
  std::string err;
  milliseconds elapsed{0};

  std::string Describe() const {
    std::ostringstream s;
    if (!ok) {
      s << "exec failed: " << itest::Describe(error);
      return s.str();
    }
    s << "exit_code=" << exit.exit_code << " signal=" << exit.signal
      << " reason=" << exec::EndReasonName(static_cast<exec::EndReason>(exit.reason))
      << " timed_out=" << exit.timed_out << " truncated=" << exit.truncated
      << " cancelled=" << exit.cancelled << " duration_ms=" << exit.duration_ms
      << " elapsed=" << elapsed.count() << "ms\nstdout(" << out.size() << ")=["
      << out.substr(0, 2000) << "]\nstderr(" << err.size() << ")=[" << err.substr(0, 2000) << "]";
    return s.str();
  }
};

// An exec started with StartExec: what arrived so far, safe to look at from the test thread.
struct AsyncExec {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t tag = 0;
  uint32_t pid = 0;
  std::string out;
  std::string err;
  bool done = false;
  ExecRun run;
  Clock::time_point started = Clock::now();

  // Waits until stdout contains `needle`; false on timeout or when the exec ended first.
  bool WaitForOutput(std::string_view needle, milliseconds timeout = milliseconds(10000)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] {
      return out.find(needle) != std::string::npos || done;
    }) && out.find(needle) != std::string::npos;
  }
  // Waits for the end; false on timeout.
  bool WaitDone(milliseconds timeout = milliseconds(20000)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return done; });
  }
  ExecRun Result() {
    std::lock_guard<std::mutex> lock(mu);
    return run;
  }
};

// Host pids of every descendant of `pid` (through /proc/PID/task/*/children), depth first.
inline void CollectDescendants(pid_t pid, std::vector<pid_t>& out, int depth = 0) {
  if (depth > 64) return;
  std::string task_dir = "/proc/" + std::to_string(pid) + "/task";
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(task_dir.c_str()), ::closedir);
  if (!d) return;
  while (struct dirent* e = ::readdir(d.get())) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(task_dir + "/" + e->d_name + "/children");
    pid_t child;
    while (f >> child) {
      out.push_back(child);
      CollectDescendants(child, out, depth + 1);
    }
  }
}

// The host's /proc/PID/comm, without the newline ("" when gone).
inline std::string HostComm(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/comm");
  std::string comm;
  std::getline(f, comm);
  return comm;
}

// VmRSS of /proc/self/status in KiB.
inline long SelfRssKiB() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

// A file on the HOST (outside every jail) that no verb may ever reach; removed at the end.
class HostMarker {
 public:
  HostMarker(std::string path, std::string content) : path_(std::move(path)) {
    std::ofstream f(path_, std::ios::binary | std::ios::trunc);
    f << content;
    EXPECT_TRUE(f.good()) << "write host marker " << path_;
  }
  ~HostMarker() { ::unlink(path_.c_str()); }
  HostMarker(const HostMarker&) = delete;
  HostMarker& operator=(const HostMarker&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline bool HostPathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// Runs a command to its end on `client`, collecting its output.
inline ExecRun RunOn(fs::InitClient& client, const fs::proto::ExecRequest& req) {
  ExecRun run;
  fs::InitClient::ExecCallbacks cb;
  cb.on_output = [&run](int stream, std::string_view data) {
    (stream == 1 ? run.out : run.err).append(data);
  };
  auto start = Clock::now();
  auto r = client.Exec(req, cb);
  run.elapsed = Since(start);
  run.ok = r.ok();
  if (r.ok()) {
    run.exit = r.value();
  } else {
    run.error = r.error();
  }
  return run;
}

class InitTest : public IntegrationTest {
 protected:
  void SetUp() override {
    IntegrationTest::SetUp();
    if (IsSkipped()) return;
    runtime::SandboxOptions o;
    o.jail.workspace = ws_.path();
    o.jail.hostname = "box";
    o.jail.warn_unwritable_workspace = false;
    // The pid and a random part: a run killed before its clean-up leaves its cgroups, whose
    // name a later process of the same pid would otherwise meet (EEXIST).
    o.cgroup_name = "nsbox-itest-init-" + std::to_string(::getpid()) + "-" + RandomHex(6);
    o.init_binary = NSBOX_INIT_BIN;
    Configure(o);
    auto box = runtime::Sandbox::Start(o);
    ASSERT_TRUE(box.ok()) << box.error().message();
    box_ = std::move(*box);
  }

  void TearDown() override {
    // The sandbox goes first, so that every reader-thread callback has run before the
    // workspace (and anything a test captured) is gone.
    box_.reset();
  }

  // A subclass's changes to the sandbox's options.
  virtual void Configure(runtime::SandboxOptions&) {}

  fs::InitClient& client() { return box_->client(); }

  static fs::proto::ExecRequest Request(std::string command) {
    fs::proto::ExecRequest req;
    req.command = std::move(command);
    req.cwd = "/workspace";
    req.env = {kJailPath, "HOME=/root", "LANG=C.UTF-8"};
    return req;
  }

  // Runs a command to its end, collecting its output.
  ExecRun Run(const fs::proto::ExecRequest& req) { return RunOn(client(), req); }
  ExecRun Run(const std::string& command) { return Run(Request(command)); }

  // Runs a shell command that must succeed quietly (exit 0, empty stderr); its stdout.
  std::string Sh(const std::string& command) {
    ExecRun run = Run(command);
    EXPECT_TRUE(run.ok && run.exit.exit_code == 0 && run.err.empty())
        << "command: " << command << "\n"
        << run.Describe();
    return run.out;
  }

  // Starts a command without waiting for it.
  std::shared_ptr<AsyncExec> Start(const fs::proto::ExecRequest& req) {
    auto a = std::make_shared<AsyncExec>();
    fs::InitClient::ExecCallbacks cb;
    cb.on_started = [a](uint32_t pid) {
      std::lock_guard<std::mutex> lock(a->mu);
      a->pid = pid;
      a->cv.notify_all();
    };
    cb.on_output = [a](int stream, std::string_view data) {
      std::lock_guard<std::mutex> lock(a->mu);
      (stream == 1 ? a->out : a->err).append(data);
      (stream == 1 ? a->run.out : a->run.err).append(data);
      a->cv.notify_all();
    };
    a->tag = client().StartExec(req, cb, [a](fs::FsOutcome<fs::proto::ExecExit> r) {
      std::lock_guard<std::mutex> inner(a->mu);
      a->run.ok = r.ok();
      if (r.ok()) {
        a->run.exit = r.value();
      } else {
        a->run.error = r.error();
      }
      a->run.elapsed = Since(a->started);
      a->done = true;
      a->cv.notify_all();
    });
    return a;
  }
  std::shared_ptr<AsyncExec> Start(const std::string& command) { return Start(Request(command)); }

  // Host pids of every process of the sandbox but nsbox-init, with their comm.
  std::vector<std::pair<pid_t, std::string>> SandboxProcesses() const {
    std::vector<pid_t> pids;
    CollectDescendants(box_->init_pid(), pids);
    std::vector<std::pair<pid_t, std::string>> out;
    for (pid_t p : pids) {
      std::string comm = HostComm(p);
      // The runner's child made ahead for the next command is nsbox-init's, not a command's.
      if (comm == exec::kWarmChildName) continue;
      out.emplace_back(p, std::move(comm));
    }
    return out;
  }
  static std::string Names(const std::vector<std::pair<pid_t, std::string>>& procs) {
    std::string s;
    for (const auto& [pid, comm] : procs) s += std::to_string(pid) + ":" + comm + " ";
    return s;
  }
  // Waits up to `timeout` for the sandbox to hold no process but nsbox-init; what is left.
  std::vector<std::pair<pid_t, std::string>> WaitSandboxEmpty(milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      auto procs = SandboxProcesses();
      if (procs.empty() || Clock::now() > deadline) return procs;
      std::this_thread::sleep_for(milliseconds(20));
    }
  }

  // Sends hostile bytes and waits for the reply to `tag` (registered before the bytes go out, so
  // the reply cannot arrive first and be dropped).
  fs::FsOutcome<fs::InitClient::RawReply> SendAndAwait(std::string_view bytes, uint64_t tag,
                                                       milliseconds timeout = milliseconds(5000)) {
    auto wait = client().ExpectReply(tag);
    auto sent = client().SendRaw(bytes);
    EXPECT_TRUE(sent.ok()) << sent.error().message();
    return wait(timeout);
  }

  // Runs `fn` on a helper thread and waits up to `timeout` for it: nullopt if it did not
  // return in time (it is then left to finish when the sandbox closes, and joined after).
  template <typename T>
  std::optional<T> Within(milliseconds timeout, std::function<T()> fn) {
    struct Shared {
      std::mutex mu;
      std::condition_variable cv;
      std::optional<T> value;
    };
    auto shared = std::make_shared<Shared>();
    waiters_.emplace_back([shared, fn = std::move(fn)] {
      T v = fn();
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->value.emplace(std::move(v));
      shared->cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(shared->mu);
    shared->cv.wait_for(lock, timeout, [&] { return shared->value.has_value(); });
    return std::move(shared->value);
  }

  // Declared first: destroyed last, after the sandbox that binds it.
  TempWorkspace ws_;
  std::unique_ptr<runtime::Sandbox> box_;
  // Within() threads; joined after the sandbox is gone (its close fails every waiter).
  struct Joiner {
    std::vector<std::thread> threads;
    void emplace_back(std::function<void()> fn) { threads.emplace_back(std::move(fn)); }
    ~Joiner() {
      for (auto& t : threads) t.join();
    }
  };
  Joiner waiters_;
};

}  // namespace nsbox::itest

// Group "exhaustion" (docs/security.md): a sandbox that tries to exhaust processes, memory, disk
// and the daemon's own resources (output, connections, slow and never-reading clients). Each
// case asserts the limit that stops it and that everyone else is still served; the control is
// the same work under the limit, which succeeds.

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include "isolate/disk.h"
#include "tests/adversarial/fixture.h"

namespace nsbox::adversarial {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

class ExhaustionTest : public AdversarialTest {
 protected:
  // A health request on a fresh connection: its latency in ms (-1 if it failed).
  long HealthLatencyMs() {
    Client c(daemon().endpoint());
    const auto t0 = Clock::now();
    Response r = c.Get("/v1/health", milliseconds(5000));
    if (r.status != 200) return -1;
    return std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
  }
  // 300,000 names of 200 bytes in the sandbox's /tmp: a listing of 60.9 MB of JSON (issue 44
  // measured 62.6 MB). The first name is 000000xxx..., the last 299999xxx...
  void MakeHugeDirectory(const std::string& id) {
    ExecResult made = Exec(id,
                           "mkdir /tmp/huge && cd /tmp/huge && python3 -c 'for i in "
                           "range(300000): open(\"%06d%s\" % (i, \"x\" * 194), \"w\").close()' "
                           "&& ls -U | wc -l",
                           milliseconds(300000));
    ASSERT_EQ(made.out(), "300000\n") << "control: the directory is that big" << made.Describe();
  }
};

void RaiseFdLimit() {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// A non-blocking stream connection to the daemon's Unix socket, or to 127.0.0.1:port.
int Connect(const std::string& unix_path, uint16_t port = 0) {
  int fd = -1;
  int rc = -1;
  if (!unix_path.empty()) {
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", unix_path.c_str());
    // SAFETY: sockaddr_un is the address of an AF_UNIX socket.
    rc = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // SAFETY: sockaddr_in is the address of an AF_INET socket.
    rc = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Reads every fd to EOF (or the deadline), all at once with poll; returns what each sent.
std::vector<std::string> ReadAllToEof(const std::vector<int>& fds, milliseconds timeout) {
  std::vector<std::string> out(fds.size());
  std::vector<bool> done(fds.size(), false);
  size_t left = fds.size();
  const auto deadline = Clock::now() + timeout;
  std::vector<pollfd> pfds;
  std::vector<size_t> index;
  char buf[65536];
  while (left > 0 && Clock::now() < deadline) {
    pfds.clear();
    index.clear();
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!done[i]) {
        pfds.push_back({fds[i], POLLIN, 0});
        index.push_back(i);
      }
    }
    if (poll(pfds.data(), pfds.size(), 200) <= 0) continue;
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (pfds[k].revents == 0) continue;
      const size_t i = index[k];
      ssize_t n = recv(fds[i], buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        out[i].append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        done[i] = true;
        --left;
      }
    }
  }
  return out;
}

// ---- processes and memory ----

// A fork bomb under `pids: 64`: fork fails with EAGAIN before 64 processes, the daemon and the
// sandbox stay usable. Control: under `pids: 128` the same bomb gets further, so the limit is
// what stopped it.
TEST_F(ExhaustionTest, ForkBombStopsAtThePidsLimit) {
  const std::string id = NewSandbox("bomb", "{\"limits\":{\"pids\":64}}");
  InstallTools(id);
  KeyValues bomb = Probe(id, "forkbomb");
  const long forks = std::stol(Get(bomb, "forks") == "<missing>" ? "-1" : Get(bomb, "forks"));
  EXPECT_EQ(Get(bomb, "fork_errno"), "EAGAIN");
  EXPECT_GT(forks, 32);
  EXPECT_LT(forks, 64);
  EXPECT_EQ(Get(bomb, "reaped"), Get(bomb, "forks"));
  EXPECT_EQ(Sh(id, "echo still usable"), "still usable\n");
  const std::string wider = NewSandbox("wider", "{\"limits\":{\"pids\":128}}");
  InstallTools(wider);
  KeyValues control = Probe(wider, "forkbomb");
  EXPECT_GT(std::stol(Get(control, "forks") == "<missing>" ? "0" : Get(control, "forks")), 64)
      << "control";
  EXPECT_LT(HealthLatencyMs(), 1000);
}

// Terminals: every sandbox shares the host's kernel.pty.max pool, so its devpts has a `max=`.
// Opening /dev/ptmx until it fails stops at exactly that many with ENOSPC; a second sandbox can
// still open terminals meanwhile (control: the pool was not emptied), and so can the first once
// the holder has exited (nothing leaked).
TEST_F(ExhaustionTest, PtyExhaustionStopsAtTheSandboxesOwnLimit) {
  const std::string id = NewSandbox("ptys");
  const std::string other = NewSandbox("ptys2");
  const std::string hog =
      "n=0; while [ $n -lt 1000 ] && exec {fd}<>/dev/ptmx; do n=$((n+1)); done 2>/tmp/err; "
      "echo opened=$n; grep -c 'No space left on device' /tmp/err";
  // The hog holds its terminals for 4 s while the other sandbox opens one.
  Response held;
  std::thread holder([&] {
    Client c = NewClient();
    held = c.PostJson(SbPath(id, "/exec"), json::object{{"command", hog + "; sleep 4"}},
                      milliseconds(60000));
  });
  std::this_thread::sleep_for(milliseconds(1500));
  EXPECT_EQ(Sh(other, "exec 3<>/dev/ptmx && echo other-ok"), "other-ok\n") << "control";
  holder.join();
  json::object answer = Obj(held);
  EXPECT_EQ(Str(answer, "stdout"), "opened=128\n1\n") << held.Describe();
  EXPECT_EQ(Sh(id, hog), "opened=128\n1\n") << "terminals of an ended command stay taken";
  EXPECT_LT(HealthLatencyMs(), 1000);
}

// A memory bomb under `memoryBytes: 64 MiB`: the kernel's OOM killer ends it, and the answer
// says so (api.md: reason "oom", exit code 137). Control: 16 MiB fits.
TEST_F(ExhaustionTest, MemoryBombIsOomKilled) {
  const std::string id = NewSandbox("mem", "{\"limits\":{\"memoryBytes\":67108864}}");
  InstallTools(id);
  ExecResult ok = Exec(id, std::string(kJailProbe) + " memhog 16");
  EXPECT_EQ(ok.exit_code(), 0) << "control: " << ok.Describe();
  ExecResult bomb = Exec(id, std::string(kJailProbe) + " memhog 1024", milliseconds(60000));
  EXPECT_EQ(bomb.exit_code(), 137) << bomb.Describe();
  EXPECT_EQ(Str(bomb.answer, "signal"), "SIGKILL");
  EXPECT_EQ(bomb.reason(), "oom") << bomb.Describe();
  EXPECT_EQ(Sh(id, "echo alive"), "alive\n");
}

// The same bomb written to the sandbox's tmpfs from inside: tmpfs pages are charged to the
// command's memory, so the writer is killed and what stays in /tmp is below the limit.
// Control: 8 MiB fits.
TEST_F(ExhaustionTest, MemoryBombThroughTmpfsFromInside) {
  const std::string id = NewSandbox("tmpfs", "{\"limits\":{\"memoryBytes\":67108864}}");
  EXPECT_EQ(Sh(id, "head -c 8M /dev/zero > /tmp/small && stat -c %s /tmp/small"), "8388608\n")
      << "control";
  const size_t log_at = daemon().LogSize();
  ExecResult bomb = Exec(id, "head -c 512M /dev/zero > /tmp/big", milliseconds(60000));
  EXPECT_NE(bomb.exit_code(), 0) << bomb.Describe();
  // What stays in /tmp is below the limit, and the sandbox's nsbox-init survived it: the next
  // command runs in the same jail (no restart), and can clean up.
  ExecResult after = Exec(id, "stat -c %s /tmp/big; rm /tmp/big");
  EXPECT_EQ(after.reason(), "exited") << after.Describe();
  EXPECT_LT(std::stol("0" + after.out()), 64L * 1024 * 1024) << after.Describe();
  EXPECT_EQ(daemon().Log(log_at).find("nsbox-init had exited"), std::string::npos)
      << "the sandbox's nsbox-init was killed by its own memory limit";
  // /dev/shm is memory like /tmp.
  ExecResult shm = Exec(id, "head -c 512M /dev/zero > /dev/shm/big", milliseconds(60000));
  EXPECT_NE(shm.exit_code(), 0) << shm.Describe();
  ExecResult after_shm = Exec(id, "rm -f /dev/shm/big; echo ok");
  EXPECT_EQ(after_shm.out(), "ok\n") << after_shm.Describe();
}

// The host pid of the nsbox-init whose sandbox runs a process named `marker` (argv[0]) that
// its command left running: that process's parent once the command has ended; -1 when none is
// found within 2 s.
pid_t InitRunning(const std::string& marker) {
  for (int tries = 0; tries < 200; ++tries) {
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string dir = entry.path().string();
      std::ifstream cmdline(dir + "/cmdline");
      std::string argv0;
      if (!std::getline(cmdline, argv0, '\0') || argv0 != marker) continue;
      std::ifstream status(dir + "/status");
      std::string line;
      pid_t parent = -1;
      while (std::getline(status, line)) {
        if (line.rfind("PPid:", 0) == 0) parent = std::atoi(line.c_str() + 5);
      }
      std::ifstream comm("/proc/" + std::to_string(parent) + "/comm");
      std::string name;
      if (parent > 0 && std::getline(comm, name) && name == "nsbox-init") return parent;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  return -1;
}

std::string OomScoreAdj(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/oom_score_adj");
  std::string v;
  std::getline(f, v);
  return v;
}

// A command is the OOM killer's choice before nsbox-init (exec/spawn.cc raises each command's
// oom_score_adj to 500). A child made ahead for commands in a row shares nsbox-init's memory
// until its execve, and the kernel gives processes that share a memory map (vfork children
// aside) the score one of them sets: in a sandbox with a memory limit nsbox-init makes none and
// keeps the score it started with (the daemon's); in one without, it shares its commands' score
// while it keeps such a child, and takes its own back when it goes idle (2-4 s).
TEST_F(ExhaustionTest, NsboxInitKeepsItsOomScoreBelowItsCommandsUnderAMemoryLimit) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "children made ahead are x86-64 only";
#endif
  const std::string start_score = OomScoreAdj(daemon().pid());  // what nsbox-init inherits
  const std::string limited = NewSandbox("oom-limited", "{\"limits\":{\"memoryBytes\":67108864}}");
  const std::string plain = NewSandbox("oom-plain", "{}");
  std::string command_score;
  for (const std::string& id : {limited, plain}) {
    for (int i = 0; i < 6; ++i) EXPECT_EQ(Sh(id, "true"), "") << id;
    command_score = Sh(id, "cat /proc/self/oom_score_adj");
    EXPECT_EQ(command_score, "500\n") << id << ": a command's score";
    EXPECT_EQ(Sh(id, "(exec -a nsbox-oom-marker-" + id + " sleep 600) >/dev/null 2>&1 &"), "");
  }
  const pid_t limited_init = InitRunning("nsbox-oom-marker-" + limited);
  const pid_t plain_init = InitRunning("nsbox-oom-marker-" + plain);
  ASSERT_GT(limited_init, 0);
  ASSERT_GT(plain_init, 0);
  ASSERT_NE(limited_init, plain_init);
  ASSERT_NE(start_score + "\n", command_score) << "control: the daemon's score is not 500";
  EXPECT_EQ(OomScoreAdj(limited_init), start_score)
      << "nsbox-init of the sandbox with a memory limit";
  EXPECT_EQ(OomScoreAdj(plain_init) + "\n", command_score)
      << "control: without a limit, a child made ahead shares nsbox-init's score";
  // Idle (no command for 2 s; the marker is no command of the runner's): no child is kept, and
  // nsbox-init's score is its own again.
  std::string idle;
  for (int tries = 0; tries < 80 && (idle = OomScoreAdj(plain_init)) != start_score; ++tries) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(idle, start_score) << "nsbox-init of the sandbox without a limit, idle";
}

// The same bomb through the files API: a 256 MiB upload into /tmp (a tmpfs) of a sandbox limited
// to 64 MiB. The bytes are memory of the host either way; they must count against the sandbox's
// limit (api.md: 507 ENOSPC/EDQUOT when a write does not fit). Control: 8 MiB fits.
TEST_F(ExhaustionTest, MemoryBombThroughUploadToTmpfs) {
  const std::string id = NewSandbox("upload", "{\"limits\":{\"memoryBytes\":67108864}}");
  EXPECT_EQ(PutFile(id, "/tmp/small", std::string(8 * kMiB, 's')).status, 204) << "control";
  Response r = PutFile(id, "/tmp/big", std::string(256 * kMiB, 'b'));
  EXPECT_EQ(r.status, 507) << r.Describe();
  EXPECT_EQ(r.ErrorCode(), "ENOSPC") << r.Describe();
  // Node's wording, as every file error.
  EXPECT_EQ(r.ErrorMessage(), "ENOSPC: no space left on device, write '/tmp/big'") << r.Describe();
  ExecResult held = Exec(id, "du -sk /tmp | cut -f1");
  EXPECT_LT(std::stol(held.out().empty() ? "0" : held.out()), 64L * 1024) << held.Describe();
}

// A disk of its own (limits.diskBytes) bounds what a sandbox keeps, however it fills it: one
// big file, fallocate, and more files than the disk has inodes. Each ends in ENOSPC inside; the
// host's disk loses nothing past what the creation reserved; the sandbox is usable again once
// it removes its files, and another sandbox and the daemon never notice. What a full disk looks
// like without one: /dev/full.
TEST_F(ExhaustionTest, DiskFillStopsAtTheSandboxesOwnDisk) {
  if (auto st = isolate::DiskSupport(); !st.ok()) {
    GTEST_SKIP() << "NOT RUN: this host gives no sandbox a disk: " << st.error().message();
  }
  const std::string id = NewSandbox("disk", "{\"limits\":{\"diskBytes\":33554432}}");
  // What the sandbox holds of the host's disk: its image's blocks (the host's free space moves
  // with whatever else the machine writes meanwhile).
  const std::string image = daemon_->SandboxDir(id) + "/disk.ext4";
  auto host_bytes = [&] {
    struct stat st {};
    EXPECT_EQ(::stat(image.c_str(), &st), 0) << image;
    return static_cast<int64_t>(st.st_blocks) * 512;
  };
  ASSERT_EQ(Exec(id, "true").exit_code(), 0);
  const int64_t held_before = host_bytes();
  EXPECT_GE(held_before, int64_t{33554432}) << "control: the image's blocks are reserved";
  ExecResult big = Exec(id, "head -c 64M /dev/zero > /workspace/big; echo rc=$?");
  EXPECT_NE(big.err().find("No space left on device"), std::string::npos) << big.Describe();
  EXPECT_EQ(big.out(), "rc=1\n");
  ExecResult reserve = Exec(id, "rm /workspace/big; fallocate -l 1G /root/f; echo rc=$?");
  EXPECT_NE(reserve.err().find("No space left on device"), std::string::npos) << reserve.Describe();
  EXPECT_EQ(reserve.out(), "rc=1\n");
  // ext4 keeps what a failed fallocate got: the disk is full until the file goes.
  EXPECT_EQ(Exec(id, "rm /root/f; echo rc=$?").out(), "rc=0\n");
  // Inodes: empty files until none is left (a 32 MiB ext4 has 8,192).
  ExecResult inodes = Exec(id,
                           "mkdir /workspace/many && cd /workspace/many && "
                           "seq 1 20000 | xargs touch 2>&1 | tail -1; ls | wc -l",
                           milliseconds(60000));
  EXPECT_NE(inodes.out().find("No space left on device"), std::string::npos) << inodes.Describe();
  // The host's disk: nothing past the reservation.
  EXPECT_EQ(host_bytes(), held_before)
      << "the sandbox took more of the host's disk than its reservation";
  // Room made, it writes again; the daemon and another sandbox saw nothing.
  EXPECT_EQ(Exec(id, "rm -rf /workspace/many; echo ok > /workspace/ok && cat /workspace/ok").out(),
            "ok\n");
  const std::string other = NewSandbox("other");
  ExecResult full = Exec(other, "echo x 2>&1 >/dev/full; echo rc=$?");
  EXPECT_EQ(full.out(), "/bin/bash: line 1: echo: write error: No space left on device\nrc=1\n");
  EXPECT_EQ(PutFile(other, "/workspace/f", std::string(40 * kMiB, 'f')).status, 204)
      << "a sandbox without a disk of its own is not bound by another's";
}

// ---- output ----

// 100 MiB of output without a single newline: cut at the cap (64 MiB for stdout and stderr
// together), the process tree killed, the answer exact. Control: 1 MiB passes whole.
TEST_F(ExhaustionTest, OutputFloodWithoutNewlines) {
  const std::string id = NewSandbox("flood");
  ExecResult small = Exec(id, "head -c 1M /dev/zero | tr '\\0' a");
  EXPECT_EQ(small.out().size(), kMiB) << "control";
  EXPECT_EQ(Field(small.answer, "truncated"), json::value(false));
  ExecResult flood =
      Exec(id, "head -c 100M /dev/zero | tr '\\0' a; echo never", milliseconds(60000));
  ASSERT_EQ(flood.response.status, 200) << flood.response.transport_error;
  EXPECT_EQ(flood.reason(), "output_limit");
  EXPECT_EQ(flood.exit_code(), 1);
  EXPECT_EQ(Field(flood.answer, "truncated"), json::value(true));
  const std::string err = "nsbox: output exceeded 67108864 bytes; process tree killed\n";
  EXPECT_EQ(flood.err(), err);
  EXPECT_EQ(flood.out().size(), 64 * kMiB);
  EXPECT_EQ(flood.out().find_first_not_of('a'), std::string::npos);
  EXPECT_EQ(Sh(id, "ps -e -o comm= | grep -c -e head -e tr; true"), "0\n");
  // api.md: the daemon never holds more than the cap for one command. The buffered answer is
  // sent from the output's pieces; built whole, it peaked at five copies of it (over 350 MiB).
  // This test's daemon is its own: its peak is this answer's, plus the daemon's few MiB.
  EXPECT_LT(PeakRssKib(daemon().pid()), (64 + 48) * 1024);
}

// The same flood streamed to a client that never reads: the daemon holds at most the cap for it
// (api.md: "never holds more than the cap for one command"), the command ends at the cap, and
// every other client is served meanwhile.
TEST_F(ExhaustionTest, NeverReadingClientOfAStreamingFlood) {
  const std::string id = NewSandbox("never-read");
  Sh(id, "true");
  const long rss0 = RssKib(daemon().pid());
  RawConnection raw(daemon().endpoint());
  ASSERT_TRUE(raw.connected());
  const std::string body = "{\"command\":\"yes nsbox-flood\"}";
  ASSERT_TRUE(raw.Send("POST " + SbPath(id, "/exec") +
                       " HTTP/1.1\r\nHost: x\r\nAccept: application/x-ndjson\r\nContent-Type: "
                       "application/json\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body));
  // The command ends at the cap in the jail (the daemon holds what it could not send).
  long worst = 0;
  bool ended = false;
  for (int i = 0; i < 150 && !ended; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    worst = std::max(worst, HealthLatencyMs());
    ended = i > 3 && Sh(id, "ps -e -o comm= | grep -c '^yes$'; true") == "0\n";
  }
  const long rss1 = RssKib(daemon().pid());
  EXPECT_TRUE(ended) << "the flood never reached its cap";
  EXPECT_LT(worst, 1000) << "another client waited " << worst << " ms";
  std::fprintf(stderr, "the daemon holds %ld MiB for the client that does not read\n",
               (rss1 - rss0) / 1024);
  EXPECT_LT(rss1 - rss0, 160L * 1024) << "the daemon grew by " << (rss1 - rss0) / 1024 << " MiB";
  // Ended at the cap while its answer still waits for the client: no longer running, its
  // session kept for re-attach (docs/exec.md), which the client's hang-up does not change.
  EXPECT_EQ(Arr(Call("GET", SbPath(id, "/execs")), "execs").size(), 0u);
  auto flood = [&]() -> std::optional<json::object> {
    for (const auto& e : Arr(Call("GET", SbPath(id, "/execs?all=1")), "execs")) {
      if (Str(e.as_object(), "command") == "yes nsbox-flood") return e.as_object();
    }
    return std::nullopt;
  };
  auto kept = flood();
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(Str(*kept, "state"), "exited");
  EXPECT_EQ(Str(Field(*kept, "exit").as_object(), "reason"), "output_limit");
  raw.Close();
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_TRUE(flood().has_value());
}

// ---- connections ----

// 1,000 commands at once, each on its own connection: every one answered, exactly.
TEST_F(ExhaustionTest, ThousandConcurrentExecs) {
  RaiseFdLimit();
  const std::string id = NewSandbox("thousand");
  Sh(id, "true");
  const int kN = 1000;
  std::vector<int> fds;
  for (int i = 0; i < kN; ++i) {
    int fd = Connect(daemon().socket_path());
    ASSERT_GE(fd, 0) << "connection " << i << ": " << strerror(errno);
    const std::string body = "{\"command\":\"sleep 1; echo " + std::to_string(i) + "\"}";
    ASSERT_TRUE(SendAll(fd, "POST " + SbPath(id, "/exec") +
                                " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                                "application/json\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body));
    fds.push_back(fd);
  }
  const auto t0 = Clock::now();
  std::vector<std::string> answers = ReadAllToEof(fds, milliseconds(120000));
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
  for (int fd : fds) close(fd);
  int exact = 0;
  for (int i = 0; i < kN; ++i) {
    const std::string& a = answers[static_cast<size_t>(i)];
    Scan("exec answer", a);
    const std::string want = "\"stdout\":\"" + std::to_string(i) + "\\n\"";
    if (a.rfind("HTTP/1.1 200 ", 0) == 0 && a.find(want) != std::string::npos &&
        a.find("\"exitCode\":0") != std::string::npos) {
      ++exact;
    } else if (exact + 5 > i) {
      ADD_FAILURE() << "answer " << i << ": " << a.substr(0, 500);
    }
  }
  EXPECT_EQ(exact, kN);
  EXPECT_LT(took, 60000);
  std::fprintf(stderr, "1,000 concurrent execs answered in %lld ms\n",
               static_cast<long long>(took));
}

// Slow-loris: 500 connections on the Unix socket and 500 on TCP (without a token) dribbling a
// request's header one byte at a time. Everyone else is still answered within 1 s; when they
// hang up the daemon's fds come back (the after-case check).
TEST_F(ExhaustionTest, SlowLorisClientsDoNotStarveOthers) {
  RaiseFdLimit();
  std::vector<int> fds;
  for (int i = 0; i < 1000; ++i) {
    int fd = i % 2 == 0 ? Connect(daemon().socket_path()) : Connect("", tcp_port());
    ASSERT_GE(fd, 0) << strerror(errno);
    fds.push_back(fd);
  }
  const std::string head = "GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  const std::string id = NewSandbox("loris");
  long worst = 0;
  for (size_t step = 0; step < 40; ++step) {
    for (int fd : fds) {
      char c = step < head.size() ? head[step] : 'a';
      (void)!send(fd, &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    worst = std::max(worst, HealthLatencyMs());
    if (step % 10 == 0) {
      EXPECT_EQ(Sh(id, "echo served"), "served\n");
    }
  }
  EXPECT_GE(worst, 0);
  EXPECT_LT(worst, 1000) << "a client waited " << worst << " ms behind the slow ones";
  EXPECT_GE(daemon().CountFds(), 1000) << "control: the slow connections were all held";
  for (int fd : fds) close(fd);
}

// A flood of TCP connections that never show the token: the daemon holds at most 1,024 of them
// (each for --auth-timeout at most) and closes newer ones at once, so that such a peer cannot take
// the fds the sandboxes need. The Unix socket and the sandboxes are served meanwhile; once some of
// the flood hangs up, TCP clients with the token are served again.
TEST_F(ExhaustionTest, ConnectionsWithoutTheTokenAreCapped) {
  RaiseFdLimit();
  const std::string id = NewSandbox("flood");
  std::vector<int> flood;
  for (int i = 0; i < 1024; ++i) {
    int fd = Connect("", tcp_port());
    ASSERT_GE(fd, 0) << "connection " << i << ": " << strerror(errno);
    flood.push_back(fd);
  }
  // Accepted in order: this one finds 1,024 waiting, and is closed without a word.
  const int extra = Connect("", tcp_port());
  ASSERT_GE(extra, 0) << strerror(errno);
  pollfd p{extra, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1) << "the connection beyond the cap was not closed";
  char c;
  EXPECT_LE(recv(extra, &c, 1, 0), 0) << "it was answered instead of closed";
  close(extra);
  EXPECT_GE(HealthLatencyMs(), 0) << "the Unix socket is still served";
  EXPECT_EQ(Sh(id, "echo served"), "served\n");
  EXPECT_NE(daemon().Log().find("TCP connections have not shown the token yet"), std::string::npos);

  for (int i = 0; i < 100; ++i) close(flood[i]);
  Client with_token(e2e::Endpoint::Tcp("127.0.0.1", tcp_port()), bearer());
  int status = 0;
  for (int i = 0; i < 50 && status != 200; ++i) {  // the daemon sees the hang-ups in its time
    status = with_token.Get("/v1/health", milliseconds(2000)).status;
    if (status != 200) {
      with_token.Disconnect();
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
  EXPECT_EQ(status, 200) << "a client with the token, once the flood has thinned";
  for (size_t i = 100; i < flood.size(); ++i) close(flood[i]);
}

// A client that sends a request and never reads the answer (a 32 MiB file), then one that hangs
// up halfway: the daemon neither blocks nor holds them.
TEST_F(ExhaustionTest, NeverReadingDownloadDoesNotBlockOthers) {
  const std::string id = NewSandbox("download");
  ASSERT_EQ(PutFile(id, "/workspace/big", std::string(32 * kMiB, 'd')).status, 204);
  std::vector<std::unique_ptr<RawConnection>> stuck;
  for (int i = 0; i < 20; ++i) {
    auto raw = std::make_unique<RawConnection>(daemon().endpoint());
    ASSERT_TRUE(raw->Send("GET " + SbPath(id, "/files?path=big") + " HTTP/1.1\r\nHost: x\r\n\r\n"));
    stuck.push_back(std::move(raw));
  }
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_LT(HealthLatencyMs(), 1000);
  Response r = GetFile(id, "/workspace/big");
  EXPECT_EQ(r.body.size(), 32 * kMiB) << "control: a reading client gets it all";
  stuck.clear();
}

// How deep the chain of directories "d" under `top` goes on the host, walked by fd as it was made.
int HostDepth(const std::string& top) {
  int fd = open(top.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  int depth = 0;
  while (fd >= 0) {
    const int next = openat(fd, "d", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(fd);
    fd = next;
    if (fd >= 0) ++depth;
  }
  return depth;
}

// The entries of the daemon's sandboxes directory that are removals not finished (.trash-*).
std::vector<std::string> TrashLeft(const std::string& state_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(state_dir + "/sandboxes", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".trash-", 0) == 0) out.push_back(name);
  }
  return out;
}

// A sandbox makes a tree deeper than the daemon's open-file limit, then is deleted (issue 44: the
// daemon's removal kept one open directory per level, failed with EMFILE and answered 204 anyway,
// leaving the tree on the host as .trash-..., also after a restart, while it held nearly all of
// its fds). The daemon's limit is lowered to 4,096 open files for the case (its hard limit
// stays), so that a tree deeper than it is made in a moment. Control: the tree is on the host,
// 6,000 levels deep, before the DELETE.
TEST_F(ExhaustionTest, ATreeDeeperThanTheDaemonsFdLimitIsDeletedWhole) {
  const std::string id = NewSandbox("deep");
  InstallTools(id);
  KeyValues made = Attack(id, "deeptree /workspace/deep 6000");
  ASSERT_EQ(Get(made, "made"), "6000");
  const std::string host_tree = daemon().SandboxDir(id) + "/workspace/deep";
  ASSERT_EQ(HostDepth(host_tree), 6000) << "control: the tree is on the host";
  struct rlimit old {};
  ASSERT_EQ(prlimit(daemon().pid(), RLIMIT_NOFILE, nullptr, &old), 0);
  ASSERT_GT(old.rlim_max, 4096u);
  const struct rlimit lowered = {4096, old.rlim_max};
  ASSERT_EQ(prlimit(daemon().pid(), RLIMIT_NOFILE, &lowered, nullptr), 0);
  Response del = Call("DELETE", SbPath(id), {}, {}, milliseconds(60000));
  const std::vector<std::string> left = TrashLeft(daemon().state_dir());
  Response metrics = Call("GET", "/metrics");
  EXPECT_EQ(prlimit(daemon().pid(), RLIMIT_NOFILE, &old, nullptr), 0);
  EXPECT_EQ(del.status, 204) << del.Describe();
  EXPECT_TRUE(left.empty()) << "left on the host: " << left.front();
  EXPECT_EQ(HostDepth(host_tree), 0);
  EXPECT_NE(metrics.body.find("\nnsbox_sandbox_removals_pending 0\n"), std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("\nnsbox_sandbox_removal_failures_total 0\n"), std::string::npos);
  EXPECT_EQ(Call("GET", SbPath(id)).status, 404);
}

// ---- listings ----

std::string HugeName(int i) {
  char digits[8];
  std::snprintf(digits, sizeof digits, "%06d", i);
  return digits + std::string(194, 'x');
}

// Six clients list the directory at once, whole: 6 x 60.9 MB pass through the daemon, which
// never held a listing whole. Before it did, and its JSON, and kept what it freed: 7 MiB of RSS
// grew to 641-901 MiB. Control: every answer is the whole listing, sorted.
TEST_F(ExhaustionTest, SixHugeListingsAtOnceStayWithinTheDaemonsBound) {
  const std::string id = NewSandbox("listing");
  MakeHugeDirectory(id);
  const long rss0 = RssKib(daemon().pid());
  std::vector<std::thread> clients;
  std::vector<Response> answers(6);
  std::atomic<bool> done{false};
  long peak = rss0;
  std::thread sampler([&] {
    while (!done) {
      peak = std::max(peak, RssKib(daemon().pid()));
      std::this_thread::sleep_for(milliseconds(20));
    }
  });
  for (size_t i = 0; i < answers.size(); ++i) {
    clients.emplace_back([&, i] {
      Client c(daemon().endpoint());
      answers[i] = c.Request("POST", SbPath(id, "/fs/readdir"), R"({"path": "/tmp/huge"})", {},
                             milliseconds(300000));
    });
  }
  for (auto& t : clients) t.join();
  done = true;
  sampler.join();
  for (const Response& r : answers) {
    ASSERT_EQ(r.status, 200) << r.transport_error << r.body.substr(0, 300);
    // {"entries":[ 300,000 quoted names of 200 bytes, 299,999 commas ]}
    EXPECT_EQ(r.body.size(), 12u + 300000u * 202u + 299999u + 2u);
    json::value v = json::parse(r.body);
    const json::array& entries = v.at("entries").as_array();
    ASSERT_EQ(entries.size(), 300000u);
    EXPECT_EQ(entries.front().as_string(), HugeName(0));
    EXPECT_EQ(entries[123456].as_string(), HugeName(123456));
    EXPECT_EQ(entries.back().as_string(), HugeName(299999));
  }
  const long rss1 = RssKib(daemon().pid());
  std::fprintf(stderr, "daemon RSS: %ld MiB before, peak %ld MiB, %ld MiB after\n", rss0 / 1024,
               peak / 1024, rss1 / 1024);
  // At most 6 listings of about 10 MiB each in flight (docs/daemon.md), and given back after.
  EXPECT_LT(peak - rss0, 96L * 1024) << "the daemon grew by " << (peak - rss0) / 1024 << " MiB";
  EXPECT_LT(rss1 - rss0, 24L * 1024) << "the daemon kept " << (rss1 - rss0) / 1024 << " MiB";
}

// A client that asks for the huge listing and never reads: the daemon holds a few MiB for it,
// stops reading the sandbox's channel while they wait, and after 10 s cuts the answer short
// (no last chunk, the connection closed) and serves the sandbox again. Meanwhile every other
// sandbox and the daemon are served at once. Control: once cut off, the sandbox answers.
TEST_F(ExhaustionTest, AHugeListingsClientThatNeverReadsIsCutOff) {
  const std::string id = NewSandbox("stuck-listing");
  MakeHugeDirectory(id);
  const std::string other = NewSandbox("other");
  Sh(other, "true");
  const long rss0 = RssKib(daemon().pid());
  RawConnection raw(daemon().endpoint());
  const std::string body = R"({"path": "/tmp/huge"})";
  ASSERT_TRUE(raw.Send("POST " + SbPath(id, "/fs/readdir") +
                       " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body));
  const auto start = Clock::now();
  long worst = 0, rss = 0;
  for (int i = 0; i < 30; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    worst = std::max(worst, HealthLatencyMs());
    rss = std::max(rss, RssKib(daemon().pid()));
  }
  const auto other_start = Clock::now();
  EXPECT_EQ(Sh(other, "echo served"), "served\n");
  EXPECT_LT(Clock::now() - other_start, milliseconds(1000)) << "another sandbox waited";
  EXPECT_LT(worst, 1000) << "the daemon answered its health after " << worst << " ms";
  EXPECT_LT(rss - rss0, 32L * 1024) << "the daemon holds " << (rss - rss0) / 1024 << " MiB";
  // The sandbox's own verbs wait for the channel, at most until the cut.
  EXPECT_EQ(Sh(id, "echo served"), "served\n");
  const auto waited = Clock::now() - start;
  EXPECT_LT(waited, milliseconds(16000));
  std::string got;
  EXPECT_TRUE(raw.WaitClosed(milliseconds(20000), &got)) << "the answer was not cut short";
  EXPECT_NE(got.find("200 OK"), std::string::npos) << got.substr(0, 300);
  EXPECT_NE(got.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_EQ(got.find("\r\n0\r\n\r\n"), std::string::npos) << "a last chunk was sent";
  EXPECT_LT(got.size(), 16u * kMiB);
  // Control: a client that reads gets it whole meanwhile.
  Response whole = Fs(id, "readdir", json::object{{"path", "/tmp/huge"}});
  ASSERT_EQ(whole.status, 200) << whole.Describe();
  EXPECT_EQ(json::parse(whole.body).at("entries").as_array().size(), 300000u);
}

}  // namespace
}  // namespace nsbox::adversarial

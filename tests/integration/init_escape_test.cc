// The file verbs never leave the jail (api.md "Paths": the jail's / is the only root there is):
// symlinks to "/", "../..", "/etc", magic /proc links, a RENAME_EXCHANGE race, and atomic
// replacement as a concurrent reader sees it.

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "init_fixture.h"

namespace nsbox::itest {
namespace {

constexpr const char* kHostSecret = "HOST-SECRET";

std::vector<std::string> NamesOf(const fs::proto::ReaddirReply& r) {
  std::vector<std::string> names;
  for (const auto& e : r.entries) names.push_back(e.name);
  return names;
}

class InitEscapeTest : public InitTest {
 protected:
  void SetUp() override {
    InitTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    marker_name_ = "nsbox-itest-secret-" + std::to_string(::getpid());
    host_marker_ = std::make_unique<HostMarker>("/tmp/" + marker_name_, kHostSecret);
    host_hostname_ = ReadHostFile("/etc/hostname");
    ASSERT_NE(host_hostname_, "box\n") << "the host's hostname must differ from the jail's";
    // The jail's twin of the host marker, in the jail's own /tmp.
    Sh("printf jail-tmp > /tmp/" + marker_name_);
  }

  static std::string ReadHostFile(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
  }

  std::string marker_name_;
  std::unique_ptr<HostMarker> host_marker_;
  std::string host_hostname_;
};

TEST_F(InitEscapeTest, SymlinksToRootResolveToTheJailsRoot) {
  Sh("ln -s / l-root && ln -s ../.. l-up && ln -s ../../../../../../../../.. l-up-many && "
     "ln -s /etc l-etc && ln -s ../workspace/../../etc l-etc-rel && "
     "mkdir -p deep/er && ln -s ../../../.. deep/er/l-up");
  auto root_list = client().Readdir("/", false);
  ASSERT_TRUE(Succeeds(root_list));
  for (std::string link : {"/workspace/l-root", "/workspace/l-up", "/workspace/l-up-many",
                           "/workspace/deep/er/l-up"}) {
    SCOPED_TRACE(link);
    auto hostname = client().ReadFile(link + "/etc/hostname");
    ASSERT_TRUE(Succeeds(hostname));
    EXPECT_EQ(hostname.value(), "box\n");
    auto tmp = client().ReadFile(link + "/tmp/" + marker_name_);
    ASSERT_TRUE(Succeeds(tmp));
    EXPECT_EQ(tmp.value(), "jail-tmp");
    auto st = client().Stat(link + "/tmp/" + marker_name_);
    ASSERT_TRUE(Succeeds(st));
    EXPECT_EQ(st.value().size, 8u);
    auto st_link = client().Stat(link);
    ASSERT_TRUE(Succeeds(st_link));
    EXPECT_TRUE(st_link.value().is_directory);
    EXPECT_TRUE(st_link.value().is_symbolic_link);
    EXPECT_TRUE(client().Exists(link + "/workspace/nsbox-probe").value());
    EXPECT_FALSE(client().Exists(link + ws_.path()).value()) << "the host's workspace path";
    auto list = client().Readdir(link, false);
    ASSERT_TRUE(Succeeds(list));
    EXPECT_EQ(NamesOf(list.value()), NamesOf(root_list.value()));
  }
  for (std::string link : {"/workspace/l-etc", "/workspace/l-etc-rel"}) {
    auto hostname = client().ReadFile(link + "/hostname");
    ASSERT_TRUE(Succeeds(hostname)) << link;
    EXPECT_EQ(hostname.value(), "box\n") << link;
  }
  // "/.." is "/" as well.
  auto dotdot = client().ReadFile("/workspace/l-root/../../etc/hostname");
  if (dotdot.ok()) {
    EXPECT_EQ(dotdot.value(), "box\n");
  }
}

TEST_F(InitEscapeTest, WritesThroughSymlinksStayInTheJail) {
  const std::string pid = std::to_string(::getpid());
  Sh("ln -s / l-root && ln -s ../.. l-up && ln -s ../../../../../.. l-up-many && "
     "ln -s /tmp/final-abs-" +
     pid + " final-abs && ln -s ../../../../tmp/final-rel-" + pid +
     " final-rel && ln -s /proc/self/root/tmp/final-magic-" + pid + " final-magic");
  const std::vector<std::string> written = {"/workspace/l-root/tmp/w-root-" + pid,
                                            "/workspace/l-up/tmp/w-up-" + pid,
                                            "/workspace/l-up-many/tmp/w-up-many-" + pid};
  for (const auto& path : written) EXPECT_TRUE(Succeeds(client().WriteFile(path, "in jail")));
  EXPECT_TRUE(Succeeds(client().WriteFile("/workspace/final-abs", "abs")));
  EXPECT_TRUE(Succeeds(client().WriteFile("/workspace/final-rel", "rel")));
  auto magic = client().WriteFile("/workspace/final-magic", "magic");
  EXPECT_TRUE(Succeeds(client().Mkdir("/workspace/l-root/tmp/d-root-" + pid, false)));
  EXPECT_TRUE(Succeeds(client().Mkdir("/workspace/l-up/tmp/d-up-" + pid + "/x/y", true)));
  // rm through the link removes the jail's twin of the marker, never the host's file.
  EXPECT_TRUE(Succeeds(client().Rm("/workspace/l-root/tmp/" + marker_name_, false, false)));
  EXPECT_EQ(Sh("cd /tmp && cat w-root-" + pid + " w-up-" + pid + " w-up-many-" + pid +
               " final-abs-" + pid + " final-rel-" + pid + " && stat -c %F d-root-" + pid +
               " d-up-" + pid + "/x/y && (test -e " + marker_name_ + " || echo twin-removed)"),
            "in jailin jailin jailabsrel"
            "directory\ndirectory\ntwin-removed\n");
  if (magic.ok()) {
    EXPECT_EQ(Sh("cat /tmp/final-magic-" + pid), "magic");
  } else {
    EXPECT_EQ(magic.error().err, ELOOP) << Describe(magic.error());
  }
  // The host saw none of it.
  for (std::string name : {"w-root-", "w-up-", "w-up-many-", "final-abs-", "final-rel-",
                           "final-magic-", "d-root-", "d-up-"}) {
    EXPECT_FALSE(HostPathExists("/tmp/" + name + pid)) << "/tmp/" << name << pid << " on the host";
  }
  EXPECT_EQ(ReadHostFile(host_marker_->path()), kHostSecret);
}

// Magic links (/proc/PID/root, /proc/PID/cwd, /proc/self/fd/N) are refused (ELOOP) or resolve
// inside the jail; in particular nsbox-init's own fds (the control socket, the host's cgroup
// directory) never lead anywhere.
TEST_F(InitEscapeTest, MagicLinksAreRefusedOrStayInside) {
  Sh("ln -s /proc/self/root l-self-root && ln -s /proc/1/root l-init-root && "
     "ln -s /proc/1/cwd l-init-cwd");
  for (std::string base : {"/proc/self/root", "/proc/1/root", "/proc/thread-self/root",
                           "/workspace/l-self-root", "/workspace/l-init-root"}) {
    SCOPED_TRACE(base);
    auto r = client().ReadFile(base + "/etc/hostname");
    if (r.ok()) {
      EXPECT_EQ(r.value(), "box\n");
    } else {
      EXPECT_EQ(r.error().err, ELOOP) << Describe(r.error());
    }
    auto secret = client().ReadFile(base + "/tmp/" + marker_name_);
    if (secret.ok()) {
      EXPECT_EQ(secret.value(), "jail-tmp");
    }
    auto st = client().Stat(base + "/tmp/" + marker_name_);
    if (st.ok()) {
      EXPECT_EQ(st.value().size, 8u);
    }
    auto list = client().Readdir(base + "/tmp", false);
    auto jail_tmp = client().Readdir("/tmp", false);
    if (list.ok() && jail_tmp.ok()) {
      EXPECT_EQ(NamesOf(list.value()), NamesOf(jail_tmp.value()));
    }
    auto exists = client().Exists(base + "/tmp/" + marker_name_);
    EXPECT_TRUE(Succeeds(exists));
    auto made = client().Mkdir(base + "/tmp/magic-dir", true);
    if (made.ok()) {
      EXPECT_EQ(Sh("stat -c %F /tmp/magic-dir"), "directory\n");
    } else {
      EXPECT_EQ(made.error().err, ELOOP) << Describe(made.error());
    }
    auto w = client().WriteFile(base + "/tmp/magic-write", "x");
    if (!w.ok()) {
      EXPECT_EQ(w.error().err, ELOOP) << Describe(w.error());
    }
  }
  EXPECT_FALSE(HostPathExists("/tmp/magic-write"));
  EXPECT_FALSE(HostPathExists("/tmp/magic-dir"));
  // rm through them: the jail's twin at most, never the host's marker (checked at the end).
  for (std::string base : {"/proc/self/root", "/proc/1/root", "/workspace/l-self-root"}) {
    auto rm = client().Rm(base + "/tmp/" + marker_name_, false, true);
    if (!rm.ok()) {
      EXPECT_EQ(rm.error().err, ELOOP) << Describe(rm.error());
    }
  }
  // nsbox-init's control socket (fd 3) and the host's cgroup directory (fd 4) by magic link.
  EXPECT_TRUE(FailsWith(client().ReadFile("/proc/self/fd/3"), ELOOP));
  if (box_->cgroups().v2_dir_fd() >= 0) {
    EXPECT_TRUE(FailsWith(client().Readdir("/proc/self/fd/4", false), ELOOP));
    EXPECT_TRUE(FailsWith(client().ReadFile("/proc/self/fd/4/cgroup.procs"), ELOOP));
    EXPECT_TRUE(FailsWith(client().Mkdir("/proc/self/fd/4/escape", false), ELOOP));
  }
  for (std::string path : {"/proc/1/cwd", "/workspace/l-init-cwd", "/proc/self/cwd"}) {
    auto list = client().Readdir(path, false);
    if (!list.ok()) {
      EXPECT_EQ(list.error().err, ELOOP) << path << " " << Describe(list.error());
    }
  }
  // Every fd nsbox-init could hold.
  std::vector<std::string> cgroup_dirs = box_->cgroups().paths();
  for (int n = 0; n < 64; ++n) {
    const std::string fd = "/proc/self/fd/" + std::to_string(n);
    SCOPED_TRACE(fd);
    auto list = client().Readdir(fd, false);
    if (list.ok()) {
      for (const auto& name : NamesOf(list.value())) {
        EXPECT_NE(name, "cgroup.procs") << "a host cgroup directory through " << fd;
      }
    }
    auto procs = client().ReadFile(fd + "/cgroup.procs");
    EXPECT_FALSE(procs.ok()) << "read " << fd << "/cgroup.procs: " << procs.value();
    auto read = client().ReadFile(fd);
    if (read.ok()) {
      ADD_FAILURE() << "readFile " << fd << " read " << read.value().size() << " bytes";
    }
    EXPECT_FALSE(client().Exists(fd + "/cgroup.procs").value());
    auto made = client().Mkdir(fd + "/escape-" + std::to_string(n), false);
    EXPECT_FALSE(made.ok()) << "mkdir through " << fd;
    // Only where an fd is open: for a missing one writeFile's mkdir -p of the parent spins
    // (mkdir in /proc/self/fd is ENOENT forever) until its step bound, ~65 ms each.
    if (n < 16) {
      auto w = client().WriteFile(fd + "/written", "x");
      EXPECT_FALSE(w.ok()) << "writeFile through " << fd;
    }
  }
  for (const auto& dir : cgroup_dirs) {
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
    if (!d) continue;
    while (struct dirent* e = ::readdir(d.get())) {
      EXPECT_NE(std::string(e->d_name).rfind("escape-", 0), 0u) << dir << "/" << e->d_name;
    }
  }
  EXPECT_EQ(ReadHostFile(host_marker_->path()), kHostSecret);
}

// A command swaps a directory and a symlink to "/" as fast as it can (renameat2
// RENAME_EXCHANGE) while the client resolves paths through the swapped name: every answer is
// the directory's file, the jail's file, or an error; never the host's, and no write lands
// outside the jail.
TEST_F(InitEscapeTest, RenameExchangeRaceNeverEscapes) {
  const std::string pid = std::to_string(::getpid());
  Sh("mkdir -p r/a/tmp r/a/etc && printf dir-tmp > r/a/tmp/" + marker_name_ +
     " && printf 'dir-hostname\\n' > r/a/etc/hostname && ln -s / r/b");
  // One exchange by hand first: the racer must really swap (x86_64 renameat2 is 316).
  ASSERT_EQ(Sh("cd r && perl -e 'my ($a, $b) = (\"a\", \"b\"); "
               "syscall(316, -100, $a, -100, $b, 2) == 0 or die $!; "
               "syscall(316, -100, $a, -100, $b, 2) == 0 or die $!; print \"ok\"' && "
               "stat -c %F a b"),
            "okdirectory\nsymbolic link\n");
  auto racer = Start(
      "cd /workspace/r && echo racing && exec perl -e "
      "'my ($a, $b) = (\"a\", \"b\"); "
      "while (1) { syscall(316, -100, $a, -100, $b, 2) == 0 or die \"renameat2: $!\" }'");
  ASSERT_TRUE(racer->WaitForOutput("racing")) << racer->Result().Describe();

  constexpr int kThreads = 4;
  constexpr int kPerThread = 2500;
  std::mutex mu;
  std::map<std::string, int> seen;  // outcome -> count
  std::vector<std::string> escapes;
  auto note = [&](const std::string& outcome, bool escaped) {
    std::lock_guard<std::mutex> lock(mu);
    ++seen[outcome];
    if (escaped && escapes.size() < 10) escapes.push_back(outcome);
  };
  const std::string marker_path = "/workspace/r/a/tmp/" + marker_name_;
  auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        switch (i % 4) {
          case 0: {
            auto r = client().ReadFile(marker_path);
            if (!r.ok()) {
              note("read marker: " + ErrnoName(r.error().err), false);
            } else {
              bool ok = r.value() == "dir-tmp" || r.value() == "jail-tmp";
              note("read marker: " + r.value(), !ok);
            }
            break;
          }
          case 1: {
            auto r = client().ReadFile("/workspace/r/a/etc/hostname");
            if (!r.ok()) {
              note("read hostname: " + ErrnoName(r.error().err), false);
            } else {
              bool ok = r.value() == "dir-hostname\n" || r.value() == "box\n";
              note("read hostname: " + r.value(), !ok);
            }
            break;
          }
          case 2: {
            auto r = client().Stat(marker_path);
            if (!r.ok()) {
              note("stat marker: " + ErrnoName(r.error().err), false);
            } else {
              bool ok = r.value().size == 7 || r.value().size == 8;
              note("stat marker size " + std::to_string(r.value().size), !ok);
            }
            break;
          }
          default: {
            auto r = client().WriteFile(
                "/workspace/r/a/tmp/nsbox-race-w-" + pid + "-" + std::to_string(t), "w");
            note(r.ok() ? "write ok" : "write: " + ErrnoName(r.error().err), false);
            break;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  auto took = Since(start);

  EXPECT_FALSE(racer->done) << "the racer stopped early: " << racer->Result().Describe();
  client().KillExec(racer->tag, Reason(exec::EndReason::kCancelled));
  ASSERT_TRUE(racer->WaitDone(milliseconds(5000)));
  EXPECT_TRUE(racer->Result().exit.cancelled) << racer->Result().Describe();

  std::string summary;
  for (const auto& [k, v] : seen) summary += "  " + k + " x" + std::to_string(v) + "\n";
  EXPECT_TRUE(escapes.empty()) << "host content reached through the race:\n" << summary;
  EXPECT_LT(took.count(), 20000) << summary;
  std::printf("rename-exchange race: %d calls in %lld ms\n%s", kThreads * kPerThread,
              static_cast<long long>(took.count()), summary.c_str());
  // No write reached the host's /tmp.
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir("/tmp"), ::closedir);
  ASSERT_TRUE(d);
  while (struct dirent* e = ::readdir(d.get())) {
    EXPECT_NE(std::string(e->d_name).rfind("nsbox-race-w-" + pid, 0), 0u)
        << "/tmp/" << e->d_name << " written on the host";
  }
  EXPECT_EQ(ReadHostFile(host_marker_->path()), kHostSecret);
}

// writeFile replaces atomically: a command reading the file in a loop while the client
// rewrites it 200 times sees wholly the one content or wholly the other, every time.
TEST_F(InitEscapeTest, ConcurrentReaderSeesOldOrNewNeverAMix) {
  const std::string a(70000, 'A');
  const std::string b(50000, 'B');
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/f", a)));
  auto req = Request(
      "exec perl -e '$| = 1; my ($n, $bad, $miss) = (0, 0, 0); "
      "my ($A, $B) = (\"A\" x 70000, \"B\" x 50000); print \"ready\\n\"; "
      "until (-e \"/workspace/stop\") { "
      "  if (open(my $f, \"<\", \"/workspace/f\")) { local $/; my $d = <$f>; close $f; $n++; "
      "    $bad++ unless $d eq $A || $d eq $B; } else { $miss++ } } "
      "print \"reads=$n bad=$bad missing=$miss\\n\"'");
  req.timeout_ms = 60000;
  auto reader = Start(req);
  ASSERT_TRUE(reader->WaitForOutput("ready")) << reader->Result().Describe();
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/f", i % 2 == 0 ? b : a))) << i;
  }
  ASSERT_TRUE(Succeeds(client().WriteFile("/workspace/stop", "")));
  ASSERT_TRUE(reader->WaitDone(milliseconds(10000)));
  ExecRun run = reader->Result();
  ASSERT_TRUE(run.ok) << run.Describe();
  EXPECT_EQ(run.exit.exit_code, 0) << run.Describe();
  std::string line = run.out.substr(run.out.find('\n') + 1);
  EXPECT_NE(line.find(" bad=0 missing=0\n"), std::string::npos) << run.Describe();
  EXPECT_EQ(line.find("reads=0 "), std::string::npos) << run.Describe();
  auto final_read = client().ReadFile("/workspace/f");
  ASSERT_TRUE(Succeeds(final_read));
  EXPECT_TRUE(final_read.value() == a) << "the last write (A) must be what stays";
}

}  // namespace
}  // namespace nsbox::itest

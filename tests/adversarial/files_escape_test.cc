// Group "file API escapes" (docs/security.md): every file verb, given paths and links an
// attacker inside the sandbox chose, stays in the jail. The verbs run in nsbox-init, inside the
// jail's mount namespace, resolving with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS), so
// the jail's "/" is the only root there is. Each case's control shows that what the attack aims
// at exists on the host (the canary holds the token) and that the verb itself works.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "tests/adversarial/fixture.h"

namespace nsbox::adversarial {
namespace {

class FilesEscapeTest : public AdversarialTest {
 protected:
  void SetUp() override {
    AdversarialTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    id_ = NewSandbox();
    hostname_ = Sh(id_, "hostname");
    ASSERT_NE(hostname_, e2e::ReadHostFile("/etc/hostname"))
        << "control: the jail's hostname must differ from the host's";
  }

  // The canary file's name (its directory is /var/tmp on the host).
  std::string CanaryName() const {
    return canaries().file().substr(canaries().file().rfind('/') + 1);
  }

  // Every verb on `path` (mkdir below it): "verb=status[:code]" for each, in one line.
  std::string AllVerbs(const std::string& path) {
    auto one = [](const char* verb, const Response& r) {
      return std::string(verb) + "=" + std::to_string(r.status) +
             (r.ErrorCode().empty() ? "" : ":" + r.ErrorCode()) + " ";
    };
    std::string out;
    out += one("read", GetFile(id_, path));
    out += one("stat", Fs(id_, "stat", {{"path", path}}));
    Response ex = Fs(id_, "exists", {{"path", path}});
    out += "exists=" + json::serialize(Field(Obj(ex), "exists")) + " ";
    out += one("readdir", Fs(id_, "readdir", {{"path", path}}));
    out += one("write", PutFile(id_, path, "x"));
    out += one("mkdir", Fs(id_, "mkdir", {{"path", path + "/d"}, {"recursive", true}}));
    Response rm = Fs(id_, "rm", {{"path", path}, {"recursive", true}});
    out += "rm=" + std::to_string(rm.status) + (rm.ErrorCode().empty() ? "" : ":" + rm.ErrorCode());
    return out;
  }

  std::string id_;
  std::string hostname_;
};

// `..` and absolute host paths: /var/tmp does not exist in the jail, so reads are ENOENT and
// writes hit the read-only root (EROFS) before anything is made.
TEST_F(FilesEscapeTest, DotDotAndAbsoluteHostPathsStayInTheJail) {
  // Control: the canary is on the host, and `..` folding works (it reaches a jail file).
  ASSERT_TRUE(canaries().FilesIntact());
  Sh(id_, "printf inside > /tmp/dotdot");
  Response inside = GetFile(id_, "../../../../../tmp/dotdot");
  ASSERT_EQ(inside.status, 200) << inside.Describe();
  EXPECT_EQ(inside.body, "inside");

  const std::string name = CanaryName();
  for (const std::string& path :
       {canaries().file(), "../../../../../../../var/tmp/" + name,
        "/workspace/../../../../var/tmp/" + name, "/./var/./tmp/../tmp/" + name}) {
    SCOPED_TRACE(path);
    EXPECT_EQ(AllVerbs(path),
              "read=404:ENOENT stat=404:ENOENT exists=false readdir=404:ENOENT write=404:ENOENT "
              "mkdir=404:ENOENT rm=404:ENOENT");
    // writeFile makes the missing parents as Node's mkdir -p does, which answers the stat of
    // the first one it could not make: ENOENT for /var on the read-only root.
    Response w = PutFile(id_, path, "x");
    EXPECT_EQ(w.ErrorCode(), "ENOENT") << w.Describe();
    EXPECT_EQ(w.ErrorMessage(), "ENOENT: no such file or directory, mkdir '/var'");
  }
  // The host's /tmp twin: the jail's /tmp is its own tmpfs.
  Response tmp = GetFile(id_, canaries().tmp_file());
  EXPECT_EQ(tmp.status, 404) << tmp.Describe();
  EXPECT_EQ(tmp.ErrorCode(), "ENOENT");
  EXPECT_TRUE(canaries().FilesIntact());
}

// A symlink to "/" (absolute or by `..`) is the jail's root for every verb.
TEST_F(FilesEscapeTest, SymlinksToRootAreTheJailsRootForEveryVerb) {
  Sh(id_, "ln -s / r && ln -s ../../../../.. up && mkdir -p a/b && ln -s ../../../../../.. a/b/up");
  Response root = Fs(id_, "readdir", {{"path", "/"}});
  ASSERT_EQ(root.status, 200);
  for (const std::string link : {"/workspace/r", "/workspace/up", "/workspace/a/b/up"}) {
    SCOPED_TRACE(link);
    Response h = GetFile(id_, link + "/etc/hostname");
    ASSERT_EQ(h.status, 200) << h.Describe();
    EXPECT_EQ(h.body, hostname_) << "the jail's /etc/hostname";
    Response list = Fs(id_, "readdir", {{"path", link}});
    EXPECT_EQ(list.body, root.body);
    Response st = Fs(id_, "stat", {{"path", link + "/workspace"}});
    EXPECT_EQ(Field(Obj(st), "isDirectory"), json::value(true)) << st.Describe();
    EXPECT_EQ(AllVerbs(link + "/var/tmp/" + CanaryName()),
              "read=404:ENOENT stat=404:ENOENT exists=false readdir=404:ENOENT write=404:ENOENT "
              "mkdir=404:ENOENT rm=404:ENOENT");
    // Writes through the link land in the jail's /tmp, never the host's.
    EXPECT_EQ(PutFile(id_, link + "/tmp/via-link", "jail").status, 204);
    EXPECT_EQ(Fs(id_, "mkdir", {{"path", link + "/tmp/dir-via-link"}}).status, 204);
    EXPECT_EQ(Sh(id_, "cat /tmp/via-link && test -d /tmp/dir-via-link && echo ok"), "jailok\n");
    EXPECT_EQ(Fs(id_, "rm", {{"path", link + "/tmp/dir-via-link"}, {"recursive", true}}).status,
              204);
    EXPECT_EQ(Fs(id_, "rm", {{"path", link + "/tmp/via-link"}}).status, 204);
  }
  EXPECT_NE(access("/tmp/via-link", F_OK), 0) << "a file reached the host's /tmp";
  EXPECT_NE(access("/tmp/dir-via-link", F_OK), 0) << "a directory reached the host's /tmp";
}

// Symlinks to paths that exist on the host (the sandbox's own host directory, the state dir, the
// socket, the token file, the canary, the daemon's /proc entry) lead nowhere in the jail.
TEST_F(FilesEscapeTest, SymlinksToHostPathsLeadNowhere) {
  ExpectInitAnswers(id_);
  const std::string own = daemon().SandboxDir(id_);
  ASSERT_FALSE(own.empty());
  const std::vector<std::string> targets = {
      own + "/workspace",     daemon().state_dir(),
      daemon().socket_path(), daemon().dir() + "/token",
      canaries().file(),      "/proc/" + std::to_string(daemon().pid()) + "/environ",
      daemon().log_path()};
  int n = 0;
  for (const auto& target : targets) {
    SCOPED_TRACE(target);
    // Control: it is there on the host.
    ASSERT_EQ(access(target.c_str(), F_OK), 0) << target;
    const std::string link = "/workspace/host-" + std::to_string(n++);
    Sh(id_, "ln -s '" + target + "' " + link);
    const std::string verbs = AllVerbs(link);
    // Reads find nothing (the path does not exist in the jail); a write makes the missing
    // parents as Node's mkdir -p does and stops at the read-only root (ENOENT, Node's answer);
    // mkdir below a dangling link is ENOTDIR; rm of the link (the sandbox's own file) succeeds.
    EXPECT_EQ(verbs,
              "read=404:ENOENT stat=404:ENOENT exists=false readdir=404:ENOENT write=404:ENOENT "
              "mkdir=400:ENOTDIR rm=204");
  }
  EXPECT_TRUE(canaries().FilesIntact());
  EXPECT_EQ(access(daemon().socket_path().c_str(), F_OK), 0);
}

// The directory/symlink swap (CVE-2018-15664's shape): an attacker exchanges a directory and a
// symlink to a host-looking path with renameat2(RENAME_EXCHANGE) as fast as it can while the
// verbs run 10,000 times. Each answer is one of the jail's two states, never the host's file.
TEST_F(FilesEscapeTest, RenameExchangeRaceAgainstEveryVerb) {
  InstallTools(id_);
  const std::string name = CanaryName();
  Sh(id_, "mkdir -p race/d && printf in-dir > race/d/" + name + " && ln -s /var/tmp race/s");
  // The swapper runs in the background until the stop file appears (or 120 s).
  ExecResult bg = Exec(id_, std::string("cd race && (") + kJailAttacker +
                                " exchange d s /workspace/stop 120 > /workspace/swaps.txt &)");
  ASSERT_EQ(bg.exit_code(), 0) << bg.Describe();
  const std::string path = "/workspace/race/d/" + name;
  int in_dir = 0, enoent = 0, other = 0;
  std::string others;
  const int kIterations = 10000;
  for (int i = 0; i < kIterations; ++i) {
    Response r;
    switch (i % 5) {
      case 0:
      case 1:
        r = GetFile(id_, path);
        if (r.status == 200 && r.body == "in-dir") ++in_dir;
        break;
      case 2:
        r = Fs(id_, "stat", {{"path", path}});
        if (r.status == 200 && Field(Obj(r), "size") == json::value(6)) ++in_dir;
        break;
      case 3:
        r = Fs(id_, "readdir", {{"path", "/workspace/race/d"}});
        if (r.status == 200 && r.body == "{\"entries\":[\"" + name + "\"]}") ++in_dir;
        break;
      default:
        r = Fs(id_, "exists", {{"path", path}});
        if (r.status == 200 && r.body == "{\"exists\":true}") ++in_dir;
        if (r.status == 200 && r.body == "{\"exists\":false}") ++enoent;
        break;
    }
    if (r.status == 404 && r.ErrorCode() == "ENOENT") ++enoent;
    const bool known = (r.status == 200) || (r.status == 404 && r.ErrorCode() == "ENOENT");
    if (!known) {
      ++other;
      if (others.size() < 2000) others += r.Describe() + "\n";
    }
    ASSERT_EQ(r.body.find(canaries().token()), std::string::npos) << "the host's file was read";
  }
  Sh(id_,
     "touch /workspace/stop; for i in $(seq 100); do test -s /workspace/swaps.txt && break; "
     "sleep 0.05; done");
  KeyValues swaps = ParseKeyValues(Sh(id_, "cat /workspace/swaps.txt"));
  EXPECT_EQ(in_dir + enoent, kIterations) << others;
  EXPECT_EQ(other, 0) << others;
  // Control: the race was live (the swapper swapped, and both states were seen).
  EXPECT_GT(std::stol(Get(swaps, "swaps") == "<missing>" ? "0" : Get(swaps, "swaps")), 1000);
  EXPECT_GT(in_dir, 0);
  EXPECT_GT(enoent, 0) << "the symlink state was never observed: the race did not happen";
  EXPECT_TRUE(canaries().FilesIntact());
}

// A FIFO, a socket and devices given to readFile and writeFile: an answer within 1 s (EINVAL),
// never a hang, and no growth of the daemon's memory.
TEST_F(FilesEscapeTest, FifoSocketAndDevicesAnswerAtOnce) {
  InstallTools(id_);
  Sh(id_, std::string("mkfifo fifo && ") + kJailAttacker +
              " sock /workspace/sock >/dev/null && ln -s /dev/zero zero && ln -s fifo fifo-link");
  // Control: a naive reader of the FIFO hangs (timeout(1) ends it), /dev/zero never ends.
  ExecResult hang = Exec(id_, "timeout 1 cat fifo; echo rc=$?");
  EXPECT_EQ(hang.out(), "rc=124\n") << hang.Describe();
  EXPECT_EQ(Sh(id_, "head -c 4096 /dev/zero | wc -c"), "4096\n");
  const long rss_before = RssKib(daemon().pid());
  for (const std::string path :
       {"/workspace/fifo", "/workspace/sock", "/workspace/zero", "/workspace/fifo-link",
        "/dev/zero", "/dev/urandom", "/dev/random", "/dev/tty", "/dev/ptmx", "/dev/full",
        "/dev/null", "/dev/pts/ptmx"}) {
    SCOPED_TRACE(path);
    for (int round = 0; round < 5; ++round) {
      const auto t0 = Clock::now();
      Response r = GetFile(id_, path, milliseconds(5000));
      const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
      EXPECT_EQ(r.status, 400) << r.Describe();
      EXPECT_EQ(r.ErrorCode(), "EINVAL") << r.Describe();
      EXPECT_LT(took, 1000);
    }
    const auto t0 = Clock::now();
    Response w = PutFile(id_, path, "never written");
    EXPECT_LT(std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count(), 1000);
    EXPECT_EQ(w.status, 400) << w.Describe();
    EXPECT_EQ(w.ErrorCode(), "EINVAL") << w.Describe();
  }
  // Nothing was written into the FIFO or over the devices.
  EXPECT_EQ(Sh(id_, "stat -c %F fifo sock; timeout 1 cat fifo; echo rc=$?"),
            "fifo\nsocket\nrc=124\n");
  const long rss_after = RssKib(daemon().pid());
  EXPECT_LT(rss_after - rss_before, 8 * 1024)
      << "the daemon grew by " << rss_after - rss_before << " KiB";
}

// PATH_MAX and NAME_MAX: a path of 4097 bytes and a name of 256 are ENAMETOOLONG for every verb
// (exists: false). Control: a name of 255 bytes and a path just under 4096 work.
TEST_F(FilesEscapeTest, OverlongPathsAndNames) {
  const std::string name255(255, 'n');
  const std::string name256(256, 'n');
  // A directory chain of 200-byte names up to 3,900 bytes; the file's name fills up the rest.
  std::string deep = "/workspace";
  while (4093 - deep.size() > 250) deep += "/" + std::string(200, 'd');
  ASSERT_EQ(Fs(id_, "mkdir", {{"path", deep}, {"recursive", true}}).status, 204);
  const std::string ok_path = deep + "/" + std::string(4094 - deep.size() - 1, 'f');
  ASSERT_LT(4094 - deep.size() - 1, 256u);
  ASSERT_EQ(ok_path.size(), 4094u);
  EXPECT_EQ(PutFile(id_, ok_path, "deep").status, 204);
  EXPECT_EQ(GetFile(id_, ok_path).body, "deep");
  EXPECT_EQ(PutFile(id_, "/workspace/" + name255, "255").status, 204);
  EXPECT_EQ(GetFile(id_, "/workspace/" + name255).body, "255");

  const std::string too_long = deep + "/" + std::string(4097 - deep.size() - 1, 'f');
  ASSERT_EQ(too_long.size(), 4097u);
  for (const std::string& path : {too_long, "/workspace/" + name256}) {
    SCOPED_TRACE(path.size());
    for (const auto& [verb, r] : std::vector<std::pair<std::string, Response>>{
             {"read", GetFile(id_, path)},
             {"write", PutFile(id_, path, "x")},
             {"stat", Fs(id_, "stat", {{"path", path}})},
             {"readdir", Fs(id_, "readdir", {{"path", path}})},
             {"mkdir", Fs(id_, "mkdir", {{"path", path}, {"recursive", true}})},
             {"rm", Fs(id_, "rm", {{"path", path}, {"recursive", true}})}}) {
      EXPECT_EQ(r.status, 400) << verb << ": " << r.Describe();
      EXPECT_EQ(r.ErrorCode(), "ENAMETOOLONG") << verb << ": " << r.Describe();
    }
    EXPECT_EQ(Fs(id_, "exists", {{"path", path}}).body, "{\"exists\":false}");
  }
}

// A tree 5,000 directories deep (made from inside, far deeper than PATH_MAX): the verbs answer
// ENAMETOOLONG past PATH_MAX, readdir and stat work on its top, and rm -r removes it all with
// two fds whatever the depth.
TEST_F(FilesEscapeTest, TreeFiveThousandDeep) {
  ExecResult made = Exec(id_,
                         json::object{{"command",
                                       "python3 -c \"import os\n"
                                       "os.mkdir('deep'); os.chdir('deep')\n"
                                       "for i in range(4999):\n"
                                       "  os.mkdir('d'); os.chdir('d')\n"
                                       "open('leaf','w').write('bottom')\"; "
                                       "find deep -type d | wc -l"}},
                         milliseconds(60000));
  ASSERT_EQ(made.exit_code(), 0) << made.Describe();
  EXPECT_EQ(made.out(), "5000\n") << "control: the tree is 5,000 deep";
  Response top = Fs(id_, "readdir", {{"path", "/workspace/deep"}});
  EXPECT_EQ(top.body, "{\"entries\":[\"d\"]}") << top.Describe();
  std::string beyond = "/workspace/deep";
  for (int i = 0; i < 2100; ++i) beyond += "/d";
  Response st = Fs(id_, "stat", {{"path", beyond}});
  EXPECT_EQ(st.status, 400) << st.Describe();
  EXPECT_EQ(st.ErrorCode(), "ENAMETOOLONG");
  const auto t0 = Clock::now();
  Response rm =
      Fs(id_, "rm", {{"path", "/workspace/deep"}, {"recursive", true}}, milliseconds(60000));
  EXPECT_EQ(rm.status, 204) << rm.Describe();
  EXPECT_LT(std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count(), 30000);
  EXPECT_EQ(Fs(id_, "exists", {{"path", "/workspace/deep"}}).body, "{\"exists\":false}");
  EXPECT_EQ(Sh(id_, "ls -A /workspace | wc -l"), "0\n");
}

// /proc/self/... and /proc/1/... magic links: refused (ELOOP) by every verb, also behind an
// ordinary symlink. Control: a command follows the same links (they exist and work).
TEST_F(FilesEscapeTest, ProcMagicLinksAreRefusedByEveryVerb) {
  Sh(id_, "ln -s /proc/self/root l-self-root && ln -s /proc/1/cwd l-init-cwd");
  EXPECT_EQ(Sh(id_, "readlink /proc/self/root; cat /proc/self/root/etc/hostname"),
            "/\n" + hostname_)
      << "control: a command follows magic links";
  for (const std::string base :
       {"/proc/self/root", "/proc/1/root", "/proc/thread-self/root", "/proc/self/cwd",
        "/proc/1/cwd", "/proc/self/fd/3", "/proc/self/fd/4", "/workspace/l-self-root",
        "/workspace/l-init-cwd"}) {
    SCOPED_TRACE(base);
    for (const std::string& path : {base, base + "/etc/hostname"}) {
      Response r = GetFile(id_, path);
      EXPECT_EQ(r.status, 400) << r.Describe();
      EXPECT_EQ(r.ErrorCode(), "ELOOP") << r.Describe();
      Response st = Fs(id_, "stat", {{"path", path}});
      // The lstat of such a link in nsbox-init's own /proc entry finds nothing: that entry is
      // not there for the verbs (TheServersOwnProcEntriesAreHiddenAsFromCommands).
      const bool own_entry = path == base && base.starts_with("/proc/");
      EXPECT_EQ(st.ErrorCode(), own_entry ? "ENOENT" : "ELOOP") << st.Describe();
      EXPECT_EQ(Fs(id_, "exists", {{"path", path}}).body, "{\"exists\":false}");
    }
    EXPECT_EQ(Fs(id_, "readdir", {{"path", base}}).ErrorCode(), "ELOOP");
    EXPECT_EQ(Fs(id_, "mkdir", {{"path", base + "/x"}, {"recursive", true}}).ErrorCode(), "ELOOP");
    EXPECT_EQ(PutFile(id_, base + "/tmp/x", "x").ErrorCode(), "ELOOP");
    EXPECT_EQ(Fs(id_, "rm", {{"path", base + "/tmp/x"}, {"force", true}}).ErrorCode(), "ELOOP");
  }
  EXPECT_NE(access("/tmp/x", F_OK), 0);
}

// nsbox-init's own /proc files cannot be read through the API (they are not there for the verbs,
// as for a command: TheServersOwnProcEntriesAreHiddenAsFromCommands), so neither its
// environment, nor its memory, nor its command line reach a client. Control: the daemon's
// environment on the host does hold the canary, so a leak would be seen.
TEST_F(FilesEscapeTest, InitsProcFilesHoldNoSecret) {
  ASSERT_NE(e2e::ReadHostFile("/proc/" + std::to_string(daemon().pid()) + "/environ")
                .find(canaries().token()),
            std::string::npos)
      << "control: the daemon's environment holds the canary";
  for (const std::string path :
       {"/proc/self/environ", "/proc/1/environ", "/proc/thread-self/environ", "/proc/self/mem",
        "/proc/1/mem", "/proc/1/cmdline", "/proc/1/maps", "/proc/1/status", "/proc/self/maps"}) {
    SCOPED_TRACE(path);
    Response r = GetFile(id_, path);
    EXPECT_EQ(r.status, 404) << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "ENOENT") << r.Describe();
    EXPECT_EQ(r.body.find(canaries().token()), std::string::npos);
    EXPECT_EQ(r.body.find(daemon().dir()), std::string::npos);
    EXPECT_EQ(r.body.find("nsbox-init"), std::string::npos);
  }
}

// Writes to the read-only root, the host's /usr, /proc and /etc: refused, the host unchanged.
// A recursive rm of a place that cannot be removed (a mount point, or in a read-only directory)
// is refused before anything in it is touched, as Node's rm tries rmdir first: the sandbox's
// files in /workspace, /tmp and /root are all still there afterwards.
TEST_F(FilesEscapeTest, ReadOnlyPlacesRefuseEveryWrite) {
  const std::string ls_before = e2e::ReadHostFile("/usr/bin/ls");
  const std::string passwd_before = e2e::ReadHostFile("/etc/passwd");
  Sh(id_,
     "mkdir -p /workspace/keep/d && echo w > /workspace/keep/d/f && echo t > /tmp/keep && "
     "echo r > /root/keep");
  struct Case {
    std::string verb, path;
    int status;
    std::string code;
  };
  const bool sysrq = access("/proc/sysrq-trigger", F_OK) == 0;
  const std::vector<Case> cases = {
      {"write", "/etc/passwd", 403, "EROFS"},
      {"write", "/usr/bin/ls", 403, "EROFS"},
      {"write", "/newfile", 403, "EROFS"},
      // Missing parents are made as Node's mkdir -p does, which answers the stat of the first
      // one it could not make.
      {"write", "/usr/lib/x/y", 404, "ENOENT"},
      // Masked with /dev/null where the host has it: a device, not a file to replace.
      {"write", "/proc/sysrq-trigger", sysrq ? 400 : 404, sysrq ? "EINVAL" : "ENOENT"},
      // Files of /proc that are there: no new file can be made beside them to replace them with.
      {"write", "/proc/sys/kernel/core_pattern", 403, "EPERM"},
      // nsbox-init's own: not there for the verbs (TheServersOwnProcEntriesAreHidden...).
      {"write", "/proc/1/oom_score_adj", 404, "ENOENT"},
      {"mkdir", "/usr/nsbox-adv", 403, "EROFS"},
      {"mkdir", "/etc/nsbox-adv", 403, "EROFS"},
      {"mkdir -p", "/usr/nsbox-adv/x", 404, "ENOENT"},
      {"rm", "/etc/hostname", 403, "EROFS"},
      {"rm", "/usr/bin/ls", 403, "EROFS"},
      {"rm", "/workspace", 403, "EROFS"},
      {"rm", "/tmp", 403, "EROFS"},
      {"rm", "/", 409, "EBUSY"},
      {"rm", "/dev", 403, "EROFS"},
      {"rm", "/usr/share", 403, "EROFS"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.verb + " " + c.path);
    Response r = c.verb == "write"      ? PutFile(id_, c.path, "owned")
                 : c.verb == "mkdir"    ? Fs(id_, "mkdir", {{"path", c.path}})
                 : c.verb == "mkdir -p" ? Fs(id_, "mkdir", {{"path", c.path}, {"recursive", true}})
                                        : Fs(id_, "rm", {{"path", c.path}, {"recursive", true}});
    EXPECT_EQ(r.status, c.status) << r.Describe();
    EXPECT_EQ(r.ErrorCode(), c.code) << r.Describe();
  }
  EXPECT_EQ(e2e::ReadHostFile("/usr/bin/ls"), ls_before);
  EXPECT_EQ(e2e::ReadHostFile("/etc/passwd"), passwd_before);
  EXPECT_EQ(Sh(id_, "test -d /workspace && test -d /tmp && cat /etc/hostname"), hostname_);
  EXPECT_EQ(Sh(id_, "cat /workspace/keep/d/f /tmp/keep /root/keep"), "w\nt\nr\n")
      << "a refused rm emptied what it could not remove";
  EXPECT_EQ(Sh(id_, "test -e /dev/null && test -e /usr/share/doc && echo there"), "there\n");
  Response rm_root = Fs(id_, "rm", {{"path", "/"}, {"recursive", true}, {"force", true}});
  EXPECT_EQ(rm_root.ErrorMessage(), "EBUSY: resource busy or locked, rmdir '/'")
      << rm_root.Describe();
}

// The file verbs run as nsbox-init, which the kernel shows its own /proc entries whatever
// hidepid says: they are not there for the verbs either, as they are not for a command (its
// memory map, fds, command line and environment). Other processes' entries are, as a command
// sees them.
TEST_F(FilesEscapeTest, TheServersOwnProcEntriesAreHiddenAsFromCommands) {
  // Control: what a command sees of PID 1.
  EXPECT_EQ(Sh(id_, "test -e /proc/1 || echo hidden"), "hidden\n");
  const std::string sleeper = Sh(id_, "sleep 60 > /dev/null 2>&1 & echo $!");
  ASSERT_FALSE(sleeper.empty());
  const std::string pid = sleeper.substr(0, sleeper.size() - 1);
  // Its directory, as a command's `test -e /proc/1` finds it: not there.
  for (const std::string path : {"/proc/1", "/proc/self", "/proc/1/fd", "/proc/self/fd",
                                 "/proc/1/task", "/proc/thread-self"}) {
    SCOPED_TRACE(path);
    EXPECT_EQ(Fs(id_, "stat", {{"path", path}}).ErrorCode(), "ENOENT");
    EXPECT_EQ(Fs(id_, "readdir", {{"path", path}}).ErrorCode(), "ENOENT");
    EXPECT_EQ(Fs(id_, "exists", {{"path", path}}).body, "{\"exists\":false}");
  }
  EXPECT_EQ(Fs(id_, "rm", {{"path", "/proc/1"}, {"recursive", true}}).ErrorCode(), "ENOENT");
  // /proc's listing names the command's process, not PID 1's.
  const json::value listing = Field(Obj(Fs(id_, "readdir", {{"path", "/proc"}})), "entries");
  ASSERT_TRUE(listing.is_array()) << json::serialize(listing);
  std::vector<std::string> names;
  for (const json::value& e : listing.as_array()) names.push_back(std::string(e.as_string()));
  EXPECT_EQ(std::count(names.begin(), names.end(), "1"), 0);
  EXPECT_EQ(std::count(names.begin(), names.end(), pid), 1) << pid;
  EXPECT_EQ(std::count(names.begin(), names.end(), "self"), 1);
  // Control: a command's own entries and procfs's files are read as a command reads them.
  Response cmdline = GetFile(id_, "/proc/" + pid + "/cmdline");
  EXPECT_EQ(cmdline.status, 200) << cmdline.Describe();
  EXPECT_EQ(cmdline.body, std::string("sleep\0"
                                      "60\0",
                                      9));
  EXPECT_EQ(GetFile(id_, "/proc/sys/kernel/ostype").body, "Linux\n");
  Sh(id_, "kill " + pid);
}

// A NUL byte, pathBase64 of a traversal, malformed base64: refused or confined.
TEST_F(FilesEscapeTest, NulBytesAndBase64Paths) {
  const std::string nul = std::string("/workspace/a") + '\0' + "/../../var/tmp";
  Response r = Call("GET", SbPath(id_, "/files?path=" + PctEncode(nul)));
  EXPECT_EQ(r.status, 400) << r.Describe();
  EXPECT_EQ(r.ErrorCode(), "invalid_request");
  Response ex =
      Call("POST", SbPath(id_, "/fs/exists"), "{\"path\":\"/workspace/a\\u0000/../../etc\"}",
           {{"Content-Type", "application/json"}});
  EXPECT_EQ(ex.body, "{\"exists\":false}") << ex.Describe();
  Response b64 = Call(
      "GET", SbPath(id_, "/files?pathBase64=" +
                             PctEncode(e2e::Base64Encode("../../../../var/tmp/" + CanaryName()))));
  EXPECT_EQ(b64.status, 404) << b64.Describe();
  EXPECT_EQ(b64.ErrorCode(), "ENOENT");
  Response bad = Call("GET", SbPath(id_, "/files?pathBase64=%%%%"));
  EXPECT_EQ(bad.status, 400) << bad.Describe();
  Response bad2 = Call("GET", SbPath(id_, "/files?pathBase64=" + PctEncode("*not base64*")));
  EXPECT_EQ(bad2.status, 400) << bad2.Describe();
  EXPECT_EQ(bad2.ErrorCode(), "invalid_request");
  EXPECT_EQ(bad2.ErrorMessage(), "\"pathBase64\": invalid base64 at offset 0") << bad2.Describe();
}

// The upload's target directory is swapped for a symlink to /etc halfway through the body: the
// commit lands in the directory that was resolved at the start (now renamed), never through
// the new link.
TEST_F(FilesEscapeTest, TargetSwappedForSymlinkMidUpload) {
  Sh(id_, "mkdir dir");
  RawConnection raw(daemon().endpoint());
  ASSERT_TRUE(raw.connected()) << raw.error();
  const std::string body(1 << 20, 'u');
  const std::string head =
      "PUT " + SbPath(id_, "/files?path=%2Fworkspace%2Fdir%2Fpasswd") +
      " HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  ASSERT_TRUE(raw.Send(head + body.substr(0, body.size() / 2)));
  std::this_thread::sleep_for(milliseconds(200));
  Sh(id_, "mv dir dir.old && ln -s /etc dir");
  ASSERT_TRUE(raw.Send(body.substr(body.size() / 2)));
  Response r = raw.ReadResponse();
  ScanResponse("upload", r);
  EXPECT_EQ(r.status, 204) << r.Describe();
  EXPECT_EQ(Sh(id_, "wc -c < dir.old/passwd; readlink dir; grep -c '^root:' /etc/passwd"),
            "1048576\n/etc\n1\n");
}

// A stopped sandbox is started by the first verb: each attack, made on a stopped sandbox, gets
// the answer it gets from a running one (api.md "Paths": the daemon never resolves a sandbox path
// on the host, running or not).
TEST_F(FilesEscapeTest, StoppedSandboxGivesTheSameAnswers) {
  Sh(id_, "ln -s / r && ln -s '" + canaries().file() + "' c");
  const std::vector<std::pair<std::string, std::string>> attacks = {
      {"read", "/workspace/c"},
      {"stat", "/workspace/c"},
      {"exists", "/workspace/c"},
      {"readdir", "/workspace/c"},
      {"write", "/workspace/c"},
      {"mkdir", "/workspace/c/d"},
      {"read", "/workspace/r/etc/hostname"},
      {"read", "/workspace/r/var/tmp/x"}};
  auto run = [&](const std::string& verb, const std::string& path) {
    Response r = verb == "read"    ? GetFile(id_, path)
                 : verb == "write" ? PutFile(id_, path, "x")
                 : verb == "mkdir" ? Fs(id_, verb, {{"path", path}, {"recursive", true}})
                                   : Fs(id_, verb, {{"path", path}});
    return std::to_string(r.status) + " " + r.ErrorCode() + " " + (r.status == 200 ? r.body : "");
  };
  for (const auto& [verb, path] : attacks) {
    SCOPED_TRACE(verb + " " + path);
    const std::string running = run(verb, path);
    Response stop = Call("POST", SbPath(id_, "/stop"));
    ASSERT_EQ(stop.status, 200) << stop.Describe();
    ASSERT_EQ(Str(Obj(stop), "state"), "stopped");
    EXPECT_EQ(run(verb, path), running);
  }
  EXPECT_EQ(run("read", "/workspace/c"), "404 ENOENT ");
  EXPECT_EQ(run("read", "/workspace/r/etc/hostname"), "200  " + hostname_);
  EXPECT_TRUE(canaries().FilesIntact());
}

// Another sandbox's files, by its host path: unreachable. Control: they are on the host.
TEST_F(FilesEscapeTest, AnotherSandboxsFilesAreUnreachable) {
  const std::string other = NewSandbox("victim");
  Sh(other, "printf victim-secret > /workspace/secret");
  const std::string host_path = daemon().SandboxDir(other) + "/workspace/secret";
  ASSERT_EQ(e2e::ReadHostFile(host_path), "victim-secret") << "control: on the host";
  Sh(id_, "ln -s '" + host_path + "' l");
  EXPECT_EQ(AllVerbs(host_path),
            "read=404:ENOENT stat=404:ENOENT exists=false readdir=404:ENOENT write=404:ENOENT "
            "mkdir=404:ENOENT rm=404:ENOENT");
  EXPECT_EQ(GetFile(id_, "/workspace/l").status, 404);
  ExecResult cat = Exec(id_, "cat '" + host_path + "' /workspace/l 2>&1; ls /workspace");
  EXPECT_EQ(cat.out().find("victim-secret"), std::string::npos) << cat.Describe();
  EXPECT_EQ(Sh(other, "cat /workspace/secret"), "victim-secret");
}

// A hard link from the workspace to a file of the read-only image: EXDEV (link(2) never crosses
// mounts), so a writeFile can never reach an image file by a second name. Control: a link
// inside the workspace works.
TEST_F(FilesEscapeTest, HardLinksNeverCrossIntoTheImage) {
  ExecResult r = Exec(id_,
                      "ln /usr/bin/ls /workspace/ls-link 2>&1; echo rc=$?; "
                      "ln /etc/hostname /workspace/h 2>&1; echo rc=$?; "
                      "echo a > f && ln f g && echo ok");
  EXPECT_EQ(r.out(),
            "ln: failed to create hard link '/workspace/ls-link' => '/usr/bin/ls': Invalid "
            "cross-device link\nrc=1\n"
            "ln: failed to create hard link '/workspace/h' => '/etc/hostname': Invalid "
            "cross-device link\nrc=1\nok\n")
      << r.Describe();
}

}  // namespace
}  // namespace nsbox::adversarial

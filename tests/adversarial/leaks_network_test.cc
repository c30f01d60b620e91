// Groups "information leaks" and "network" (docs/security.md): what a command can learn of the
// host (its environment and secrets, its processes, its network, the daemon's token) and what
// host services it can reach (loopback, the daemon's socket, an abstract Unix socket). The
// canaries of the fixture are planted in each of those places; every answer is searched for
// them. Each control shows the canary is really there, reachable from the host.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "tests/adversarial/fixture.h"

namespace nsbox::adversarial {
namespace {

class LeaksTest : public AdversarialTest {
 protected:
  void SetUp() override {
    AdversarialTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    id_ = NewSandbox();
    InstallTools(id_);
  }
  std::string id_;
};

// The host's first non-loopback IPv4 address ("" when there is none).
std::string HostAddress() {
  std::istringstream in(RunOnHost({"/usr/bin/hostname", "-I"}));
  std::string addr;
  while (in >> addr) {
    if (addr.find(':') == std::string::npos && addr.rfind("127.", 0) != 0) return addr;
  }
  return "";
}

// ---- information leaks ----

// The command's environment is exactly the documented base (api.md "exec"), whatever the
// daemon's own holds. Control: the daemon's environment on the host holds the canary.
TEST_F(LeaksTest, EnvironmentIsExactlyTheBase) {
  ASSERT_NE(e2e::ReadHostFile("/proc/" + std::to_string(daemon().pid()) + "/environ")
                .find(canaries().token()),
            std::string::npos)
      << "control";
  std::set<std::string> names;
  for (const auto& [k, v] : Probe(id_, "status")) {
    if (k.rfind("env.", 0) == 0) names.insert(k.substr(4));
  }
  // bash adds PWD, SHLVL and _ before it execs the probe.
  const std::set<std::string> expected = {"HOME",  "HOSTNAME", "LANG", "LOGNAME", "PATH", "PWD",
                                          "SHELL", "SHLVL",    "TERM", "TMPDIR",  "USER", "_"};
  EXPECT_EQ(names, expected);
  ExecResult r = Exec(id_,
                      "cat /proc/self/environ /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | "
                      "grep -c -e NSBOX_ -e CANARY");
  EXPECT_EQ(r.out(), "0\n") << r.Describe();
}

// The token, the canary and the daemon's paths are in no file a command can read. Control: grep
// finds what is there (the hostname), and the host's token file holds the token.
TEST_F(LeaksTest, NoSecretInAnyReadableFile) {
  ASSERT_NE(e2e::ReadHostFile(daemon().dir() + "/token").find(bearer()), std::string::npos);
  const std::string hostname = Sh(id_, "hostname");
  ExecResult control =
      Exec(id_, "grep -rlsF '" + hostname.substr(0, hostname.size() - 1) + "' /etc/hostname");
  EXPECT_EQ(control.out(), "/etc/hostname\n") << "control: grep finds what is there";
  // The secret travels on stdin into a pattern file that the search leaves out: on a command
  // line it would be found in the search's own /proc/PID/cmdline.
  for (const std::string& secret : {canaries().token(), bearer()}) {
    ExecResult r =
        Exec(id_,
             json::object{{"command",
                           "cat > /dev/shm/.p; grep -rlsF -f /dev/shm/.p / --exclude-dir=proc "
                           "--exclude-dir=usr --exclude-dir=dev --exclude-dir=private; echo rc=$?; "
                           "grep -lsF -f /dev/shm/.p "
                           "/proc/[0-9]*/environ /proc/[0-9]*/cmdline; echo rc=$?; rm /dev/shm/.p"},
                          {"stdin", secret}},
             milliseconds(60000));
    EXPECT_EQ(r.out(), "rc=1\nrc=1\n") << r.Describe();
  }
  // The host's /etc/ssl (CA certificates) is bound in; its private/ is there but closed: the
  // host's root owns it, which the sandbox's root is not.
  if (access("/etc/ssl/private", F_OK) == 0) {
    ExecResult priv = Exec(id_, "ls /etc/ssl/private 2>&1; echo rc=$?");
    EXPECT_EQ(priv.out(),
              "ls: cannot open directory '/etc/ssl/private': Permission denied\nrc=2\n");
  }
}

// Which programs and files other sandboxes and the host use is not a sandbox's to learn (issue
// 44): inotify on the jail's /usr, its /etc (the daemon's shared copy and the host's allowlisted
// directories) and its device nodes sees none of another sandbox's or the host's uses of them,
// though they are the same files. Before, they were binds of the host's: a watch on
// /usr/bin/tsort saw every sandbox and the host run it. Control: the same watches see the
// sandbox's own uses, as one on a file of its own /workspace does.
TEST_F(LeaksTest, OthersUseOfSharedFilesIsNotSeenThroughInotify) {
  const std::string other = NewSandbox("other");
  const std::vector<std::string> paths = {"/usr/bin/tsort",   "/usr/bin",       "/etc/passwd",
                                          "/etc/ld.so.cache", "/etc/ssl/certs", "/dev/null",
                                          "/dev/urandom",     "/workspace/own"};
  const std::string uses =
      "tsort /dev/null; ls /usr/bin /etc/ssl/certs > /dev/null; cat /etc/passwd "
      "/etc/ld.so.cache > /dev/null; head -c 16 /dev/urandom > /dev/null";
  // A watcher in the background: the events on each path from its start to `stop`.
  auto watch = [&](const std::string& name) -> std::function<KeyValues()> {
    std::string args;
    for (const auto& p : paths) args += " " + p;
    Sh(id_, "echo own > /workspace/own; rm -f /tmp/" + name + "*; (setsid " + kJailAttacker +
                " watch 500 /tmp/" + name + ".stop" + args + " > /tmp/" + name + ".out 2>&1 &)");
    auto out = [&, name] { return GetFile(id_, "/tmp/" + name + ".out").body; };
    for (int i = 0; i < 100 && out().find("ready=1") == std::string::npos; ++i) {
      std::this_thread::sleep_for(milliseconds(100));
    }
    KeyValues placed = ParseKeyValues(out());
    EXPECT_EQ(Get(placed, "ready"), "1") << out();
    for (size_t i = 0; i < paths.size(); ++i) {
      EXPECT_EQ(Get(placed, "watch." + std::to_string(i)), "0") << paths[i];
    }
    return [&, name, out] {
      std::this_thread::sleep_for(milliseconds(300));
      EXPECT_EQ(PutFile(id_, "/tmp/" + name + ".stop", "").status, 204);
      for (int i = 0; i < 100 && out().find("events.0=") == std::string::npos; ++i) {
        std::this_thread::sleep_for(milliseconds(100));
      }
      return ParseKeyValues(out());
    };
  };
  auto stop = watch("others");
  Sh(other, uses + "; cat /workspace/own 2>/dev/null; true");
  RunOnHost({"/bin/sh", "-c", uses});
  KeyValues seen = stop();
  for (size_t i = 0; i < paths.size(); ++i) {
    EXPECT_EQ(Get(seen, "events." + std::to_string(i)), "0")
        << paths[i] << ": another sandbox's or the host's use of it was seen";
  }
  // Control: its own uses, seen on every path.
  stop = watch("own");
  Sh(id_, uses + "; cat /workspace/own > /dev/null");
  seen = stop();
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string n = Get(seen, "events." + std::to_string(i));
    EXPECT_TRUE(!n.empty() && n != "0") << paths[i] << ": " << n << " events of its own uses";
  }
}

// Host processes are invisible: /proc lists only the sandbox's own. Control: the host has the
// daemon and many more.
TEST_F(LeaksTest, HostProcessesAreInvisible) {
  // Waits until the background job has exec'd sleep: until then it is a bash (CI under load
  // once listed "bash" here).
  Sh(id_,
     "sleep 30 >/dev/null 2>&1 & "
     "while [ \"$(cat /proc/$!/comm 2>/dev/null)\" != sleep ]; do sleep 0.01; done");
  KeyValues in = Probe(id_, "status");
  const std::string pids = Get(in, "pids");
  // The background sleep and the probe itself (bash execs it), in either order (the probe may
  // run in a child the runner made before the sleep was forked); never 1 (hidden nsbox-init).
  std::smatch two;
  ASSERT_TRUE(std::regex_match(pids, two, std::regex("(\\d+),(\\d+)"))) << pids;
  EXPECT_TRUE(Get(in, "pid") == two[1].str() || Get(in, "pid") == two[2].str())
      << Get(in, "pid") << " in " << pids;
  EXPECT_NE(two[1].str(), "1");
  KeyValues host = ProbeOnHost({"status"});
  EXPECT_NE(Get(host, "pids").find("," + std::to_string(daemon().pid()) + ","), std::string::npos)
      << "control: the host's /proc lists the daemon";
  ExecResult r = Exec(id_, "exec ps -e -o comm=");
  EXPECT_EQ(r.out(), "sleep\nps\n") << r.Describe();
}

// Only a loopback interface; the host's listeners and Unix sockets are not in the jail's /proc.
// Control: the host's /proc/net shows the canary's port and abstract socket.
TEST_F(LeaksTest, NetworkShowsOnlyTheSandboxsLoopback) {
  KeyValues in = Probe(id_, "status");
  EXPECT_EQ(Get(in, "ifaces"), "lo");
  EXPECT_EQ(Get(in, "iface.lo.up"), "1");
  char port_hex[8];
  std::snprintf(port_hex, sizeof port_hex, "%04X", canaries().port());
  ExecResult r = Exec(id_, std::string("grep -c ':") + port_hex +
                               "' /proc/net/tcp /proc/net/tcp6; grep -c -e nsbox -e '@' "
                               "/proc/net/unix");
  EXPECT_EQ(r.out(), "/proc/net/tcp:0\n/proc/net/tcp6:0\n0\n") << r.Describe();
  EXPECT_NE(e2e::ReadHostFile("/proc/net/tcp").find(std::string(":") + port_hex), std::string::npos)
      << "control";
  EXPECT_NE(e2e::ReadHostFile("/proc/net/unix").find(canaries().abstract_name()), std::string::npos)
      << "control";
  EXPECT_NE(Get(ProbeOnHost({"status"}), "ifaces"), "lo") << "control: the host has more";
}

// The kernel log and the keyrings are closed; /etc is the jail's own (no shadow). Control: the
// host has /etc/shadow.
TEST_F(LeaksTest, KernelLogKeyringsAndShadowAreClosed) {
  ExecResult r = Exec(id_,
                      "dmesg 2>&1 | head -1; cat /etc/shadow 2>&1; "
                      "cut -d: -f1 /etc/passwd | tr '\\n' ' '");
  EXPECT_EQ(r.out(),
            "dmesg: read kernel buffer failed: Operation not permitted\n"
            "cat: /etc/shadow: No such file or directory\n"
            "root nobody ")
      << r.Describe();
  EXPECT_EQ(access("/etc/shadow", F_OK), 0) << "control";
}

// ---- network ----

// The canary service on the host's 127.0.0.1 and ::1: refused, the jail's loopback is its own.
// Control: from the host, the service answers with the canary.
TEST_F(LeaksTest, HostLoopbackServiceUnreachable) {
  const std::string port = std::to_string(canaries().port());
  KeyValues v4 = Attack(id_, "connect tcp 127.0.0.1 " + port);
  EXPECT_EQ(Get(v4, "connect"), "ECONNREFUSED");
  KeyValues v6 = Attack(id_, "connect tcp6 ::1 " + port);
  EXPECT_EQ(Get(v6, "connect"), "ECONNREFUSED");
  ExpectCanaryConnection();
  KeyValues host = AttackOnHost({"connect", "tcp", "127.0.0.1", port});
  EXPECT_EQ(Get(host, "connect"), "0") << "control";
  EXPECT_EQ(Get(host, "read"), "CANARY." + canaries().token() + ".") << "control";
}

// The daemon's socket (by its host path) and its TCP port: not there. Control: the host reaches
// both.
TEST_F(LeaksTest, DaemonSocketAndPortUnreachable) {
  KeyValues unix_sock = Attack(id_, "connect unix " + daemon().socket_path());
  EXPECT_EQ(Get(unix_sock, "connect"), "ENOENT");
  KeyValues tcp = Attack(id_, "connect tcp 127.0.0.1 " + std::to_string(tcp_port()));
  EXPECT_EQ(Get(tcp, "connect"), "ECONNREFUSED");
  KeyValues host = AttackOnHost({"connect", "unix", daemon().socket_path()});
  EXPECT_EQ(Get(host, "connect"), "0") << "control";
  KeyValues host_tcp = AttackOnHost({"connect", "tcp", "127.0.0.1", std::to_string(tcp_port())});
  EXPECT_EQ(Get(host_tcp, "connect"), "0") << "control";
}

// The abstract Unix socket namespace belongs to the network namespace: the host's canary socket
// is not there. Control: the host connects and reads the canary.
TEST_F(LeaksTest, AbstractCanarySocketUnreachable) {
  KeyValues in = Attack(id_, "connect abstract " + canaries().abstract_name());
  EXPECT_EQ(Get(in, "connect"), "ECONNREFUSED");
  ExpectCanaryConnection();
  KeyValues host = AttackOnHost({"connect", "abstract", canaries().abstract_name()});
  EXPECT_EQ(Get(host, "connect"), "0") << "control";
  EXPECT_EQ(Get(host, "read"), "CANARY." + canaries().token() + ".");
}

// No route out: the host's own address and the internet are unreachable. Control: the host has
// a non-loopback address.
TEST_F(LeaksTest, NoRouteOut) {
  const std::string addr = HostAddress();
  KeyValues out = Attack(id_, "connect tcp 192.0.2.1 80");
  EXPECT_EQ(Get(out, "connect"), "ENETUNREACH");
  if (!addr.empty()) {
    KeyValues own = Attack(id_, "connect tcp " + addr + " " + std::to_string(tcp_port()));
    EXPECT_EQ(Get(own, "connect"), "ENETUNREACH") << addr;
  }
  EXPECT_FALSE(addr.empty()) << "control: the host has a network";
  ExecResult dns = Exec(id_, "getent hosts example.com; echo rc=$?");
  EXPECT_EQ(dns.out(), "rc=2\n") << dns.Describe();
}

// Two sandboxes: neither reaches the other's abstract socket or loopback listener. Control:
// each reaches its own.
TEST_F(LeaksTest, SandboxesCannotReachEachOther) {
  const std::string other = NewSandbox("neighbour");
  const std::string listen =
      "python3 -c \"import socket,os\n"
      "a=socket.socket(socket.AF_UNIX); a.bind('\\0nsbox-adv-neighbour'); a.listen(8)\n"
      "t=socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
      "t.bind(('127.0.0.1', 7000)); t.listen(8)\n"
      "open('/tmp/ready','w').close()\n"
      "import time; time.sleep(30)\" >/dev/null 2>&1 & "
      "for i in $(seq 100); do test -e /tmp/ready && break; sleep 0.05; done";
  Sh(other, listen);
  InstallTools(other);
  KeyValues own = ParseKeyValues(Sh(other, std::string(kJailAttacker) +
                                               " connect abstract nsbox-adv-neighbour; " +
                                               kJailAttacker + " connect tcp 127.0.0.1 7000"));
  EXPECT_EQ(Get(own, "connect"), "0") << "control: the neighbour reaches its own";
  KeyValues in = Attack(id_, "connect abstract nsbox-adv-neighbour");
  EXPECT_EQ(Get(in, "connect"), "ECONNREFUSED");
  KeyValues tcp = Attack(id_, "connect tcp 127.0.0.1 7000");
  EXPECT_EQ(Get(tcp, "connect"), "ECONNREFUSED");
}

}  // namespace
}  // namespace nsbox::adversarial

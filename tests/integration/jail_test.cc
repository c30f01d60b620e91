// The jail of `nsbox run`, observed from inside by nsbox-probe: ids, processes, network,
// capabilities, seccomp, file system, limits, environment, signals and exit codes. Each isolation
// claim has a control run of the same probe on the host, which shows the probe can see the
// difference (security-references.md, "Rules for our suite": non-vacuous).

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "isolate/idmap.h"
#include "policy/capabilities.h"
#include "policy/filesystem.h"
#include "policy/limits.h"
#include "policy/seccomp_profile.h"
#include "tests/integration/harness.h"

namespace nsbox::itest {
namespace {

std::string ErrName(int err) {
  if (err == 0) return "0";
  const char* name = strerrorname_np(err);
  return name != nullptr ? name : std::to_string(err);
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  if (s.empty()) return parts;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) parts.push_back(item);
  return parts;
}

bool ContainsNoCase(std::string haystack, std::string needle) {
  auto lower = [](std::string& s) {
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  };
  lower(haystack);
  lower(needle);
  return haystack.find(needle) != std::string::npos;
}

class JailTest : public IntegrationTest {
 protected:
  void SetUp() override {
    IntegrationTest::SetUp();
    if (IsSkipped()) return;
    ws_.emplace();
    ids_ = MappedIds();
  }

  // nsbox run --workspace WS <nsbox_args> -- /workspace/nsbox-probe <probe_args>
  RunResult RunProbe(const std::vector<std::string>& nsbox_args,
                     const std::vector<std::string>& probe_args, const RunOptions& options = {}) {
    std::vector<std::string> cmd = Jail(nsbox_args);
    cmd.push_back(kProbeInJail);
    cmd.insert(cmd.end(), probe_args.begin(), probe_args.end());
    return RunNsbox(cmd, options);
  }

  // The probe's report from inside the jail; fails the test unless it exited 0.
  KeyValues Probe(const std::vector<std::string>& nsbox_args,
                  const std::vector<std::string>& probe_args) {
    RunResult r = RunProbe(nsbox_args, probe_args);
    EXPECT_EQ(r.exit_code, 0) << r.Describe();
    EXPECT_TRUE(r.leftover.empty()) << r.Describe();
    return ParseKeyValues(r.out);
  }

  // The same probe run directly on the host: the control.
  KeyValues Control(const std::vector<std::string>& probe_args) {
    std::vector<std::string> argv = {kProbeBin};
    argv.insert(argv.end(), probe_args.begin(), probe_args.end());
    RunResult r = RunProgram(argv);
    EXPECT_EQ(r.exit_code, 0) << r.Describe();
    return ParseKeyValues(r.out);
  }

  // "run --workspace WS <nsbox_args> -- <command...>"
  std::vector<std::string> Command(const std::vector<std::string>& nsbox_args,
                                   const std::vector<std::string>& command) const {
    std::vector<std::string> args = Jail(nsbox_args);
    args.insert(args.end(), command.begin(), command.end());
    return args;
  }

  // "run --workspace WS <extra> --" : the start of an nsbox command line.
  std::vector<std::string> Jail(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = {"run"};
    auto ws = ws_->Args();
    args.insert(args.end(), ws.begin(), ws.end());
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--");
    return args;
  }

  std::optional<TempWorkspace> ws_;
  isolate::IdMapping ids_;
};

// ---------------------------------------------------------------------------------------------
// Identity: user namespace, pid namespace, network, hostname, session.

TEST_F(JailTest, RootInsideIsTheMappedHostRange) {
  KeyValues in = Probe({}, {"status"});
  EXPECT_EQ(Get(in, "uid"), "0");
  EXPECT_EQ(Get(in, "euid"), "0");
  EXPECT_EQ(Get(in, "gid"), "0");
  EXPECT_EQ(Get(in, "uid_map"), "0 " + std::to_string(ids_.uid.outside) + " 65536");
  EXPECT_EQ(Get(in, "gid_map"), "0 " + std::to_string(ids_.gid.outside) + " 65536");
  EXPECT_NE(ids_.uid.outside, 0u);

  KeyValues host = Control({"status"});
  EXPECT_EQ(Get(host, "uid_map"), "0 0 4294967295") << "control: the host's own map";
}

TEST_F(JailTest, OnlyTheSandboxProcessesAreVisible) {
  KeyValues in = Probe({}, {"status"});
  // PID 1 is nsbox's init, the command PID 2. /proc is mounted hidepid=ptraceable and the init
  // is not dumpable, so the command cannot even see it.
  EXPECT_EQ(Get(in, "pids"), "2") << "only the command itself";
  EXPECT_EQ(Get(in, "pid"), "2");
  EXPECT_EQ(Get(in, "ppid"), "1");

  KeyValues host = Control({"status"});
  EXPECT_GT(Split(Get(host, "pids"), ',').size(), 2u) << "control: the host shows its processes";
}

TEST_F(JailTest, CommandRunsInItsOwnSession) {
  KeyValues in = Probe({}, {"status"});
  EXPECT_EQ(Get(in, "sid"), "2") << "setsid: the command leads its own session";
  EXPECT_EQ(Get(in, "pgid"), "2");
  EXPECT_EQ(Get(in, "tty_nr"), "0") << "no controlling terminal without --tty";
}

TEST_F(JailTest, OnlyLoopbackInterface) {
  KeyValues in = Probe({}, {"status"});
  EXPECT_EQ(Get(in, "ifaces"), "lo");
  EXPECT_EQ(Get(in, "iface.lo.up"), "1");

  KeyValues host = Control({"status"});
  EXPECT_NE(Get(host, "ifaces"), "lo") << "control: the host has more interfaces";
}

TEST_F(JailTest, HostnameIsTheGivenOne) {
  KeyValues given = Probe({"--hostname", "itest-box"}, {"status"});
  EXPECT_EQ(Get(given, "hostname"), "itest-box");
  EXPECT_EQ(Get(given, "env.HOSTNAME"), "itest-box");
  KeyValues etc = Probe({"--hostname", "itest-box"}, {"read", "/etc/hostname"});
  EXPECT_EQ(Get(etc, "read.line1[/etc/hostname]"), "itest-box");

  KeyValues by_default = Probe({}, {"status"});
  EXPECT_EQ(Get(by_default, "hostname"), "nsbox");
  EXPECT_EQ(Get(by_default, "env.HOSTNAME"), "nsbox");
}

// ---------------------------------------------------------------------------------------------
// Privileges: capabilities, no_new_privs, seccomp.

TEST_F(JailTest, CapabilitiesAreTheDefaultSetAndSeccompIsOn) {
  const std::string expected =
      policy::FormatCapabilityMask(policy::DefaultCommandCapabilities().Mask());
  KeyValues in = Probe({}, {"status"});
  EXPECT_EQ(Get(in, "CapEff"), expected);
  EXPECT_EQ(Get(in, "CapPrm"), expected);
  EXPECT_EQ(Get(in, "CapBnd"), expected);
  EXPECT_EQ(Get(in, "CapInh"), "0000000000000000");
  EXPECT_EQ(Get(in, "CapAmb"), "0000000000000000");
  EXPECT_EQ(Get(in, "NoNewPrivs"), "1");
  EXPECT_EQ(Get(in, "prctl_no_new_privs"), "1");
  EXPECT_EQ(Get(in, "Seccomp"), "2") << "SECCOMP_MODE_FILTER";
  EXPECT_EQ(Get(in, "Seccomp_filters"), "1");

  KeyValues host = Control({"status"});
  EXPECT_NE(Get(host, "CapEff"), expected) << "control: root on the host has every capability";
  EXPECT_EQ(Get(host, "Seccomp"), "0");
  EXPECT_EQ(Get(host, "NoNewPrivs"), "0");
}

// One probed syscall: the probe's key, the profile's syscall name, and whether the host control
// is expected to differ (false only where the host kernel answers what the filter answers).
struct SyscallCase {
  const char* key;
  const char* syscall;
  const char* no_control_reason = nullptr;
};

const SyscallCase kDeniedSyscalls[] = {
    {"mount", "mount"},
    {"umount2", "umount2"},
    {"pivot_root", "pivot_root"},
    {"chroot", "chroot"},
    {"unshare_newuser", "unshare"},
    {"setns", "setns"},
    {"clone_newuser", "clone"},
    {"clone3", "clone3"},
    {"keyctl", "keyctl"},
    {"add_key", "add_key"},
    {"request_key", "request_key"},
    {"ptrace", "ptrace"},
    {"process_vm_readv", "process_vm_readv"},
    {"process_vm_writev", "process_vm_writev"},
    {"kcmp", "kcmp"},
    {"pidfd_getfd", "pidfd_getfd"},
    {"process_madvise", "process_madvise"},
    {"bpf", "bpf"},
    {"perf_event_open", "perf_event_open"},
    {"userfaultfd", "userfaultfd"},
    {"io_uring_setup", "io_uring_setup"},
    {"io_uring_enter", "io_uring_enter"},
    {"io_uring_register", "io_uring_register"},
    {"init_module", "init_module"},
    {"finit_module", "finit_module"},
    {"delete_module", "delete_module"},
    {"create_module", "create_module"},
    {"get_kernel_syms", "get_kernel_syms"},
    {"query_module", "query_module"},
    {"kexec_load", "kexec_load"},
    {"kexec_file_load", "kexec_file_load"},
    {"reboot", "reboot"},
    {"settimeofday", "settimeofday"},
    {"clock_settime", "clock_settime"},
    {"acct", "acct"},
    {"quotactl", "quotactl"},
    {"quotactl_fd", "quotactl_fd"},
    {"swapon", "swapon"},
    {"swapoff", "swapoff"},
    {"syslog", "syslog"},
    {"lookup_dcookie", "lookup_dcookie"},
    {"fanotify_init", "fanotify_init"},
    {"open_by_handle_at", "open_by_handle_at"},
    {"vhangup", "vhangup"},
    {"sethostname", "sethostname"},
    {"setdomainname", "setdomainname"},
    {"iopl", "iopl"},
    {"ioperm", "ioperm"},
    {"modify_ldt", "modify_ldt"},
    {"uselib", "uselib"},
    {"ustat", "ustat"},
    {"sysfs", "sysfs"},
    {"_sysctl", "_sysctl"},
    {"nfsservctl", "nfsservctl"},
    {"mbind", "mbind"},
    {"set_mempolicy", "set_mempolicy"},
    {"get_mempolicy", "get_mempolicy"},
    {"set_mempolicy_home_node", "set_mempolicy_home_node"},
    {"move_pages", "move_pages"},
    {"migrate_pages", "migrate_pages"},
    {"lsm_get_self_attr", "lsm_get_self_attr"},
    {"lsm_set_self_attr", "lsm_set_self_attr"},
    {"lsm_list_modules", "lsm_list_modules"},
    {"fsopen", "fsopen"},
    {"fsconfig", "fsconfig"},
    {"fsmount", "fsmount"},
    {"fspick", "fspick"},
    {"move_mount", "move_mount"},
    {"open_tree", "open_tree"},
    {"open_tree_attr", "open_tree_attr"},
    {"mount_setattr", "mount_setattr"},
    {"statmount", "statmount"},
    {"listmount", "listmount"},
    {"listns", "listns",
     "listns is Linux 6.19: an older host kernel answers ENOSYS as the filter does"},
    {"file_getattr", "file_getattr"},
    {"personality", "personality"},
    {"socket_packet", "socket"},
    {"socket_vsock", "socket"},
    {"socket_alg", "socket",
     "a host kernel without AF_ALG answers EAFNOSUPPORT as the filter does"},
    {"socketpair_packet", "socketpair"},
    {"ioctl_tiocsti", "ioctl"},
    {"ioctl_tiocsti_high", "ioctl"},
    {"ioctl_tioclinux", "ioctl"},
    {"prlimit_pid1", "prlimit64"},
    {"prlimit_pid1_high", "prlimit64"},
};

// Calls the filter must let through: the same answer inside and on the host.
const char* const kAllowedSyscalls[] = {"personality_query", "socket_unix", "ioctl_fionread",
                                        "prlimit_self"};

// The errno the profile gives `name`: from its deny rules (every rule on a name must agree), its
// argument allowlists, or ENOSYS for a syscall numbered above enosys_above that was not reviewed.
std::optional<int> ProfileErrno(const policy::SeccompProfile& p, const std::string& name) {
  std::optional<int> err;
  for (const auto& rule : p.deny) {
    if (name != rule.name) continue;
    if (err && *err != rule.errno_value) ADD_FAILURE() << name << ": rules disagree on errno";
    err = rule.errno_value;
  }
  for (const auto& list : p.arg_allowlists) {
    if (name == list.name) err = list.errno_value;
  }
  if (err) return err;
  auto nr = policy::X8664SyscallNumberFallback(name);
  if (nr && static_cast<uint32_t>(*nr) > p.enosys_above &&
      std::none_of(p.allow_newer.begin(), p.allow_newer.end(),
                   [&](const policy::NewerSyscall& s) { return name == s.name; })) {
    return ENOSYS;
  }
  return std::nullopt;
}

TEST_F(JailTest, DeniedSyscallsFailWithTheProfileErrno) {
  const policy::SeccompProfile profile = policy::DefaultSeccompProfile();
  KeyValues in = Probe({}, {"syscalls"});
  KeyValues host = Control({"syscalls"});
  for (const SyscallCase& c : kDeniedSyscalls) {
    const std::string key = std::string("sys.") + c.key;
    std::optional<int> err = ProfileErrno(profile, c.syscall);
    if (!err) {
      ADD_FAILURE() << c.syscall << " (probe " << c.key << ") is not denied by the profile";
      continue;
    }
    EXPECT_EQ(Get(in, key), ErrName(*err)) << "in the jail: " << c.key;
    if (c.no_control_reason == nullptr) {
      EXPECT_NE(Get(host, key), Get(in, key))
          << "control: on the host " << c.key << " must answer something else than the filter";
    } else if (Get(host, key) == Get(in, key)) {
      std::fprintf(stderr, "note: %s has no control here: %s\n", c.key, c.no_control_reason);
    }
    EXPECT_NE(Get(host, key), "<missing>") << c.key;
  }
  for (const char* name : kAllowedSyscalls) {
    const std::string key = std::string("sys.") + name;
    EXPECT_NE(Get(in, key), "<missing>") << name;
    EXPECT_EQ(Get(in, key), Get(host, key)) << "allowed call " << name << " differs from the host";
  }
}

TEST_F(JailTest, ForeignSyscallAbisKillTheProcess) {
  KeyValues in = Probe({}, {"syscalls", "abi_i386", "abi_x32"});
  KeyValues host = Control({"syscalls", "abi_i386", "abi_x32"});
  // The compiled filter kills any architecture but x86_64 (SCMP_FLTATR_ACT_BADARCH). On a kernel
  // without the i386 ABI (IA32 emulation off), int 0x80 is a SIGSEGV on the host too: the call
  // never reaches the filter, nor runs.
  if (Get(host, "sys.abi_i386") == "SIGSEGV") {
    std::fprintf(stderr, "note: this kernel has no i386 ABI; int 0x80 is a SIGSEGV everywhere\n");
    EXPECT_EQ(Get(in, "sys.abi_i386"), "SIGSEGV");
  } else {
    EXPECT_EQ(Get(in, "sys.abi_i386"), "SIGSYS");
    EXPECT_EQ(Get(host, "sys.abi_i386"), "0") << "control: int 0x80 getpid works on the host";
  }
  EXPECT_EQ(Get(in, "sys.abi_x32"), "SIGSYS");
  EXPECT_NE(Get(host, "sys.abi_x32"), "SIGSYS");
}

// Every syscall the profile refuses is probed (except those that have no harmless probe).
TEST(JailProbeCoverage, EveryDeniedSyscallIsProbed) {
  const policy::SeccompProfile profile = policy::DefaultSeccompProfile();
  std::set<std::string> probed;
  for (const SyscallCase& c : kDeniedSyscalls) probed.insert(c.syscall);
  for (const auto& rule : profile.deny) {
    EXPECT_EQ(probed.count(rule.name), 1u) << "no probe for denied syscall " << rule.name;
  }
  for (const auto& list : profile.arg_allowlists) {
    EXPECT_EQ(probed.count(list.name), 1u) << "no probe for filtered syscall " << list.name;
  }
}

// ---------------------------------------------------------------------------------------------
// File system.

TEST_F(JailTest, UsrAndRootAreReadOnly) {
  KeyValues in = Probe({}, {"write", "/usr/nsbox-itest", "/usr/bin/nsbox-itest", "/nsbox-itest",
                            "/etc/nsbox-itest"});
  EXPECT_EQ(Get(in, "write[/usr/nsbox-itest]"), "EROFS");
  EXPECT_EQ(Get(in, "write[/usr/bin/nsbox-itest]"), "EROFS");
  EXPECT_EQ(Get(in, "write[/nsbox-itest]"), "EROFS");
  EXPECT_EQ(Get(in, "write[/etc/nsbox-itest]"), "EROFS");
  struct stat st;
  EXPECT_NE(lstat("/usr/nsbox-itest", &st), 0) << "a file appeared in the host's /usr";
}

TEST_F(JailTest, WorkspaceIsWritableAndOwnedByTheMappedRoot) {
  KeyValues in = Probe({}, {"write", "/workspace/created.txt"});
  EXPECT_EQ(Get(in, "write[/workspace/created.txt]"), "0");
  KeyValues seen = Probe({}, {"stat", "/workspace/created.txt"});
  EXPECT_EQ(Get(seen, "stat.uid[/workspace/created.txt]"), "0") << "root's file, inside";
  EXPECT_EQ(Get(seen, "stat.gid[/workspace/created.txt]"), "0");

  struct stat st {};
  const std::string host_path = ws_->HostPath("created.txt");
  ASSERT_EQ(stat(host_path.c_str(), &st), 0) << host_path << ": " << ErrName(errno);
  EXPECT_EQ(st.st_uid, ids_.uid.outside);
  EXPECT_EQ(st.st_gid, ids_.gid.outside);
  std::ifstream f(host_path);
  std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "written by nsbox-probe\n");
}

TEST_F(JailTest, TmpAndRootHomeAreWritable) {
  KeyValues in = Probe({}, {"write", "/tmp/x", "/root/x"});
  EXPECT_EQ(Get(in, "write[/tmp/x]"), "0");
  EXPECT_EQ(Get(in, "write[/root/x]"), "0");
}

TEST_F(JailTest, NoShadowNoSys) {
  KeyValues in = Probe({}, {"status"});
  EXPECT_EQ(Get(in, "shadow"), "ENOENT");
  EXPECT_EQ(Get(in, "sys"), "ENOENT");
  KeyValues etc = Probe({}, {"list", "/etc"});
  std::vector<std::string> entries = Split(Get(etc, "list.entries[/etc]"), ',');
  std::set<std::string> names(entries.begin(), entries.end());
  for (const char* want :
       {"passwd", "group", "hosts", "hostname", "resolv.conf", "nsswitch.conf"}) {
    EXPECT_EQ(names.count(want), 1u)
        << "/etc lacks " << want << ": " << Get(etc, "list.entries[/etc]");
  }
  for (const char* never : {"shadow", "gshadow", "shadow-", "gshadow-", "sudoers"}) {
    EXPECT_EQ(names.count(never), 0u) << "/etc has " << never;
  }

  KeyValues gen = Probe({}, {"read", "/etc/passwd", "/etc/group"});
  EXPECT_TRUE(Get(gen, "read.line1[/etc/passwd]").starts_with("root:x:0:0:"))
      << Get(gen, "read.line1[/etc/passwd]");
  EXPECT_TRUE(Get(gen, "read.line1[/etc/group]").starts_with("root:x:0:"))
      << Get(gen, "read.line1[/etc/group]");

  KeyValues host = Control({"status"});
  EXPECT_EQ(Get(host, "shadow"), "0") << "control: the host has /etc/shadow";
  EXPECT_EQ(Get(host, "sys"), "0") << "control: the host has /sys";
}

// The masked paths of the policy: a file reads empty (/dev/null over it), a directory is empty.
// Paths this host's kernel does not have must simply stay absent.
TEST_F(JailTest, ProcMaskedPathsAreEmpty) {
  std::vector<std::string> files, dirs, absent;
  for (const auto& rule : policy::ProcMaskedPaths()) {
    struct stat st;
    if (lstat(rule.path, &st) != 0) {
      absent.push_back(rule.path);
    } else if (S_ISDIR(st.st_mode)) {
      dirs.push_back(rule.path);
    } else {
      files.push_back(rule.path);
    }
  }
  std::vector<std::string> args = {"read"};
  args.insert(args.end(), files.begin(), files.end());
  KeyValues read = Probe({}, args);
  for (const auto& f : files) {
    // A read error would hide the content too, but a masked file must look like /dev/null: EOF.
    if (Get(read, "read[" + f + "]") != "0") {
      ADD_FAILURE() << f << ": reading it fails with " << Get(read, "read[" + f + "]")
                    << " instead of reading empty (/dev/null bound over it)";
      continue;
    }
    EXPECT_EQ(Get(read, "read.bytes[" + f + "]"), "0") << f << " is not masked";
  }
  args = {"list"};
  args.insert(args.end(), dirs.begin(), dirs.end());
  args.insert(args.end(), absent.begin(), absent.end());
  KeyValues list = Probe({}, args);
  for (const auto& d : dirs) {
    EXPECT_EQ(Get(list, "list[" + d + "]"), "0") << d;
    EXPECT_EQ(Get(list, "list.entries[" + d + "]"), "") << d << " is not masked";
  }
  for (const auto& a : absent) {
    EXPECT_EQ(Get(list, "list[" + a + "]"), "ENOENT") << a << " is absent on the host";
  }

  KeyValues host = Control({"read", "/proc/timer_list"});
  EXPECT_NE(Get(host, "read.bytes[/proc/timer_list]"), "0") << "control: the host's is not empty";
}

TEST_F(JailTest, ProcSysAndFriendsAreReadOnly) {
  // O_TRUNC on procfs: the probe sees the mount's read-only flag (EROFS) before permissions.
  // Never run on the host.
  KeyValues in = Probe({}, {"openw", "/proc/sys/vm/overcommit_memory",
                            "/proc/sys/net/core/somaxconn", "/proc/self/comm"});
  EXPECT_EQ(Get(in, "openw[/proc/sys/vm/overcommit_memory]"), "EROFS");
  EXPECT_EQ(Get(in, "openw[/proc/sys/net/core/somaxconn]"), "EROFS");
  EXPECT_EQ(Get(in, "openw[/proc/self/comm]"), "0") << "the rest of /proc stays writable";

  KeyValues mounts = Probe({}, {"mounts"});
  for (const auto& rule : policy::ProcReadonlyPaths()) {
    struct stat st;
    if (lstat(rule.path, &st) != 0) continue;  // not on this kernel
    const std::string v = Get(mounts, std::string("mount.") + rule.path);
    EXPECT_TRUE(v.starts_with("proc ro,") || v == "proc ro") << rule.path << ": " << v;
  }
}

TEST_F(JailTest, DevIsMinimal) {
  KeyValues in = Probe({}, {"list", "/dev"});
  std::vector<std::string> entries = Split(Get(in, "list.entries[/dev]"), ',');
  std::set<std::string> names(entries.begin(), entries.end());
  const std::set<std::string> required = {"null",  "zero",   "full",  "random", "urandom",
                                          "tty",   "pts",    "ptmx",  "shm",    "fd",
                                          "stdin", "stdout", "stderr"};
  for (const auto& r : required) EXPECT_EQ(names.count(r), 1u) << "/dev lacks " << r;
  for (const auto& n : names) {
    EXPECT_EQ(required.count(n) + (n == "console" || n == "core" || n == "mqueue"), 1u)
        << "/dev has more than the minimum: " << n;
  }
}

TEST_F(JailTest, MountsAreReadOnlyWhereTheyShouldBe) {
  KeyValues in = Probe({}, {"mounts"});
  auto has_ro = [&](const std::string& point) {
    std::string v = Get(in, "mount." + point);
    std::vector<std::string> words = Split(v, ' ');
    return words.size() == 2 && (words[1] == "ro" || words[1].starts_with("ro,"));
  };
  EXPECT_TRUE(has_ro("/")) << Get(in, "mount./");
  EXPECT_TRUE(has_ro("/usr")) << Get(in, "mount./usr");
  EXPECT_TRUE(has_ro("/proc/sys")) << Get(in, "mount./proc/sys");
  EXPECT_FALSE(has_ro("/workspace")) << Get(in, "mount./workspace");
  EXPECT_TRUE(Get(in, "mount./tmp").starts_with("tmpfs rw")) << Get(in, "mount./tmp");
  EXPECT_TRUE(Get(in, "mount./root").starts_with("tmpfs rw")) << Get(in, "mount./root");
  EXPECT_TRUE(Get(in, "mount./proc").starts_with("proc ")) << Get(in, "mount./proc");
  EXPECT_EQ(in.count("mount./sys"), 0u);
}

// /, /dev, /tmp and /dev/shm are one tmpfs (one superblock, docs/isolation.md), each place with
// its own mount flags: / is read-only, /tmp runs programs, /dev/shm and /dev do not; the
// directories under /dev/pts that /tmp and the masks are bound from stay covered; a masked
// directory is empty and read-only.
TEST_F(JailTest, ScratchPlacesAreOneTmpfsWithTheirOwnFlags) {
  RunResult r = RunNsbox(Command(
      {"--memory", "64M"},
      {"sh", "-c",
       "stat -c %d / /tmp /dev /dev/shm | uniq | wc -l; touch /x 2>/dev/null || echo root-ro; "
       "printf '#!/bin/sh\\necho ran\\n' > /tmp/x.sh && chmod +x /tmp/x.sh && /tmp/x.sh; "
       "cp /tmp/x.sh /dev/shm/x.sh && /dev/shm/x.sh 2>/dev/null || echo shm-noexec; "
       "echo pts: $(ls -A /dev/pts); echo acpi: $(ls -A /proc/acpi 2>&1); "
       "touch /proc/acpi/x 2>/dev/null || echo acpi-ro; stat -f -c %b /tmp /dev/shm"}));
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  // A host without /proc/acpi has no mask there: the probe then finds nothing to list.
  struct stat st;
  const std::string acpi = lstat("/proc/acpi", &st) == 0
                               ? "acpi:\nacpi-ro\n"
                               : "acpi: ls: cannot access '/proc/acpi': No such file or directory\n"
                                 "acpi-ro\n";
  EXPECT_EQ(r.out, "1\nroot-ro\nran\nshm-noexec\npts: ptmx\n" + acpi + "8192\n8192\n")
      << r.Describe();
}

// ---------------------------------------------------------------------------------------------
// Resource limits.

TEST_F(JailTest, MemoryHogIsOomKilled) {
  RunResult r = RunProbe({"--memory", "64M"}, {"memhog", "256"});
  EXPECT_EQ(r.exit_code, 137) << r.Describe();
  EXPECT_TRUE(ContainsNoCase(r.err, "out of memory")) << r.Describe();
  EXPECT_EQ(r.out.find("memhog=done"), std::string::npos) << r.Describe();
  EXPECT_TRUE(r.leftover.empty()) << r.Describe();
}

TEST_F(JailTest, ForkBombStopsAtThePidsLimit) {
  RunResult r = RunProbe({"--pids", "64"}, {"forkbomb"}, WithTimeout(std::chrono::seconds(15)));
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  KeyValues kv = ParseKeyValues(r.out);
  EXPECT_EQ(Get(kv, "fork_errno"), "EAGAIN") << r.Describe();
  const int forks = std::atoi(Get(kv, "forks").c_str());
  // 64 tasks in the cgroup: init, the probe and at most 62 children.
  EXPECT_GE(forks, 1) << r.Describe();
  EXPECT_LE(forks, 62) << r.Describe();
  EXPECT_EQ(Get(kv, "reaped"), Get(kv, "forks"));
  EXPECT_LT(r.elapsed, std::chrono::seconds(5)) << "the host must stay responsive";
  EXPECT_TRUE(r.leftover.empty()) << r.Describe();
}

// The limits land in the jail's own cgroups (nsbox-run-<nsbox pid>), read from the host while
// the jail runs: v1 memory/pids/cpu here, or the v2 equivalents.
TEST_F(JailTest, LimitsAreAppliedToTheJailCgroups) {
  std::map<std::string, std::string> seen;
  RunOptions o;
  o.ready_output = "ready";
  o.signal = SIGTERM;
  o.on_ready = [&](pid_t nsbox) {
    const std::string name = "/nsbox-run-" + std::to_string(nsbox);
    for (const std::string& dir : FindNsboxRunCgroups()) {
      if (!dir.ends_with(name)) continue;
      for (const char* file :
           {"memory.limit_in_bytes", "memory.max", "pids.max", "cpu.cfs_quota_us",
            "cpu.cfs_period_us", "cpu.max", "cgroup.procs"}) {
        std::ifstream f(dir + "/" + file);
        if (!f) continue;
        std::string v((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        while (!v.empty() && v.back() == '\n') v.pop_back();
        seen[file] = v;
        if (std::string(file) == "cgroup.procs") seen["procs:" + dir] = v;
      }
    }
  };
  RunResult r = RunNsbox(Command({"--memory", "64M", "--pids", "64", "--cpus", "0.5"},
                                 {"sh", "-c", "echo ready; exec sleep 100"}),
                         o);
  EXPECT_TRUE(r.ready) << r.Describe();
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.Describe();
  std::string all;
  for (const auto& [k, v] : seen) all += k + "=" + v + "\n";
  const bool v2_memory = seen.count("memory.max") != 0;
  EXPECT_EQ(seen[v2_memory ? "memory.max" : "memory.limit_in_bytes"], "67108864") << all;
  EXPECT_EQ(seen["pids.max"], "64") << all;
  if (seen.count("cpu.max") != 0) {
    EXPECT_EQ(seen["cpu.max"], "50000 100000") << all;
  } else {
    EXPECT_EQ(seen["cpu.cfs_quota_us"], "50000") << all;
    EXPECT_EQ(seen["cpu.cfs_period_us"], "100000") << all;
  }
  // Every hierarchy holds the jail's two processes (init and the command).
  for (const auto& [k, v] : seen) {
    if (k.starts_with("procs:")) {
      EXPECT_EQ(Split(v, '\n').size(), 2u) << k << ": " << v;
    }
  }
  EXPECT_TRUE(r.leftover.empty()) << r.Describe();
  for (const std::string& dir : FindNsboxRunCgroups()) {
    EXPECT_FALSE(dir.ends_with("/nsbox-run-" + std::to_string(r.pid))) << "left behind: " << dir;
  }
}

TEST_F(JailTest, RlimitsAreThePolicyClampedToTheHost) {
  KeyValues in = Probe({}, {"status"});
  auto text = [](rlim_t v) {
    return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v);
  };
  for (const auto& rule : policy::DefaultRlimits()) {
    std::string key;
    if (rule.resource == RLIMIT_CORE) key = "rlimit.core";
    if (rule.resource == RLIMIT_NOFILE) key = "rlimit.nofile";
    if (key.empty()) continue;
    struct rlimit host {};
    ASSERT_EQ(getrlimit(static_cast<__rlimit_resource>(rule.resource), &host), 0);
    struct rlimit want = policy::ClampRlimit(rule, host);
    EXPECT_EQ(Get(in, key), text(want.rlim_cur) + " " + text(want.rlim_max)) << rule.name;
  }
  EXPECT_EQ(Get(in, "rlimit.core"), "0 0");
}

// ---------------------------------------------------------------------------------------------
// Escapes.

TEST_F(JailTest, EscapeAttemptsFail) {
  KeyValues in = Probe({}, {"escape"});
  EXPECT_EQ(Get(in, "escape.mount"), "EPERM");
  EXPECT_EQ(Get(in, "escape.unshare_user"), "EPERM");
  EXPECT_EQ(Get(in, "escape.unshare_mount"), "EPERM");
  EXPECT_EQ(Get(in, "escape.chroot"), "EPERM");
  EXPECT_EQ(Get(in, "escape.setns_mnt"), "EPERM");
  EXPECT_NE(Get(in, "escape.open_proc1_ns"), "0") << "nsbox-init's namespaces are not ours";
  EXPECT_NE(Get(in, "escape.proc1_shadow"), "0");
  EXPECT_NE(Get(in, "escape.proc1_shadow"), "<missing>");
  EXPECT_EQ(Get(in, "escape.shadow"), "ENOENT");
  EXPECT_EQ(Get(in, "escape.mknod"), "EPERM");

  KeyValues host = Control({"escape"});
  EXPECT_EQ(Get(host, "escape.mount"), "0") << "control";
  EXPECT_EQ(Get(host, "escape.unshare_user"), "0") << "control";
  EXPECT_EQ(Get(host, "escape.chroot"), "0") << "control";
  EXPECT_EQ(Get(host, "escape.setns_mnt"), "0") << "control";
  EXPECT_EQ(Get(host, "escape.mknod"), "0") << "control";
}

TEST_F(JailTest, TiocstiIsRefused) {
  // With a terminal: fd 0 is the jail's pty.
  RunResult r = RunProbe({"--tty"}, {"tiocsti", "--stdin"}, WithStdin(""));
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  KeyValues tty = ParseKeyValues(r.out);
  EXPECT_EQ(Get(tty, "tiocsti.stdin_isatty"), "1") << r.Describe();
  EXPECT_EQ(Get(tty, "tiocsti.stdin"), "EPERM") << r.Describe();
  EXPECT_EQ(Get(tty, "tiocsti.pty"), "EPERM") << r.Describe();
  // Without one: a pty pair of the probe's own.
  KeyValues in = Probe({}, {"tiocsti"});
  EXPECT_EQ(Get(in, "tiocsti.pty"), "EPERM");

  KeyValues host = Control({"tiocsti"});
  EXPECT_EQ(Get(host, "tiocsti.pty"), "0") << "control: TIOCSTI works on the host";
}

TEST_F(JailTest, SignallingInitFromInsideDoesNothing) {
  RunResult r = RunProbe({}, {"signal-init"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  KeyValues kv = ParseKeyValues(r.out);
  EXPECT_EQ(Get(kv, "kill.TERM"), "0") << r.Describe();
  EXPECT_EQ(Get(kv, "kill.KILL"), "0") << r.Describe();
  EXPECT_EQ(Get(kv, "init_alive"), "1") << r.Describe();
  EXPECT_EQ(Get(kv, "alive"), "1") << r.Describe();
}

// ---------------------------------------------------------------------------------------------
// Environment.

TEST_F(JailTest, EnvironmentIsOnlyTheAllowlistAndEnv) {
  RunResult r = RunProbe({"--env", "FOO=bar baz", "--env", "LANG=de_DE.UTF-8"}, {"status"},
                         WithEnv({"NSBOX_TEST_SECRET=canary-7f3a91", "FOO=from-host"}));
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : ParseKeyValues(r.out)) {
    if (k.starts_with("env.")) env[k.substr(4)] = v;
  }
  const std::string shell = access("/bin/bash", X_OK) == 0 ? "/bin/bash" : "/bin/sh";
  const std::map<std::string, std::string> expected = {
      {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
      {"HOME", "/root"},
      {"USER", "root"},
      {"LOGNAME", "root"},
      {"SHELL", shell},
      {"HOSTNAME", "nsbox"},
      {"LANG", "de_DE.UTF-8"},
      {"TERM", "xterm-256color"},
      {"TMPDIR", "/tmp"},
      {"FOO", "bar baz"},
  };
  EXPECT_EQ(env, expected);
  EXPECT_EQ(r.out.find("canary-7f3a91"), std::string::npos) << r.Describe();
}

// ---------------------------------------------------------------------------------------------
// Exit codes, working directory, signals.

TEST_F(JailTest, ExitCodeIsPropagated) {
  RunResult r = RunNsbox(Command({}, {"sh", "-c", "exit 42"}));
  EXPECT_EQ(r.exit_code, 42) << r.Describe();
  r = RunNsbox(Command({}, {"true"}));
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(r.leftover.empty()) << r.Describe();
}

TEST_F(JailTest, SignalDeathIs128PlusTheSignal) {
  RunResult r = RunNsbox(Command({}, {"sh", "-c", "kill -SEGV $$"}));
  EXPECT_EQ(r.exit_code, 128 + SIGSEGV) << r.Describe();
  EXPECT_EQ(r.term_signal, 0) << "nsbox itself must exit, not die: " << r.Describe();
}

TEST_F(JailTest, CwdIsRelativeToTheWorkspace) {
  ws_->MakeDir("sub");
  KeyValues in = Probe({"--cwd", "sub"}, {"status"});
  EXPECT_EQ(Get(in, "cwd"), "/workspace/sub");
  KeyValues by_default = Probe({}, {"status"});
  EXPECT_EQ(Get(by_default, "cwd"), "/workspace");
}

TEST_F(JailTest, MissingCwdIs125) {
  const auto before = FindNsboxRunCgroups();
  RunResult r = RunNsbox(Command({"--cwd", "no/such/dir"}, {"true"}));
  EXPECT_EQ(r.exit_code, 125) << r.Describe();
  EXPECT_NE(r.err.find("no/such/dir"), std::string::npos) << r.Describe();
  ExpectNothingLeftBehind(r, before);
}

TEST_F(JailTest, SigtermIsForwardedToTheCommand) {
  RunOptions o;
  o.signal = SIGTERM;
  o.ready_output = "ready";
  o.timeout = std::chrono::seconds(15);
  RunResult r = RunNsbox(Command({}, {"sh", "-c", "echo ready; exec sleep 100"}), o);
  EXPECT_TRUE(r.signal_sent) << r.Describe();
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.Describe();
  EXPECT_EQ(r.term_signal, 0) << "nsbox must forward SIGTERM, not die of it: " << r.Describe();
  EXPECT_LT(r.elapsed, std::chrono::seconds(5)) << r.Describe();
  EXPECT_TRUE(r.leftover.empty()) << r.Describe();
}

}  // namespace
}  // namespace nsbox::itest

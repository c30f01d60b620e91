// The seccomp profile (policy/seccomp_profile.h) and its compiler and loader (isolate/seccomp.h):
// the table's sanity, the compiled BPF run by a small classic-BPF interpreter on synthetic input,
// and the filter loaded for real in forked children (no privilege needed once no_new_privs is
// set; the whole-table probe also unshares a user namespace, and skips where it cannot).

#include "isolate/seccomp.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "policy/seccomp_profile.h"

namespace nsbox::isolate {
namespace {

using policy::SeccompProfile;

constexpr uint32_t kAllow = SECCOMP_RET_ALLOW;
constexpr uint32_t kKillProcess = SECCOMP_RET_KILL_PROCESS;
constexpr uint32_t Errno(int err) { return SECCOMP_RET_ERRNO | static_cast<uint32_t>(err); }
constexpr uint32_t kX32Bit = 0x40000000;

// ---------------------------------------------------------------------------------------------
// A classic-BPF interpreter for seccomp programs: the instructions libseccomp and the preamble
// emit, and a few more. Fails the test on anything else.
uint32_t RunBpf(std::span<const struct sock_filter> prog, const struct seccomp_data& data) {
  uint32_t a = 0;
  uint32_t x = 0;
  uint32_t mem[BPF_MEMWORDS] = {};
  // SAFETY: seccomp_data is plain integers; the filter reads it as bytes, as the kernel does.
  const auto* bytes = reinterpret_cast<const unsigned char*>(&data);
  size_t pc = 0;
  while (pc < prog.size()) {
    const struct sock_filter f = prog[pc++];
    const uint32_t src = BPF_SRC(f.code) == BPF_X ? x : f.k;
    switch (BPF_CLASS(f.code)) {
      case BPF_LD:
        if (f.code == (BPF_LD | BPF_W | BPF_ABS)) {
          if (f.k % 4 != 0 || f.k + 4 > sizeof(data)) {
            ADD_FAILURE() << "bad load offset " << f.k << " at " << pc - 1;
            return 0xDEADBEEF;
          }
          std::memcpy(&a, bytes + f.k, 4);
        } else if (f.code == (BPF_LD | BPF_IMM)) {
          a = f.k;
        } else if (f.code == (BPF_LD | BPF_MEM)) {
          a = mem[f.k % BPF_MEMWORDS];
        } else {
          ADD_FAILURE() << "unsupported load 0x" << std::hex << f.code;
          return 0xDEADBEEF;
        }
        break;
      case BPF_LDX:
        if (f.code == (BPF_LDX | BPF_IMM)) {
          x = f.k;
        } else if (f.code == (BPF_LDX | BPF_MEM)) {
          x = mem[f.k % BPF_MEMWORDS];
        } else {
          ADD_FAILURE() << "unsupported ldx 0x" << std::hex << f.code;
          return 0xDEADBEEF;
        }
        break;
      case BPF_ST:
        mem[f.k % BPF_MEMWORDS] = a;
        break;
      case BPF_STX:
        mem[f.k % BPF_MEMWORDS] = x;
        break;
      case BPF_ALU:
        switch (BPF_OP(f.code)) {
          case BPF_ADD:
            a += src;
            break;
          case BPF_SUB:
            a -= src;
            break;
          case BPF_MUL:
            a *= src;
            break;
          case BPF_OR:
            a |= src;
            break;
          case BPF_AND:
            a &= src;
            break;
          case BPF_XOR:
            a ^= src;
            break;
          case BPF_LSH:
            a <<= (src & 31);
            break;
          case BPF_RSH:
            a >>= (src & 31);
            break;
          case BPF_NEG:
            a = -a;
            break;
          default:
            ADD_FAILURE() << "unsupported alu 0x" << std::hex << f.code;
            return 0xDEADBEEF;
        }
        break;
      case BPF_JMP: {
        if (BPF_OP(f.code) == BPF_JA) {
          pc += f.k;
          break;
        }
        bool taken = false;
        switch (BPF_OP(f.code)) {
          case BPF_JEQ:
            taken = a == src;
            break;
          case BPF_JGT:
            taken = a > src;
            break;
          case BPF_JGE:
            taken = a >= src;
            break;
          case BPF_JSET:
            taken = (a & src) != 0;
            break;
          default:
            ADD_FAILURE() << "unsupported jump 0x" << std::hex << f.code;
            return 0xDEADBEEF;
        }
        pc += taken ? f.jt : f.jf;
        break;
      }
      case BPF_RET:
        return BPF_RVAL(f.code) == BPF_A ? a : f.k;
      case BPF_MISC:
        if (BPF_MISCOP(f.code) == BPF_TAX) {
          x = a;
        } else {
          a = x;
        }
        break;
      default:
        ADD_FAILURE() << "unsupported class 0x" << std::hex << f.code;
        return 0xDEADBEEF;
    }
  }
  ADD_FAILURE() << "ran off the end of the program";
  return 0xDEADBEEF;
}

const SeccompProgram& DefaultProgram() {
  static const SeccompProgram* program = [] {
    auto compiled = CompileSeccomp(policy::DefaultSeccompProfile());
    if (!compiled.ok()) {
      ADD_FAILURE() << compiled.error().message();
      return new SeccompProgram({BPF_STMT(BPF_RET | BPF_K, 0xDEADBEEF)});
    }
    return new SeccompProgram(std::move(compiled).value());
  }();
  return *program;
}

int Nr(const char* name) {
  auto nr = ResolveSyscallNumber(name);
  EXPECT_TRUE(nr.ok()) << name;
  return nr.ok() ? *nr : -1;
}

uint32_t Eval(const SeccompProgram& program, uint32_t nr, std::array<uint64_t, 6> args = {},
              uint32_t arch = AUDIT_ARCH_X86_64) {
  struct seccomp_data data {};
  data.nr = static_cast<int>(nr);
  data.arch = arch;
  data.instruction_pointer = 0x401000;
  for (size_t i = 0; i < args.size(); ++i) data.args[i] = args[i];
  return RunBpf(program.instructions(), data);
}

uint32_t Eval(const char* name, std::array<uint64_t, 6> args = {}) {
  return Eval(DefaultProgram(), static_cast<uint32_t>(Nr(name)), args);
}

// ---------------------------------------------------------------------------------------------
// The table.

TEST(SeccompProfileTest, EveryEntryHasAReasonAResolvableNameAndASaneErrno) {
  const SeccompProfile p = policy::DefaultSeccompProfile();
  for (const auto& rule : p.deny) {
    EXPECT_NE(rule.reason, nullptr);
    EXPECT_GT(std::strlen(rule.reason), 10u) << rule.name;
    EXPECT_TRUE(ResolveSyscallNumber(rule.name).ok()) << rule.name;
    EXPECT_TRUE(rule.errno_value == EPERM || rule.errno_value == ENOSYS) << rule.name;
  }
  for (const auto& list : p.arg_allowlists) {
    EXPECT_GT(std::strlen(list.reason), 10u) << list.name;
    EXPECT_TRUE(ResolveSyscallNumber(list.name).ok()) << list.name;
    EXPECT_FALSE(list.allowed.empty()) << list.name;
  }
  for (const auto& s : p.allow_newer) {
    EXPECT_GT(std::strlen(s.reason), 10u) << s.name;
    auto nr = ResolveSyscallNumber(s.name);
    ASSERT_TRUE(nr.ok()) << s.name;
    EXPECT_GT(static_cast<uint32_t>(*nr), p.enosys_above) << s.name;
  }
  EXPECT_EQ(p.enosys_above, 450u);
}

TEST(SeccompProfileTest, NoDuplicatesAndNoRuleShadowedByAnother) {
  const SeccompProfile p = policy::DefaultSeccompProfile();
  std::set<std::string> always;
  std::set<std::string> conditional;
  for (const auto& rule : p.deny) {
    if (rule.when.empty()) {
      EXPECT_TRUE(always.insert(rule.name).second) << "twice: " << rule.name;
    } else {
      conditional.insert(rule.name);
    }
  }
  for (const auto& name : conditional) EXPECT_EQ(always.count(name), 0u) << name;
  std::set<std::string> listed;
  for (const auto& list : p.arg_allowlists) {
    EXPECT_TRUE(listed.insert(list.name).second) << list.name;
    EXPECT_EQ(always.count(list.name), 0u) << list.name;
  }
  for (const auto& s : p.allow_newer) {
    EXPECT_EQ(always.count(s.name), 0u) << s.name;
    EXPECT_TRUE(listed.insert(s.name).second) << s.name;
  }
}

TEST(SeccompProfileTest, DeniesEverySyscallTheSecurityReferencesList) {
  const SeccompProfile p = policy::DefaultSeccompProfile();
  std::set<std::string> denied;
  for (const auto& rule : p.deny) denied.insert(rule.name);
  for (const char* name : {"unshare",
                           "setns",
                           "mount",
                           "umount2",
                           "pivot_root",
                           "chroot",
                           "clone",
                           "clone3",
                           "fsopen",
                           "fsconfig",
                           "fsmount",
                           "fspick",
                           "move_mount",
                           "open_tree",
                           "open_tree_attr",
                           "mount_setattr",
                           "add_key",
                           "keyctl",
                           "request_key",
                           "ptrace",
                           "process_vm_readv",
                           "process_vm_writev",
                           "kcmp",
                           "pidfd_getfd",
                           "process_madvise",
                           "bpf",
                           "perf_event_open",
                           "userfaultfd",
                           "io_uring_setup",
                           "io_uring_enter",
                           "io_uring_register",
                           "init_module",
                           "finit_module",
                           "delete_module",
                           "create_module",
                           "query_module",
                           "get_kernel_syms",
                           "kexec_load",
                           "kexec_file_load",
                           "reboot",
                           "settimeofday",
                           "clock_settime",
                           "acct",
                           "quotactl",
                           "quotactl_fd",
                           "swapon",
                           "swapoff",
                           "syslog",
                           "lookup_dcookie",
                           "fanotify_init",
                           "open_by_handle_at",
                           "iopl",
                           "ioperm",
                           "uselib",
                           "ustat",
                           "sysfs",
                           "_sysctl",
                           "nfsservctl",
                           "modify_ldt",
                           "mbind",
                           "set_mempolicy",
                           "get_mempolicy",
                           "set_mempolicy_home_node",
                           "move_pages",
                           "migrate_pages",
                           "sethostname",
                           "setdomainname",
                           "lsm_get_self_attr",
                           "lsm_set_self_attr",
                           "lsm_list_modules",
                           "statmount",
                           "listmount",
                           "ioctl"}) {
    EXPECT_EQ(denied.count(name), 1u) << name;
  }
}

TEST(SeccompProfileTest, FallbackNumbersAgreeWithLibseccompWhereItKnowsThem) {
  int previous = 450;
  for (const auto& s : policy::X8664SyscallNumberFallbacks()) {
    EXPECT_EQ(s.nr, previous + 1) << s.name << ": the table is dense and sorted";
    previous = s.nr;
    const int libseccomp = seccomp_syscall_resolve_name_arch(SCMP_ARCH_X86_64, s.name);
    if (libseccomp != __NR_SCMP_ERROR) {
      EXPECT_EQ(libseccomp, s.nr) << s.name;
    }
    auto resolved = ResolveSyscallNumber(s.name);
    ASSERT_TRUE(resolved.ok()) << s.name;
    EXPECT_EQ(*resolved, s.nr);
  }
  EXPECT_EQ(policy::X8664SyscallNumberFallback("mseal"), 462);
  EXPECT_EQ(policy::X8664SyscallNumberFallback("read"), std::nullopt);
}

TEST(SeccompProfileTest, ResolveRejectsUnknownNamesAndOtherArchitecturesSyscalls) {
  EXPECT_EQ(*ResolveSyscallNumber("read"), 0);
  EXPECT_EQ(*ResolveSyscallNumber("open_tree_attr"), 467);
  EXPECT_FALSE(ResolveSyscallNumber("no_such_syscall").ok());
  EXPECT_FALSE(ResolveSyscallNumber("vm86").ok());    // i386 only
  EXPECT_FALSE(ResolveSyscallNumber("umount").ok());  // x86_64 has umount2 only
}

// ---------------------------------------------------------------------------------------------
// The compiled program, evaluated offline.

TEST(SeccompBpfTest, CompilesToAProgramTheKernelAccepts) {
  const SeccompProgram& program = DefaultProgram();
  EXPECT_GT(program.size(), 20u);
  EXPECT_LE(program.size(), static_cast<size_t>(BPF_MAXINSNS));
  EXPECT_EQ(program.fprog()->len, program.size());
  EXPECT_EQ(program.fprog()->filter, program.instructions().data());
  // Copies point at their own instructions.
  SeccompProgram copy = program;
  EXPECT_EQ(copy.fprog()->filter, copy.instructions().data());
  EXPECT_NE(copy.fprog()->filter, program.fprog()->filter);
}

TEST(SeccompBpfTest, AnOversizedProgramIsRefusedNotTruncated) {
  std::vector<struct sock_filter> insns(BPF_MAXINSNS + 1, BPF_STMT(BPF_RET | BPF_K, kAllow));
  const SeccompProgram program(std::move(insns));
  EXPECT_EQ(program.fprog()->len, 0u);  // the kernel answers EINVAL to length 0
}

TEST(SeccompBpfTest, NamespaceAndMountCalls) {
  EXPECT_EQ(Eval("mount"), Errno(EPERM));
  EXPECT_EQ(Eval("umount2"), Errno(EPERM));
  EXPECT_EQ(Eval("unshare", {CLONE_NEWUSER}), Errno(EPERM));
  EXPECT_EQ(Eval("setns"), Errno(EPERM));
  EXPECT_EQ(Eval("pivot_root"), Errno(EPERM));
  EXPECT_EQ(Eval("chroot"), Errno(EPERM));
  EXPECT_EQ(Eval("clone3"), Errno(ENOSYS));
  EXPECT_EQ(Eval("fsopen"), Errno(ENOSYS));
  EXPECT_EQ(Eval("move_mount"), Errno(ENOSYS));
  EXPECT_EQ(Eval("open_tree_attr"), Errno(ENOSYS));  // 467, by the fallback table
  EXPECT_EQ(Eval("statmount"), Errno(ENOSYS));
  EXPECT_EQ(Eval("listmount"), Errno(ENOSYS));
}

TEST(SeccompBpfTest, CloneIsDeniedWithAnyNamespaceFlagOnly) {
  EXPECT_EQ(Eval("clone", {CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD}),
            kAllow);
  EXPECT_EQ(Eval("clone", {SIGCHLD}), kAllow);
  EXPECT_EQ(Eval("clone", {CLONE_VM | CLONE_VFORK | SIGCHLD}), kAllow);
  for (uint64_t flag : {CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER,
                        CLONE_NEWPID, CLONE_NEWNET}) {
    EXPECT_EQ(Eval("clone", {flag | SIGCHLD}), Errno(EPERM)) << std::hex << flag;
    EXPECT_EQ(Eval("clone", {flag | CLONE_VM | CLONE_FS}), Errno(EPERM)) << std::hex << flag;
  }
  EXPECT_EQ(Eval("clone", {uint64_t{0x7E020000} | (uint64_t{1} << 40)}), Errno(EPERM));
}

TEST(SeccompBpfTest, IoctlTerminalInjectionIsDeniedWhateverTheHighBits) {
  EXPECT_EQ(Eval("ioctl", {0, TIOCSTI}), Errno(EPERM));
  EXPECT_EQ(Eval("ioctl", {0, uint64_t{TIOCSTI} | 0x100000000}), Errno(EPERM));
  EXPECT_EQ(Eval("ioctl", {0, uint64_t{TIOCSTI} | 0xFFFFFFFF00000000}), Errno(EPERM));
  EXPECT_EQ(Eval("ioctl", {0, TIOCLINUX}), Errno(EPERM));
  EXPECT_EQ(Eval("ioctl", {0, uint64_t{TIOCLINUX} | 0x800000000}), Errno(EPERM));
  EXPECT_EQ(Eval("ioctl", {0, TCGETS}), kAllow);
  EXPECT_EQ(Eval("ioctl", {0, TIOCGWINSZ}), kAllow);
  EXPECT_EQ(Eval("ioctl", {0, FIONREAD}), kAllow);
}

// nsbox-init is PID 1 of every command's PID namespace: its limits are out of prlimit's reach,
// however the 64-bit register around the pid_t is filled; a command's own processes are not.
TEST(SeccompBpfTest, PrlimitOfPidOneIsDeniedWhateverTheHighBits) {
  constexpr uint64_t kLimit = 0x7fff0000;  // any pointer: the filter does not read it
  EXPECT_EQ(Eval("prlimit64", {1, RLIMIT_NOFILE, kLimit, 0}), Errno(EPERM));
  EXPECT_EQ(Eval("prlimit64", {1, RLIMIT_CPU, kLimit, kLimit}), Errno(EPERM));
  EXPECT_EQ(Eval("prlimit64", {1, RLIMIT_NOFILE, 0, kLimit}), Errno(EPERM));
  EXPECT_EQ(Eval("prlimit64", {uint64_t{1} | 0x100000000, RLIMIT_FSIZE, kLimit, 0}), Errno(EPERM));
  EXPECT_EQ(Eval("prlimit64", {0xFFFFFFFF00000001, RLIMIT_FSIZE, kLimit, 0}), Errno(EPERM));
  // Itself (0, what glibc's setrlimit passes) and any other pid: the kernel's checks decide.
  EXPECT_EQ(Eval("prlimit64", {0, RLIMIT_NOFILE, kLimit, 0}), kAllow);
  EXPECT_EQ(Eval("prlimit64", {0x100000000, RLIMIT_NOFILE, kLimit, 0}), kAllow);
  EXPECT_EQ(Eval("prlimit64", {2, RLIMIT_NOFILE, kLimit, 0}), kAllow);
  EXPECT_EQ(Eval("prlimit64", {4097, RLIMIT_NOFILE, kLimit, 0}), kAllow);
  EXPECT_EQ(Eval("setrlimit", {RLIMIT_NOFILE, kLimit}), kAllow);
}

TEST(SeccompBpfTest, SocketFamiliesOutsideTheAllowlistGetEafnosupport) {
  for (uint64_t family : {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK}) {
    EXPECT_EQ(Eval("socket", {family, SOCK_STREAM, 0}), kAllow) << family;
    EXPECT_EQ(Eval("socketpair", {family, SOCK_STREAM, 0}), kAllow) << family;
  }
  for (uint64_t family : {0, AF_PACKET, AF_ALG, AF_VSOCK, AF_TIPC, AF_RDS, AF_BLUETOOTH, 3, 255}) {
    EXPECT_EQ(Eval("socket", {family, SOCK_RAW, 0}), Errno(EAFNOSUPPORT)) << family;
    EXPECT_EQ(Eval("socketpair", {family, SOCK_RAW, 0}), Errno(EAFNOSUPPORT)) << family;
  }
  // The high half must be zero too: the kernel would read AF_INET, the filter refuses.
  EXPECT_EQ(Eval("socket", {uint64_t{AF_INET} | 0x100000000}), Errno(EAFNOSUPPORT));
}

TEST(SeccompBpfTest, PersonalityOnlyDockersValues) {
  for (uint64_t persona : std::array<uint64_t, 5>{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}) {
    EXPECT_EQ(Eval("personality", {persona}), kAllow) << std::hex << persona;
  }
  for (uint64_t persona :
       {uint64_t{READ_IMPLIES_EXEC}, uint64_t{ADDR_NO_RANDOMIZE}, uint64_t{MMAP_PAGE_ZERO},
        uint64_t{0x1}, uint64_t{0x20009}, uint64_t{0xfffffffe}, uint64_t{0xffffffffffffffff},
        uint64_t{0x100000000}}) {
    EXPECT_EQ(Eval("personality", {persona}), Errno(EPERM)) << std::hex << persona;
  }
}

TEST(SeccompBpfTest, OrdinaryCallsAreAllowed) {
  for (const char* name :
       {"read", "write", "openat", "close", "mmap", "execve", "exit_group", "rt_sigaction", "futex",
        "getpid", "wait4", "seccomp", "landlock_create_ruleset", "adjtimex", "name_to_handle_at",
        "memfd_secret", "futex_waitv", "pidfd_open", "openat2"}) {
    EXPECT_EQ(Eval(name), kAllow) << name;
  }
}

TEST(SeccompBpfTest, EveryUnconditionalRuleAndEveryNewerSyscall) {
  const SeccompProfile p = policy::DefaultSeccompProfile();
  std::set<int> decided;
  for (const auto& rule : p.deny) {
    const int nr = Nr(rule.name);
    decided.insert(nr);
    if (rule.when.empty()) {
      EXPECT_EQ(Eval(rule.name, {1, 2, 3, 4, 5, 6}), Errno(rule.errno_value)) << rule.name;
    }
  }
  for (const auto& s : p.allow_newer) {
    decided.insert(Nr(s.name));
    EXPECT_EQ(Eval(s.name), kAllow) << s.name;
  }
  EXPECT_EQ(Eval(DefaultProgram(), 452, {~uint64_t{0}, 0, 0, 0}), kAllow);  // fchmodat2
  EXPECT_EQ(Eval(DefaultProgram(), 462), kAllow);                           // mseal
  // Everything else above 450 is a syscall nobody reviewed: ENOSYS, so libc falls back.
  for (uint32_t nr = 451; nr < 2048; ++nr) {
    if (decided.count(static_cast<int>(nr)) != 0) continue;
    ASSERT_EQ(Eval(DefaultProgram(), nr), Errno(ENOSYS)) << nr;
  }
  EXPECT_EQ(Eval(DefaultProgram(), 463), Errno(ENOSYS));  // setxattrat: not reviewed as allowed
  EXPECT_EQ(Eval(DefaultProgram(), 500), Errno(ENOSYS));
  EXPECT_EQ(Eval(DefaultProgram(), 0x3FFFFFFF), Errno(ENOSYS));
}

TEST(SeccompBpfTest, OtherArchitecturesAndX32AreKilled) {
  const SeccompProgram& program = DefaultProgram();
  EXPECT_EQ(Eval(program, 20, {}, AUDIT_ARCH_I386), kKillProcess);   // i386 getpid
  EXPECT_EQ(Eval(program, 102, {}, AUDIT_ARCH_I386), kKillProcess);  // i386 socketcall
  EXPECT_EQ(Eval(program, 0, {}, AUDIT_ARCH_AARCH64), kKillProcess);
  EXPECT_EQ(Eval(program, kX32Bit | 39, {}), kKillProcess);   // x32 getpid
  EXPECT_EQ(Eval(program, kX32Bit | 165, {}), kKillProcess);  // x32 mount
  EXPECT_EQ(Eval(program, kX32Bit | 521, {}), kKillProcess);  // x32 ptrace
}

// ---------------------------------------------------------------------------------------------
// Deriving and rejecting profiles.

TEST(SeccompProfileTest, AllowDerivesALooserProfile) {
  SeccompProfile server = policy::DefaultSeccompProfile();
  server.Allow("io_uring_setup", "the in-jail server's event loop");
  server.Allow("io_uring_enter", "the in-jail server's event loop");
  server.Allow("io_uring_register", "the in-jail server's event loop");
  server.Allow("setxattrat", "a test of allowing a newer syscall");
  auto program = CompileSeccomp(server);
  ASSERT_TRUE(program.ok()) << program.error().message();
  EXPECT_EQ(Eval(*program, static_cast<uint32_t>(Nr("io_uring_setup"))), kAllow);
  EXPECT_EQ(Eval(*program, static_cast<uint32_t>(Nr("io_uring_enter"))), kAllow);
  EXPECT_EQ(Eval(*program, 463), kAllow);
  EXPECT_EQ(Eval(*program, static_cast<uint32_t>(Nr("mount"))), Errno(EPERM));
  // A denied newer syscall falls back to ENOSYS if only its rule is dropped...
  SeccompProfile p = policy::DefaultSeccompProfile();
  p.Allow("listmount", "a test");
  auto q = CompileSeccomp(p);
  ASSERT_TRUE(q.ok()) << q.error().message();
  EXPECT_EQ(Eval(*q, 458), kAllow);  // ...but Allow also lists it in allow_newer.
}

TEST(SeccompProfileTest, CompileRejectsMalformedProfiles) {
  using Cmp = policy::SyscallArgCmp;
  SeccompProfile base;
  base.enosys_above = 450;

  SeccompProfile unknown = base;
  unknown.deny.push_back({"no_such_syscall", EPERM, {}, "test"});
  EXPECT_FALSE(CompileSeccomp(unknown).ok());

  SeccompProfile same_arg = base;
  same_arg.deny.push_back(
      {"personality", EPERM, {{0, Cmp::kNe, 0}, {0, Cmp::kNe, 8}}, "one argument twice"});
  EXPECT_FALSE(CompileSeccomp(same_arg).ok());

  SeccompProfile newer_with_args = base;
  newer_with_args.deny.push_back({"listmount", ENOSYS, {{0, Cmp::kEq, 0}}, "test"});
  EXPECT_FALSE(CompileSeccomp(newer_with_args).ok());

  SeccompProfile bad_errno = base;
  bad_errno.deny.push_back({"mount", 5000, {}, "test"});
  EXPECT_FALSE(CompileSeccomp(bad_errno).ok());

  SeccompProfile old_in_newer = base;
  old_in_newer.allow_newer.push_back({"read", "test"});
  EXPECT_FALSE(CompileSeccomp(old_in_newer).ok());

  SeccompProfile empty_mask = base;
  empty_mask.deny.push_back({"clone", EPERM, {{0, Cmp::kAnyBitSet, 0}}, "test"});
  EXPECT_FALSE(CompileSeccomp(empty_mask).ok());

  // An empty profile is fine: only the architecture and ENOSYS-above checks.
  auto empty = CompileSeccomp(base);
  ASSERT_TRUE(empty.ok()) << empty.error().message();
  EXPECT_EQ(Eval(*empty, static_cast<uint32_t>(Nr("mount"))), kAllow);
  EXPECT_EQ(Eval(*empty, 460), Errno(ENOSYS));
}

TEST(SeccompProfileTest, OtherComparisonOperatorsCompile) {
  using Cmp = policy::SyscallArgCmp;
  SeccompProfile p;
  p.enosys_above = 450;
  p.deny.push_back({"kill", EPERM, {{0, Cmp::kEq, 1}}, "test: kill(1, ...)"});
  p.deny.push_back({"dup2", EPERM, {{1, Cmp::kLt, 3}}, "test: dup2 onto stdio"});
  p.deny.push_back({"dup3", EPERM, {{1, Cmp::kGe, 1000}}, "test: dup3 high"});
  p.deny.push_back({"tkill", EPERM, {{1, Cmp::kNe, 0}, {0, Cmp::kGt, 100}}, "test"});
  auto program = CompileSeccomp(p);
  ASSERT_TRUE(program.ok()) << program.error().message();
  const auto nr = [](const char* n) { return static_cast<uint32_t>(Nr(n)); };
  EXPECT_EQ(Eval(*program, nr("kill"), {1, 9}), Errno(EPERM));
  EXPECT_EQ(Eval(*program, nr("kill"), {2, 9}), kAllow);
  EXPECT_EQ(Eval(*program, nr("dup2"), {5, 2}), Errno(EPERM));
  EXPECT_EQ(Eval(*program, nr("dup2"), {5, 3}), kAllow);
  EXPECT_EQ(Eval(*program, nr("dup3"), {5, 1000}), Errno(EPERM));
  EXPECT_EQ(Eval(*program, nr("dup3"), {5, 999}), kAllow);
  EXPECT_EQ(Eval(*program, nr("tkill"), {101, 9}), Errno(EPERM));
  EXPECT_EQ(Eval(*program, nr("tkill"), {101, 0}), kAllow);
  EXPECT_EQ(Eval(*program, nr("tkill"), {100, 9}), kAllow);
}

// ---------------------------------------------------------------------------------------------
// The filter loaded for real, in forked children.

// Runs `body` in a forked child with the results pipe as its argument; returns the child's wait
// status and what it wrote.
template <typename Body>
int RunChild(Body body, std::vector<long>* results) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << std::strerror(errno);
    return -1;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    // No core files from the children that are meant to die of SIGSYS.
    const struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    body(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  long value;
  while (read(fds[0], &value, sizeof(value)) == sizeof(value)) results->push_back(value);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

// The errno of a raw syscall made in the child, or 0 if it succeeded.
long ErrnoOf(long ret) { return ret == -1 ? errno : 0; }

void Report(int fd, long value) {
  if (write(fd, &value, sizeof(value)) != sizeof(value)) _exit(3);
}

void LoadOrExit(const SeccompProgram& program, int fd) {
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) _exit(4);
  const int err = LoadSeccomp(program);
  Report(fd, err);
  if (err != 0) _exit(5);
}

TEST(SeccompLiveTest, DeniedCallsGetTheProfilesErrnoAndOthersWork) {
  const SeccompProgram& program = DefaultProgram();
  std::vector<long> r;
  const int status = RunChild(
      [&](int fd) {
        LoadOrExit(program, fd);
        Report(fd, ErrnoOf(getpid() > 0 ? 0 : -1));
        Report(fd, ErrnoOf(mount(nullptr, nullptr, nullptr, 0, nullptr)));
        Report(fd, ErrnoOf(unshare(CLONE_NEWUSER)));
        Report(fd, ErrnoOf(syscall(SYS_keyctl, 0, 0, 0, 0, 0)));
        Report(fd, ErrnoOf(syscall(SYS_clone3, nullptr, 0)));
        // CLONE_NEWUSER | CLONE_FS is invalid, so even without the filter no child is created.
        Report(fd, ErrnoOf(syscall(SYS_clone, CLONE_NEWUSER | CLONE_FS | SIGCHLD, 0, 0, 0, 0)));
        Report(fd, ErrnoOf(syscall(SYS_io_uring_setup, 0, nullptr)));
        Report(fd, ErrnoOf(ioctl(-1, TIOCSTI, nullptr)));
        struct termios t;
        Report(fd, ErrnoOf(ioctl(-1, TCGETS, &t)));
        Report(fd, ErrnoOf(socket(AF_PACKET, SOCK_RAW, 0)));
        const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        Report(fd, ErrnoOf(s < 0 ? -1 : 0));
        Report(fd, ErrnoOf(personality(0xffffffff) == -1 ? -1 : 0));
        Report(fd, ErrnoOf(personality(READ_IMPLIES_EXEC)));
        Report(fd, ErrnoOf(syscall(457, nullptr, nullptr, 0, 0)));  // statmount
        Report(fd, ErrnoOf(syscall(500, 0, 0, 0)));
        Report(fd, ErrnoOf(syscall(452, -1, nullptr, 0, 0)));  // fchmodat2: allowed
        // Without the filter: ESRCH, as this process is not traced.
        Report(fd, ErrnoOf(syscall(SYS_ptrace, PTRACE_GETREGS, getpid(), 0, 0)));
      },
      &r);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  ASSERT_EQ(r.size(), 18u);
  size_t i = 0;
  EXPECT_EQ(r[i++], 0) << "LoadSeccomp";
  EXPECT_EQ(r[i++], 0) << "getpid";
  EXPECT_EQ(r[i++], EPERM) << "mount";
  EXPECT_EQ(r[i++], EPERM) << "unshare(CLONE_NEWUSER)";
  EXPECT_EQ(r[i++], EPERM) << "keyctl";
  EXPECT_EQ(r[i++], ENOSYS) << "clone3";
  EXPECT_EQ(r[i++], EPERM) << "clone(CLONE_NEWUSER)";
  EXPECT_EQ(r[i++], EPERM) << "io_uring_setup";
  EXPECT_EQ(r[i++], EPERM) << "ioctl(TIOCSTI)";
  EXPECT_EQ(r[i++], EBADF) << "ioctl(TCGETS) reaches the kernel";
  EXPECT_EQ(r[i++], EAFNOSUPPORT) << "socket(AF_PACKET)";
  EXPECT_EQ(r[i++], 0) << "socket(AF_UNIX)";
  EXPECT_EQ(r[i++], 0) << "personality(query)";
  EXPECT_EQ(r[i++], EPERM) << "personality(READ_IMPLIES_EXEC)";
  EXPECT_EQ(r[i++], ENOSYS) << "statmount";
  EXPECT_EQ(r[i++], ENOSYS) << "syscall 500";
  EXPECT_NE(r[i], ENOSYS) << "fchmodat2 reaches the kernel";
  EXPECT_NE(r[i++], EPERM) << "fchmodat2 reaches the kernel";
  EXPECT_EQ(r[i++], EPERM) << "ptrace";
}

// Every rule of the table, live: a copy of the profile whose every errno is a sentinel no kernel
// path returns, so a match proves the filter (not the kernel) answered. The child first moves
// into a new user namespace, so that even a rule that failed to match could not touch the host
// with the zero arguments used here (everything host-wide needs capabilities it lacks there).
TEST(SeccompLiveTest, EveryRuleOfTheTableMatchesOnTheRunningKernel) {
  constexpr int kSentinel = 4000;
  SeccompProfile p = policy::DefaultSeccompProfile();
  for (auto& rule : p.deny) rule.errno_value = kSentinel;
  for (auto& list : p.arg_allowlists) list.errno_value = kSentinel;
  auto program = CompileSeccomp(p);
  ASSERT_TRUE(program.ok()) << program.error().message();
  std::vector<std::pair<std::string, int>> unconditional;
  for (const auto& rule : p.deny) {
    if (rule.when.empty()) unconditional.emplace_back(rule.name, Nr(rule.name));
  }
  std::vector<long> r;
  const int status = RunChild(
      [&](int fd) {
        if (unshare(CLONE_NEWUSER) != 0) _exit(77);
        LoadOrExit(*program, fd);
        for (const auto& [name, nr] : unconditional) {
          Report(fd, ErrnoOf(syscall(nr, 0, 0, 0, 0, 0, 0)));
        }
        Report(fd, ErrnoOf(syscall(SYS_clone, CLONE_NEWNET | CLONE_NEWUSER | CLONE_FS, 0, 0, 0)));
        Report(fd, ErrnoOf(syscall(SYS_ioctl, 0, uint64_t{TIOCSTI} | 0x100000000, 0)));
        Report(fd, ErrnoOf(syscall(SYS_ioctl, 0, TIOCLINUX, 0)));
        Report(fd, ErrnoOf(syscall(SYS_personality, ADDR_NO_RANDOMIZE)));
        Report(fd, ErrnoOf(syscall(SYS_socket, AF_ALG, SOCK_SEQPACKET, 0)));
        Report(fd, ErrnoOf(syscall(SYS_socketpair, AF_TIPC, SOCK_DGRAM, 0, nullptr)));
        // Reads nothing and sets nothing: the kernel would check permission only.
        Report(fd, ErrnoOf(syscall(SYS_prlimit64, uint64_t{1} | 0x100000000, RLIMIT_CORE, nullptr,
                                   nullptr)));
      },
      &r);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    GTEST_SKIP() << "unshare(CLONE_NEWUSER) is not permitted here";
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  ASSERT_EQ(r.size(), 1 + unconditional.size() + 7);
  EXPECT_EQ(r[0], 0) << "LoadSeccomp";
  for (size_t i = 0; i < unconditional.size(); ++i) {
    EXPECT_EQ(r[1 + i], kSentinel)
        << unconditional[i].first << " (" << unconditional[i].second << ")";
  }
  for (size_t i = 1 + unconditional.size(); i < r.size(); ++i) {
    EXPECT_EQ(r[i], kSentinel) << "conditional probe " << i - unconditional.size() - 1;
  }
}

TEST(SeccompLiveTest, X32SyscallKillsTheProcess) {
  const SeccompProgram& program = DefaultProgram();
  std::vector<long> r;
  const int status = RunChild(
      [&](int fd) {
        LoadOrExit(program, fd);
        syscall(kX32Bit | SYS_getpid);
      },
      &r);
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGSYS);
}

long Int80Getpid() {
  long ret = 20;  // __NR_getpid of i386
  // SAFETY (test only): int 0x80 enters the i386 syscall ABI; the kernel preserves every register
  // but eax (and, on some kernels, r8-r11, which are declared clobbered).
  asm volatile("int $0x80" : "+a"(ret) : : "memory", "r8", "r9", "r10", "r11");
  return ret;
}

TEST(SeccompLiveTest, I386SyscallKillsTheProcess) {
  std::vector<long> r;
  const int control = RunChild([](int fd) { Report(fd, Int80Getpid()); }, &r);
  if (!WIFEXITED(control) || WEXITSTATUS(control) != 0 || r.size() != 1 || r[0] <= 0) {
    GTEST_SKIP() << "this kernel does not run i386 syscalls (no IA32 emulation)";
  }
  r.clear();
  const SeccompProgram& program = DefaultProgram();
  const int status = RunChild(
      [&](int fd) {
        LoadOrExit(program, fd);
        Report(fd, Int80Getpid());
      },
      &r);
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGSYS);
  EXPECT_EQ(r.size(), 1u) << "only LoadSeccomp's report";
}

}  // namespace
}  // namespace nsbox::isolate

namespace nsbox::isolate {
namespace {

// The kernel's rule for stacked filters (kernel/seccomp.c, seccomp_run_filters): the answer with
// the lowest action wins (KILL_PROCESS, as a negative s32, lowest of all); on a tie the most
// recently installed filter's answer stands.
uint32_t Stacked(uint32_t older, uint32_t newer) {
  auto action = [](uint32_t r) { return static_cast<int32_t>(r & SECCOMP_RET_ACTION_FULL); };
  return action(older) < action(newer) ? older : newer;
}

TEST(SeccompStackTest, InitsFilterPlusTheCommandsEqualsTheDefaultProfile) {
  auto init = CompileSeccomp(policy::InitSeccompProfile());
  auto over = CompileSeccomp(policy::CommandOverInitSeccompProfile());
  ASSERT_TRUE(init.ok()) << init.error().message();
  ASSERT_TRUE(over.ok()) << over.error().message();
  // Small is the point: loading the whole default filter costs tens of microseconds per exec.
  EXPECT_LT(over->size(), 32u);
  EXPECT_EQ(Eval(*init, static_cast<uint32_t>(Nr("clone3"))), kAllow);
  EXPECT_EQ(Eval(*init, static_cast<uint32_t>(Nr("io_uring_setup"))), kAllow);
  const std::vector<std::array<uint64_t, 6>> args = {
      {}, {0x10000000}, {0xffffffffull}, {17}, {0x5412}, {1, 0x5412}, {2, 0x541C}, {0x7E020000}};
  for (uint32_t nr = 0; nr < 1024; ++nr) {
    for (const auto& a : args) {
      uint32_t want = Eval(DefaultProgram(), nr, a);
      uint32_t got = Stacked(Eval(*init, nr, a), Eval(*over, nr, a));
      ASSERT_EQ(got, want) << "syscall " << nr << " arg0 " << a[0] << " arg1 " << a[1];
    }
  }
  for (uint32_t arch :
       {static_cast<uint32_t>(AUDIT_ARCH_I386), static_cast<uint32_t>(AUDIT_ARCH_X86_64)}) {
    uint32_t nr = arch == AUDIT_ARCH_I386 ? 20 : (kX32Bit | 39);
    EXPECT_EQ(Stacked(Eval(*init, nr, {}, arch), Eval(*over, nr, {}, arch)), kKillProcess);
  }
}

}  // namespace
}  // namespace nsbox::isolate

// nsbox-init's guard against its commands (runtime/init_guard.h): which saved ids it picks, the
// limits a command starts with, and, as root, the kernel's prlimit check against saved ids that
// differ from the real and effective ones, in a user namespace of 65536 ids as a jail's.

#include "runtime/init_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>

namespace nsbox::runtime {
namespace {

TEST(InitGuardTest, TheSavedIdIsNobodyWhenMappedElseTheLowestOther) {
  EXPECT_EQ(AnotherMappedId("         0 1610612736      65536\n", 0), 65534u);
  EXPECT_EQ(AnotherMappedId("0 100000 1000\n", 0), 1u);
  EXPECT_EQ(AnotherMappedId("0 100000 1\n5 200000 3\n", 0), 5u);
  EXPECT_EQ(AnotherMappedId("0 100000 1\n65534 200000 1\n", 0), 65534u);
  EXPECT_EQ(AnotherMappedId("0 100000 2\n", 0), 1u);
  // Never the id it must differ from.
  EXPECT_EQ(AnotherMappedId("65534 100000 1\n", 65534), std::nullopt);
  EXPECT_EQ(AnotherMappedId("65533 100000 3\n", 65534), 65533u);
  // One id only, an empty map, malformed lines: none.
  EXPECT_EQ(AnotherMappedId("0 100000 1\n", 0), std::nullopt);
  EXPECT_EQ(AnotherMappedId("", 0), std::nullopt);
  EXPECT_EQ(AnotherMappedId("0 100000\nx 1 2\n0 1 0\n", 0), std::nullopt);
  // (uid_t)-1 means "unchanged" to setresuid: never picked.
  EXPECT_EQ(AnotherMappedId("0 100000 1\n4294967295 5 1\n", 0), std::nullopt);
}

TEST(InitGuardTest, ACommandGetsEveryLimitTheConfiguredOnesFirst) {
  const std::vector<fs::proto::Rlimit> configured = {{RLIMIT_NOFILE, 1024, 65536},
                                                     {RLIMIT_CORE, 0, 0}};
  std::vector<fs::proto::Rlimit> own;
  for (uint32_t r = 0; r < RLIM_NLIMITS; ++r) own.push_back({r, 1000 + r, 2000 + r});
  const auto all = CommandRlimits(configured, own);
  ASSERT_EQ(all.size(), static_cast<size_t>(RLIM_NLIMITS));
  for (uint32_t r = 0; r < RLIM_NLIMITS; ++r) {
    size_t seen = 0;
    for (const auto& l : all) {
      if (l.resource != r) continue;
      ++seen;
      if (r == RLIMIT_NOFILE) {
        EXPECT_EQ(l.soft, 1024u);
        EXPECT_EQ(l.hard, 65536u);
      } else if (r == RLIMIT_CORE) {
        EXPECT_EQ(l.soft, 0u);
      } else {
        EXPECT_EQ(l.soft, 1000 + r) << r;
        EXPECT_EQ(l.hard, 2000 + r) << r;
      }
    }
    EXPECT_EQ(seen, 1u) << "resource " << r;
  }
}

TEST(InitGuardTest, OwnLimitsAreEveryResourceAsGetrlimitReadsThem) {
  auto own = ReadOwnLimits();
  ASSERT_TRUE(own.ok()) << own.error().message();
  ASSERT_EQ(own->size(), static_cast<size_t>(RLIM_NLIMITS));
  struct rlimit nofile {};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &nofile), 0);
  EXPECT_EQ((*own)[RLIMIT_NOFILE].soft, nofile.rlim_cur);
  EXPECT_EQ((*own)[RLIMIT_NOFILE].hard, nofile.rlim_max);
}

// The errno of a prlimit64 that lowers `pid`'s RLIMIT_CORE to 0 (harmless: nothing here dumps).
int LowerCoreOf(pid_t pid) {
  const struct rlimit zero = {0, 0};
  // SAFETY: prlimit64 reads `zero`; the old value is not asked for.
  return syscall(SYS_prlimit64, pid, RLIMIT_CORE, &zero, nullptr) == 0 ? 0 : errno;
}

// Drops CAP_SYS_RESOURCE from the caller's effective and permitted sets, as a command has none
// (policy/capabilities.cc); the other capabilities stay. False when capget or capset failed.
bool DropSysResource() {
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2] = {};
  // SAFETY: capget and capset of this process, with the version-3 layout (two data words).
  if (syscall(SYS_capget, &header, data) != 0) return false;
  data[CAP_SYS_RESOURCE / 32].effective &= ~(1u << (CAP_SYS_RESOURCE % 32));
  data[CAP_SYS_RESOURCE / 32].permitted &= ~(1u << (CAP_SYS_RESOURCE % 32));
  return syscall(SYS_capset, &header, data) == 0;
}

// A child that runs `fn` and exits with what it returns.
template <typename Fn>
int InChild(Fn fn) {
  const pid_t pid = fork();
  if (pid == 0) _exit(fn());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status);
}

// The kernel's prlimit check (kernel/sys.c, check_prlimit_permission) against a process whose
// saved ids differ from its real and effective ones: no caller without CAP_SYS_RESOURCE (which
// no command has) matches, whatever ids it takes.
// Control: the same call succeeds before the guard, and on the caller's own child after it.
TEST(InitGuardLiveTest, SavedIdsThatDifferMatchNoCallerOfPrlimit) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to map 65536 ids into a user namespace";
  int go[2];
  int result[2];
  ASSERT_EQ(pipe2(go, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(result, O_CLOEXEC), 0);
  const pid_t guardian = fork();
  if (guardian == 0) {
    close(go[1]);
    close(result[0]);
    auto report = [&](int code, int value) {
      const int pair[2] = {code, value};
      if (write(result[1], pair, sizeof pair) != sizeof pair) _exit(3);
    };
    if (unshare(CLONE_NEWUSER) != 0) _exit(77);
    report(0, 0);  // the parent writes the maps now
    char byte;
    if (read(go[0], &byte, 1) != 1) _exit(4);
    // SAFETY: raw calls change this single-threaded child only: root of its namespace.
    if (syscall(SYS_setresgid, 0, 0, 0) != 0 || syscall(SYS_setresuid, 0, 0, 0) != 0) _exit(5);
    // A command as nsbox-init starts one: its credentials back to (0, 0, 0), as execve makes
    // them; then the attack, as root and as any other id it may take (CAP_SETUID).
    auto command = [] {
      if (syscall(SYS_setresgid, 0, 0, 0) != 0 || syscall(SYS_setresuid, 0, 0, 0) != 0) return 90;
      if (!DropSysResource()) return 92;
      const int as_root = LowerCoreOf(getppid());
      if (syscall(SYS_setresgid, 65534, 65534, 65534) != 0 ||
          syscall(SYS_setresuid, 65534, 65534, 65534) != 0) {
        return 91;
      }
      const int as_nobody = LowerCoreOf(getppid());
      auto code = [](int err) { return err == 0 ? 0 : err == EPERM ? 1 : 9; };
      return code(as_root) * 10 + code(as_nobody);
    };
    report(1, InChild(command));  // before the guard: root may (0), nobody may not (1)
    auto ids = GuardSavedIds();
    if (!ids.ok()) _exit(6);
    report(2, ids->uid.value_or(0));
    report(3, ids->gid.value_or(0));
    report(4, InChild(command));  // after: neither (11)
    // The command's own child stays in its reach.
    report(5, InChild([] {
             const pid_t child = fork();
             if (child == 0) {
               pause();
               _exit(0);
             }
             const int err = LowerCoreOf(child);
             kill(child, SIGKILL);
             waitpid(child, nullptr, 0);
             return err;
           }));
    _exit(0);
  }
  close(go[0]);
  close(result[1]);
  int pair[2];
  ASSERT_EQ(read(result[0], pair, sizeof pair), static_cast<ssize_t>(sizeof pair))
      << "the child could not unshare a user namespace";
  for (const char* map : {"uid_map", "gid_map"}) {
    const std::string path = "/proc/" + std::to_string(guardian) + "/" + map;
    const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << path;
    const std::string text = "0 1610612736 65536\n";
    ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size())) << path;
    close(fd);
  }
  ASSERT_EQ(write(go[1], "g", 1), 1);
  std::map<int, int> got;
  while (read(result[0], pair, sizeof pair) == static_cast<ssize_t>(sizeof pair)) {
    got[pair[0]] = pair[1];
  }
  close(result[0]);
  close(go[1]);
  int status = 0;
  waitpid(guardian, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_EQ(got[1], 1) << "control: before the guard, a command (as root) lowers its parent's "
                          "limit";
  EXPECT_EQ(got[2], 65534);
  EXPECT_EQ(got[3], 65534);
  EXPECT_EQ(got[4], 11) << "1: EPERM, 0: allowed; as root " << got[4] / 10 << ", as nobody "
                        << got[4] % 10;
  EXPECT_EQ(got[5], 0) << "control: a command lowers its own child's limit";
}

}  // namespace
}  // namespace nsbox::runtime

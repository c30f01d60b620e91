// The command capability set (policy/capabilities.h) and how it is applied
// (isolate/capabilities.h): the table, the plan, and ApplyCapabilities in a forked child that
// first unshares a user namespace (which gives it a full set without privilege over the host),
// read back from /proc/self/status before and after an execve. Skips where user namespaces are
// not permitted.

#include "isolate/capabilities.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/capability.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "policy/capabilities.h"

namespace nsbox::isolate {
namespace {

constexpr uint64_t kDockerDefaultMask = 0x00000000a80425fb;  // moby's default, with SYS_CHROOT
constexpr uint64_t kExpectedMask = 0x00000000a80025fb;       // ours: Docker's minus SYS_CHROOT

TEST(CapabilityTableTest, EveryEntryIsARealCapabilityWithItsNameAndAReason) {
  const policy::CapabilitySet set = policy::DefaultCommandCapabilities();
  std::set<int> seen;
  for (const auto& e : set.keep) {
    EXPECT_TRUE(seen.insert(e.cap).second) << "twice: " << e.name;
    cap_value_t value = -1;
    ASSERT_EQ(cap_from_name(e.name, &value), 0) << e.name;  // libcap knows it by that name
    EXPECT_EQ(value, e.cap) << e.name;
    EXPECT_GT(std::strlen(e.reason), 10u) << e.name;
  }
  EXPECT_EQ(set.keep.size(), 13u);
}

TEST(CapabilityTableTest, MaskIsDockersDefaultWithoutSysChroot) {
  const uint64_t mask = policy::DefaultCommandCapabilities().Mask();
  EXPECT_EQ(mask, kExpectedMask);
  EXPECT_EQ(mask | (uint64_t{1} << CAP_SYS_CHROOT), kDockerDefaultMask);
  EXPECT_EQ(mask & (uint64_t{1} << CAP_SYS_CHROOT), 0u);
  EXPECT_EQ(mask & (uint64_t{1} << CAP_SYS_ADMIN), 0u);
  EXPECT_EQ(mask & (uint64_t{1} << CAP_SYS_PTRACE), 0u);
  EXPECT_EQ(mask & (uint64_t{1} << CAP_NET_ADMIN), 0u);
}

TEST(CapabilityTableTest, FormatsLikeProcStatus) {
  EXPECT_EQ(policy::FormatCapabilityMask(kExpectedMask), "00000000a80025fb");
  EXPECT_EQ(policy::FormatCapabilityMask(0), "0000000000000000");
  EXPECT_EQ(policy::FormatCapabilityMask(0x000001ffffffffff), "000001ffffffffff");
}

TEST(CapabilityPlanTest, PlansForTheRunningKernel) {
  auto plan = PlanCapabilities(policy::DefaultCommandCapabilities());
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->keep(), kExpectedMask);
  EXPECT_GE(plan->last_cap(), CAP_AUDIT_READ);  // 37, Linux 3.16: older kernels are unsupported
  EXPECT_LT(plan->last_cap(), 64);
}

TEST(CapabilityPlanTest, RejectsCapabilitiesTheKernelLacks) {
  policy::CapabilitySet set;
  set.keep.push_back({CAP_CHECKPOINT_RESTORE, "CAP_CHECKPOINT_RESTORE", "newer than the kernel"});
  EXPECT_FALSE(PlanCapabilities(set, CAP_CHECKPOINT_RESTORE - 1).ok());
  EXPECT_TRUE(PlanCapabilities(set, CAP_CHECKPOINT_RESTORE).ok());
  EXPECT_FALSE(PlanCapabilities(set, 64).ok());
  EXPECT_FALSE(PlanCapabilities(set, -1).ok());
}

// The Cap* lines of a /proc/PID/status text.
std::map<std::string, std::string> CapLines(const std::string& status) {
  std::map<std::string, std::string> out;
  std::istringstream in(status);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Cap", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    out[line.substr(0, colon)] = value;
  }
  return out;
}

bool WriteFileOrFalse(const char* path, const std::string& text) {
  const int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  return ok;
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

TEST(ApplyCapabilitiesTest, InAUserNamespaceBeforeAndAfterExecve) {
  auto plan = PlanCapabilities(policy::DefaultCommandCapabilities());
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  const uid_t uid = geteuid();
  const gid_t gid = getegid();
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    // The child: uid 0 of a new user namespace (mapped to our own uid), with a full set in it.
    close(fds[0]);
    if (unshare(CLONE_NEWUSER) != 0) _exit(77);
    if (!WriteFileOrFalse("/proc/self/setgroups", "deny") ||
        !WriteFileOrFalse("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
        !WriteFileOrFalse("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1")) {
      _exit(78);
    }
    const int err = ApplyCapabilities(*plan);
    if (err != 0) _exit(100 + err);
    const int status_fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (status_fd < 0) _exit(79);
    const std::string before = ReadAll(status_fd) + "--- execve ---\n";
    if (write(fds[1], before.data(), before.size()) != static_cast<ssize_t>(before.size())) {
      _exit(80);
    }
    if (dup2(fds[1], STDOUT_FILENO) < 0) _exit(81);
    const char* argv[] = {"cat", "/proc/self/status", nullptr};
    // SAFETY: execv does not modify argv; its prototype predates const.
    execv("/bin/cat", const_cast<char* const*>(argv));
    _exit(82);
  }
  close(fds[1]);
  const std::string out = ReadAll(fds[0]);
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "unshare(CLONE_NEWUSER) is not permitted here";
  ASSERT_EQ(WEXITSTATUS(status), 0) << "child step failed (100 + errno for ApplyCapabilities)";

  const size_t split = out.find("--- execve ---\n");
  ASSERT_NE(split, std::string::npos);
  const std::string kept = policy::FormatCapabilityMask(kExpectedMask);
  const std::string none = policy::FormatCapabilityMask(0);
  for (const std::string& text : {out.substr(0, split), out.substr(split)}) {
    const auto caps = CapLines(text);
    ASSERT_EQ(caps.size(), 5u) << text;
    EXPECT_EQ(caps.at("CapBnd"), kept);
    EXPECT_EQ(caps.at("CapPrm"), kept);
    EXPECT_EQ(caps.at("CapEff"), kept);
    EXPECT_EQ(caps.at("CapInh"), none);
    EXPECT_EQ(caps.at("CapAmb"), none);
  }
}

}  // namespace
}  // namespace nsbox::isolate

// The parsers of the per-exec usage figures (exec/usage.h), and of cgroup.events (exec/spawn.h):
// the kernel's texts, and odd or hostile ones (a sandbox cannot write these files, but a parser
// must never invent a figure).

#include "exec/usage.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "base/files.h"
#include "base/unique_fd.h"
#include "exec/spawn.h"

namespace nsbox::exec {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

TEST(CpuStat, TheKernelsText) {
  CpuStat cpu = ParseCpuStat(
      "usage_usec 1503027\nuser_usec 1002003\nsystem_usec 501024\nnr_periods 0\n"
      "nr_throttled 0\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0\n");
  EXPECT_EQ(cpu.user_us, 1002003u);
  EXPECT_EQ(cpu.system_us, 501024u);
}

TEST(CpuStat, MissingMalformedAndOutOfRange) {
  EXPECT_FALSE(ParseCpuStat("").user_us.has_value());
  EXPECT_FALSE(ParseCpuStat("usage_usec 5\n").system_us.has_value());
  EXPECT_FALSE(ParseCpuStat("user_usec -1\n").user_us.has_value());
  EXPECT_FALSE(ParseCpuStat("user_usec 12abc\n").user_us.has_value());
  EXPECT_FALSE(ParseCpuStat("user_usec \n").user_us.has_value());
  EXPECT_FALSE(ParseCpuStat("user_usec  5\n").user_us.has_value());  // two spaces
  EXPECT_FALSE(ParseCpuStat("user_usec 99999999999999999999999\n").user_us.has_value());
  EXPECT_EQ(ParseCpuStat("user_usec 18446744073709551615").user_us, kMax);  // no newline
  // A key that only starts like ours, or ends like it, is not ours.
  EXPECT_FALSE(ParseCpuStat("user_usec_total 7\nxuser_usec 8\n").user_us.has_value());
  // The first occurrence wins; a NUL byte is not a digit.
  EXPECT_EQ(ParseCpuStat("user_usec 1\nuser_usec 2\n").user_us, 1u);
  EXPECT_FALSE(ParseCpuStat(std::string("user_usec 1\0002\n", 14)).user_us.has_value());
  EXPECT_FALSE(ParseCpuStat("user_usec 1\r\n").user_us.has_value());
}

TEST(FindKeyedValue, EmptyKeyFindsNothing) {
  EXPECT_FALSE(FindKeyedValue(" 5\n", "").has_value());
  EXPECT_EQ(FindKeyedValue("a 1\nb 2", "b"), 2u);
}

TEST(SingleValue, NumbersOnly) {
  EXPECT_EQ(ParseSingleValue("209715200\n"), 209715200u);
  EXPECT_EQ(ParseSingleValue("0"), 0u);
  EXPECT_FALSE(ParseSingleValue("max\n").has_value());
  EXPECT_FALSE(ParseSingleValue("").has_value());
  EXPECT_FALSE(ParseSingleValue("\n").has_value());
  EXPECT_FALSE(ParseSingleValue("-1\n").has_value());
  EXPECT_FALSE(ParseSingleValue("12 \n").has_value());
  EXPECT_FALSE(ParseSingleValue("12\n\n").has_value());
  EXPECT_FALSE(ParseSingleValue("18446744073709551616\n").has_value());
}

TEST(IoStat, SumsEveryDevice) {
  auto io = ParseIoStat(
      "8:0 rbytes=4096 wbytes=1048576 rios=1 wios=256 dbytes=0 dios=0\n"
      "253:1 rbytes=100 wbytes=0 rios=2 wios=0 dbytes=0 dios=0\n");
  ASSERT_TRUE(io.has_value());
  EXPECT_EQ(io->read, 4196u);
  EXPECT_EQ(io->write, 1048576u);
}

TEST(IoStat, EmptyIsZeroNotUnknown) {
  auto io = ParseIoStat("");
  ASSERT_TRUE(io.has_value());
  EXPECT_EQ(io->read, 0u);
  EXPECT_EQ(io->write, 0u);
}

TEST(IoStat, OddAndHostileLines) {
  // Fields of later kernels and fields without '=' are skipped; order does not matter.
  auto io = ParseIoStat("8:0 wbytes=5 future=9 junk rbytes=3\n\n8:16\n");
  ASSERT_TRUE(io.has_value());
  EXPECT_EQ(io->read, 3u);
  EXPECT_EQ(io->write, 5u);
  // Sums saturate instead of wrapping around.
  io = ParseIoStat("8:0 rbytes=18446744073709551615\n8:1 rbytes=10\n");
  ASSERT_TRUE(io.has_value());
  EXPECT_EQ(io->read, kMax);
  // Malformed: no device, a bad device, a bad number.
  EXPECT_FALSE(ParseIoStat("rbytes=5\n").has_value());
  EXPECT_FALSE(ParseIoStat("8 rbytes=5\n").has_value());
  EXPECT_FALSE(ParseIoStat("a:b rbytes=5\n").has_value());
  EXPECT_FALSE(ParseIoStat("8:0 rbytes=-5\n").has_value());
  EXPECT_FALSE(ParseIoStat("8:0 wbytes=\n").has_value());
  EXPECT_FALSE(ParseIoStat("8:0 rbytes=99999999999999999999999\n").has_value());
}

TEST(OomKillCount, V2MemoryEvents) {
  EXPECT_EQ(ParseOomKillCount("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n"), 1u);
  EXPECT_EQ(ParseOomKillCount("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"), 0u);
  // oom_group_kill alone is not oom_kill.
  EXPECT_EQ(ParseOomKillCount("oom_group_kill 3\n"), 0u);
}

TEST(OomKillCount, V1OomControl) {
  EXPECT_EQ(ParseOomKillCount("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"), 2u);
  // Before 4.13 there is no oom_kill line: no kill is known.
  EXPECT_EQ(ParseOomKillCount("oom_kill_disable 1\nunder_oom 1\n"), 0u);
  EXPECT_EQ(ParseOomKillCount("oom_kill x\n"), 0u);
  EXPECT_EQ(ParseOomKillCount(""), 0u);
}

TEST(ReadUsage, NoDirectoriesIsAllUnknown) {
  CommandUsage u = ReadUsage(UsageDirs{});
  EXPECT_EQ(u, CommandUsage{});
  EXPECT_FALSE(u.cpu_user_us.has_value());
  EXPECT_FALSE(OomKilledIn(UsageDirs{}));
}

// A reused cgroup's figures: the counters less what they were before, never below zero; the
// peaks as read; what the host does not give stays unknown.
TEST(UsageSince, SubtractsTheCountersOnly) {
  CommandUsage before;
  before.cpu_user_us = 1000;
  before.cpu_system_us = 500;
  before.memory_peak_bytes = 1 << 20;
  before.pids_peak = 1;
  before.io_read_bytes = 4096;
  CommandUsage now;
  now.cpu_user_us = 1500;
  now.cpu_system_us = 400;  // read lower than before (never in practice): zero, not a wrap
  now.memory_peak_bytes = 300 << 10;
  now.pids_peak = 3;
  now.io_read_bytes = 8192;
  now.io_write_bytes = 100;  // unknown before: counted from zero
  CommandUsage u = UsageSince(now, before);
  EXPECT_EQ(u.cpu_user_us, uint64_t{500});
  EXPECT_EQ(u.cpu_system_us, uint64_t{0});
  EXPECT_EQ(u.memory_peak_bytes, uint64_t{300 << 10});
  EXPECT_EQ(u.pids_peak, uint64_t{3});
  EXPECT_EQ(u.io_read_bytes, uint64_t{4096});
  EXPECT_EQ(u.io_write_bytes, uint64_t{100});
  EXPECT_EQ(UsageSince(CommandUsage{}, before), CommandUsage{});
  EXPECT_EQ(UsageSince(now, CommandUsage{}), now);
}

TEST(ResetMemoryPeak, NothingToResetIsFalse) {
  EXPECT_FALSE(ResetMemoryPeak(UsageFiles{}));
  EXPECT_TRUE(NoOomKills(UsageFiles{}));
}

// Whether a set's cgroup is empty, from its cgroup.events: CgroupEmpty takes a file that cannot
// be read for a cgroup that is gone (nothing to wait for); CgroupKnownEmpty, which decides
// whether a set may serve the next command, takes it for not known to be empty.
TEST(CgroupEvents, AnUnreadFileIsNotKnownToBeEmpty) {
  char tmpl[] = "/tmp/nsbox-events-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  EXPECT_TRUE(CgroupEmpty(fd.get())) << "no file: gone";
  EXPECT_FALSE(CgroupKnownEmpty(fd.get())) << "no file: not known";
  ASSERT_TRUE(WriteFileAtomic(dir, "cgroup.events", "populated 1\nfrozen 0\n").ok());
  EXPECT_FALSE(CgroupEmpty(fd.get()));
  EXPECT_FALSE(CgroupKnownEmpty(fd.get()));
  ASSERT_TRUE(WriteFileAtomic(dir, "cgroup.events", "populated 0\nfrozen 0\n").ok());
  EXPECT_TRUE(CgroupEmpty(fd.get()));
  EXPECT_TRUE(CgroupKnownEmpty(fd.get()));
  ASSERT_EQ(::unlink((dir + "/cgroup.events").c_str()), 0);
  ASSERT_EQ(::rmdir(dir.c_str()), 0);
}

}  // namespace
}  // namespace nsbox::exec

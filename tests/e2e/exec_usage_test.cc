// The `usage` object of an exec's answer (docs/daemon.md, docs/cgroups.md "Per-exec usage"),
// through the daemon: in the buffered answer and in the NDJSON exit event, six keys, each an
// integer or null (null only where the host has no controller for it).

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

using std::chrono::milliseconds;

constexpr const char* kUsageKeys[] = {"cpuUserMs", "cpuSystemMs", "memoryPeakBytes",
                                      "pidsPeak",  "ioReadBytes", "ioWriteBytes"};

// Every key there, each a non-negative integer or null; the figure of `key` (-1 for null).
::testing::AssertionResult WellFormedUsage(const json::object& answer) {
  const json::value* usage = answer.if_contains("usage");
  if (usage == nullptr || !usage->is_object()) {
    return ::testing::AssertionFailure() << "no usage object in " << json::serialize(answer);
  }
  const json::object& u = usage->as_object();
  if (u.size() != std::size(kUsageKeys)) {
    return ::testing::AssertionFailure() << "not six keys: " << json::serialize(u);
  }
  for (const char* key : kUsageKeys) {
    const json::value* v = u.if_contains(key);
    if (v == nullptr) return ::testing::AssertionFailure() << "no " << key;
    const bool ok = v->is_null() || (v->is_int64() && v->as_int64() >= 0) || v->is_uint64();
    if (!ok) return ::testing::AssertionFailure() << key << " is " << json::serialize(*v);
  }
  return ::testing::AssertionSuccess();
}

int64_t Figure(const json::object& answer, const char* key) {
  const json::value& v = answer.at("usage").as_object().at(key);
  if (v.is_null()) return -1;
  return v.is_int64() ? v.as_int64() : static_cast<int64_t>(v.as_uint64());
}

class ExecUsageTest : public E2eSandboxTest {};

// A busy shell loop of a few hundred ms of CPU and five background sleeps: the figures are there
// and plausible.
TEST_F(ExecUsageTest, BufferedAnswerCarriesUsage) {
  ExecResult r = Exec(id_,
                      "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; "
                      "for n in 1 2 3 4 5; do sleep 0.2 & done; wait");
  ASSERT_EQ(r.response.status, 200) << r.Describe();
  ASSERT_EQ(r.exit_code(), 0) << r.Describe();
  ASSERT_TRUE(WellFormedUsage(r.answer)) << r.Describe();
  // cpu.stat is in every cgroup v2 directory; this host has one (hybrid or pure v2).
  const int64_t cpu = Figure(r.answer, "cpuUserMs") + Figure(r.answer, "cpuSystemMs");
  EXPECT_GE(Figure(r.answer, "cpuUserMs"), 0) << r.Describe();
  EXPECT_GT(cpu, 50) << r.Describe();
  EXPECT_LT(cpu, 60000) << r.Describe();
  // Memory and pids: measured here (v1 memory and pids hierarchies, or v2 controllers).
  const int64_t memory = Figure(r.answer, "memoryPeakBytes");
  const int64_t pids = Figure(r.answer, "pidsPeak");
  if (memory != -1) {
    EXPECT_GT(memory, 100 * 1024) << r.Describe();
    EXPECT_LT(memory, 1LL << 30) << r.Describe();
  }
  if (pids != -1) {
    EXPECT_GE(pids, 6) << r.Describe();
  }
}

TEST_F(ExecUsageTest, StreamExitEventCarriesUsage) {
  NdjsonStream s(daemon().endpoint(), "POST", SbPath(id_, "/exec"),
                 R"({"command":"echo a; sleep 0.1"})");
  ASSERT_EQ(s.status(), 200) << s.error();
  std::vector<json::object> events = s.ReadAll(milliseconds(20000));
  ASSERT_FALSE(events.empty()) << s.error();
  const json::object& exit = events.back();
  EXPECT_EQ(Str(exit, "type"), "exit") << json::serialize(exit);
  EXPECT_TRUE(WellFormedUsage(exit));
}

// Each exec's figures are its own: a small command right after a big one does not report the
// big one's peak.
TEST_F(ExecUsageTest, FiguresArePerExec) {
  ExecResult big = Exec(id_,
                        "head -c 100M /dev/zero | tail -c 1 >/dev/null; "
                        "x=$(head -c 40M /dev/zero | tr '\\0' a); echo ${#x}");
  ASSERT_EQ(big.exit_code(), 0) << big.Describe();
  ExecResult small = Exec(id_, "true");
  ASSERT_EQ(small.exit_code(), 0) << small.Describe();
  ASSERT_TRUE(WellFormedUsage(big.answer));
  ASSERT_TRUE(WellFormedUsage(small.answer));
  const int64_t big_peak = Figure(big.answer, "memoryPeakBytes");
  const int64_t small_peak = Figure(small.answer, "memoryPeakBytes");
  if (big_peak == -1) GTEST_SKIP() << "this host reports no memory peak";
  EXPECT_GE(big_peak, 40LL << 20) << big.Describe();
  EXPECT_LT(small_peak, 20LL << 20) << small.Describe();
}

}  // namespace
}  // namespace nsbox::e2e

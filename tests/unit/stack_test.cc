#include "base/stack.h"

#include <alloca.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace nsbox {
namespace {

// Private_Dirty of the [stack] mapping, in KiB (/proc/self/smaps).
long StackDirtyKb() {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool in_stack = false;
  while (std::getline(in, line)) {
    if (line.find(" [stack]") != std::string::npos) {
      in_stack = true;
    } else if (in_stack && line.rfind("Private_Dirty:", 0) == 0) {
      return std::stol(line.substr(14));
    }
  }
  return -1;
}

// Touches `bytes` of the stack below the caller. Not instrumented: under AddressSanitizer an
// array may live on a fake stack in the heap; alloca is on the thread's own stack.
__attribute__((noinline, no_sanitize("address"))) void TouchStack(size_t bytes) {
  auto* p = static_cast<volatile char*>(alloca(bytes));
  for (size_t i = 0; i < bytes; i += 512) p[i] = 1;
}

TEST(Stack, FindsTheStackMapping) {
  auto r = MainStackMapping(
      "00400000-00690000 r-xp 00000000 fd:01 123 /usr/bin/x\n"
      "377f2000-37809000 rw-p 00000000 00:00 0                                  [heap]\n"
      "7ffc19c10000-7ffc19c31000 rw-p 00000000 00:00 0                          [stack]\n"
      "7ffc19d8e000-7ffc19d92000 r--p 00000000 00:00 0                          [vvar]\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->start, 0x7ffc19c10000u);
  EXPECT_EQ(r->end, 0x7ffc19c31000u);
  EXPECT_FALSE(MainStackMapping("00400000-00690000 r-xp 0 fd:01 1 /x\n").has_value());
  EXPECT_FALSE(MainStackMapping("zz-7ffc19c31000 rw-p 0 00:00 0 [stack]\n").has_value());
  EXPECT_FALSE(MainStackMapping("7ffc19c31000-7ffc19c10000 rw-p 0 00:00 0 [stack]\n").has_value());
  EXPECT_FALSE(MainStackMapping("").has_value());
}

TEST(Stack, GivesBackWhatADeepCallLeftAndNothingOffTheMainThread) {
  TouchStack(512 * 1024);
  const long before = StackDirtyKb();
  ASSERT_GE(before, 512) << "the deep call's pages are dirty";
  EXPECT_GE(ReleaseUnusedMainStack(), 256u * 1024);
  const long after = StackDirtyKb();
  EXPECT_LE(after, before - 400) << before << " KiB -> " << after << " KiB";
  // Deep again: the pages come back, as zeros, and work.
  TouchStack(512 * 1024);
  EXPECT_GE(StackDirtyKb(), 512);
  size_t on_thread = 1;
  std::thread([&] { on_thread = ReleaseUnusedMainStack(); }).join();
  EXPECT_EQ(on_thread, 0u) << "another thread's frame says nothing of the main stack";
}

}  // namespace
}  // namespace nsbox

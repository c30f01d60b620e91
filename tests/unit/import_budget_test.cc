#include "images/import_budget.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <string>

namespace nsbox::images {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
using Step = ImportBudget::Step;

class ImportBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nsbox-budget-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { ::rmdir(dir_.c_str()); }
  ImportLimits Limits(uint64_t max_bytes) {
    ImportLimits l;
    l.max_bytes = max_bytes;
    l.keep_free_percent = 0;
    return l;
  }
  uint64_t FreeBytes() {
    struct statvfs fs {};
    EXPECT_EQ(::statvfs(dir_.c_str(), &fs), 0);
    return fs.f_bavail * fs.f_frsize;
  }
  std::string dir_;
};

TEST_F(ImportBudgetTest, EachStepIsBoundedOnItsOwn) {
  ImportBudget b(Limits(64 * kMiB), dir_);
  EXPECT_TRUE(b.Charge(Step::kUpload, 64 * kMiB, "the upload").ok());
  EXPECT_TRUE(b.Charge(Step::kScratch, 60 * kMiB, "x").ok());
  EXPECT_TRUE(b.Charge(Step::kUnpacked, 64 * kMiB, "x").ok());
  EXPECT_EQ(b.stop(), ImportStop::kNone);
  auto over = b.Charge(Step::kScratch, 4 * kMiB + 1, "source.tar.gz");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code(), EFBIG);
  EXPECT_EQ(over.error().message(),
            "source.tar.gz: the decompressed copy of the tarball would be more than the 64.0 MiB "
            "an import may write (nsbox serve --image-max-bytes); 60.0 MiB were written, and "
            "this is 4.0 MiB more");
  EXPECT_EQ(b.stop(), ImportStop::kTooLarge);
  EXPECT_EQ(b.stop_message(), over.error().message());
  EXPECT_EQ(b.used(Step::kScratch), 60 * kMiB) << "a refused write is not counted";
}

TEST_F(ImportBudgetTest, ExpectRefusesAHugeDeclarationWithoutCounting) {
  ImportBudget b(Limits(64 * kMiB), dir_);
  EXPECT_TRUE(b.Expect(Step::kUnpacked, 64 * kMiB, "entry 'a'").ok());
  EXPECT_EQ(b.used(Step::kUnpacked), 0u);
  auto bomb = b.Expect(Step::kUnpacked, uint64_t{4} << 30, "entry 'big'");
  ASSERT_FALSE(bomb.ok());
  EXPECT_NE(bomb.error().message().find("entry 'big': the unpacked image would be more than"),
            std::string::npos)
      << bomb.error().message();
  // A declaration so large that adding it would wrap around is refused too.
  ImportBudget c(Limits(64 * kMiB), dir_);
  ASSERT_TRUE(c.Charge(Step::kUnpacked, kMiB, "x").ok());
  EXPECT_FALSE(c.Expect(Step::kUnpacked, UINT64_MAX, "entry 'wrap'").ok());
}

TEST_F(ImportBudgetTest, DeclaredSizesAndLayers) {
  ImportBudget b(Limits(64 * kMiB), dir_);
  EXPECT_TRUE(b.Declared(64 * kMiB, "x.tar.gz").ok());
  auto over = b.Declared(64 * kMiB + 1, "x.tar.gz");
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.error().message().find("x.tar.gz: the tarball's members hold 64.0 MiB or more"),
            std::string::npos)
      << over.error().message();
  ImportLimits l = Limits(64 * kMiB);
  l.max_layers = 128;
  ImportBudget layers(l, dir_);
  EXPECT_TRUE(layers.Layers(128).ok());
  auto many = layers.Layers(3000);
  ASSERT_FALSE(many.ok());
  EXPECT_EQ(many.error().message(),
            "the image has 3000 layers, more than the 128 nsboxd imports (nsbox serve "
            "--image-max-layers)");
  EXPECT_EQ(layers.stop(), ImportStop::kTooLarge);
}

TEST_F(ImportBudgetTest, EntriesCountTheirInodeAndName) {
  ImportBudget b(Limits(ImportBudget::kBytesPerEntry * 3), dir_);
  EXPECT_TRUE(b.Entry().ok());
  EXPECT_TRUE(b.Entry().ok());
  EXPECT_TRUE(b.Entry().ok());
  EXPECT_FALSE(b.Entry().ok());
  EXPECT_EQ(b.used(Step::kUnpacked), ImportBudget::kBytesPerEntry * 3);
}

TEST_F(ImportBudgetTest, TheFreeSpaceIsKept) {
  // Keeping more than the file system has free: refused at the first look, ENOSPC, saying both.
  ImportLimits l = Limits(UINT64_MAX);
  l.keep_free_bytes = FreeBytes() + (uint64_t{1} << 40);
  ImportBudget b(l, dir_);
  auto st = b.CheckFreeSpace();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ENOSPC);
  EXPECT_NE(st.error().message().find("the file system of " + dir_ + " has "), std::string::npos)
      << st.error().message();
  EXPECT_NE(st.error().message().find("--image-keep-free"), std::string::npos);
  EXPECT_EQ(b.stop(), ImportStop::kKeepFree);
  // Looked at again after kCheckEveryBytes counted, not at every write.
  ImportBudget later(l, dir_);
  EXPECT_TRUE(later.Charge(Step::kUnpacked, ImportBudget::kCheckEveryBytes - 1, "x").ok());
  EXPECT_FALSE(later.Charge(Step::kUnpacked, 1, "x").ok());
  EXPECT_EQ(later.stop(), ImportStop::kKeepFree);
  // Control: keeping nothing, or 0% of a file system with room.
  ImportLimits none = Limits(UINT64_MAX);
  ImportBudget free_ok(none, dir_);
  EXPECT_TRUE(free_ok.CheckFreeSpace().ok());
  ImportLimits one = Limits(UINT64_MAX);
  one.keep_free_bytes = 1;
  ImportBudget one_ok(one, dir_);
  EXPECT_TRUE(one_ok.CheckFreeSpace().ok());
}

TEST_F(ImportBudgetTest, ACancelledImportStopsAtItsNextCall) {
  std::atomic<bool> stopping{false};
  ImportBudget b(Limits(UINT64_MAX), dir_);
  b.WatchStopping(&stopping);
  EXPECT_TRUE(b.Charge(Step::kUnpacked, 1, "x").ok());
  b.ClientGone();
  auto st = b.Charge(Step::kUnpacked, 1, "x");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ECANCELED);
  EXPECT_EQ(st.error().message(), "the import was cancelled: its client went away");
  EXPECT_EQ(b.stop(), ImportStop::kClientGone);

  ImportBudget d(Limits(UINT64_MAX), dir_);
  d.WatchStopping(&stopping);
  EXPECT_TRUE(d.CheckCancel().ok());
  stopping.store(true);
  EXPECT_EQ(d.CheckCancel().error().message(), "the import was cancelled: the daemon is stopping");
  EXPECT_EQ(d.stop(), ImportStop::kDaemonStopping);
}

TEST(DescribeBytes, Units) {
  EXPECT_EQ(DescribeBytes(0), "0 bytes");
  EXPECT_EQ(DescribeBytes(1), "1 byte");
  EXPECT_EQ(DescribeBytes(1023), "1023 bytes");
  EXPECT_EQ(DescribeBytes(1024), "1.0 KiB");
  EXPECT_EQ(DescribeBytes(64 * kMiB), "64.0 MiB");
  EXPECT_EQ(DescribeBytes(uint64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(DescribeBytes(UINT64_MAX), "16.0 EiB");
}

}  // namespace
}  // namespace nsbox::images

// A sandbox's own disk (isolate/disk.h): the image, its file system, and the loop device under
// it, on the real kernel, as root.
#include "isolate/disk.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "base/unique_fd.h"
#include "tests/common/loop_devices.h"

namespace nsbox::isolate {
namespace {

namespace sfs = std::filesystem;

#define ASSERT_OK(expr)                                     \
  do {                                                      \
    auto status_ = (expr);                                  \
    ASSERT_TRUE(status_.ok()) << status_.error().message(); \
  } while (0)

// The loop devices bound to `image` now, by sysfs ("/dev/loop3").
std::vector<std::string> LoopsOf(const std::string& image) {
  std::vector<std::string> out;
  for (const auto& [device, backing] : testutil::BoundLoopDevices()) {
    if (backing == image) out.push_back(device);
  }
  return out;
}

bool NoLoopWithin(const std::string& image, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!LoopsOf(image).empty()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

class DiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "NOT RUN: needs root";
    if (auto st = DiskSupport(); !st.ok()) {
      GTEST_SKIP() << "NOT RUN: this host gives no sandbox a disk: " << st.error().message();
    }
    char tmpl[] = "/var/tmp/nsbox-disk-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    image_ = dir_ + "/disk.ext4";
  }
  void TearDown() override {
    if (!dir_.empty()) sfs::remove_all(dir_);
  }
  std::string dir_;
  std::string image_;
};

TEST_F(DiskTest, ImageIsReservedAndHoldsTheDirectoriesWithTheirOwner) {
  const uint64_t bytes = 64u << 20;
  ASSERT_OK(MakeDiskImage(image_, bytes,
                          {{"workspace", 0700, 100000, 100001}, {"home", 0700, 100000, 100001}}));
  struct stat st {};
  ASSERT_EQ(::stat(image_.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), bytes);
  // Every block is reserved on the host (fallocate), none left as a hole.
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, bytes);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_TRUE(NoLoopWithin(image_, std::chrono::milliseconds(2000)))
      << "the loop device of the creation's mount stayed attached";
  auto made = DiskMountCount(image_);
  ASSERT_TRUE(made.ok()) << made.error().message();
  EXPECT_EQ(*made, 1u) << "mounted once, by its creation";

  auto disk = Disk::Open(image_);
  ASSERT_TRUE(disk.ok()) << disk.error().message();
  for (const char* sub : {"workspace", "home"}) {
    struct stat d {};
    ASSERT_EQ(::fstatat((*disk)->mount_fd(), sub, &d, AT_SYMLINK_NOFOLLOW), 0) << sub;
    EXPECT_TRUE(S_ISDIR(d.st_mode));
    EXPECT_EQ(d.st_mode & 07777, 0700u);
    EXPECT_EQ(d.st_uid, 100000u);
    EXPECT_EQ(d.st_gid, 100001u);
  }
  auto used = DiskMountCount(image_);
  ASSERT_TRUE(used.ok()) << used.error().message();
  EXPECT_EQ(*used, 2u) << "a disk a sandbox used is told from one never used";
  struct statvfs sv {};
  ASSERT_EQ(::statvfs((*disk)->PathOf("workspace").c_str(), &sv), 0);
  const uint64_t total = static_cast<uint64_t>(sv.f_blocks) * sv.f_frsize;
  EXPECT_LE(total, bytes - kDiskTailBytes) << "the image's last MiB is outside the file system";
  EXPECT_GT(total, bytes * 8 / 10) << "ext4's own metadata took more than a fifth";
}

TEST_F(DiskTest, AWriteStopsWithEnospcAtTheDisksSize) {
  const uint64_t bytes = 32u << 20;
  ASSERT_OK(MakeDiskImage(image_, bytes, {{"workspace"}}));
  auto disk = Disk::Open(image_);
  ASSERT_TRUE(disk.ok()) << disk.error().message();
  const std::string file = (*disk)->PathOf("workspace") + "/big";
  UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_TRUE(fd.valid()) << std::strerror(errno);
  std::string chunk(1u << 20, 'x');
  uint64_t written = 0;
  int err = 0;
  for (int i = 0; i < 64; ++i) {
    ssize_t n = ::write(fd.get(), chunk.data(), chunk.size());
    if (n < 0) {
      err = errno;
      break;
    }
    written += static_cast<uint64_t>(n);
  }
  if (err == 0 && ::fsync(fd.get()) != 0) err = errno;
  EXPECT_EQ(err, ENOSPC) << std::strerror(err) << " after " << written << " bytes";
  EXPECT_LE(written, bytes);
  EXPECT_GT(written, bytes / 2);
  // The image did not grow: the host's disk holds what it reserved, no more.
  struct stat st {};
  ASSERT_EQ(::stat(image_.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), bytes);
}

TEST_F(DiskTest, FilesSurviveAndOneImageIsNeverMountedThroughTwoLoopDevices) {
  ASSERT_OK(MakeDiskImage(image_, 32u << 20, {{"workspace"}}));
  auto first = Disk::Open(image_);
  ASSERT_TRUE(first.ok()) << first.error().message();
  {
    std::ofstream out((*first)->PathOf("workspace") + "/kept");
    out << "kept across mounts";
  }
  {
    UniqueFd root(::openat((*first)->mount_fd(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_EQ(::syncfs(root.get()), 0) << std::strerror(errno);
  }
  // A second open while the first mount lives (a jail of a dead daemon not yet ended) goes
  // through the same loop device, so both see one file system.
  auto second = Disk::Open(image_);
  ASSERT_TRUE(second.ok()) << second.error().message();
  EXPECT_EQ((*second)->device(), (*first)->device());
  EXPECT_EQ(LoopsOf(image_).size(), 1u);
  {
    std::ofstream out((*second)->PathOf("workspace") + "/second");
    out << "through the second";
  }
  EXPECT_TRUE(sfs::exists((*first)->PathOf("workspace") + "/second"));
  first->reset();
  second->reset();
  EXPECT_TRUE(NoLoopWithin(image_, std::chrono::milliseconds(2000)))
      << "the loop device outlived the last mount";
  auto again = Disk::Open(image_);
  ASSERT_TRUE(again.ok()) << again.error().message();
  std::ifstream in((*again)->PathOf("workspace") + "/kept");
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "kept across mounts");
}

TEST_F(DiskTest, BadSizesAndAFullHostDiskAreRefusedAndLeaveNothing) {
  for (uint64_t bytes :
       {uint64_t{0}, uint64_t{1} << 20, (uint64_t{64} << 20) + 1, kMaxDiskBytes + 4096}) {
    auto st = MakeDiskImage(image_, bytes, {{"workspace"}});
    ASSERT_FALSE(st.ok()) << bytes;
    EXPECT_EQ(st.error().code(), EINVAL) << st.error().message();
    EXPECT_FALSE(sfs::exists(image_));
  }
  // More than the host's disk has: fallocate's ENOSPC, and no image left behind.
  struct statvfs sv {};
  ASSERT_EQ(::statvfs(dir_.c_str(), &sv), 0);
  const uint64_t free_bytes = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
  const uint64_t too_big = (free_bytes + (uint64_t{1} << 30)) / 4096 * 4096;
  if (too_big <= kMaxDiskBytes) {
    auto st = MakeDiskImage(image_, too_big, {{"workspace"}});
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code(), ENOSPC) << st.error().message();
    EXPECT_NE(st.error().message().find("fallocate"), std::string::npos) << st.error().message();
    EXPECT_FALSE(sfs::exists(image_));
  }
  // An image that is there already is never overwritten.
  { std::ofstream(image_) << "someone's"; }
  auto st = MakeDiskImage(image_, 32u << 20, {{"workspace"}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), EEXIST) << st.error().message();
}

TEST_F(DiskTest, AnImageThatIsNotExt4IsRefusedWithTheWayToCheckIt) {
  { std::ofstream(image_) << std::string(32u << 20, '\0'); }
  auto disk = Disk::Open(image_);
  ASSERT_FALSE(disk.ok());
  EXPECT_NE(disk.error().message().find("e2fsck"), std::string::npos) << disk.error().message();
  EXPECT_TRUE(NoLoopWithin(image_, std::chrono::milliseconds(2000)));
}

}  // namespace
}  // namespace nsbox::isolate

// A sandbox's own disk (limits.diskBytes, docs/daemon.md "Disk limits"), through the daemon as a
// client uses it: what a full disk looks like inside and through the file endpoints, that the
// files live through stop, restarts and a SIGKILL of the daemon, that a disk still mounted when
// its daemon died is mounted through the same loop device again, that DELETE leaves no image and
// no loop device, and the sizes that are refused.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "isolate/disk.h"
#include "tests/common/loop_devices.h"
#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

using std::chrono::milliseconds;
namespace sfs = std::filesystem;

// The loop devices whose backing file is under `dir` ("/dev/loop3 /…/disk.ext4").
std::vector<std::string> LoopsUnder(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& [device, backing] : testutil::BoundLoopDevices()) {
    if (backing.rfind(dir + "/", 0) == 0) out.push_back(device + " " + backing);
  }
  return out;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}

class Disks : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    if (auto st = isolate::DiskSupport(); !st.ok()) {
      GTEST_SKIP() << "NOT RUN: this host gives no sandbox a disk: " << st.error().message();
    }
  }
  // The sandbox `id` with a disk of `bytes`; its answer.
  Response CreateWithDisk(const std::string& id, uint64_t bytes) {
    return Create(id, "{\"limits\":{\"diskBytes\":" + std::to_string(bytes) + "}}");
  }
  bool NoLoopsWithin(milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!LoopsUnder(daemon().state_dir()).empty()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return true;
  }
};

constexpr uint64_t kMiB = 1 << 20;

TEST_F(Disks, AFullDiskIsEnospcInsideAndThroughTheFileEndpoints) {
  const std::string id = NewId();
  // Not a multiple of 4 KiB: rounded up to the disk's blocks, and said so.
  Response created = CreateWithDisk(id, 40000000);
  ASSERT_EQ(created.status, 201) << created.Describe();
  const uint64_t bytes = 9766 * 4096;
  EXPECT_EQ(Field(Obj(created), "limits").as_object().at("diskBytes").to_number<uint64_t>(), bytes);
  Response got = client().Get(SbPath(id));
  EXPECT_EQ(Field(Obj(got), "limits").as_object().at("diskBytes").to_number<uint64_t>(), bytes);

  // /workspace and /root are on one file system of about that size.
  const std::string df = Sh(id,
                            "df -B1 --output=size /workspace | tail -1; "
                            "test $(stat -c %d /workspace) = $(stat -c %d /root) && echo same");
  const uint64_t size = std::stoull(df);
  EXPECT_LE(size, bytes);
  EXPECT_GT(size, bytes / 2);  // less ext4's journal and tables, not the host's disk
  EXPECT_NE(df.find("same"), std::string::npos) << df;

  // A command fills it: ENOSPC, and the image on the host did not grow.
  ExecResult fill = Exec(id, "dd if=/dev/zero of=/workspace/fill bs=1M count=64; echo rc=$?");
  EXPECT_NE(fill.err().find("No space left on device"), std::string::npos) << fill.err();
  EXPECT_EQ(fill.out(), "rc=1\n");
  const std::string image = daemon().SandboxDir(id) + "/disk.ext4";
  // Its directory holds the disk, not the empty workspace/ and home/ a skeleton made ahead has.
  std::vector<std::string> names;
  for (const auto& e : sfs::directory_iterator(daemon().SandboxDir(id))) {
    names.push_back(e.path().filename());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "disk.ext4"}));
  struct stat st {};
  ASSERT_EQ(::stat(image.c_str(), &st), 0) << image;
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), bytes);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, bytes) << "the image's blocks are reserved";

  // An upload into the full disk: 507 ENOSPC, as api.md says for a full disk.
  Response up = PutFile(id, "/root/upload", std::string(8 * kMiB, 'u'));
  EXPECT_EQ(up.status, 507) << up.Describe();
  EXPECT_EQ(up.ErrorCode(), "ENOSPC") << up.Describe();
  // Room made, the same upload goes through; a bigger one than the disk never does.
  Sh(id, "rm /workspace/fill");
  EXPECT_EQ(PutFile(id, "/root/upload", std::string(8 * kMiB, 'u')).status, 204);
  Response big = PutFile(id, "/root/big", std::string(48 * kMiB, 'b'));
  EXPECT_EQ(big.status, 507) << big.Describe();
  EXPECT_EQ(Sh(id, "test -e /root/big || echo no-big; stat -c %s /root/upload"),
            "no-big\n" + std::to_string(8 * kMiB) + "\n");

  // A sandbox without a disk of its own is not bound by it (control).
  const std::string other = NewId("other");
  Create(other);
  EXPECT_EQ(PutFile(other, "/root/big", std::string(48 * kMiB, 'b')).status, 204);
}

TEST_F(Disks, FilesLiveThroughStopRestartAndSigkillOnOneLoopDevice) {
  const std::string id = NewId();
  ASSERT_EQ(CreateWithDisk(id, 32 * kMiB).status, 201);
  ASSERT_EQ(PutFile(id, "/workspace/a.txt", "aaa\n").status, 204);
  Sh(id, "echo rc > /root/.rc");
  auto check = [&](const char* when) {
    EXPECT_EQ(Sh(id, "cat /workspace/a.txt /root/.rc"), "aaa\nrc\n") << when;
    // One, once a loop device a dead daemon's jail held has finished its detaching (its sysfs
    // entry goes a moment after its last user).
    std::vector<std::string> loops;
    const auto deadline = std::chrono::steady_clock::now() + milliseconds(3000);
    while ((loops = LoopsUnder(daemon().state_dir())).size() != 1 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(20));
    }
    EXPECT_EQ(loops.size(), 1u) << when << ":\n" << Join(loops);
  };
  check("created");
  ASSERT_EQ(client().Request("POST", SbPath(id, "/stop")).status, 200);
  check("after stop");
  ASSERT_TRUE(daemon().Stop()) << daemon().error();
  EXPECT_TRUE(NoLoopsWithin(milliseconds(3000))) << "the daemon ended, its disks still attached:\n"
                                                 << Join(LoopsUnder(daemon().state_dir()));
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  check("after a restart");
  // Killed with a command running on the disk: the next daemon mounts it again, once.
  std::thread t([&] {
    Client c = NewClient();
    c.PostJson(SbPath(id, "/exec"),
               json::object{{"command", "cd /workspace && while :; do echo x >> log; done"}});
  });
  std::this_thread::sleep_for(milliseconds(300));
  daemon().Kill();
  t.join();
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  check("after a SIGKILL");
  EXPECT_EQ(Sh(id, "test -s /workspace/log && echo logged"), "logged\n");
}

// The image still mounted when a daemon dies (here a host process holds a file of it open, as a
// jail of the dead daemon that has not yet ended would): the next daemon mounts it through the
// same loop device, so there is one file system on it, never two writing one image.
TEST_F(Disks, ADiskStillMountedAfterTheDaemonDiedIsMountedThroughItsLoopDeviceAgain) {
  const std::string id = NewId();
  ASSERT_EQ(CreateWithDisk(id, 32 * kMiB).status, 201);
  Sh(id, "echo one > /workspace/shared");
  pid_t init = 0;
  for (const auto& p : Descendants(daemon().pid())) {
    if (p.comm == "nsbox-init") init = p.pid;
  }
  ASSERT_GT(init, 0);
  const std::string path = "/proc/" + std::to_string(init) + "/root/workspace/shared";
  UniqueFd held(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(held.valid()) << path << ": " << std::strerror(errno);
  struct stat host_view {};
  ASSERT_EQ(::fstat(held.get(), &host_view), 0);
  daemon().Kill();
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  EXPECT_EQ(LoopsUnder(daemon().state_dir()).size(), 1u) << "control: the held file keeps it";
  EXPECT_EQ(Sh(id, "cat /workspace/shared; echo two > /workspace/shared"), "one\n");
  const std::vector<std::string> loops = LoopsUnder(daemon().state_dir());
  EXPECT_EQ(loops.size(), 1u) << "a second loop device on one image:\n" << Join(loops);
  // One file system: the sandbox's /workspace is the held file's, and a write shows on both.
  EXPECT_EQ(Sh(id, "stat -c %d /workspace/shared"), std::to_string(host_view.st_dev) + "\n");
  char buf[8] = {};
  EXPECT_EQ(::pread(held.get(), buf, sizeof buf, 0), 4);
  EXPECT_EQ(std::string(buf, 4), "two\n");
  held.reset();
  ASSERT_EQ(Delete(id).status, 204);
  EXPECT_TRUE(NoLoopsWithin(milliseconds(3000))) << Join(LoopsUnder(daemon().state_dir()));
}

TEST_F(Disks, DeleteRemovesTheImageAndDetachesItsLoopDevice) {
  const std::string id = NewId();
  ASSERT_EQ(CreateWithDisk(id, 32 * kMiB).status, 201);
  Sh(id, "echo x > /workspace/x; sleep 1000 &");
  const std::string dir = daemon().SandboxDir(id);
  ASSERT_FALSE(dir.empty());
  EXPECT_EQ(LoopsUnder(daemon().state_dir()).size(), 1u);
  Response del = Delete(id);
  EXPECT_EQ(del.status, 204) << del.Describe();
  struct stat st {};
  EXPECT_NE(::lstat(dir.c_str(), &st), 0) << dir << " is still there";
  EXPECT_TRUE(NoLoopsWithin(milliseconds(3000))) << Join(LoopsUnder(daemon().state_dir()));
  // The id anew: an empty disk.
  ASSERT_EQ(CreateWithDisk(id, 32 * kMiB).status, 201);
  EXPECT_EQ(Sh(id, "ls -A /workspace /root"), "/root:\n\n/workspace:\n");
}

TEST_F(Disks, BadSizesAreRefusedAndAFullHostDiskIs507WithNothingLeft) {
  const std::string id = NewId();
  for (const char* disk : {"1048576", "0", "-1", "\"1G\"", "16777216.5", "8796093022209"}) {
    Response r = client().Request("PUT", SbPath(id),
                                  std::string("{\"limits\":{\"diskBytes\":") + disk + "}}",
                                  {{"Content-Type", "application/json"}});
    EXPECT_EQ(r.status, 400) << disk << ": " << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "invalid_request") << disk;
  }
  EXPECT_EQ(client().Get(SbPath(id)).status, 404);
  // More than the state directory's disk has free: refused at creation, not at the first write.
  struct statvfs sv {};
  ASSERT_EQ(::statvfs(daemon().state_dir().c_str(), &sv), 0);
  const uint64_t too_big = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize + (uint64_t{1} << 30);
  if (too_big > isolate::kMaxDiskBytes) GTEST_SKIP() << "the host's disk is too large to fill";
  const size_t dirs_before = daemon().SandboxDirs().size();
  Response r = client().Request("PUT", SbPath(id),
                                "{\"limits\":{\"diskBytes\":" + std::to_string(too_big) + "}}",
                                {{"Content-Type", "application/json"}});
  EXPECT_EQ(r.status, 507) << r.Describe();
  EXPECT_EQ(r.ErrorCode(), "ENOSPC") << r.Describe();
  EXPECT_NE(r.Describe().find("fallocate"), std::string::npos) << r.Describe();
  EXPECT_EQ(client().Get(SbPath(id)).status, 404);
  EXPECT_EQ(daemon().SandboxDirs().size(), dirs_before);
  EXPECT_TRUE(NoLoopsWithin(milliseconds(2000)));
  // The control. ext4 reuses the blocks the failed fallocate took and gave back only once its
  // journal has committed: a sync commits it, and a few tries cover another writer's commit.
  int control = 0;
  for (int attempt = 0; attempt < 10; ++attempt) {
    ::sync();
    control = CreateWithDisk(id, 16 * kMiB).status;
    if (control != 507) break;
    std::this_thread::sleep_for(milliseconds(500));
  }
  EXPECT_EQ(control, 201) << "control";
}

}  // namespace
}  // namespace nsbox::e2e

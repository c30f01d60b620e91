#include "isolate/shared_etc.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

namespace nsbox::isolate {
namespace {

namespace stdfs = std::filesystem;

std::string Slurp(const stdfs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A host /etc of our own: two allowlisted files (one private), a directory, a symlink, and a
// secret that is not allowlisted.
class SharedEtcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nsbox-shared-etc-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    host_ = root_ / "etc";
    stdfs::create_directory(host_);
    std::ofstream(host_ / "services") << "http 80/tcp\n";
    std::ofstream(host_ / "gitconfig") << "[user]\n";
    ::chmod((host_ / "gitconfig").c_str(), 0600);
    stdfs::create_directory(host_ / "ssl");
    std::ofstream(host_ / "ssl" / "cert.pem") << "CERT";
    stdfs::create_symlink("../usr/lib/os-release", host_ / "os-release");
    std::ofstream(host_ / "shadow") << "root:$6$secret:::\n";
  }
  void TearDown() override { stdfs::remove_all(root_); }

  SharedEtcRequest Request() {
    auto entries = ScanHostEtc(host_.string());
    EXPECT_TRUE(entries.ok()) << entries.error().message();
    SharedEtcRequest r;
    r.cache_dir = (root_ / "cache").string();
    r.host_etc_dir = host_.string();
    r.entries = entries.ok() ? *entries : std::vector<JailFsConfig::EtcEntry>{};
    r.nameserver = "10.213.0.1";
    r.owner_uid = ::getuid();
    r.owner_gid = ::getgid();
    return r;
  }

  stdfs::path root_, host_;
};

TEST_F(SharedEtcTest, HoldsTheGeneratedFilesCopiesAndMountPointsAndNothingElse) {
  if (::geteuid() != 0) GTEST_SKIP() << "NOT RUN: chown to another uid needs root";
  SharedEtcRequest r = Request();
  r.owner_uid = 4242;
  r.owner_gid = 4343;
  auto made = PrepareSharedEtc(r);
  ASSERT_TRUE(made.ok()) << made.error().message();
  stdfs::path dir = *made;
  EXPECT_EQ(dir.parent_path(), root_ / "cache");
  std::set<std::string> names;
  for (const auto& e : stdfs::directory_iterator(dir)) names.insert(e.path().filename());
  EXPECT_EQ(names, (std::set<std::string>{"gitconfig", "group", "hostname", "hosts", "mtab",
                                          "nsswitch.conf", "os-release", "passwd", "resolv.conf",
                                          "services", "ssl"}));
  EXPECT_EQ(Slurp(dir / "services"), "http 80/tcp\n");
  EXPECT_EQ(Slurp(dir / "gitconfig"), "[user]\n");
  struct stat st {};
  ASSERT_EQ(::stat((dir / "gitconfig").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "a copy is no more readable than the host's file";
  // Generated files are the jail's root's; copies keep their host owner.
  ASSERT_EQ(::stat((dir / "passwd").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 4242u);
  EXPECT_EQ(st.st_gid, 4343u);
  ASSERT_EQ(::stat((dir / "services").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, ::getuid());
  // The host's directories are mount points: each jail binds the live one.
  EXPECT_TRUE(stdfs::is_directory(dir / "ssl"));
  EXPECT_TRUE(stdfs::is_empty(dir / "ssl"));
  EXPECT_EQ(stdfs::read_symlink(dir / "os-release"), "../usr/lib/os-release");
  EXPECT_EQ(stdfs::read_symlink(dir / "mtab"), "../proc/self/mounts");
  // Placeholders for the sandbox's own; the rest as GeneratedEtcFiles says.
  EXPECT_EQ(Slurp(dir / "hosts"), "");
  EXPECT_EQ(Slurp(dir / "hostname"), "");
  EXPECT_NE(Slurp(dir / "resolv.conf").find("nameserver 10.213.0.1\n"), std::string::npos);
  EXPECT_NE(Slurp(dir / "passwd").find("root:x:0:0:"), std::string::npos);
}

TEST_F(SharedEtcTest, IsReusedUntilAHostFileOrTheResolverChanges) {
  auto first = PrepareSharedEtc(Request());
  ASSERT_TRUE(first.ok()) << first.error().message();
  auto again = PrepareSharedEtc(Request());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);

  // Replaced the way package managers do: a new file renamed over the old one.
  std::ofstream(host_ / "services.new") << "http 8080/tcp\n";
  stdfs::rename(host_ / "services.new", host_ / "services");
  auto changed = PrepareSharedEtc(Request());
  ASSERT_TRUE(changed.ok());
  EXPECT_NE(*changed, *first);
  EXPECT_EQ(Slurp(stdfs::path(*changed) / "services"), "http 8080/tcp\n");
  // The version running jails bind is left as it was.
  EXPECT_EQ(Slurp(stdfs::path(*first) / "services"), "http 80/tcp\n");

  // Edited in place: the ctime moves.
  std::ofstream(host_ / "services", std::ios::app) << "ssh 22/tcp\n";
  auto edited = PrepareSharedEtc(Request());
  ASSERT_TRUE(edited.ok());
  EXPECT_NE(*edited, *changed);
  EXPECT_EQ(Slurp(stdfs::path(*edited) / "services"), "http 8080/tcp\nssh 22/tcp\n");

  SharedEtcRequest other = Request();
  other.nameserver = "10.99.0.1";
  auto resolver = PrepareSharedEtc(other);
  ASSERT_TRUE(resolver.ok());
  EXPECT_NE(*resolver, *edited);
  EXPECT_NE(Slurp(stdfs::path(*resolver) / "resolv.conf").find("10.99.0.1"), std::string::npos);
}

TEST_F(SharedEtcTest, ConcurrentStartsMakeOneVersionAndLeaveNoTempDirectory) {
  const SharedEtcRequest r = Request();
  std::vector<std::string> paths(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < paths.size(); ++i) {
    threads.emplace_back([&, i] {
      auto made = PrepareSharedEtc(r);
      paths[i] = made.ok() ? *made : "error: " + made.error().message();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& p : paths) EXPECT_EQ(p, paths[0]);
  std::vector<std::string> entries;
  for (const auto& e : stdfs::directory_iterator(root_ / "cache")) {
    entries.push_back(e.path().filename());
  }
  EXPECT_EQ(entries.size(), 1u) << "a version and nothing half-made beside it";
}

TEST_F(SharedEtcTest, RefusesARelativeCache) {
  SharedEtcRequest r = Request();
  r.cache_dir = "cache";
  EXPECT_FALSE(PrepareSharedEtc(r).ok());
}

}  // namespace
}  // namespace nsbox::isolate

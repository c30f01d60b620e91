// The image store against real files, as root: every import format, the layer semantics
// (whiteouts, owners, modes, links, xattrs), hostile input (bad digests, missing blobs, corrupt
// tarballs, paths that try to leave the image), and the store's life cycle (names, replace,
// removal, garbage collection, recovery after a crash). Plain GoogleTest: it relies on nothing
// of harness.cc beyond being linked with it.

#include "images/store.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "images/import.h"
#include "tests/common/image_builder.h"

namespace nsbox::images {
namespace {

using namespace nsbox::testutil;  // NOLINT: the builder's vocabulary reads best unqualified

constexpr uint32_t kUidBase = 200000;
constexpr uint32_t kGidBase = 300000;

std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Readlink(const std::string& path) {
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  return n < 0 ? "<" + std::string(strerror(errno)) + ">"
               : std::string(buf, static_cast<size_t>(n));
}

struct stat Lstat(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path << ": " << strerror(errno);
  return st;
}

// The content of a file the import made; a failed expectation (not an abort) when it is missing.
std::string Content(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    ADD_FAILURE() << path << " is not a regular file";
    return "<missing>";
  }
  return ReadFileOrDie(path);
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool Contains(const std::vector<std::string>& v, std::string_view needle) {
  return std::any_of(v.begin(), v.end(),
                     [&](const std::string& s) { return s.find(needle) != std::string::npos; });
}

std::string Joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += "[" + s + "] ";
  return out;
}

class ImageImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: imports chown every entry";
    char tmpl[] = "/var/tmp/nsbox-image-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << strerror(errno);
    root_ = tmpl;
    images_ = root_ + "/images";
    ids_.uid = {0, kUidBase, 65536};
    ids_.gid = {0, kGidBase, 65536};
    OpenStore();
  }

  void TearDown() override {
    store_.reset();
    if (!root_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(root_, ec);
    }
  }

  void OpenStore() {
    store_.reset();
    auto store = ImageStore::Open(images_, ids_);
    ASSERT_TRUE(store.ok()) << store.error().message();
    store_ = std::move(store).value();
  }

  // Writes `data` into the test's directory; returns its path.
  std::string Put(const std::string& name, std::string_view data) {
    std::string path = root_ + "/" + name;
    WriteFileOrDie(path, data);
    return path;
  }

  Result<ImageInfo> Import(const std::string& name, const std::string& source,
                           bool replace = false) {
    return store_->Import(name, source, replace, nullptr);
  }

  // Imports and fails the test on an error; the image's rootfs in rootfs_ (a path that does not
  // exist after a failure, so that no check looks at the host's files instead).
  ImageInfo MustImport(const std::string& name, const std::string& source) {
    rootfs_ = root_ + "/no-rootfs";
    auto info = Import(name, source);
    EXPECT_TRUE(info.ok()) << info.error().message();
    if (!info.ok()) return ImageInfo{};
    auto rootfs = store_->RootfsOf(info->id);
    EXPECT_TRUE(rootfs.ok()) << rootfs.error().message();
    if (rootfs.ok()) rootfs_ = *rootfs;
    return *info;
  }

  std::string InRoot(const std::string& rel) const { return rootfs_ + "/" + rel; }

  // A failed import leaves nothing: no .import-* directory, no content, no name.
  void ExpectNothingLeft(const std::string& name) {
    for (const std::string& entry : ListDir(images_)) {
      EXPECT_NE(entry.rfind(".import-", 0), 0u) << "left behind: " << entry;
    }
    EXPECT_EQ(ListDir(images_ + "/content"), std::vector<std::string>{});
    EXPECT_FALSE(store_->Find(name).has_value());
    EXPECT_FALSE(Exists(images_ + "/" + name + ".json"));
  }

  // Expects an EINVAL import whose message has every one of `needles`; then nothing left.
  void ExpectBadInput(const std::string& source, const std::vector<std::string>& needles) {
    auto info = Import("bad", source);
    ASSERT_FALSE(info.ok()) << "imported " << source;
    EXPECT_EQ(info.error().code(), EINVAL) << info.error().message();
    for (const std::string& needle : needles) {
      EXPECT_NE(info.error().message().find(needle), std::string::npos)
          << "'" << needle << "' not in: " << info.error().message();
    }
    ExpectNothingLeft("bad");
  }

  std::string root_;
  std::string images_;
  std::string rootfs_;
  isolate::IdMapping ids_;
  std::unique_ptr<ImageStore> store_;
};

ImageSpec OneLayer(std::vector<TarEntry> entries) {
  ImageSpec spec;
  spec.layers = {std::move(entries)};
  return spec;
}

// ---- formats ----

TEST_F(ImageImportTest, OciLayoutDirectory) {
  ImageSpec spec = OneLayer(
      {Dir("etc"), File("etc/hello", "hello\n"), Dir("bin"), Symlink("bin/sh", "/bin/busybox")});
  spec.env = {"PATH=/bin", "FOO=bar"};
  spec.working_dir = "/srv";
  spec.user = "1000:1000";
  spec.entrypoint = {"/entry"};
  spec.cmd = {"run", "it"};
  ImageFiles oci = BuildOciLayout(spec);
  WriteLayoutDir(oci, root_ + "/layout");

  ImageInfo info = MustImport("demo", root_ + "/layout");
  EXPECT_EQ(info.name, "demo");
  EXPECT_EQ(info.format, "oci");
  EXPECT_EQ(info.digest, oci.digest);
  EXPECT_EQ(info.layers, 1u);
  EXPECT_EQ(info.files, 4u);
  EXPECT_EQ(info.size_bytes, 6u);
  EXPECT_EQ(info.id.size(), 32u);
  EXPECT_EQ(info.uid_base, kUidBase);
  EXPECT_EQ(info.gid_base, kGidBase);
  EXPECT_EQ(info.shell, "/bin/sh");
  EXPECT_EQ(info.imported_at.size(), 24u) << info.imported_at;
  EXPECT_EQ(info.config.env, (std::vector<std::string>{"PATH=/bin", "FOO=bar"}));
  EXPECT_EQ(info.config.working_dir, "/srv");
  EXPECT_EQ(info.config.user, "1000:1000");
  EXPECT_EQ(info.config.entrypoint, std::vector<std::string>{"/entry"});
  EXPECT_EQ(info.config.cmd, (std::vector<std::string>{"run", "it"}));
  EXPECT_EQ(info.config.architecture, "amd64");
  EXPECT_EQ(info.config.os, "linux");
  // The image has no /srv: its sandboxes' commands would fail to start there, and the import
  // says so.
  EXPECT_EQ(
      info.warnings,
      std::vector<std::string>{"the config's WorkingDir '/srv' is not a directory of the image: a "
                               "command of its sandboxes fails unless it is given another cwd"})
      << Joined(info.warnings);

  EXPECT_EQ(Content(InRoot("etc/hello")), "hello\n");
  EXPECT_EQ(Readlink(InRoot("bin/sh")), "/bin/busybox");
  EXPECT_EQ(rootfs_, images_ + "/content/" + info.id + "/rootfs");
  // The store's view, the name's file and the content's own copy agree.
  auto found = store_->Find("demo");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->id, info.id);
  ASSERT_EQ(store_->List().size(), 1u);
  auto by_id = store_->InfoOf(info.id);
  ASSERT_TRUE(by_id.ok()) << by_id.error().message();
  EXPECT_EQ(EncodeImageInfo(*by_id), EncodeImageInfo(info));
  auto from_name = DecodeImageInfo(ReadFileOrDie(images_ + "/demo.json"));
  ASSERT_TRUE(from_name.ok()) << from_name.error().message();
  EXPECT_EQ(from_name->id, info.id);
  // Nothing of the import is left around the content.
  EXPECT_EQ(ListDir(images_), (std::vector<std::string>{"content", "demo.json"}));
  EXPECT_EQ(ListDir(images_ + "/content/" + info.id),
            (std::vector<std::string>{"image.json", "rootfs"}));
  // The root directory belongs to the image's root.
  struct stat st = Lstat(rootfs_);
  EXPECT_EQ(st.st_uid, kUidBase);
  EXPECT_EQ(st.st_gid, kGidBase);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
}

TEST_F(ImageImportTest, OciLayoutTarWithGzipLayers) {
  ImageSpec spec;
  spec.layers = {{Dir("a"), File("a/one", "1")}, {File("a/two", "22")}};
  ImageFiles oci = BuildOciLayout(spec);
  ImageInfo info = MustImport("tar", Put("oci.tar", PackTar(oci)));
  EXPECT_EQ(info.format, "oci");
  EXPECT_EQ(info.digest, oci.digest);
  EXPECT_EQ(info.layers, 2u);
  EXPECT_EQ(Content(InRoot("a/one")), "1");
  EXPECT_EQ(Content(InRoot("a/two")), "22");
}

TEST_F(ImageImportTest, CompressedOciTarWithZstdLayers) {
  ImageSpec spec = OneLayer({Dir("z"), File("z/file", std::string(100000, 'z'))});
  spec.layer_compression = Compression::kZstd;
  ImageFiles oci = BuildOciLayout(spec);
  ImageInfo info = MustImport("zst", Put("oci.tar.gz", PackTar(oci, Compression::kGzip)));
  EXPECT_EQ(info.format, "oci");
  EXPECT_EQ(Content(InRoot("z/file")), std::string(100000, 'z'));
  // The decompressed scratch copy was unlinked at once: nothing but the content is left.
  EXPECT_EQ(ListDir(images_ + "/content/" + info.id),
            (std::vector<std::string>{"image.json", "rootfs"}));
}

TEST_F(ImageImportTest, NestedIndexPicksThisPlatform) {
  ImageSpec spec = OneLayer({File("amd64", "yes")});
  ImageFiles oci = BuildOciLayout(spec, OciOptions{.nested_index = true});
  ImageInfo info = MustImport("multi", Put("multi.tar", PackTar(oci)));
  EXPECT_EQ(info.digest, oci.digest);
  EXPECT_EQ(Content(InRoot("amd64")), "yes");
}

TEST_F(ImageImportTest, DockerSaveTarball) {
  ImageSpec spec;
  spec.layer_compression = Compression::kNone;  // as docker save writes them
  spec.layers = {{Dir("etc"), File("etc/base", "base")}, {File("etc/top", "top")}};
  spec.env = {"A=1"};
  ImageFiles docker = BuildDockerSave(spec);
  ImageInfo info = MustImport("docker", Put("docker.tar", PackTar(docker)));
  EXPECT_EQ(info.format, "docker");
  EXPECT_EQ(info.digest, docker.config_digest);
  EXPECT_EQ(info.layers, 2u);
  EXPECT_EQ(info.config.env, std::vector<std::string>{"A=1"});
  EXPECT_EQ(Content(InRoot("etc/base")), "base");
  EXPECT_EQ(Content(InRoot("etc/top")), "top");
}

TEST_F(ImageImportTest, GzippedDockerSaveWithCompressedLayers) {
  // `docker save | gzip`, and layers compressed inside: their diff_ids can only be checked by
  // decompressing them once more.
  ImageSpec spec = OneLayer({File("f", "gz")});
  spec.layer_compression = Compression::kGzip;
  ImageFiles docker = BuildDockerSave(spec);
  ImageInfo info = MustImport("dgz", Put("docker.tar.gz", PackTar(docker, Compression::kGzip)));
  EXPECT_EQ(Content(InRoot("f")), "gz");
  EXPECT_TRUE(info.warnings.empty()) << Joined(info.warnings);
}

TEST_F(ImageImportTest, DockerSaveDiffIdMismatch) {
  ImageSpec spec = OneLayer({File("f", "real")});
  spec.layer_compression = Compression::kNone;
  ImageFiles docker = BuildDockerSave(spec);
  docker.Find(docker.layer_paths[0]) = MakeTar({File("f", "forged")});
  ExpectBadInput(Put("docker.tar", PackTar(docker)), {"layer 1", "diff_id", docker.diff_ids[0]});
}

TEST_F(ImageImportTest, RootfsTarball) {
  // As `tar -C root -czf rootfs.tar.gz .` writes it: "./" names, the root itself first.
  std::vector<TarEntry> entries = {Dir("./"), Dir("./etc"), File("./etc/os-release", "ID=x\n"),
                                   File("/abs", "stripped")};
  ImageInfo info = MustImport("rootfs", Put("rootfs.tar.gz", MakeTar(entries, Compression::kGzip)));
  EXPECT_EQ(info.format, "rootfs");
  EXPECT_EQ(info.digest, "");
  EXPECT_EQ(info.layers, 1u);
  EXPECT_EQ(info.config.architecture, "");
  EXPECT_EQ(Content(InRoot("etc/os-release")), "ID=x\n");
  EXPECT_EQ(Content(InRoot("abs")), "stripped");
}

TEST_F(ImageImportTest, BusyboxRootfs) {
  if (!HaveBusybox()) GTEST_SKIP() << kBusybox << " is missing (Debian's busybox-static)";
  ImageInfo info =
      MustImport("busybox", Put("busybox.tar.gz", MakeTar(BusyboxRootfs(), Compression::kGzip)));
  EXPECT_EQ(info.shell, "/bin/sh");
  struct stat st = Lstat(InRoot("bin/busybox"));
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), ReadFileOrDie(kBusybox).size());
  for (const std::string& cmd : BusyboxCommands()) {
    EXPECT_EQ(Readlink(InRoot("bin/" + cmd)), "/bin/busybox") << cmd;
  }
  EXPECT_EQ(Lstat(InRoot("tmp")).st_mode & 07777, 01777u);
  EXPECT_EQ(Lstat(InRoot("root")).st_mode & 07777, 0700u);
  EXPECT_NE(Content(InRoot("etc/passwd")).find("root:x:0:0"), std::string::npos);
}

TEST_F(ImageImportTest, ShellIsLookedUpInsideTheImage) {
  // /bin -> /usr/bin (absolute, merged /usr) without bash: the host's /usr/bin/bash must not
  // count.
  auto no_bash = Import(
      "no-bash", Put("a.tar", MakeTar({Dir("usr"), Dir("usr/bin"), Symlink("bin", "/usr/bin")})));
  ASSERT_TRUE(no_bash.ok()) << no_bash.error().message();
  EXPECT_EQ(no_bash->shell, "/bin/sh");
  auto bash = Import(
      "bash", Put("b.tar", MakeTar({Dir("usr"), Dir("usr/bin"), File("usr/bin/bash", "#!", 0755),
                                    Symlink("bin", "/usr/bin")})));
  ASSERT_TRUE(bash.ok()) << bash.error().message();
  EXPECT_EQ(bash->shell, "/bin/bash");
  auto not_executable =
      Import("bash-0644", Put("c.tar", MakeTar({Dir("bin"), File("bin/bash", "#!", 0644)})));
  ASSERT_TRUE(not_executable.ok()) << not_executable.error().message();
  EXPECT_EQ(not_executable->shell, "/bin/sh");
}

TEST_F(ImageImportTest, DirectoryThatIsNoLayout) {
  ASSERT_EQ(::mkdir((root_ + "/plain").c_str(), 0755), 0);
  ExpectBadInput(root_ + "/plain", {"not an OCI image layout"});
}

// ---- layer semantics ----

TEST_F(ImageImportTest, WhiteoutsAndOpaqueDirectories) {
  ImageSpec spec;
  spec.layers = {
      {Dir("a"), File("a/gone", "1"), File("a/kept", "2"), Dir("d"), File("d/old", "3"),
       Dir("d/sub"), File("d/sub/deep", "4"), Dir("tree"), Dir("tree/x"), File("tree/x/y", "5")},
      {Whiteout("a/gone"), Whiteout("tree"), Dir("d"), File("d/new", "6"), OpaqueWhiteout("d")},
  };
  ImageInfo info = MustImport("wh", Put("wh.tar", PackTar(BuildOciLayout(spec))));
  EXPECT_EQ(ListDir(InRoot("a")), std::vector<std::string>{"kept"});
  // Opaque: the lower layer's d/old and d/sub are gone, this layer's d/new stays even though it
  // came before the marker.
  EXPECT_EQ(ListDir(InRoot("d")), std::vector<std::string>{"new"});
  EXPECT_FALSE(Exists(InRoot("tree")));
  // Whiteout files themselves never appear.
  EXPECT_EQ(ListDir(rootfs_), (std::vector<std::string>{"a", "d"}));
}

TEST_F(ImageImportTest, LaterLayersReplaceEntries) {
  ImageSpec spec;
  spec.layers = {
      {File("was-file", "f"), Dir("was-dir"), File("was-dir/inner", "i"), Symlink("link", "/x"),
       Dir("keep", 0700)},
      {Dir("was-file"), File("was-dir", "now a file"), File("link", "no longer a link"),
       Dir("keep", 0751).Owner(7, 8)},
  };
  MustImport("replace", Put("r.tar", PackTar(BuildOciLayout(spec))));
  EXPECT_TRUE(S_ISDIR(Lstat(InRoot("was-file")).st_mode));
  EXPECT_EQ(Content(InRoot("was-dir")), "now a file");
  EXPECT_EQ(Content(InRoot("link")), "no longer a link");
  struct stat keep = Lstat(InRoot("keep"));
  EXPECT_EQ(keep.st_mode & 07777, 0751u);
  EXPECT_EQ(keep.st_uid, kUidBase + 7);
}

TEST_F(ImageImportTest, OwnersAreShiftedAndModesKept) {
  auto info = MustImport(
      "owners", Put("o.tar", MakeTar({Dir("srv", 0750).Owner(33, 33),
                                      File("srv/suid", "x", 04755).Owner(1000, 2000),
                                      File("srv/sgid", "x", 02711).Owner(0, 50),
                                      Symlink("srv/link", "suid").Owner(5, 6), Dir("tmp", 01777),
                                      File("implicit/parent/file", "p").Owner(65535, 65535)})));
  struct stat srv = Lstat(InRoot("srv"));
  EXPECT_EQ(srv.st_uid, kUidBase + 33);
  EXPECT_EQ(srv.st_gid, kGidBase + 33);
  EXPECT_EQ(srv.st_mode & 07777, 0750u);
  struct stat suid = Lstat(InRoot("srv/suid"));
  EXPECT_EQ(suid.st_uid, kUidBase + 1000);
  EXPECT_EQ(suid.st_gid, kGidBase + 2000);
  EXPECT_EQ(suid.st_mode & 07777, 04755u) << "the chown must come before the chmod";
  EXPECT_EQ(Lstat(InRoot("srv/sgid")).st_mode & 07777, 02711u);
  struct stat link = Lstat(InRoot("srv/link"));
  EXPECT_EQ(link.st_uid, kUidBase + 5);
  EXPECT_EQ(link.st_gid, kGidBase + 6);
  EXPECT_EQ(Lstat(InRoot("tmp")).st_mode & 07777, 01777u);
  // Directories the tarball did not list are made for it, owned by the image's root.
  struct stat implicit = Lstat(InRoot("implicit/parent"));
  EXPECT_EQ(implicit.st_uid, kUidBase);
  EXPECT_EQ(implicit.st_mode & 07777, 0755u);
  EXPECT_EQ(Lstat(InRoot("implicit/parent/file")).st_uid, kUidBase + 65535);
  // mtimes are kept, for directories too (set after their content was made).
  EXPECT_EQ(suid.st_mtime, 1700000000);
  EXPECT_EQ(srv.st_mtime, 1700000000);
  EXPECT_EQ(info.files, 6u) << "entries unpacked; the implicit directories are not entries";
}

TEST_F(ImageImportTest, OwnerOutsideTheRange) {
  ExpectBadInput(Put("o.tar", MakeTar({File("big", "x").Owner(70000, 0)})),
                 {"'big'", "owner 70000 is outside the sandbox's 65536 ids"});
  ExpectBadInput(Put("g.tar", MakeTar({File("big", "x").Owner(0, 65536)})),
                 {"group 65536 is outside"});
}

TEST_F(ImageImportTest, HardlinksAndSymlinks) {
  ImageSpec spec;
  spec.layers = {{Dir("bin"), File("bin/tool", "binary", 0755)},
                 {Hardlink("bin/alias", "bin/tool"), Symlink("bin/abs", "/etc/target"),
                  Symlink("bin/rel", "../etc/../bin/tool"), Hardlink("linked-link", "bin/abs")}};
  MustImport("links", Put("l.tar", PackTar(BuildOciLayout(spec))));
  struct stat tool = Lstat(InRoot("bin/tool"));
  struct stat alias = Lstat(InRoot("bin/alias"));
  EXPECT_EQ(tool.st_ino, alias.st_ino);
  EXPECT_EQ(tool.st_nlink, 2u);
  EXPECT_EQ(Readlink(InRoot("bin/abs")), "/etc/target");
  EXPECT_EQ(Readlink(InRoot("bin/rel")), "../etc/../bin/tool");
  // A hardlink to a symlink is the symlink itself, not what it points at.
  EXPECT_EQ(Readlink(InRoot("linked-link")), "/etc/target");
}

TEST_F(ImageImportTest, DeviceNodesAreSkippedFifosKept) {
  auto info = MustImport("dev", Put("d.tar", MakeTar({Dir("dev"), CharDevice("dev/null", 1, 3),
                                                      CharDevice("dev/zero", 1, 5),
                                                      Fifo("run-fifo", 0620).Owner(1, 2)})));
  EXPECT_FALSE(Exists(InRoot("dev/null")));
  EXPECT_FALSE(Exists(InRoot("dev/zero")));
  EXPECT_TRUE(Contains(info.warnings, "skipped 2 device nodes (first: /dev/null)"))
      << Joined(info.warnings);
  struct stat fifo = Lstat(InRoot("run-fifo"));
  EXPECT_TRUE(S_ISFIFO(fifo.st_mode));
  EXPECT_EQ(fifo.st_mode & 07777, 0620u);
  EXPECT_EQ(fifo.st_uid, kUidBase + 1);
}

TEST_F(ImageImportTest, XattrsKeptWhereAllowed) {
  auto info = MustImport(
      "xattr", Put("x.tar", MakeTar({File("f", "x").Xattr("user.x", "hello"),
                                     Dir("d").Xattr("user.dir", "yes"),
                                     File("t", "x").Xattr("trusted.overlay.opaque", "y")})));
  char buf[64] = {};
  ssize_t n = ::getxattr(InRoot("f").c_str(), "user.x", buf, sizeof buf);
  ASSERT_EQ(n, 5) << strerror(errno);
  EXPECT_EQ(std::string(buf, 5), "hello");
  n = ::getxattr(InRoot("d").c_str(), "user.dir", buf, sizeof buf);
  EXPECT_EQ(n, 3);
  EXPECT_LT(::getxattr(InRoot("t").c_str(), "trusted.overlay.opaque", buf, sizeof buf), 0);
  EXPECT_TRUE(Contains(info.warnings, "dropped 1 xattr")) << Joined(info.warnings);
}

TEST_F(ImageImportTest, WithoutOpenat2) {
  // The O_NOFOLLOW walk that stands in for openat2 before Linux 5.6 makes the same tree and
  // refuses the same escapes.
  internal::SetUseOpenat2ForTesting(false);
  ImageSpec spec;
  spec.layers = {
      {Dir("a"), File("a/gone", "1"), File("a/b/c/kept", "2"), Dir("d"), File("d/old", "3"),
       File("tool", "t", 0755)},
      {Whiteout("a/gone"), OpaqueWhiteout("d"), File("d/new", "4"), Hardlink("a/b/tool", "tool")}};
  auto info = Import("walk", Put("walk.tar", PackTar(BuildOciLayout(spec))));
  char tmpl[] = "/tmp/nsbox-canary-XXXXXX";
  const bool made = ::mkdtemp(tmpl) != nullptr;
  const std::string canary = tmpl;
  auto evil = Import(
      "evil", Put("evil.tar", MakeTar({Symlink("evil", canary), File("evil/file", "pwned")})));
  internal::SetUseOpenat2ForTesting(true);
  ASSERT_TRUE(made);
  ASSERT_TRUE(info.ok()) << info.error().message();
  rootfs_ = *store_->RootfsOf(info->id);
  EXPECT_EQ(ListDir(InRoot("a")), std::vector<std::string>{"b"});
  EXPECT_EQ(Content(InRoot("a/b/c/kept")), "2");
  EXPECT_EQ(ListDir(InRoot("d")), std::vector<std::string>{"new"});
  EXPECT_EQ(Lstat(InRoot("a/b/tool")).st_ino, Lstat(InRoot("tool")).st_ino);
  ASSERT_FALSE(evil.ok());
  EXPECT_EQ(evil.error().code(), EINVAL);
  EXPECT_NE(evil.error().message().find("symlink"), std::string::npos) << evil.error().message();
  EXPECT_EQ(ListDir(canary), std::vector<std::string>{});
  ::rmdir(canary.c_str());
}

// ---- bad input ----

TEST_F(ImageImportTest, LayerDigestMismatch) {
  ImageSpec spec;
  spec.layers = {{File("one", "1")}, {File("two", "2")}};
  spec.layer_compression = Compression::kNone;
  ImageFiles oci = BuildOciLayout(spec);
  // Another valid layer of the same size under the second layer's name: it unpacks fine, its
  // digest is wrong.
  oci.Find(oci.layer_paths[1]) = MakeTar({File("two", "3")});
  ExpectBadInput(Put("bad.tar", PackTar(oci)),
                 {"layer 2", oci.layer_digests[1], "digest mismatch"});
}

TEST_F(ImageImportTest, LayerBlobMissing) {
  ImageSpec spec;
  spec.layers = {{File("one", "1")}, {File("two", "2")}};
  ImageFiles oci = BuildOciLayout(spec);
  oci.Erase(oci.layer_paths[1]);
  ExpectBadInput(Put("bad.tar", PackTar(oci)), {"layer 2", oci.layer_digests[1], "missing"});
  WriteLayoutDir(oci, root_ + "/layout");
  ExpectBadInput(root_ + "/layout", {"layer 2", oci.layer_digests[1], "missing"});
}

TEST_F(ImageImportTest, ManifestDigestMismatch) {
  ImageFiles oci = BuildOciLayout(OneLayer({File("f", "x")}));
  // Same size, other bytes: the size check passes, the digest does not.
  std::string& manifest = oci.Find("blobs/sha256/" + oci.digest.substr(7));
  manifest.replace(manifest.find("\"layers\""), 8, "\"Layers\"");
  ExpectBadInput(Put("bad.tar", PackTar(oci)), {"manifest", oci.digest, "digest mismatch"});
}

TEST_F(ImageImportTest, TruncatedTarballs) {
  std::string tar =
      PackTar(BuildOciLayout(OneLayer({File("f", std::string(50000, 'x'))}), OciOptions{}));
  ExpectBadInput(Put("cut.tar", tar.substr(0, tar.size() / 2)), {"cut.tar"});
  std::string gz = MakeTar({File("f", std::string(200000, 'y'))}, Compression::kGzip);
  ExpectBadInput(Put("cut.tar.gz", gz.substr(0, gz.size() / 2)), {"cut.tar.gz"});
}

TEST_F(ImageImportTest, NotATarball) {
  std::string noise(10000, '\0');
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<char>((i * 7919 + 13) % 251);
  ExpectBadInput(Put("noise.bin", noise), {"noise.bin", "not a tar archive"});
  ExpectBadInput(Put("empty.tar", ""), {"empty.tar", "not a tar archive"});
  ExpectBadInput(Put("zeros.tar", std::string(1024, '\0')), {"zeros.tar", "no entries"});
  auto missing = Import("missing", root_ + "/does-not-exist");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ENOENT) << missing.error().message();
}

TEST_F(ImageImportTest, DotDotEntryIsRefused) {
  const std::string outside = "escaped-" + std::to_string(::getpid());
  ExpectBadInput(Put("dotdot.tar", MakeTar({Dir("etc"), File("../../../" + outside, "pwned")})),
                 {"../../../" + outside, "'..'"});
  EXPECT_FALSE(Exists(root_ + "/" + outside));
  EXPECT_FALSE(Exists(images_ + "/" + outside));
  ExpectBadInput(Put("dotdot2.tar", MakeTar({File("a/../../b", "x")})), {"'..'"});
}

TEST_F(ImageImportTest, SymlinkParentIsRefused) {
  char tmpl[] = "/tmp/nsbox-canary-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string canary = tmpl;
  // evil -> the canary (absolute, and relative through the image's root), then a file below it:
  // refused, and nothing appears in the canary.
  ExpectBadInput(Put("evil.tar", MakeTar({Symlink("evil", canary), File("evil/file", "pwned")})),
                 {"'evil/file'", "'evil'", "symlink"});
  ExpectBadInput(Put("evil2.tar", MakeTar({Dir("d"), Symlink("d/up", "../../../../../../.."),
                                           File("d/up" + canary + "/file", "pwned")})),
                 {"symlink"});
  // The same across layers of an OCI image.
  ImageSpec spec;
  spec.layers = {{Symlink("evil", canary)}, {Dir("evil"), File("evil/file", "still a dir now")}};
  auto ok = Import("across", Put("across.tar", PackTar(BuildOciLayout(spec))));
  // A directory entry replaces the symlink (never follows it); the file then lands inside.
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  spec.layers = {{Symlink("evil", canary)}, {File("evil/file", "pwned")}};
  auto info = Import("across2", Put("across2.tar", PackTar(BuildOciLayout(spec))));
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.error().code(), EINVAL);
  EXPECT_NE(info.error().message().find("layer 2"), std::string::npos) << info.error().message();
  EXPECT_EQ(ListDir(canary), std::vector<std::string>{});
  ::rmdir(canary.c_str());
}

TEST_F(ImageImportTest, HardlinkTargetsStayInside) {
  ExpectBadInput(Put("h1.tar", MakeTar({Hardlink("passwd", "../../../../etc/passwd")})),
                 {"hardlink target", "'..'"});
  ExpectBadInput(Put("h2.tar", MakeTar({Hardlink("copy", "missing")})),
                 {"'copy'", "'missing'", "does not exist"});
  // An absolute target names a path inside the image, never the host's.
  ExpectBadInput(Put("h3.tar", MakeTar({Hardlink("passwd", "/etc/passwd")})), {"does not exist"});
  char tmpl[] = "/tmp/nsbox-canary-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string canary = tmpl;
  WriteFileOrDie(canary + "/secret", "host file");
  ExpectBadInput(Put("h4.tar", MakeTar({Symlink("evil", canary), Hardlink("x", "evil/secret")})),
                 {"symlink"});
  EXPECT_EQ(Lstat(canary + "/secret").st_nlink, 1u);
  std::filesystem::remove_all(canary);
}

TEST_F(ImageImportTest, MutatedInputsFailCleanly) {
  // Cut short or with bytes flipped, every kind of source: an import either succeeds (the flip
  // hit file data no digest covers) or fails with EINVAL, and a failure leaves nothing behind.
  // Deterministic (a fixed xorshift sequence), so a failure here reproduces.
  ImageSpec spec;
  spec.layers = {
      {Dir("a"), File("a/f", std::string(3000, 'q')), Symlink("a/l", "/x"), Hardlink("a/h", "a/f")},
      {Whiteout("a/f"), OpaqueWhiteout("a"), File("a/g", "zz").Xattr("user.q", "1")}};
  spec.layer_compression = Compression::kNone;
  std::vector<std::string> seeds = {PackTar(BuildOciLayout(spec)), PackTar(BuildDockerSave(spec)),
                                    MakeTar(spec.layers[0]),
                                    MakeTar(spec.layers[0], Compression::kGzip)};
  spec.layer_compression = Compression::kGzip;
  seeds.push_back(PackTar(BuildOciLayout(spec)));
  uint64_t x = 88172645463325252ull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  size_t imported = 0;
  for (int i = 0; i < 200; ++i) {
    std::string data = seeds[static_cast<size_t>(i) % seeds.size()];
    if (next() % 3 == 0) {
      data.resize(next() % data.size());
    } else {
      for (uint64_t flips = 1 + next() % 8; flips > 0; --flips) {
        data[next() % data.size()] = static_cast<char>(next());
      }
    }
    auto r = Import("m" + std::to_string(i), Put("mutated.bin", data));
    if (r.ok()) {
      ++imported;
    } else {
      EXPECT_EQ(r.error().code(), EINVAL) << "case " << i << ": " << r.error().message();
    }
  }
  for (const std::string& entry : ListDir(images_)) EXPECT_NE(entry.rfind(".import-", 0), 0u);
  EXPECT_EQ(ListDir(images_ + "/content").size(), imported);
}

// ---- the store ----

TEST_F(ImageImportTest, NamesTakenAndReplaced) {
  const std::string first = Put("1.tar", MakeTar({File("v", "1")}));
  const std::string second = Put("2.tar", MakeTar({File("v", "2")}));
  ImageInfo one = MustImport("app", first);
  auto taken = Import("app", second);
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.error().code(), EEXIST) << taken.error().message();
  EXPECT_EQ(store_->Find("app")->id, one.id);

  auto two = Import("app", second, /*replace=*/true);
  ASSERT_TRUE(two.ok()) << two.error().message();
  EXPECT_NE(two->id, one.id);
  EXPECT_EQ(store_->Find("app")->id, two->id);
  EXPECT_EQ(Content(*store_->RootfsOf(two->id) + "/v"), "2");
  // The old content stays (a sandbox may run on it) until collected, and keeps its metadata.
  EXPECT_EQ(Content(*store_->RootfsOf(one.id) + "/v"), "1");
  EXPECT_EQ(store_->InfoOf(one.id)->id, one.id);
  ASSERT_TRUE(store_->CollectGarbage({one.id}).ok());
  EXPECT_TRUE(store_->RootfsOf(one.id).ok());
  ASSERT_TRUE(store_->CollectGarbage({}).ok());
  EXPECT_EQ(store_->RootfsOf(one.id).error().code(), ENOENT);
  EXPECT_EQ(store_->InfoOf(one.id).error().code(), ENOENT);
  EXPECT_TRUE(store_->RootfsOf(two->id).ok());
  // Out of sight at once, deleted by PurgeTrash (the daemon's janitor thread).
  std::vector<std::string> content = ListDir(images_ + "/content");
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0].rfind(".trash-" + one.id + "-", 0), 0u) << content[0];
  EXPECT_EQ(content[1], two->id);
  ASSERT_TRUE(store_->PurgeTrash().ok());
  EXPECT_EQ(ListDir(images_ + "/content"), std::vector<std::string>{two->id});
}

TEST_F(ImageImportTest, InvalidNames) {
  const std::string tar = Put("t.tar", MakeTar({File("f", "x")}));
  for (const std::string& bad : std::vector<std::string>{"", "host", "Upper", "-dash", ".dot",
                                                         "a/b", "a:b", std::string(65, 'a')}) {
    EXPECT_TRUE(InvalidImageNameReason(bad).has_value()) << bad;
    auto r = Import(bad, tar);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), EINVAL);
  }
  for (const std::string& good :
       std::vector<std::string>{"debian-12", "busybox.1", "a", "0_x", std::string(64, 'a')}) {
    EXPECT_FALSE(InvalidImageNameReason(good).has_value()) << good;
  }
}

TEST_F(ImageImportTest, RemoveKeepsContentInUse) {
  ImageInfo a = MustImport("a", Put("a.tar", MakeTar({File("f", "a")})));
  ImageInfo b = MustImport("b", Put("b.tar", MakeTar({File("f", "b")})));
  EXPECT_EQ(store_->Remove("nope", {}).error().code(), ENOENT);
  ASSERT_TRUE(store_->Remove("a", {}).ok());
  EXPECT_FALSE(store_->Find("a").has_value());
  EXPECT_FALSE(Exists(images_ + "/a.json"));
  EXPECT_EQ(store_->RootfsOf(a.id).error().code(), ENOENT);
  ASSERT_TRUE(store_->Remove("b", {b.id}).ok());
  EXPECT_TRUE(store_->RootfsOf(b.id).ok()) << "in use: kept";
  ASSERT_TRUE(store_->CollectGarbage({}).ok());
  EXPECT_EQ(store_->RootfsOf(b.id).error().code(), ENOENT);
  ASSERT_TRUE(store_->PurgeTrash().ok());
  EXPECT_EQ(ListDir(images_ + "/content"), std::vector<std::string>{});
  EXPECT_TRUE(store_->List().empty());
}

TEST_F(ImageImportTest, OpenCleansWhatACrashLeft) {
  ImageInfo kept = MustImport("kept", Put("k.tar", MakeTar({File("f", "k")})));
  // An import killed half-way, an upload being spooled, a content directory that never got its
  // image.json, a removal cut short, a torn <name>.json temp file, and a corrupt <name>.json.
  ASSERT_EQ(::mkdir((images_ + "/.import-0123abcd").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((images_ + "/.import-0123abcd/rootfs").c_str(), 0755), 0);
  ASSERT_EQ(::symlink("/etc", (images_ + "/.import-0123abcd/rootfs/etc").c_str()), 0);
  WriteFileOrDie(images_ + "/.import-upload-99", "partial upload");
  const std::string half = std::string(32, 'f');
  ASSERT_EQ(::mkdir((images_ + "/content/" + half).c_str(), 0711), 0);
  ASSERT_EQ(::mkdir((images_ + "/content/" + half + "/rootfs").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((images_ + "/content/.trash-x").c_str(), 0700), 0);
  WriteFileOrDie(images_ + "/.kept.json.tmp", "{");
  WriteFileOrDie(images_ + "/broken.json", "{not json");

  OpenStore();
  EXPECT_EQ(ListDir(images_), (std::vector<std::string>{"broken.json", "content", "kept.json"}))
      << "the corrupt broken.json is skipped, never deleted";
  // Out of sight at once (a start does not wait for deleting them), deleted by PurgeTrash.
  std::vector<std::string> content = ListDir(images_ + "/content");
  EXPECT_EQ(content.size(), 5u);
  for (const std::string& entry : content) {
    EXPECT_TRUE(entry == kept.id || entry.rfind(".trash-", 0) == 0) << entry;
  }
  ASSERT_TRUE(store_->PurgeTrash().ok());
  EXPECT_EQ(ListDir(images_ + "/content"), std::vector<std::string>{kept.id});
  EXPECT_TRUE(Exists("/etc/passwd")) << "the leftover's symlink was removed, not followed";
  ASSERT_EQ(store_->List().size(), 1u);
  EXPECT_EQ(store_->List()[0].id, kept.id);
  EXPECT_FALSE(store_->Find("broken").has_value());
}

TEST_F(ImageImportTest, ProgressReportsEveryLayer) {
  ImageSpec spec;
  spec.layers = {{File("a", std::string(5 << 20, 'a'))}, {File("b", "b")}, {File("c", "c")}};
  spec.layer_compression = Compression::kNone;  // 5 MiB read: at least one report in between
  const std::string tar = Put("p.tar", PackTar(BuildOciLayout(spec)));
  std::vector<ImportProgress> seen;
  auto info =
      store_->Import("progress", tar, false, [&](const ImportProgress& p) { seen.push_back(p); });
  ASSERT_TRUE(info.ok()) << info.error().message();
  std::vector<uint64_t> layers;
  bool reading = false, publishing = false, mid_layer = false;
  for (const ImportProgress& p : seen) {
    if (p.phase == "reading") reading = true;
    if (p.phase == "publishing") publishing = true;
    if (p.phase == "layer") {
      EXPECT_EQ(p.layers, 3u);
      if (layers.empty() || layers.back() != p.layer) layers.push_back(p.layer);
      if (p.layer == 1 && p.bytes_read >= (4u << 20)) mid_layer = true;
      EXPECT_GT(p.bytes_total, 0u);
    }
  }
  EXPECT_TRUE(reading);
  EXPECT_TRUE(publishing);
  EXPECT_TRUE(mid_layer) << "a report at least every 4 MiB";
  EXPECT_EQ(layers, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(seen.back().phase, "publishing");
}

TEST_F(ImageImportTest, WriteTarOfDirectoryRoundTrip) {
  ImageSpec spec;
  spec.layers = {{Dir("etc"), File("etc/x", "x")}, {File("etc/y", "y")}};
  ImageFiles oci = BuildOciLayout(spec);
  const std::string layout = root_ + "/layout";
  WriteLayoutDir(oci, layout);
  // Something a tar must carry as it is: a symlink (never followed) and a hardlink.
  ASSERT_EQ(::symlink("/etc/passwd", (layout + "/stray-link").c_str()), 0);
  ASSERT_EQ(::link((layout + "/oci-layout").c_str(), (layout + "/oci-layout.hard").c_str()), 0);
  const std::string tar = root_ + "/packed.tar";
  {
    int fd = ::open(tar.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    uint64_t reports = 0;
    Status st = WriteTarOfDirectory(layout, fd, [&](const ImportProgress&) { ++reports; });
    ::close(fd);
    ASSERT_TRUE(st.ok()) << st.error().message();
    EXPECT_GE(reports, 1u);
  }
  ImageInfo info = MustImport("packed", tar);
  EXPECT_EQ(info.format, "oci");
  EXPECT_EQ(info.digest, oci.digest);
  EXPECT_EQ(Content(InRoot("etc/y")), "y");
  // The symlink went in as a symlink: the host's /etc/passwd was not read through it.
  EXPECT_EQ(ReadFileOrDie(tar).find("root:x:0:0:"), std::string::npos);
  EXPECT_EQ(WriteTarOfDirectory(root_ + "/missing", 1, nullptr).error().code(), ENOENT);
}

TEST_F(ImageImportTest, ConcurrentImportsOfOneName) {
  const std::string a = Put("a.tar", MakeTar({File("who", "a")}));
  const std::string b = Put("b.tar", MakeTar({File("who", "b")}));
  Result<ImageInfo> ra = Error(0, "not run");
  Result<ImageInfo> rb = Error(0, "not run");
  std::thread ta([&] { ra = store_->Import("race", a, false, nullptr); });
  std::thread tb([&] { rb = store_->Import("race", b, false, nullptr); });
  ta.join();
  tb.join();
  ASSERT_NE(ra.ok(), rb.ok()) << (ra.ok() ? "" : ra.error().message()) << " / "
                              << (rb.ok() ? "" : rb.error().message());
  const Result<ImageInfo>& lost = ra.ok() ? rb : ra;
  EXPECT_EQ(lost.error().code(), EEXIST) << lost.error().message();
  const ImageInfo& won = ra.ok() ? *ra : *rb;
  EXPECT_EQ(store_->Find("race")->id, won.id);
  EXPECT_EQ(ListDir(images_ + "/content"), std::vector<std::string>{won.id});
  for (const std::string& entry : ListDir(images_)) EXPECT_NE(entry.rfind(".import-", 0), 0u);
}

TEST_F(ImageImportTest, ImageInfoJson) {
  ImageInfo info;
  info.name = "x";
  info.id = std::string(32, 'a');
  info.format = "oci";
  info.digest = "sha256:" + std::string(64, 'b');
  info.layers = 2;
  info.size_bytes = 1ull << 40;
  info.files = 9;
  info.imported_at = "2026-11-30T09:00:00.000Z";
  info.uid_base = 4000000000u;
  info.gid_base = 7;
  info.shell = "/bin/bash";
  info.config.env = {"A=1"};
  info.config.working_dir = "/w";
  info.config.cmd = {"sh"};
  info.warnings = {"w"};
  const std::string text = EncodeImageInfo(info);
  for (const char* key : {"\"sizeBytes\"", "\"importedAt\"", "\"uidBase\"", "\"workingDir\""}) {
    EXPECT_NE(text.find(key), std::string::npos) << key << " in " << text;
  }
  auto back = DecodeImageInfo(text);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(EncodeImageInfo(*back), text);
  for (const std::string& bad : {std::string("[]"), std::string("{}"),
                                 [&] {
                                   std::string t = text;
                                   t.replace(t.find("\"oci\""), 5, "\"zip\"");
                                   return t;
                                 }(),
                                 [&] {
                                   std::string t = text;
                                   t.replace(t.find(std::string(32, 'a')), 32, "../x");
                                   return t;
                                 }(),
                                 [&] {
                                   std::string t = text;
                                   t.replace(t.find("\"layers\":2"), 10, "\"layers\":-1");
                                   return t;
                                 }(),
                                 [&] {
                                   std::string t = text;
                                   t.replace(t.find("\"x\""), 3, "\"X/\"");
                                   return t;
                                 }()}) {
    auto r = DecodeImageInfo(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.error().code(), EINVAL);
    }
  }
}

}  // namespace
}  // namespace nsbox::images

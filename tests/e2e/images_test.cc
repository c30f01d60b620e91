// Imported images through the daemon, as a client drives them: POST /v1/images/{name} of an OCI
// layout, a docker save tarball or a root file system tarball built here from busybox-static;
// sandboxes on an image (the whiteouts hold, the image's Env and WorkingDir are the defaults, the
// whole root is writable, persistent across stop and daemon restarts, and private to the
// sandbox); replace and remove; bad input; a daemon killed in the middle of an import; the CLI.

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "isolate/disk.h"
#include "tests/common/image_builder.h"
#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

using namespace nsbox::testutil;  // NOLINT: the builder's vocabulary reads as a list of entries
using std::chrono::milliseconds;

// Entries of `dir` (none of "." and ".."), sorted; empty when it does not exist.
std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The content directories in use: what is not in the trash the daemon empties in the background.
std::vector<std::string> LiveContent(const std::string& images_dir) {
  std::vector<std::string> out;
  for (const auto& e : ListDir(images_dir + "/content")) {
    if (!e.starts_with(".trash-")) out.push_back(e);
  }
  return out;
}

// Whether `dir` becomes empty within `timeout` (the daemon removes old content on a thread of its
// own, after it has answered).
bool BecomesEmpty(const std::string& dir, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!ListDir(dir).empty()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

// Two layers on busybox: the second deletes /etc/motd (a whiteout), replaces /opt/data (an
// opaque directory) and adds a file owned by uid 1000; Env and WorkingDir set.
ImageSpec TwoLayerSpec() {
  ImageSpec spec;
  std::vector<TarEntry> base = BusyboxRootfs();
  base.push_back(File("etc/motd", "from layer one\n"));
  base.push_back(Dir("opt"));
  base.push_back(Dir("opt/data"));
  base.push_back(File("opt/data/old", "old\n"));
  base.push_back(Dir("srv"));
  spec.layers.push_back(base);
  spec.layers.push_back({Whiteout("etc/motd"), OpaqueWhiteout("opt/data"),
                         File("opt/data/new", "new\n"), Dir("home/user"),
                         File("home/user/notes", "mine\n").Owner(1000, 1000)});
  spec.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=from-the-image"};
  spec.working_dir = "/srv";
  return spec;
}

class Images : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    if (!HaveBusybox()) GTEST_FAIL() << "busybox-static is needed (" << kBusybox << ")";
  }

  Response Import(std::string_view name, std::string_view tarball, std::string_view query = "") {
    return client().Request("POST", "/v1/images/" + std::string(name) + std::string(query), tarball,
                            {}, milliseconds(60000));
  }
  std::string ImagesDir() const { return daemon().state_dir() + "/images"; }
  // A root file system tarball with `files` files of `mib` MiB each besides busybox: long enough
  // to unpack that a test can act while its import runs.
  static std::string BigRootfsTarball(size_t mib, int files) {
    std::string big(mib << 20, '\0');
    for (size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>(i >> 12);
    std::vector<TarEntry> root = BusyboxRootfs();
    for (int i = 0; i < files; ++i) root.push_back(File("big" + std::to_string(i), big));
    return MakeTar(root);
  }
  // Directories of state/images that are not content/ or a <name>.json: leftovers.
  std::vector<std::string> Leftovers() const {
    std::vector<std::string> out;
    for (const auto& e : ListDir(ImagesDir())) {
      if (e != "content" && !e.ends_with(".json")) out.push_back(e);
    }
    return out;
  }
};

TEST_F(Images, OciLayoutRunsWithItsWhiteoutsEnvAndWorkingDir) {
  ImageFiles oci = BuildOciLayout(TwoLayerSpec());
  Response imported = Import("two", PackTar(oci));
  ASSERT_EQ(imported.status, 201) << imported.Describe();
  json::object image = Obj(imported);
  EXPECT_TRUE(image.at("warnings").as_array().empty()) << imported.Describe();
  EXPECT_EQ(Str(image, "name"), "two");
  EXPECT_EQ(Str(image, "format"), "oci");
  EXPECT_EQ(Str(image, "digest"), oci.digest);
  EXPECT_EQ(Field(image, "layers").as_int64(), 2);
  EXPECT_EQ(Str(image, "shell"), "/bin/sh");  // busybox: no bash

  const std::string id = NewId();
  Response created = Create(id, R"({"image": "two", "env": {"OWN": "yes"}})");
  ASSERT_EQ(created.status, 201) << created.Describe();
  EXPECT_EQ(Str(Obj(created), "cwd"), "/srv");
  EXPECT_EQ(Sh(id, "pwd; echo $GREETING $OWN; ls /opt/data; test -e /etc/motd || echo gone"),
            "/srv\nfrom-the-image yes\nnew\ngone\n");
  // Owners as the image has them, inside; shifted on the host.
  EXPECT_EQ(Sh(id, "stat -c '%u %g %a' /home/user/notes /bin/busybox"), "1000 1000 644\n0 0 755\n");
  const std::string rootfs = ImagesDir() + "/content/" + Str(image, "id") + "/rootfs";
  struct stat notes {
  }, busybox{};
  ASSERT_EQ(::stat((rootfs + "/home/user/notes").c_str(), &notes), 0) << rootfs;
  ASSERT_EQ(::stat((rootfs + "/bin/busybox").c_str(), &busybox), 0) << rootfs;
  EXPECT_NE(busybox.st_uid, 0u);  // root inside is never root on the host
  EXPECT_EQ(notes.st_uid, busybox.st_uid + 1000);
  EXPECT_EQ(notes.st_gid, busybox.st_gid + 1000);
}

TEST_F(Images, TheRootIsWritablePersistentAndPrivateToEachSandbox) {
  ASSERT_EQ(Import("bb", PackTar(BuildOciLayout(TwoLayerSpec()))).status, 201);
  const std::string a = NewId("a"), b = NewId("b");
  ASSERT_EQ(Create(a, R"({"image": "bb"})").status, 201);
  ASSERT_EQ(Create(b, R"({"image": "bb"})").status, 201);
  // Changes anywhere in the root: a new file in /usr/bin, a changed /etc/passwd, a deleted
  // image file, /workspace and /root.
  Sh(a,
     "mkdir -p /usr/bin && echo 'echo tool' > /usr/bin/tool && chmod +x /usr/bin/tool && "
     "echo 'extra:x:5:5::/:/bin/sh' >> /etc/passwd && rm /opt/data/new && "
     "echo w > /workspace/w && echo r > /root/r");
  auto check_a = [&] {
    EXPECT_EQ(Sh(a,
                 "tool; grep -c extra /etc/passwd; ls /opt/data | wc -l; cat /workspace/w "
                 "/root/r"),
              "tool\n1\n0\nw\nr\n");
  };
  check_a();
  ASSERT_EQ(client().Request("POST", SbPath(a, "/stop")).status, 200);
  check_a();
  ASSERT_TRUE(daemon().Stop()) << daemon().error();
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  check_a();
  daemon().Kill();
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  check_a();
  // The other sandbox of the same image sees the image as imported.
  EXPECT_EQ(Sh(b,
               "command -v tool || echo none; grep -c extra /etc/passwd || true; "
               "ls /opt/data; test -e /workspace/w || echo no-w; test -e /root/r || echo no-r"),
            "none\n0\nnew\nno-w\nno-r\n");
  // DELETE removes the sandbox's layer and nothing of the image.
  const std::string dir_a = daemon().SandboxDir(a);
  ASSERT_FALSE(dir_a.empty());
  EXPECT_EQ(ListDir(dir_a), (std::vector<std::string>{"config.json", "upper", "work"}));
  EXPECT_EQ(Delete(a).status, 204);
  EXPECT_EQ(ListDir(dir_a), std::vector<std::string>{});
  EXPECT_EQ(Sh(b, "ls /opt/data"), "new\n");
  EXPECT_EQ(client().Get("/v1/images/bb").status, 200);
}

// With a disk of its own, a sandbox of an image keeps its whole layer on it: a write anywhere
// in the root counts, and fails with ENOSPC when the disk is full; the layer lives through a
// restart, and the sandbox's directory holds the disk's image alone.
TEST_F(Images, ADiskOfItsOwnHoldsTheSandboxsLayer) {
  if (auto st = isolate::DiskSupport(); !st.ok()) {
    GTEST_SKIP() << "NOT RUN: this host gives no sandbox a disk: " << st.error().message();
  }
  ASSERT_EQ(Import("bb", PackTar(BuildOciLayout(TwoLayerSpec()))).status, 201);
  const std::string id = NewId();
  Response created = Create(id, R"({"image": "bb", "limits": {"diskBytes": 33554432}})");
  ASSERT_EQ(created.status, 201) << created.Describe();
  // Owner and mode of the image's root are the root's inside, as without a disk.
  EXPECT_EQ(Sh(id, "stat -c '%u %g %a' / /bin/busybox"), "0 0 755\n0 0 755\n");
  ExecResult fill = Exec(id, "dd if=/dev/zero of=/opt/fill bs=1M count=48; echo rc=$?");
  EXPECT_NE(fill.err().find("No space left on device"), std::string::npos) << fill.err();
  EXPECT_EQ(fill.out(), "rc=1\n");
  Sh(id, "rm /opt/fill; echo kept > /etc/kept; rm /opt/data/new; echo w > /workspace/w");
  ASSERT_TRUE(daemon().Stop()) << daemon().error();
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  EXPECT_EQ(Sh(id, "cat /etc/kept /workspace/w; ls /opt/data | wc -l"), "kept\nw\n0\n");
  EXPECT_EQ(ListDir(daemon().SandboxDir(id)),
            (std::vector<std::string>{"config.json", "disk.ext4"}));
}

TEST_F(Images, DockerSaveAndRootfsTarballsImportToo) {
  ImageSpec spec = TwoLayerSpec();
  Response docker = Import("docker", PackTar(BuildDockerSave(spec)));
  ASSERT_EQ(docker.status, 201) << docker.Describe();
  EXPECT_EQ(Str(Obj(docker), "format"), "docker");
  std::vector<TarEntry> root = BusyboxRootfs();
  root.push_back(File("etc/flavour", "rootfs\n"));
  Response rootfs = Import("plain", MakeTar(root, Compression::kGzip));
  ASSERT_EQ(rootfs.status, 201) << rootfs.Describe();
  EXPECT_EQ(Str(Obj(rootfs), "format"), "rootfs");
  const std::string d = NewId("d"), p = NewId("p");
  ASSERT_EQ(Create(d, R"({"image": "docker"})").status, 201);
  ASSERT_EQ(Create(p, R"({"image": "plain"})").status, 201);
  EXPECT_EQ(Sh(d, "ls /opt/data; echo $GREETING"), "new\nfrom-the-image\n");
  EXPECT_EQ(Sh(p, "cat /etc/flavour; pwd"), "rootfs\n/workspace\n");

  Response list = client().Get("/v1/images");
  ASSERT_EQ(list.status, 200);
  std::vector<std::string> names;
  for (const auto& v : Arr(list, "images")) names.push_back(Str(v.as_object(), "name"));
  EXPECT_EQ(names, (std::vector<std::string>{"docker", "plain"}));
  json::object plain = Obj(client().Get("/v1/images/plain"));
  ASSERT_TRUE(Field(plain, "usedBy").is_array());
  EXPECT_EQ(Field(plain, "usedBy").as_array().size(), 1u);
}

TEST_F(Images, ReplaceKeepsOldSandboxesOnTheOldRootAndRemoveWaitsForThem) {
  std::vector<TarEntry> v1 = BusyboxRootfs(), v2 = BusyboxRootfs();
  v1.push_back(File("version", "1\n"));
  v2.push_back(File("version", "2\n"));
  ASSERT_EQ(Import("app", MakeTar(v1)).status, 201);
  Response taken = Import("app", MakeTar(v2));
  EXPECT_EQ(taken.status, 409) << taken.Describe();
  EXPECT_EQ(taken.ErrorCode(), "image_exists");
  const std::string old_box = NewId("old");
  ASSERT_EQ(Create(old_box, R"({"image": "app"})").status, 201);
  Response replaced = Import("app", MakeTar(v2), "?replace=1");
  ASSERT_EQ(replaced.status, 200) << replaced.Describe();
  const std::string new_box = NewId("new");
  ASSERT_EQ(Create(new_box, R"({"image": "app"})").status, 201);
  EXPECT_EQ(Sh(old_box, "cat /version"), "1\n");
  EXPECT_EQ(Sh(new_box, "cat /version"), "2\n");
  EXPECT_EQ(LiveContent(ImagesDir()).size(), 2u);

  Response refused = client().Delete("/v1/images/app");
  EXPECT_EQ(refused.status, 409) << refused.Describe();
  EXPECT_EQ(refused.ErrorCode(), "image_in_use");
  EXPECT_NE(refused.ErrorMessage().find(old_box), std::string::npos) << refused.ErrorMessage();
  // The old content goes with its last sandbox; the name's with the name.
  EXPECT_EQ(Delete(old_box).status, 204);
  EXPECT_EQ(LiveContent(ImagesDir()).size(), 1u);
  EXPECT_EQ(Delete(new_box).status, 204);
  EXPECT_EQ(client().Delete("/v1/images/app").status, 204);
  EXPECT_EQ(client().Get("/v1/images/app").status, 404);
  EXPECT_EQ(LiveContent(ImagesDir()), std::vector<std::string>{});
  EXPECT_TRUE(BecomesEmpty(ImagesDir() + "/content", milliseconds(30000)))
      << "left in content/: " << ListDir(ImagesDir() + "/content").size();
  EXPECT_EQ(ListDir(ImagesDir()), std::vector<std::string>{"content"});
}

TEST_F(Images, BadInputIsRefusedClearlyAndLeavesNothing) {
  struct Case {
    std::string what;
    std::string body;
    std::string needle;  // in the message
  };
  ImageFiles missing = BuildOciLayout(TwoLayerSpec());
  missing.Erase(missing.layer_paths[1]);
  // A flipped byte: in a file of an uncompressed layer (a valid tar, a wrong digest), and in a
  // gzip-compressed one (the stream breaks before its digest can be checked).
  ImageSpec plain_layers = TwoLayerSpec();
  plain_layers.layer_compression = Compression::kNone;
  ImageFiles corrupt = BuildOciLayout(plain_layers);
  std::string& layer = corrupt.Find(corrupt.layer_paths[1]);
  layer[layer.find("new\n")] = 'N';
  ImageFiles broken = BuildOciLayout(TwoLayerSpec());
  broken.Find(broken.layer_paths[0])[100] ^= 0x5a;
  const std::string whole = PackTar(BuildOciLayout(TwoLayerSpec()));
  // A gzip root file system tarball whose trailer's CRC-32 is wrong: its deflate data is whole,
  // which libarchive alone takes for good.
  std::string bad_crc = MakeTar(BusyboxRootfs(), Compression::kGzip);
  bad_crc[bad_crc.size() - 8] ^= 0x5a;
  const std::string canary = daemon().dir() + "/canary";
  ASSERT_EQ(::mkdir(canary.c_str(), 0755), 0);
  const std::vector<Case> cases = {
      {"random bytes", std::string(4096, '\x17'), "tar"},
      {"a truncated archive", whole.substr(0, whole.size() / 2), ""},
      {"a missing layer", PackTar(missing), missing.layer_digests[1].substr(7, 12)},
      {"a layer whose digest does not match", PackTar(corrupt), "digest"},
      {"a corrupt compressed layer", PackTar(broken), broken.layer_digests[0]},
      {"a .. entry", MakeTar({Dir("bin"), File("../evil", "x")}), ".."},
      // A message quoting a name that is not UTF-8 is still JSON (the harness's parser
      // refuses invalid UTF-8): the name is quoted with its bytes escaped.
      {"a .. entry in a name that is not UTF-8", MakeTar({File("bad\xff/../x", "x")}),
       "'bad\\xff/../x'"},
      {"a gzip tarball with a wrong CRC-32", bad_crc, "incorrect data check"},
      {"a /dev that is a symlink", MakeTar({Dir("bin"), Symlink("dev", "/tmp")}),
       "the image's /dev is a symlink"},
      {"a /tmp that is a file", MakeTar({Dir("bin"), File("tmp", "x")}),
       "the image's /tmp is not a directory"},
      {"a name longer than 255 bytes", MakeTar({File(std::string(300, 'a'), "x")}),
       "its path has a component of 300 bytes, more than the 255 of a Linux file name"},
      {"a write through a symlink", MakeTar({Symlink("escape", canary), File("escape/owned", "x")}),
       "escape"},
  };
  for (const auto& c : cases) {
    Response r = Import("bad", c.body);
    EXPECT_EQ(r.status, 400) << c.what << ": " << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "invalid_image") << c.what;
    EXPECT_NE(r.ErrorMessage().find(c.needle), std::string::npos)
        << c.what << ": " << r.ErrorMessage();
    // The client sent a body: the daemon's spool file is never named.
    EXPECT_EQ(r.ErrorMessage().find(".import-upload-"), std::string::npos) << r.ErrorMessage();
    EXPECT_EQ(client().Get("/v1/images/bad").status, 404) << c.what;
    EXPECT_EQ(Leftovers(), std::vector<std::string>{}) << c.what;
  }
  EXPECT_EQ(ListDir(canary), std::vector<std::string>{});
  EXPECT_EQ(LiveContent(ImagesDir()), std::vector<std::string>{});

  Response bad_name = Import("Bad:Name", MakeTar(BusyboxRootfs()));
  EXPECT_EQ(bad_name.status, 400) << bad_name.Describe();
  EXPECT_EQ(bad_name.ErrorCode(), "invalid_request");
  Response empty = Import("empty", "");
  EXPECT_EQ(empty.status, 400) << empty.Describe();
  Response unknown = client().Request("PUT", SbPath(NewId()), R"({"image": "nope"})");
  EXPECT_EQ(unknown.status, 404) << unknown.Describe();
  EXPECT_EQ(unknown.ErrorCode(), "image_not_found");
  EXPECT_EQ(client().Request("PATCH", "/v1/images/x").status, 405);
}

// What of an image's config its sandboxes will not use, or that will fail their commands, is
// said at the import: an Env entry that is not NAME=VALUE, a relative WorkingDir (both ignored),
// a WorkingDir the image does not have (every command would fail to start there).
TEST_F(Images, ConfigEntriesThatCannotServeAreWarnedAbout) {
  auto warnings_of = [&](const ImageSpec& spec, const std::string& name) {
    Response r = Import(name, PackTar(BuildOciLayout(spec)));
    EXPECT_EQ(r.status, 201) << r.Describe();
    std::string all;
    if (r.status != 201) return all;
    const json::object image = Obj(r);
    for (const auto& w : image.at("warnings").as_array()) all += std::string(w.as_string()) + "\n";
    return all;
  };
  ImageSpec spec = TwoLayerSpec();
  spec.env = {"GOOD=1", "BAD", "=v"};
  spec.working_dir = "/does/not/exist";
  EXPECT_EQ(warnings_of(spec, "odd-config"),
            "the config's WorkingDir '/does/not/exist' is not a directory of the image: a command "
            "of its sandboxes fails unless it is given another cwd\n"
            "the config's Env entry 'BAD' is not NAME=VALUE: ignored\n"
            "the config's Env entry '=v' is not NAME=VALUE: ignored\n");
  spec.env = {"GOOD=1"};
  spec.working_dir = "srv";
  EXPECT_EQ(warnings_of(spec, "relative-workdir"),
            "the config's WorkingDir 'srv' is not absolute: ignored, sandboxes start in "
            "/workspace\n");
}

TEST_F(Images, ProgressStreamsAsNdjson) {
  NdjsonStream stream(daemon().endpoint(), "POST", "/v1/images/streamed",
                      PackTar(BuildOciLayout(TwoLayerSpec())), milliseconds(60000));
  ASSERT_EQ(stream.status(), 200) << stream.error();
  auto events = stream.ReadAll(milliseconds(60000));
  ASSERT_FALSE(events.empty());
  bool saw_layer_two = false;
  for (const auto& e : events) {
    if (Str(e, "type") == "progress" && Str(e, "phase") == "layer" &&
        Field(e, "layer").as_int64() == 2 && Field(e, "layers").as_int64() == 2) {
      saw_layer_two = true;
    }
  }
  EXPECT_TRUE(saw_layer_two);
  EXPECT_EQ(Str(events.back(), "type"), "image");
  EXPECT_EQ(Str(events.back().at("image").as_object(), "name"), "streamed");
}

// A gzipped docker save or OCI tarball is decompressed before its layers are read: the layers'
// progress counts against their own total, never past it (it counted decompressed bytes against
// the upload's compressed size). The last layer event of a phase reaches its total.
TEST_F(Images, ProgressOfACompressedTarballStaysWithinItsTotal) {
  ImageSpec spec = TwoLayerSpec();
  spec.layer_compression = Compression::kNone;
  NdjsonStream stream(daemon().endpoint(), "POST", "/v1/images/zipped",
                      PackTar(BuildOciLayout(spec), Compression::kGzip), milliseconds(60000));
  ASSERT_EQ(stream.status(), 200) << stream.error();
  auto events = stream.ReadAll(milliseconds(60000));
  ASSERT_FALSE(events.empty());
  int layer_events = 0;
  for (const auto& e : events) {
    if (Str(e, "type") != "progress") continue;
    EXPECT_LE(Field(e, "bytesRead").as_int64(), Field(e, "bytesTotal").as_int64())
        << json::serialize(e);
    if (Str(e, "phase") == "layer") ++layer_events;
  }
  EXPECT_GE(layer_events, 2);
  ASSERT_EQ(Str(events.back(), "type"), "image") << json::serialize(events.back());
}

// Warnings quote the archive's names, which need not be UTF-8: the image's JSON stays JSON (the
// bytes escaped, \xff), in the answer, in the list, and after a restart.
TEST_F(Images, AWarningAboutANameThatIsNotUtf8KeepsTheImageUsable) {
  std::vector<TarEntry> root = BusyboxRootfs();
  root.push_back(CharDevice("dev/null\xff", 1, 3));
  Response r = Import("oddname", MakeTar(root));
  ASSERT_EQ(r.status, 201) << r.Describe();
  const std::string want = "(first: /dev/null\\xff)";
  auto has_warning = [&](const json::object& image) {
    for (const auto& w : image.at("warnings").as_array()) {
      if (std::string(w.as_string()).find(want) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(has_warning(r.Json().as_object())) << r.Describe();
  Response list = client().Get("/v1/images");
  ASSERT_EQ(list.status, 200) << list.Describe();
  EXPECT_FALSE(list.Json().as_object().empty()) << list.Describe();
  const std::string id = NewId();
  EXPECT_EQ(client().Request("PUT", SbPath(id), R"({"image": "oddname"})").status, 201);
  daemon().Kill();
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  Client fresh(daemon().endpoint());
  Response again = fresh.Get("/v1/images/oddname");
  ASSERT_EQ(again.status, 200) << again.Describe();
  EXPECT_TRUE(has_warning(again.Json().as_object())) << again.Describe();
  EXPECT_EQ(Sh(id, "echo ok"), "ok\n");
}

TEST_F(Images, AnImportCutShortByADaemonCrashLeavesNothing) {
  // A layer big enough that the daemon is still unpacking when it is killed.
  const std::string tarball = BigRootfsTarball(32, 3);
  std::thread upload([&] {
    Client c = NewClient();
    (void)c.Request("POST", "/v1/images/crashed", tarball, {}, milliseconds(60000));
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (daemon().Log().find("image=crashed received") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  daemon().Kill();
  upload.join();
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  EXPECT_EQ(client().Get("/v1/images/crashed").status, 404);
  EXPECT_EQ(Leftovers(), std::vector<std::string>{});
  EXPECT_TRUE(BecomesEmpty(ImagesDir() + "/content", milliseconds(30000)));
}

// SIGTERM while an import unpacks: the import ends unpublished and its client is answered,
// instead of the daemon finishing the import (minutes for gigabytes) and publishing an image
// whose client saw its connection drop.
TEST_F(Images, SigtermCancelsAnImportAndAnswersItsClient) {
  const std::string tarball = BigRootfsTarball(64, 4);
  Response answer;
  std::thread upload([&] {
    Client c = NewClient();
    answer = c.Request("POST", "/v1/images/stopped", tarball, {}, milliseconds(60000));
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (daemon().Log().find("image=stopped received") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_TRUE(daemon().Stop(milliseconds(10000))) << daemon().error();
  upload.join();
  EXPECT_EQ(answer.status, 500) << answer.Describe();
  EXPECT_NE(answer.ErrorMessage().find("cancelled: the daemon is stopping"), std::string::npos)
      << answer.Describe();
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  EXPECT_EQ(client().Get("/v1/images/stopped").status, 404);
  EXPECT_EQ(Leftovers(), std::vector<std::string>{});
  EXPECT_TRUE(BecomesEmpty(ImagesDir() + "/content", milliseconds(30000)));
}

TEST_F(Images, TheCliImportsALayoutDirectoryListsAndRemoves) {
  const std::string layout = daemon().dir() + "/layout";
  WriteLayoutDir(BuildOciLayout(TwoLayerSpec()), layout);
  const std::string nsbox = kNsboxBin;
  const std::string sock = daemon().socket_path();
  std::string out;
  int rc = RunProgram({nsbox, "--socket", sock, "image", "import", "fromdir", layout},
                      daemon().dir() + "/cli.log", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("fromdir imported: oci, 2 layers"), std::string::npos) << out;
  rc = RunProgram({nsbox, "--socket", sock, "image", "import", "fromdir", layout},
                  daemon().dir() + "/cli.log", &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("exists already"), std::string::npos) << out;
  rc = RunProgram({nsbox, "--socket", sock, "image", "ls"}, daemon().dir() + "/cli.log", &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("fromdir"), std::string::npos) << out;
  EXPECT_NE(out.find("host"), std::string::npos) << out;
  rc = RunProgram({nsbox, "--socket", sock, "create", "cli-box", "--image", "fromdir"},
                  daemon().dir() + "/cli.log", &out);
  EXPECT_EQ(rc, 0) << out;
  rc = RunProgram({nsbox, "--socket", sock, "exec", "cli-box", "--", "cat /opt/data/new"},
                  daemon().dir() + "/cli.log", &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "new\n");
  rc = RunProgram({nsbox, "--socket", sock, "image", "rm", "fromdir"}, daemon().dir() + "/cli.log",
                  &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("image 'fromdir' is used by 1 sandbox (cli-box)"), std::string::npos) << out;
  EXPECT_EQ(Delete("cli-box").status, 204);
  rc = RunProgram({nsbox, "--socket", sock, "image", "rm", "fromdir"}, daemon().dir() + "/cli.log",
                  &out);
  EXPECT_EQ(rc, 0) << out;
}

}  // namespace
}  // namespace nsbox::e2e

// The adversarial tier's cases on how an image is read (issue 53, items 2, 4, 5, 6, 7): hostile
// tarballs written byte by byte (tests/common/raw_tar.h), uploaded to the real daemon and
// imported with the real CLI. Each refusal has its control, the honest form of the same member,
// imported as it should be.

#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <zlib.h>

#include <string>
#include <vector>

#include "tests/adversarial/fixture.h"
#include "tests/common/image_builder.h"
#include "tests/common/raw_tar.h"

namespace nsbox::adversarial {
namespace {

namespace raw_tar = testutil::raw_tar;
using std::chrono::milliseconds;
using testutil::BusyboxRootfs;
using testutil::CharDevice;
using testutil::Compression;
using testutil::HaveBusybox;
using testutil::MakeTar;

constexpr milliseconds kImportTimeout(120000);
// Root inside a sandbox is this host uid (isolate/idmap.h, the default range).
constexpr uint32_t kUidBase = 1610612736;

class ImageReadTest : public AdversarialTest {
 protected:
  Response Import(const std::string& name, const std::string& tar) {
    return Call("POST", "/v1/images/" + name, tar, {{"Content-Type", "application/x-tar"}},
                kImportTimeout);
  }
  // The imported image's root on the host.
  std::string Rootfs(const Response& imported) {
    return daemon().state_dir() + "/images/content/" + Str(Obj(imported), "id") + "/rootfs";
  }
  // `nsbox image import NAME FILE` with the tar in a file: its exit code and all it printed.
  int CliImport(const std::string& name, const std::string& tar, std::string* output) {
    const std::string file = daemon().dir() + "/" + name + ".tar";
    testutil::WriteFileOrDie(file, tar);
    const int rc = e2e::RunProgram(
        {NSBOX_BIN, "--socket", daemon().socket_path(), "image", "import", name, file},
        daemon().dir() + "/cli.log", output);
    ::unlink(file.c_str());
    return rc;
  }
  void Delete(const std::string& name) {
    EXPECT_EQ(Call("DELETE", "/v1/images/" + name).status, 204) << name;
  }
};

// gzip, written as it is made: the issue's tarball holds 600 MB of names in 0.9 MB.
class Gzip {
 public:
  Gzip() { deflateInit2(&z_, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY); }
  ~Gzip() { deflateEnd(&z_); }
  void Add(const std::string& data) { Run(data, Z_NO_FLUSH); }
  std::string Finish() {
    Run("", Z_FINISH);
    return std::move(out_);
  }

 private:
  void Run(const std::string& data, int flush) {
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    z_.avail_in = static_cast<uInt>(data.size());
    unsigned char buf[65536];
    do {
      z_.next_out = buf;
      z_.avail_out = sizeof buf;
      deflate(&z_, flush);
      out_.append(reinterpret_cast<char*>(buf), sizeof buf - z_.avail_out);
    } while (z_.avail_out == 0 || (flush == Z_FINISH && z_.avail_in > 0));
  }
  z_stream z_{};
  std::string out_;
};

// The issue's tarball: 3,000 empty members, each with a pax path of `name_bytes` bytes.
std::string ManyNames(size_t name_bytes) {
  Gzip gz;
  gz.Add(raw_tar::Header("bin/", 0, '5') + raw_tar::File("bin/sh", "#!x\n"));
  for (int i = 0; i < 3000; ++i) {
    char dir[16];
    std::snprintf(dir, sizeof dir, "d%05d/", i);
    const std::string path = std::string(dir) + std::string(name_bytes - 7, 'a');
    gz.Add(raw_tar::Pax({raw_tar::Record("path", path)}) +
           raw_tar::File("x" + std::to_string(i), ""));
  }
  gz.Add(raw_tar::kEnd);
  return gz.Finish();
}

// Item 2: names were kept in the daemon's memory without a bound (each import of this 0.9 MB
// tarball added 576 MiB, kept after its 400). Now the first name past 4,095 bytes is refused as
// it is read, and the daemon stays its size. Control: the same 3,000 members with 200-byte names
// are imported, and the memory of that import is given back too.
TEST_F(ImageReadTest, HugeNamesCostTheDaemonNoMemory) {
  const std::string hostile = ManyNames(200000);
  ASSERT_LT(hostile.size(), 2u << 20);
  const long before = RssKib(daemon().pid());
  ASSERT_GT(before, 0);
  for (int i = 0; i < 3; ++i) {
    Response r = Import("adv-names", hostile);
    EXPECT_EQ(r.status, 400) << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "invalid_image");
    EXPECT_NE(r.ErrorMessage().find("'... (200000 bytes): its path has 200000 bytes, more than "
                                    "the 4095 of a Linux path"),
              std::string::npos)
        << r.ErrorMessage().substr(0, 600);
  }
  const long after = RssKib(daemon().pid());
  EXPECT_LT(after - before, 32 * 1024)
      << "RSS " << before << " KiB before, " << after << " KiB after three hostile imports";

  Response ok = Import("adv-names-ok", ManyNames(200));
  ASSERT_EQ(ok.status, 201) << ok.Describe();
  EXPECT_EQ(Field(Obj(ok), "files"), json::value(3002));
  struct stat st {};
  EXPECT_EQ(::stat((Rootfs(ok) + "/d02999/" + std::string(193, 'a')).c_str(), &st), 0);
  const long after_ok = RssKib(daemon().pid());
  EXPECT_LT(after_ok - before, 32 * 1024) << "RSS " << after_ok << " KiB after the control";
  Delete("adv-names-ok");
}

// Item 4: a member whose ustar header says etc/ustar-name and whose pax path is a 1,000,032-byte
// name was written as etc/ustar-name (libarchive drops a pax record over 1 MB with a warning; GNU
// tar and Python read the pax name). Refused now, naming the pax header, as are a global header
// that renames every member for GNU tar and Python but not for libarchive, and a member named
// both by a GNU long name and a pax path. Control: the pax name wins over the ustar name.
TEST_F(ImageReadTest, MembersAreNamedAsOtherTarReadersNameThem) {
  const std::string sh = raw_tar::Header("bin/", 0, '5') + raw_tar::File("bin/sh", "#!x\n");
  std::string long_name = "usr/share/doc/";
  while (long_name.size() < 1000032) long_name += std::string(250, 'n') + "/";
  long_name.resize(1000032);
  struct Case {
    const char* name;
    std::string tar;
    const char* error;
  };
  for (const Case& c : {
           Case{"adv-paxname",
                raw_tar::Pax({raw_tar::Record("path", long_name)}) +
                    raw_tar::File("etc/ustar-name", "reviewed elsewhere\n"),
                "a pax header of 1000046 bytes, more than the 262144 nsbox reads"},
           Case{"adv-global",
                raw_tar::Special('g', raw_tar::Record("path", "etc/global-name"), "GlobalHead") +
                    raw_tar::File("etc/ustar-name"),
                "a global pax header sets 'path'"},
           Case{"adv-twonames",
                raw_tar::Special('L', std::string("etc/long-name") + '\0', "././@LongLink") +
                    raw_tar::Pax({raw_tar::Record("path", "etc/pax-name")}) +
                    raw_tar::File("etc/ustar-name"),
                "a pax header and a GNU long name for one member"},
       }) {
    SCOPED_TRACE(c.name);
    Response r = Import(c.name, sh + c.tar + raw_tar::kEnd);
    EXPECT_EQ(r.status, 400) << r.Describe();
    EXPECT_EQ(r.ErrorCode(), "invalid_image");
    EXPECT_NE(r.ErrorMessage().find(c.error), std::string::npos) << r.ErrorMessage();
    EXPECT_EQ(Call("GET", std::string("/v1/images/") + c.name).status, 404);
  }
  Response ok =
      Import("adv-paxname-ok",
             sh +
                 raw_tar::Pax({raw_tar::Record("path", "usr/share/doc/" + std::string(200, 'n') +
                                                           "/" + std::string(200, 'm'))}) +
                 raw_tar::File("etc/ustar-name", "pax\n") + raw_tar::kEnd);
  ASSERT_EQ(ok.status, 201) << ok.Describe();
  EXPECT_EQ(e2e::ReadHostFile(Rootfs(ok) + "/usr/share/doc/" + std::string(200, 'n') + "/" +
                              std::string(200, 'm')),
            "pax\n");
  EXPECT_NE(::access((Rootfs(ok) + "/etc/ustar-name").c_str(), F_OK), 0);
  Delete("adv-paxname-ok");
}

// Item 5: a regular file with a system.posix_acl_default xattr (a pax LIBARCHIVE.xattr. record)
// answered 500 internal (fsetxattr: EACCES); one on a directory was set with the image's ids as
// host ids. ACL xattrs are dropped with a note now, like the ACLs libarchive parses; an xattr
// past Linux's bounds is a 400 naming the member. Control: a user.* xattr is kept.
TEST_F(ImageReadTest, XattrsNsboxWillNotKeepAreNotedOrRefusedByName) {
  // A POSIX ACL xattr (version 2): user::rwx, user:1000:rwx, group::r-x, mask::rwx, other::r-x.
  std::string acl("\x02\x00\x00\x00", 4);
  auto entry = [&](uint16_t tag, uint16_t perm, uint32_t id) {
    for (int i = 0; i < 2; ++i) acl += static_cast<char>((tag >> (8 * i)) & 0xff);
    for (int i = 0; i < 2; ++i) acl += static_cast<char>((perm >> (8 * i)) & 0xff);
    for (int i = 0; i < 4; ++i) acl += static_cast<char>((id >> (8 * i)) & 0xff);
  };
  entry(0x01, 7, 0xffffffff);
  entry(0x02, 7, 1000);
  entry(0x04, 5, 0xffffffff);
  entry(0x10, 7, 0xffffffff);
  entry(0x20, 5, 0xffffffff);
  const std::string sh = raw_tar::Header("bin/", 0, '5') + raw_tar::File("bin/sh", "#!x\n");
  const std::string tar =
      sh +
      raw_tar::Pax({raw_tar::Record("SCHILY.xattr.system.posix_acl_default", acl),
                    raw_tar::Record("SCHILY.xattr.system.posix_acl_access", acl)}) +
      raw_tar::Header("srv/", 0, '5') +
      raw_tar::Pax({raw_tar::Record("SCHILY.xattr.system.posix_acl_default", acl),
                    raw_tar::Record("SCHILY.xattr.user.kept", "yes")}) +
      raw_tar::File("srv/file", "x") + raw_tar::kEnd;
  Response ok = Import("adv-acl", tar);
  ASSERT_EQ(ok.status, 201) << ok.Describe();
  bool noted = false;
  for (const json::value& w : Arr(ok, "warnings")) {
    noted |= w.as_string() == "dropped the ACLs of 2 entries (first: /srv); their modes are kept";
  }
  EXPECT_TRUE(noted) << ok.Describe();
  const std::string root = Rootfs(ok);
  char buf[256];
  for (const char* path : {"/srv", "/srv/file"}) {
    for (const char* name : {"system.posix_acl_access", "system.posix_acl_default"}) {
      EXPECT_LT(::getxattr((root + path).c_str(), name, buf, sizeof buf), 0) << path << " " << name;
    }
  }
  ASSERT_EQ(::getxattr((root + "/srv/file").c_str(), "user.kept", buf, sizeof buf), 3)
      << "control: user.* is kept";
  EXPECT_EQ(std::string(buf, 3), "yes");
  Delete("adv-acl");

  Response big = Import(
      "adv-bigxattr",
      sh + raw_tar::Pax({raw_tar::Record("SCHILY.xattr.user.big", std::string(65537, 'v'))}) +
          raw_tar::File("srv-file", "x") + raw_tar::kEnd);
  EXPECT_EQ(big.status, 400) << big.Describe();
  EXPECT_EQ(big.ErrorMessage(),
            "layer 1 (root file system tarball): entry '/srv-file': the xattr 'user.big' has 65537 "
            "bytes, more than the 65536 Linux keeps");
}

// Item 6: a device node named with ESC ] 0; ... BEL ESC [ 2 J made `nsbox image import` print
// raw escapes (retitling and clearing the user's terminal) in its note and its errors; a name
// with "\nnsbox: info: FORGED-..." added a forged line to the daemon's log. Both escaped now.
// Control: the names are shown, escaped, and a plain name as it is.
TEST_F(ImageReadTest, ControlBytesInNamesReachNoTerminalOrLog) {
  if (!HaveBusybox()) GTEST_FAIL() << "busybox-static is needed (" << testutil::kBusybox << ")";
  const std::string forged = "nsbox: info: FORGED-" + NewId("line");
  std::vector<testutil::TarEntry> root = {
      testutil::Dir("bin"), testutil::File("bin/sh", "#!x\n", 0755), testutil::Dir("dev")};
  root.push_back(CharDevice("dev/\x1b]0;PWNED\x07\x1b[2J", 1, 3));
  root.push_back(CharDevice("dev/a\n" + forged, 1, 3));
  std::string out;
  EXPECT_EQ(CliImport("adv-esc", MakeTar(root), &out), 0) << out;
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
  EXPECT_EQ(out.find('\x07'), std::string::npos) << out;
  EXPECT_NE(out.find("skipped 2 device nodes (first: /dev/\\x1b]0;PWNED\\x07\\x1b[2J)"),
            std::string::npos)
      << out;
  Delete("adv-esc");

  // Refused, named in the error: on the terminal and in the daemon's log, escaped.
  const size_t log_from = daemon().LogSize();
  std::vector<testutil::TarEntry> evil = {testutil::File("bin/sh", "#!x\n", 0755),
                                          testutil::File("a\x1b[2J\n" + forged + "\n/../b", "x")};
  EXPECT_EQ(CliImport("adv-esc-err", MakeTar(evil), &out), 1) << out;
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
  EXPECT_NE(out.find("entry 'a\\x1b[2J\\n" + forged + "\\n/../b': the path has a '..' component"),
            std::string::npos)
      << out;
  const std::string log = daemon().Log(log_from);
  EXPECT_EQ(log.find("\n" + forged), std::string::npos) << log;
  EXPECT_EQ(log.find('\x1b'), std::string::npos) << log;
  EXPECT_NE(
      log.find("import failed: layer 1 (root file system tarball): entry 'a\\x1b[2J\\n" + forged),
      std::string::npos)
      << "control: the name reached the log, escaped: " << log;

  // Control: a plain name is shown as it is.
  std::vector<testutil::TarEntry> plain = {testutil::File("bin/sh", "#!x\n", 0755),
                                           CharDevice("dev/null", 1, 3)};
  EXPECT_EQ(CliImport("adv-plain", MakeTar(plain), &out), 0) << out;
  EXPECT_NE(out.find("skipped 1 device node (first: /dev/null)"), std::string::npos) << out;
  Delete("adv-plain");
}

// Item 7: the importer kept revision-2 security.capability xattrs, which mean the same on the host
// as in a jail. Written as revision 3 now, bound to the sandboxes' root (host uid 1610612736): on
// the host the file grants nothing to whoever runs it; in a user namespace whose root is that
// uid (the jail's mapping) it grants its capability. Controls: the same file with the image's
// revision-2 capability, as the importer kept it, grants it on the host; a user namespace of
// another root gets nothing. In a sandbox the capability reads as the sandbox's own (revision 2);
// a sandbox's commands run with no_new_privs on a nosuid root, so it grants nothing there either,
// as setuid bits do not.
TEST_F(ImageReadTest, FileCapabilitiesAreBoundToTheSandboxesRoot) {
  if (!HaveBusybox()) GTEST_FAIL() << "busybox-static is needed (" << testutil::kBusybox << ")";
  auto le32 = [](uint32_t v) {
    std::string out;
    for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
    return out;
  };
  // cap_net_bind_service+ep, as `setcap` writes it on the host (revision 2).
  const std::string cap_v2 = le32(0x02000001) + le32(1u << 10) + le32(0) + le32(0) + le32(0);
  std::vector<testutil::TarEntry> root = BusyboxRootfs();
  root.push_back(testutil::File("capbin", e2e::ReadHostFile(kAttackerBin), 0755)
                     .Xattr("security.capability", cap_v2));
  Response imported = Import("adv-cap", MakeTar(root, Compression::kGzip));
  ASSERT_EQ(imported.status, 201) << imported.Describe();
  const std::string capbin = Rootfs(imported) + "/capbin";

  KeyValues cap = AttackOnHost({"getcap", capbin});
  EXPECT_EQ(Get(cap, "cap.revision"), "3");
  EXPECT_EQ(Get(cap, "cap.permitted"), "0000000000000400");
  EXPECT_EQ(Get(cap, "cap.rootid"), std::to_string(kUidBase));
  KeyValues host = AttackOnHost({"exec-as", "--netns", "65534", capbin, "bind", "80"});
  EXPECT_EQ(Get(host, "bind"), "EACCES") << "the image's capability works on the host";
  EXPECT_EQ(Get(host, "CapEff"), "0000000000000000");

  // Control: the revision-2 capability the importer used to keep grants it on the host.
  const std::string v2_copy = daemon().dir() + "/capbin-v2";
  testutil::WriteFileOrDie(v2_copy, e2e::ReadHostFile(kAttackerBin));
  ASSERT_EQ(::chmod(v2_copy.c_str(), 0755), 0);
  ASSERT_EQ(::setxattr(v2_copy.c_str(), "security.capability", cap_v2.data(), cap_v2.size(), 0), 0);
  KeyValues v2 = AttackOnHost({"exec-as", "--netns", "65534", v2_copy, "bind", "80"});
  EXPECT_EQ(Get(v2, "bind"), "0") << "control: a host-wide capability is seen";
  EXPECT_EQ(Get(v2, "CapEff"), "0000000000000400");
  ::unlink(v2_copy.c_str());

  // Bound to the jail's root: a user namespace with the jail's mapping gets it, another does not.
  KeyValues jail_ns = AttackOnHost(
      {"exec-as", "--userns", std::to_string(kUidBase), "--netns", "1000", capbin, "bind", "80"});
  EXPECT_EQ(Get(jail_ns, "bind"), "0") << "the capability does not work for the jail's root";
  EXPECT_EQ(Get(jail_ns, "CapEff"), "0000000000000400");
  KeyValues other_ns = AttackOnHost({"exec-as", "--userns", std::to_string(kUidBase + 65536),
                                     "--netns", "1000", capbin, "bind", "80"});
  EXPECT_EQ(Get(other_ns, "bind"), "EACCES");

  // In a sandbox of the image.
  const std::string id = NewSandbox("cap", R"({"image": "adv-cap"})");
  KeyValues in = ParseKeyValues(Sh(id, "/capbin getcap /capbin"));
  EXPECT_EQ(Get(in, "cap.revision"), "2") << "the sandbox reads it as its own";
  EXPECT_EQ(Get(in, "cap.permitted"), "0000000000000400");
  KeyValues run = ParseKeyValues(Sh(id, "/capbin exec-as 1000 /capbin bind 80"));
  EXPECT_EQ(Get(run, "uid"), "1000");
  EXPECT_EQ(Get(run, "bind"), "EACCES") << "no_new_privs and nosuid: no file capability applies";
  EXPECT_EQ(Call("DELETE", SbPath(id)).status, 204);
  Delete("adv-cap");
}

}  // namespace
}  // namespace nsbox::adversarial

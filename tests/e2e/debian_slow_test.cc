// The Debian image end to end (label "slow": it downloads and unpacks a distribution).
// images/debian/build-image.sh builds it with debootstrap from the host's own mirror,
// `nsbox image import` takes it through the daemon, and a sandbox made from it installs a
// package with apt-get and finds it again after a stop and a daemon restart; a second sandbox of
// the same image does not have it. Sandboxes have no network (network: "none"), so the package
// is one built here with dpkg-deb and installed from a file, as `apt-get install ./x.deb` does.
//
// NSBOX_DEBIAN_IMAGE=/path/to/debian.tar.gz skips the build and imports that tarball instead
// (for running the test again by hand; CI always builds).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kAptTimeout{180000};

// The tail of a long output, for failure messages.
std::string Tail(const std::string& s) { return s.size() > 6000 ? s.substr(s.size() - 6000) : s; }

class DebianImage : public E2eTest {};

TEST_F(DebianImage, AptGetInstallInOneSandboxPersistsAndStaysItsOwn) {
  const std::string dir = daemon().dir();
  std::string output;

  // 1. The image, from the project's own recipe.
  std::string tarball;
  if (const char* given = std::getenv("NSBOX_DEBIAN_IMAGE"); given != nullptr && *given != 0) {
    tarball = given;
  } else {
    tarball = dir + "/debian.tar.gz";
    int rc = RunProgram({"bash", std::string(NSBOX_SOURCE_DIR) + "/images/debian/build-image.sh",
                         "--output", tarball},
                        dir + "/build-image.log", &output);
    ASSERT_EQ(rc, 0) << "images/debian/build-image.sh failed:\n" << Tail(output);
  }

  // 2. Imported with the CLI, as a user would.
  int rc = RunProgram(
      {kNsboxBin, "--socket", daemon().socket_path(), "image", "import", "debian", tarball},
      dir + "/import.log", &output);
  ASSERT_EQ(rc, 0) << Tail(output);
  EXPECT_NE(output.find("debian imported: rootfs"), std::string::npos) << output;

  // 3. A small package, built here.
  const std::string pkg = dir + "/pkg";
  ASSERT_EQ(::mkdir(pkg.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((pkg + "/DEBIAN").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((pkg + "/usr").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((pkg + "/usr/bin").c_str(), 0755), 0);
  std::ofstream(pkg + "/DEBIAN/control")
      << "Package: nsbox-hello\nVersion: 1.0\nArchitecture: all\n"
         "Maintainer: nsbox tests <tests@nsbox.invalid>\nDescription: a package for a test\n";
  std::ofstream(pkg + "/usr/bin/nsbox-hello") << "#!/bin/sh\necho hello from a package\n";
  ASSERT_EQ(::chmod((pkg + "/usr/bin/nsbox-hello").c_str(), 0755), 0);
  const std::string deb = dir + "/nsbox-hello.deb";
  rc = RunProgram({"dpkg-deb", "--root-owner-group", "--build", pkg, deb}, dir + "/dpkg-deb.log",
                  &output);
  ASSERT_EQ(rc, 0) << output;
  const std::string deb_bytes = ReadHostFile(deb);
  ASSERT_FALSE(deb_bytes.empty());

  // 4. One sandbox installs it with apt-get.
  const std::string a = NewId("deb-a");
  Response created = Create(a, R"({"image": "debian"})");
  ASSERT_EQ(created.status, 201) << created.Describe();
  EXPECT_EQ(Str(Obj(created), "image"), "debian");
  EXPECT_NE(Sh(a, "cat /etc/debian_version"), "");
  ASSERT_EQ(PutFile(a, "/root/nsbox-hello.deb", deb_bytes).status, 204);
  ExecResult install = Exec(a,
                            json::object{{"command",
                                          "DEBIAN_FRONTEND=noninteractive apt-get install -y "
                                          "/root/nsbox-hello.deb"}},
                            kAptTimeout);
  ASSERT_EQ(install.exit_code(), 0) << install.out() << install.err();
  EXPECT_EQ(Sh(a, "nsbox-hello"), "hello from a package\n");

  // 5. It is still there after a stop, and after the daemon restarts.
  ASSERT_EQ(client().Request("POST", SbPath(a, "/stop")).status, 200);
  EXPECT_EQ(Sh(a, "nsbox-hello"), "hello from a package\n");
  ASSERT_TRUE(daemon().Stop()) << daemon().error();
  ASSERT_TRUE(daemon().Restart()) << daemon().error();
  client().Disconnect();
  EXPECT_EQ(Sh(a, "dpkg-query -W -f '${Status}' nsbox-hello"), "install ok installed");
  EXPECT_EQ(Sh(a, "nsbox-hello"), "hello from a package\n");

  // 6. A second sandbox of the same image has the image as it was imported.
  const std::string b = NewId("deb-b");
  ASSERT_EQ(Create(b, R"({"image": "debian"})").status, 201);
  ExecResult missing = Exec(b, "command -v nsbox-hello; dpkg-query -W nsbox-hello");
  EXPECT_NE(missing.exit_code(), 0) << missing.out();
  EXPECT_EQ(missing.out(), "");

  // 7. Deleting a sandbox leaves the image; the image goes once no sandbox uses it.
  EXPECT_EQ(Delete(a).status, 204);
  EXPECT_EQ(client().Get("/v1/images/debian").status, 200);
  EXPECT_EQ(Sh(b, "cat /etc/debian_version").empty(), false);
  Response in_use = client().Delete("/v1/images/debian");
  EXPECT_EQ(in_use.status, 409) << in_use.Describe();
  EXPECT_EQ(in_use.ErrorCode(), "image_in_use");
  EXPECT_EQ(Delete(b).status, 204);
  EXPECT_EQ(client().Delete("/v1/images/debian").status, 204);
}

}  // namespace
}  // namespace nsbox::e2e

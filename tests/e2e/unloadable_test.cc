// A PUT of an id whose directory is in the state directory but does not load (docs/daemon.md
// "State directory", docs/api/sandboxes.md): 409 sandbox_unloadable, with why, and the directory
// left as it was (issue 52: it was 500 internal with the rename of a skeleton made ahead).

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::e2e {
namespace {

class UnloadableTest : public E2eTest {};

// Two sandboxes whose config.json the daemon cannot read after a restart (one gone, one not
// JSON), their files kept: a PUT of either is refused with the reason, and refused again (the
// first refusal took nothing the second needs); the directory and its files are untouched.
// Control: a PUT of a sandbox that loaded answers 200, and a new id 201.
TEST_F(UnloadableTest, APutOfAnIdWhoseDirectoryDoesNotLoadIs409WithWhy) {
  const std::string gone = NewId("gone"), garbled = NewId("garbled"), fine = NewId("fine");
  for (const std::string& id : {gone, garbled, fine}) {
    Create(id);
    EXPECT_EQ(Sh(id, "echo precious > /workspace/p && echo ok"), "ok\n");
  }
  const std::string gone_dir = daemon().SandboxDir(gone);
  const std::string garbled_dir = daemon().SandboxDir(garbled);
  ASSERT_FALSE(gone_dir.empty());
  ASSERT_FALSE(garbled_dir.empty());
  ASSERT_TRUE(daemon().Stop()) << daemon().error();
  ASSERT_EQ(::unlink((gone_dir + "/config.json").c_str()), 0) << gone_dir;
  std::ofstream(garbled_dir + "/config.json", std::ios::trunc) << "{\"version\": 1, \"id\":";
  ASSERT_TRUE(daemon().Restart()) << daemon().error();

  struct Case {
    std::string id, dir, why;
  };
  for (const Case& c : {Case{gone, gone_dir, "it has no config.json"},
                        Case{garbled, garbled_dir, "config.json is not JSON"}}) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const Response r = client().Request("PUT", SbPath(c.id));
      EXPECT_EQ(r.status, 409) << c.id << ": " << r.Describe();
      EXPECT_EQ(r.ErrorCode(), "sandbox_unloadable") << r.Describe();
      const std::string message = r.ErrorMessage();
      EXPECT_NE(message.find("its directory " + c.dir + " exists but cannot be loaded"),
                std::string::npos)
          << message;
      EXPECT_NE(message.find(c.why), std::string::npos) << message;
      EXPECT_NE(message.find("move the directory away"), std::string::npos) << message;
      EXPECT_EQ(message.find(".spare-"), std::string::npos) << message;
      EXPECT_EQ(message.find("rename"), std::string::npos) << message;
    }
    EXPECT_EQ(ReadHostFile(c.dir + "/workspace/p"), "precious\n") << c.id;
    EXPECT_EQ(client().Get(SbPath(c.id)).status, 404) << c.id;
  }
  EXPECT_EQ(ReadHostFile(garbled_dir + "/config.json"), "{\"version\": 1, \"id\":");
  struct stat st {};
  EXPECT_NE(::stat((gone_dir + "/config.json").c_str(), &st), 0) << "a config.json was written";

  // Control: what loaded is there; a new id is made.
  EXPECT_EQ(client().Request("PUT", SbPath(fine)).status, 200);
  EXPECT_EQ(Sh(fine, "cat /workspace/p"), "precious\n");
  const Response made = client().Request("PUT", SbPath(NewId("new")));
  EXPECT_EQ(made.status, 201) << made.Describe();
  ExpectDaemonHealthy();
}

}  // namespace
}  // namespace nsbox::e2e

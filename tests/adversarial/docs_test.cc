// docs/security.md's table of cases is kept true by the suite: every adversarial case is in it,
// and it names no case that does not exist.

#include <dirent.h>

#include <regex>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "tests/e2e/daemon_harness.h"

namespace nsbox::adversarial {
namespace {

TEST(AdversarialDocs, EveryCaseIsInTheTable) {
  const std::string root = NSBOX_SOURCE_DIR;
  const std::string doc = e2e::ReadHostFile(root + "/docs/security.md");
  ASSERT_FALSE(doc.empty()) << root << "/docs/security.md";
  std::set<std::string> in_table;
  static const std::regex kRow(R"(\n\| `([A-Za-z]+Test\.[A-Za-z0-9]+)` \|)");
  for (std::sregex_iterator it(doc.begin(), doc.end(), kRow), end; it != end; ++it) {
    in_table.insert((*it)[1]);
  }
  std::set<std::string> cases;
  const std::string dir = root + "/tests/adversarial";
  DIR* d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr) << dir;
  static const std::regex kCase(R"(\nTEST_F\(([A-Za-z]+), ([A-Za-z0-9]+)\))");
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() < 8 || name.substr(name.size() - 8) != "_test.cc") continue;
    const std::string text = e2e::ReadHostFile(dir + "/" + name);
    for (std::sregex_iterator it(text.begin(), text.end(), kCase), end; it != end; ++it) {
      cases.insert(std::string((*it)[1]) + "." + std::string((*it)[2]));
    }
  }
  closedir(d);
  EXPECT_GE(cases.size(), 60u);
  for (const auto& c : cases) EXPECT_EQ(in_table.count(c), 1u) << c << " is not in the table";
  for (const auto& t : in_table) EXPECT_EQ(cases.count(t), 1u) << t << " is not a case";
}

}  // namespace
}  // namespace nsbox::adversarial

// The version is written in one place, CMakeLists.txt's project(VERSION): runtime/version.h is
// made from it (what `nsbox --version` and GET /v1/health report), and the TypeScript client's
// package.json, which npm needs as a literal of its own, must say the same.

#include "runtime/version.h"

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <boost/json.hpp>

namespace nsbox {
namespace {

namespace json = boost::json;

std::string ReadSource(const std::string& relative) {
  std::ifstream in(std::string(NSBOX_SOURCE_DIR) + "/" + relative);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The "version" member of a JSON object, "<missing>" when it has none.
std::string VersionOf(const json::value& v) {
  const json::object* o = v.if_object();
  const json::value* version = o != nullptr ? o->if_contains("version") : nullptr;
  return version != nullptr && version->is_string() ? std::string(version->as_string())
                                                    : "<missing>";
}

TEST(Version, IsTheProjectVersionOfCMakeLists) {
  const std::string cmake = ReadSource("CMakeLists.txt");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(cmake, m, std::regex(R"(project\(nsbox VERSION ([0-9.]+))")))
      << "no project(nsbox VERSION ...) in CMakeLists.txt";
  EXPECT_EQ(m[1].str(), runtime::kVersion);
  EXPECT_TRUE(std::regex_match(std::string(runtime::kVersion), std::regex(R"(\d+\.\d+\.\d+)")))
      << runtime::kVersion;
}

TEST(Version, TheTypeScriptClientsPackageSaysTheSame) {
  const std::string package = ReadSource("clients/typescript/package.json");
  ASSERT_FALSE(package.empty()) << "clients/typescript/package.json not read";
  boost::system::error_code ec;
  json::value parsed = json::parse(package, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(VersionOf(parsed), runtime::kVersion)
      << "clients/typescript/package.json's version is not CMakeLists.txt's project(VERSION)";

  // The lock file repeats the package's version: at its top and in its root package ("").
  const std::string lock = ReadSource("clients/typescript/package-lock.json");
  ASSERT_FALSE(lock.empty()) << "clients/typescript/package-lock.json not read";
  json::value locked = json::parse(lock, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(VersionOf(locked), runtime::kVersion);
  const json::object* packages = locked.is_object() && locked.as_object().if_contains("packages")
                                     ? locked.as_object().at("packages").if_object()
                                     : nullptr;
  ASSERT_NE(packages, nullptr) << "no \"packages\" in package-lock.json";
  ASSERT_TRUE(packages->contains("")) << "no root package in package-lock.json";
  EXPECT_EQ(VersionOf(packages->at("")), runtime::kVersion);
}

}  // namespace
}  // namespace nsbox

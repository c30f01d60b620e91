// runtime/api/routes.inc against docs/api.md's "Every endpoint" table: each route of the daemon
// is documented there, and each endpoint documented there is a route (method and path, "any"
// being the table's "*").

#include "runtime/api/route_table.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace nsbox::runtime::api {
namespace {

using Endpoint = std::pair<std::string, std::string>;  // method, path

// The rows of api.md's "Every endpoint" table: "| `GET` | `/v1/health` | ..." and
// "| any | `/v1/...` | ...".
std::set<Endpoint> DocumentedEndpoints() {
  std::ifstream in(std::string(NSBOX_SOURCE_DIR) + "/docs/api.md");
  EXPECT_TRUE(in.is_open()) << NSBOX_SOURCE_DIR "/docs/api.md";
  std::set<Endpoint> out;
  std::string line;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (line.starts_with("## ")) in_section = line == "## Every endpoint";
    if (!in_section || !line.starts_with("| ")) continue;
    std::vector<std::string> cells;
    std::stringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) {
      const size_t a = cell.find_first_not_of(' ');
      const size_t b = cell.find_last_not_of(' ');
      cells.push_back(a == std::string::npos ? "" : cell.substr(a, b - a + 1));
    }
    if (cells.size() < 2 || !cells[1].starts_with("`/")) continue;  // the head, its rule
    auto unquote = [](const std::string& s) {
      return s.size() >= 2 && s.front() == '`' && s.back() == '`' ? s.substr(1, s.size() - 2) : s;
    };
    const std::string method = cells[0] == "any" ? "*" : unquote(cells[0]);
    out.emplace(method, unquote(cells[1]));
  }
  return out;
}

std::set<Endpoint> Routes() {
  std::set<Endpoint> out;
  for (const RouteSpec& r : ApiRoutes()) out.emplace(r.method, r.pattern);
  return out;
}

TEST(RouteTable, EveryRouteIsInApiMdsTable) {
  const std::set<Endpoint> documented = DocumentedEndpoints();
  ASSERT_FALSE(documented.empty());
  for (const Endpoint& r : Routes()) {
    EXPECT_TRUE(documented.contains(r))
        << r.first << " " << r.second << " is a route (runtime/api/routes.inc) that docs/api.md's "
        << "\"Every endpoint\" table does not have";
  }
}

TEST(RouteTable, EveryEndpointOfApiMdIsARoute) {
  const std::set<Endpoint> routes = Routes();
  for (const Endpoint& d : DocumentedEndpoints()) {
    EXPECT_TRUE(routes.contains(d))
        << d.first << " " << d.second << " is in docs/api.md's \"Every endpoint\" table but not a "
        << "route (runtime/api/routes.inc)";
  }
}

TEST(RouteTable, NoRouteTwice) { EXPECT_EQ(Routes().size(), ApiRoutes().size()); }

std::vector<std::string> Segs(std::initializer_list<const char*> s) { return {s.begin(), s.end()}; }

TEST(RouteTable, PatternsMatchWholeSegments) {
  EXPECT_TRUE(MatchesPattern("/v1/sandboxes/{id}", Segs({"v1", "sandboxes", "a"})));
  EXPECT_TRUE(MatchesPattern("/v1/sandboxes/{id}", Segs({"v1", "sandboxes", ""})));
  EXPECT_FALSE(MatchesPattern("/v1/sandboxes/{id}", Segs({"v1", "sandboxes"})));
  EXPECT_FALSE(MatchesPattern("/v1/sandboxes/{id}", Segs({"v1", "sandboxes", "a", ""})));
  EXPECT_FALSE(MatchesPattern("/v1/sandboxes", Segs({"v1", "sandboxesx"})));
  // {rest}: none or more segments.
  const char* proxy = "/v1/sandboxes/{id}/ports/{port}/http/{rest}";
  EXPECT_TRUE(MatchesPattern(proxy, Segs({"v1", "sandboxes", "a", "ports", "80", "http"})));
  EXPECT_TRUE(
      MatchesPattern(proxy, Segs({"v1", "sandboxes", "a", "ports", "80", "http", "x", "y"})));
  EXPECT_FALSE(MatchesPattern(proxy, Segs({"v1", "sandboxes", "a", "ports", "80", "https"})));
  EXPECT_EQ(PatternParam("/v1/sandboxes/{id}/execs/{execId}/output",
                         Segs({"v1", "sandboxes", "a", "execs", "e1", "output"}), "execId"),
            "e1");
}

}  // namespace
}  // namespace nsbox::runtime::api

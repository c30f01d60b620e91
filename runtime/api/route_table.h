#pragma once

// nsboxd's API as a table (docs/api.md "Every endpoint"): each endpoint is one line of
// runtime/api/routes.inc, its method, its path pattern and its handler. This header gives the
// table as plain data, without Boost, for the unit test that holds it and api.md to each other;
// the daemon's router (routes.cc) reads the same lines with their handlers.

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nsbox::runtime::api {

// What a route needs found before its handler runs.
enum class RouteNeeds {
  kNothing,
  kImageName,   // {name} is a valid image name
  kId,          // {id} is a valid sandbox id
  kEntry,       // ... and the sandbox exists
  kEntryInUse,  // ... and what runs in it is in use until the answer ends (SandboxUse)
};

// One endpoint: its method ("*": any), and its path, whose segments are literal or "{name}",
// which captures one segment (an empty one too); a last segment "{rest}" captures what remains,
// none or more segments.
struct RouteSpec {
  std::string_view method;
  std::string_view pattern;
  RouteNeeds needs;
};

// Every endpoint, in the table's order: for one path, the order of its methods is the order of
// a 405's Allow.
std::span<const RouteSpec> ApiRoutes();

// Whether the request's path, split at '/' and each segment percent-decoded (the leading '/'
// gives no segment), is one of `pattern`'s.
bool MatchesPattern(std::string_view pattern, const std::vector<std::string>& segs);

// The segment that `pattern`'s "{name}" captured from `segs` (which match it); "" when the
// pattern has no such segment.
std::string_view PatternParam(std::string_view pattern, const std::vector<std::string>& segs,
                              std::string_view name);

}  // namespace nsbox::runtime::api

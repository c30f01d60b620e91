// nsboxd's API as plain data (route_table.h), and how a path matches a pattern.

#include "runtime/api/route_table.h"

namespace nsbox::runtime::api {

namespace {

constexpr RouteSpec kRoutes[] = {
#define NSBOX_ROUTE(method, pattern, handler, needs) {method, pattern, RouteNeeds::needs},
#include "runtime/api/routes.inc"
#undef NSBOX_ROUTE
};

// Calls `fn(segment)` for each of `pattern`'s segments, in order.
template <typename Fn>
void ForEachPatternSegment(std::string_view pattern, Fn&& fn) {
  size_t pos = 1;  // after the leading '/'
  for (;;) {
    const size_t slash = pattern.find('/', pos);
    fn(pattern.substr(pos, slash == std::string_view::npos ? std::string_view::npos : slash - pos));
    if (slash == std::string_view::npos) return;
    pos = slash + 1;
  }
}

bool IsCapture(std::string_view seg) {
  return seg.size() >= 2 && seg.front() == '{' && seg.back() == '}';
}

}  // namespace

std::span<const RouteSpec> ApiRoutes() { return kRoutes; }

bool MatchesPattern(std::string_view pattern, const std::vector<std::string>& segs) {
  size_t i = 0;
  bool ok = true;
  bool rest = false;
  ForEachPatternSegment(pattern, [&](std::string_view seg) {
    if (!ok || rest) return;
    if (seg == "{rest}") {
      rest = true;
      return;
    }
    if (i >= segs.size() || (!IsCapture(seg) && segs[i] != seg)) {
      ok = false;
      return;
    }
    ++i;
  });
  return ok && (rest || i == segs.size());
}

std::string_view PatternParam(std::string_view pattern, const std::vector<std::string>& segs,
                              std::string_view name) {
  size_t i = 0;
  std::string_view found;
  ForEachPatternSegment(pattern, [&](std::string_view seg) {
    if (found.empty() && i < segs.size() && IsCapture(seg) &&
        seg.substr(1, seg.size() - 2) == name) {
      found = segs[i];
    }
    ++i;
  });
  return found;
}

}  // namespace nsbox::runtime::api

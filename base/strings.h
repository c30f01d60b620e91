#pragma once

#include <string_view>
#include <vector>

namespace nsbox {

// The pieces of `s` between each `sep`, empty ones included ("a,,b" gives "a", "", "b"; "" gives
// one empty piece). The views point into `s`.
std::vector<std::string_view> Split(std::string_view s, char sep);

}  // namespace nsbox

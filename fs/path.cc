#include "fs/path.h"

#include <vector>

namespace nsbox::fs {

std::string ResolvePath(std::string_view base, std::string_view path) {
  std::vector<std::string_view> parts;
  auto fold = [&parts](std::string_view p) {
    size_t i = 0;
    while (i <= p.size()) {
      size_t j = p.find('/', i);
      if (j == std::string_view::npos) j = p.size();
      std::string_view comp = p.substr(i, j - i);
      if (comp == "..") {
        if (!parts.empty()) parts.pop_back();
      } else if (!comp.empty() && comp != ".") {
        parts.push_back(comp);
      }
      i = j + 1;
    }
  };
  if (path.empty() || path[0] != '/') fold(base);
  fold(path);
  std::string out;
  for (auto comp : parts) {
    out += '/';
    out += comp;
  }
  return out.empty() ? "/" : out;
}

}  // namespace nsbox::fs

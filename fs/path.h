#pragma once

#include <string>
#include <string_view>

namespace nsbox::fs {

// Resolves `path` against `base` and folds "." and ".." lexically, exactly as Node's
// path.posix.resolve(base, path) does (api.md, "Paths"): an absolute path ignores base, ".."
// never climbs above "/", and the result has no trailing slash (except "/" itself).
// `base` must be absolute.
std::string ResolvePath(std::string_view base, std::string_view path);

}  // namespace nsbox::fs

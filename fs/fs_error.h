#pragma once

// Node-shaped errors for the file verbs (fs/file_ops.h) and the checks every path gets before a
// syscall. Internal to fs/.

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "fs/file_ops.h"

namespace nsbox::fs {

// Node's (libuv's) code and lowercase description for `err`: {"ENOENT", "no such file or
// directory"}. An errno libuv does not map (EDQUOT, ESTALE, ...) gets glibc's name and its
// description in lower case, where Node would say "Unknown system error -122".
std::pair<std::string, std::string> NodeErrno(int err);

// FsError{err, syscall, path, "<CODE>: <description>, <syscall> '<path>'"}.
FsError MakeFsError(int err, std::string_view syscall, std::string_view path);

// The bad-input checks of api.md "Paths", before any syscall: a NUL byte is EINVAL, a path of
// PATH_MAX bytes or more is ENAMETOOLONG. `syscall` names the verb's first syscall.
std::optional<FsError> CheckPath(const std::string& path, std::string_view syscall);

// "/a/b" -> {"/a", "b"}; "/a" -> {"/", "a"}; "/" -> {"/", ""}.
std::pair<std::string, std::string> SplitParent(const std::string& path);

// "/a" + "b" -> "/a/b"; "/" + "b" -> "/b".
std::string JoinPath(std::string_view dir, std::string_view name);

}  // namespace nsbox::fs

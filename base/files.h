#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "base/error.h"
#include "base/unique_fd.h"

namespace nsbox {

// open(2) relative to `dirfd` (AT_FDCWD for a plain path), O_CLOEXEC always added.
Result<UniqueFd> OpenAt(int dirfd, const std::string& path, int flags, mode_t mode = 0);
// The whole content of a small file (a /proc or /sys entry, a config file).
Result<std::string> ReadFileAt(int dirfd, const std::string& path);
inline Result<std::string> ReadFile(const std::string& path) { return ReadFileAt(-100, path); }
// Writes `content` to an existing file (a cgroup knob, /proc/PID/uid_map) in one write(2), as
// those kernel interfaces require.
Status WriteExistingFileAt(int dirfd, const std::string& path, std::string_view content);
// Writes all of `content` to `fd`, retrying short writes and EINTR.
Status WriteAll(int fd, std::string_view content, std::string_view what);

}  // namespace nsbox

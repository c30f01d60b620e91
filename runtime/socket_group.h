#pragma once

// `nsbox serve --socket-group NAME`: the gid of NAME in a group file (/etc/group), read by hand:
// nsbox is linked statically, and glibc's NSS would need the shared libraries of the glibc it
// was linked with at run time. A group of another NSS source (LDAP) is given by its number.

#include <sys/types.h>

#include <string>

#include "base/error.h"

namespace nsbox::runtime {

// The gid of `name` (a group's name, or a number) in `group_file`; ENOENT naming the group and
// how to create it when there is none.
Result<gid_t> SocketGroupId(const std::string& name, const std::string& group_file = "/etc/group");

// The name of group `gid` in `group_file`, read the same way; empty when it has none (or the file
// cannot be read). The CLI names the socket's group with it.
std::string GroupName(gid_t gid, const std::string& group_file = "/etc/group");

}  // namespace nsbox::runtime

#include "runtime/socket_group.h"

#include <errno.h>

#include <charconv>
#include <fstream>
#include <string_view>

namespace nsbox::runtime {

namespace {

// One line of a group file, name:password:gid:members; false for a line without its fields.
bool SplitGroupLine(std::string_view line, std::string_view* name, std::string_view* gid) {
  const size_t c1 = line.find(':');
  const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
  const size_t c3 = c2 == std::string_view::npos ? c2 : line.find(':', c2 + 1);
  if (c3 == std::string_view::npos) return false;
  *name = line.substr(0, c1);
  *gid = line.substr(c2 + 1, c3 - c2 - 1);
  return true;
}

}  // namespace

Result<gid_t> SocketGroupId(const std::string& name, const std::string& group_file) {
  if (name.empty()) return Error(EINVAL, "--socket-group: empty group name");
  gid_t number = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), number);
  if (ec == std::errc() && end == name.data() + name.size()) return number;
  std::ifstream in(group_file);
  if (!in) return Error::Sys("open", group_file, errno).Context("--socket-group " + name);
  std::string line;
  while (std::getline(in, line)) {
    std::string_view entry, id;
    if (!SplitGroupLine(line, &entry, &id) || entry != name) continue;
    gid_t gid = 0;
    auto [e, err] = std::from_chars(id.data(), id.data() + id.size(), gid);
    if (err != std::errc() || e != id.data() + id.size()) {
      return Error(EINVAL, "--socket-group " + name + ": " + group_file + " gives it the gid '" +
                               std::string(id) + "', not a number");
    }
    return gid;
  }
  return Error(ENOENT, "--socket-group " + name + ": no group named '" + name + "' in " +
                           group_file + " (create it with `groupadd --system " + name +
                           "`, or give its number)");
}

std::string GroupName(gid_t gid, const std::string& group_file) {
  std::ifstream in(group_file);
  const std::string want = std::to_string(gid);
  std::string line;
  while (std::getline(in, line)) {
    std::string_view name, id;
    if (SplitGroupLine(line, &name, &id) && id == want) return std::string(name);
  }
  return "";
}

}  // namespace nsbox::runtime

#include "exec/command.h"

#include <errno.h>
#include <string.h>

namespace nsbox::exec {

std::vector<std::string> CommandCandidates(const std::string& name, const std::string& path) {
  if (name.find('/') != std::string::npos) return {name};
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? colon : colon - start);
    out.push_back((dir.empty() ? "." : dir) + "/" + name);
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return out;
}

std::string PathOf(const std::vector<std::string>& env) {
  for (const auto& kv : env) {
    if (kv.rfind("PATH=", 0) == 0) return kv.substr(5);
  }
  return "/bin:/usr/bin";  // execvp's default (confstr _CS_PATH)
}

ExecFailure DescribeExecFailure(const std::string& name, int err) {
  bool searched = name.find('/') == std::string::npos;
  if ((err == ENOENT || err == ENOTDIR) && searched) {
    return {127, "nsbox: " + name + ": command not found"};
  }
  if (err == ENOENT || err == ENOTDIR) {
    return {127, "nsbox: " + name + ": " + strerrordesc_np(err)};
  }
  return {126, "nsbox: " + name + ": " + strerrordesc_np(err)};
}

}  // namespace nsbox::exec

#include "runtime/paths.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace nsbox::runtime {

namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

}  // namespace

std::string SystemSocketPath() { return "/run/nsbox/nsboxd.sock"; }

std::string DefaultSocketPath() {
  if (::geteuid() == 0) return SystemSocketPath();
  std::string runtime_dir = Env("XDG_RUNTIME_DIR");
  if (runtime_dir.empty()) runtime_dir = "/tmp/nsbox-" + std::to_string(::geteuid());
  return runtime_dir + "/nsbox/nsboxd.sock";
}

std::string DefaultStateDir() {
  if (::geteuid() == 0) return "/var/lib/nsbox";
  std::string state = Env("XDG_STATE_HOME");
  if (state.empty()) state = Env("HOME") + "/.local/state";
  return state + "/nsbox";
}

}  // namespace nsbox::runtime

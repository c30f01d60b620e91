#include "policy/environment.h"

#include <algorithm>

namespace nsbox::policy {

namespace {

// The base environment of api.md, section exec. HOSTNAME and SHELL depend on the sandbox.
struct BaseVar {
  const char* name;
  const char* value;
};
constexpr BaseVar kBaseEnvironment[] = {
    {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
    {"HOME", "/root"},
    {"USER", "root"},
    {"LOGNAME", "root"},
    {"LANG", "C.UTF-8"},
    {"TERM", "xterm-256color"},
    {"TMPDIR", "/tmp"},
};

// "K=VALUE is N bytes; ..." of a "K=V" of `size` bytes over the limit.
std::string TooLong(std::string_view name, size_t size) {
  return std::string(name) + "=VALUE is " + std::to_string(size) +
         " bytes; Linux passes a command at most " + std::to_string(kMaxEnvAssignment - 1) +
         " bytes per variable";
}

}  // namespace

std::vector<std::string> BuildEnvironment(const EnvironmentInput& input) {
  std::map<std::string, std::string> env;
  for (const auto& var : kBaseEnvironment) env[var.name] = var.value;
  env["HOSTNAME"] = input.hostname;
  env["SHELL"] = input.shell;
  for (const auto& [name, value] : input.overrides) {
    if (value.has_value()) {
      env[name] = *value;
    } else {
      env.erase(name);
    }
  }
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [name, value] : env) out.push_back(name + "=" + value);
  return out;
}

Result<std::pair<std::string, std::string>> ParseEnvAssignment(const std::string& arg,
                                                               std::string_view what,
                                                               EnvLength length) {
  auto eq = arg.find('=');
  if (eq == std::string::npos) {
    return Error::Msg(std::string(what) + " '" + arg + "': expected NAME=VALUE");
  }
  std::string name = arg.substr(0, eq);
  if (name.empty()) {
    return Error::Msg(std::string(what) + " '" + arg + "': the variable name is empty");
  }
  bool bad_name = std::any_of(name.begin(), name.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
  if (bad_name) {
    return Error::Msg(std::string(what) + " '" + arg +
                      "': the variable name has a control character");
  }
  std::string value = arg.substr(eq + 1);
  if (value.find('\0') != std::string::npos) {
    return Error::Msg(std::string(what) + " '" + name + "': the value has a NUL byte");
  }
  if (length == EnvLength::kChecked && arg.size() >= kMaxEnvAssignment) {
    // execve refuses a longer one (E2BIG), so every command of the sandbox would fail.
    return Error::Msg(std::string(what) + " '" + name + "': " + TooLong(name, arg.size()));
  }
  return std::make_pair(std::move(name), std::move(value));
}

std::string OversizedEnvEntry(const std::vector<std::string>& env) {
  for (const std::string& kv : env) {
    if (kv.size() >= kMaxEnvAssignment)
      return TooLong(std::string_view(kv).substr(0, kv.find('=')), kv.size());
  }
  return std::string();
}

}  // namespace nsbox::policy

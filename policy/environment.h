#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace nsbox::policy {

// The environment a command starts with: exactly the base of api.md (section exec), then the
// sandbox's own variables. Nothing of the caller's environment is ever copied in.
struct EnvironmentInput {
  std::string hostname;             // HOSTNAME
  std::string shell = "/bin/bash";  // SHELL: /bin/bash, or /bin/sh without bash
  std::vector<std::pair<std::string, std::optional<std::string>>> overrides;  // nullopt unsets
};

// "K=V" strings in a stable order (sorted by name).
std::vector<std::string> BuildEnvironment(const EnvironmentInput& input);

// The most bytes one "K=V" of an environment may have, with its NUL: Linux's MAX_ARG_STRLEN
// (32 pages); execve answers E2BIG to a longer one.
inline constexpr size_t kMaxEnvAssignment = 32 * 4096;

// Whether ParseEnvAssignment refuses a "K=V" of kMaxEnvAssignment bytes or more. A sandbox's own
// variables (and `nsbox run --env`) are checked: every command would fail with them. An exec's
// are not: its command is then one that cannot be started (api.md: 200, exit code 1, the reason
// on stderr), which execve's E2BIG makes it (OversizedEnvEntry says which variable).
enum class EnvLength { kChecked, kUnchecked };

// Parses one `--env K=V` argument. K must be a valid variable name: non-empty, no '=', no NUL,
// no control characters; "K=V" shorter than kMaxEnvAssignment (unless kUnchecked). Errors name
// the assignment as `what` gave it: "--env '=x': ..." for the command line, "\"env\" entry
// '=x': ..." for the API.
Result<std::pair<std::string, std::string>> ParseEnvAssignment(
    const std::string& arg, std::string_view what = "--env",
    EnvLength length = EnvLength::kChecked);

// The first "K=V" of `env` that execve refuses for its length (E2BIG), described as
// "K=VALUE is N bytes; Linux passes a command at most 131071 bytes per variable"; "" if none.
std::string OversizedEnvEntry(const std::vector<std::string>& env);

}  // namespace nsbox::policy

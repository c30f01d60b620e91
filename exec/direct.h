#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nsbox::exec {

// api.md runs `command` as `bash -c <command>`. For a command that is one simple command of
// plain words ("/bin/true", "ls -la src", "python3 x.py", "make CC=gcc -j4"), bash parses
// nothing, expands nothing and execs the program straight away (its one-shot optimisation): the
// program then sees exactly what bash gave it. Starting bash costs ≈ 1 ms here, more than
// everything else of an exec together, so nsbox-init execs such a command itself, giving the
// program what bash would:
//   - argv: the words; the file: the first word when it holds a '/', else the first executable
//     non-directory file named so in a directory of PATH, as bash searches;
//   - environment: the request's, plus `SHLVL=0` when it has none (bash 5.1+ raises SHLVL and
//     lowers it again before a one-shot exec), `_=` the file executed, and `PWD=` the physical
//     working directory (filled in by the child, Runner's CommandSpec::direct_pwd).
// Anything else, or any doubt, goes to bash: the DirectCommand carries the bash form as the
// fallback, which the child execs when the program's own execve fails (a script without a
// `#!` line, which bash runs itself; a file gone since the search) or when the working
// directory is too deep for the PWD buffer. Never taken, so bash decides:
//   - any character but letters, digits and `_ . / - + , : @ % =` (quotes, `$`, globs, `~`,
//     redirections, `;`, `&`, `|`, newlines, ...), `=` or `%` in the first word (an assignment,
//     a job), a first word that is a bash keyword or builtin (`true`, `echo`, `cd`, `[`, ...);
//   - an environment bash would read: `BASH_ENV` or anything else starting with `BASH`
//     (exported functions `BASH_FUNC_*`, `BASHOPTS`), `ENV`, `SHELLOPTS`, `POSIXLY_CORRECT`,
//     `EXECIGNORE`, a `PWD` or `OLDPWD` of its own, a `SHLVL` that is not a plain number below
//     999, no PATH or one with a relative or empty directory, or a name bash would drop;
//   - a shell that is not bash (`/bin/sh` of an image without bash).
// One difference is left, as for the argv execs of the CLI: the execve happens in nsbox-init's
// vfork child, so a path through `/proc/self/exe` (the command word, a symlink, a `#!` line)
// names nsbox-init's binary rather than bash's. That binary is root's on the host and the
// sandbox's root is an unprivileged host uid (adversarial RootInsideIsAnUnprivilegedHostUid,
// InitBinaryCannotBeReplaced): running it gains nothing a command could not already do.
struct DirectCommand {
  std::string file;               // what execve runs
  std::vector<std::string> argv;  // the words, argv[0] the first as typed
  std::vector<std::string> env;   // the request's, with SHLVL and _ (PWD comes from the child)
};

// `is_executable(path)`: an existing file the command may execute that is not a directory (the
// caller's view of the sandbox's file system: nsbox-init asks the jail's).
std::optional<DirectCommand> DirectForm(
    std::string_view command, std::string_view shell, const std::vector<std::string>& env,
    const std::function<bool(const std::string& path)>& is_executable);

// The words of `command` if it is plain words as above (the first not a keyword, builtin,
// assignment or job), nullopt otherwise.
std::optional<std::vector<std::string>> PlainWords(std::string_view command);

}  // namespace nsbox::exec

#include "exec/direct.h"

#include <algorithm>

#include "exec/command.h"

namespace nsbox::exec {
namespace {

// bash 5.2's keywords (`compgen -k`) and builtins (`enable -a`): a first word bash runs itself.
constexpr std::string_view kBashOwnWords =
    " ! [[ ]] { } case coproc do done elif else esac fi for function if in select then time until"
    " while . : [ alias bg bind break builtin caller cd command compgen complete compopt continue"
    " declare dirs disown echo enable eval exec exit export false fc fg getopts hash help history"
    " jobs kill let local logout mapfile popd printf pushd pwd read readarray readonly return set"
    " shift shopt source suspend test times trap true type typeset ulimit umask unalias unset"
    " wait ";

// Variables bash reads, resets, recomputes or drops when it imports its environment (variables.c:
// IFS, OPTIND, PS1, PPID, RANDOM, LINENO, ... measured with `env -i NAME=x bash -c env`), or
// that change what it runs (ENV, SHELLOPTS, EXECIGNORE, ...). Names starting with BASH are
// refused as a family below. The base environment's names (PATH, HOME, SHELL, HOSTNAME, LANG,
// TERM, TMPDIR, USER, LOGNAME) pass through bash unchanged and are not here.
constexpr std::string_view kBashSpecialNames =
    " CDPATH COLUMNS COMP_WORDBREAKS COPROC DIRSTACK EMACS ENV EPOCHREALTIME EPOCHSECONDS EUID"
    " EXECIGNORE FIGNORE FUNCNAME FUNCNEST GLOBIGNORE GLOBSORT GROUPS HISTCMD HISTFILE HOSTTYPE"
    " IFS IGNOREEOF INSIDE_EMACS LINENO LINES MACHTYPE MAILCHECK MAILPATH OLDPWD OPTARG OPTERR"
    " OPTIND OSTYPE PIPESTATUS POSIXLY_CORRECT PPID PS0 PS1 PS2 PS3 PS4 PWD RANDOM SECONDS"
    " SHELLOPTS SRANDOM ";

// Whether `word` is one of the space-separated words of `list` (which starts and ends with a
// space). Words of `list` hold no space, so neither can a match.
bool InList(std::string_view list, std::string_view word) {
  if (word.empty() || word.find(' ') != std::string_view::npos) return false;
  for (size_t at = list.find(word); at != std::string_view::npos; at = list.find(word, at + 1)) {
    if (list[at - 1] == ' ' && list[at + word.size()] == ' ') return true;
  }
  return false;
}

bool IsWordChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '_':
    case '.':
    case '/':
    case '-':
    case '+':
    case ',':
    case ':':
    case '@':
    case '%':
    case '=':
      return true;
    default:
      return false;
  }
}

// The SHLVL bash 5.1+ leaves to a one-shot exec unchanged: "0".."998" without a leading zero.
// Anything else it rewrites (to "0", or "1" with a warning above 999).
bool PlainShellLevel(std::string_view value) {
  if (value.empty() || value.size() > 3) return false;
  if (value.size() > 1 && value[0] == '0') return false;
  for (char c : value) {
    if (c < '0' || c > '9') return false;
  }
  return value != "999";
}

// Whether bash would hand `env` on unchanged (but for SHLVL, PWD and _, which DirectForm sets),
// with nothing in it that changes what bash runs. `*has_shlvl` says whether SHLVL is in it,
// `*path` is its PATH.
bool EnvPassesThroughBash(const std::vector<std::string>& env, bool* has_shlvl,
                          std::string_view* path_out) {
  std::vector<std::string_view> names;
  names.reserve(env.size());
  *has_shlvl = false;
  bool has_path = false;  // without one bash searches its own default, "." included
  for (const auto& kv : env) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) return false;  // bash drops it
    const std::string_view name(kv.data(), eq);
    if (name.rfind("BASH", 0) == 0) return false;
    if (InList(kBashSpecialNames, name)) return false;
    if (name == "SHLVL") {
      if (!PlainShellLevel(std::string_view(kv).substr(eq + 1))) return false;
      *has_shlvl = true;
    }
    if (name == "PATH") {
      has_path = true;
      // Every directory absolute: nsbox-init searches from its own working directory, not the
      // command's, so a relative one ("" is ".") is bash's to search.
      const std::string_view path = std::string_view(kv).substr(eq + 1);
      *path_out = path;
      size_t start = 0;
      for (;;) {
        const size_t colon = path.find(':', start);
        const std::string_view dir =
            path.substr(start, colon == std::string_view::npos ? colon : colon - start);
        if (dir.empty() || dir[0] != '/') return false;
        if (colon == std::string_view::npos) break;
        start = colon + 1;
      }
    }
    names.push_back(name);
  }
  if (!has_path) return false;
  // A name given twice: bash keeps the last; not worth copying.
  std::sort(names.begin(), names.end());
  return std::adjacent_find(names.begin(), names.end()) == names.end();
}

}  // namespace

std::optional<std::vector<std::string>> PlainWords(std::string_view command) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < command.size()) {
    const char c = command[i];
    if (c == ' ' || c == '\t') {
      ++i;
      continue;
    }
    if (!IsWordChar(c)) return std::nullopt;
    const size_t start = i;
    while (i < command.size() && IsWordChar(command[i])) ++i;
    words.emplace_back(command.substr(start, i - start));
  }
  if (words.empty()) return std::nullopt;
  const std::string& first = words.front();
  if (first.find_first_of("=%") != std::string::npos) return std::nullopt;
  if (InList(kBashOwnWords, first)) return std::nullopt;
  return words;
}

std::optional<DirectCommand> DirectForm(
    std::string_view command, std::string_view shell, const std::vector<std::string>& env,
    const std::function<bool(const std::string& path)>& is_executable) {
  const size_t slash = shell.rfind('/');
  if (shell.substr(slash == std::string_view::npos ? 0 : slash + 1) != "bash") return std::nullopt;
  auto words = PlainWords(command);
  if (!words.has_value()) return std::nullopt;
  bool has_shlvl = false;
  std::string_view path;
  if (!EnvPassesThroughBash(env, &has_shlvl, &path)) return std::nullopt;

  DirectCommand out;
  const std::string& word = words->front();
  if (word.find('/') != std::string::npos) {
    // Executed as it is, relative to the command's working directory; a missing or
    // non-executable file fails execve in the child, which then runs bash for its message.
    out.file = word;
  } else {
    for (auto& candidate : CommandCandidates(word, std::string(path))) {
      if (is_executable(candidate)) {
        out.file = std::move(candidate);
        break;
      }
    }
    if (out.file.empty()) return std::nullopt;  // "command not found" is bash's to say
  }
  out.argv = std::move(*words);
  out.env.reserve(env.size() + 2);
  for (const auto& kv : env) {
    if (kv.rfind("_=", 0) != 0) out.env.push_back(kv);
  }
  if (!has_shlvl) out.env.push_back("SHLVL=0");
  out.env.push_back("_=" + out.file);
  return out;
}

}  // namespace nsbox::exec

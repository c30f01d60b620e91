#pragma once

// The `nsbox` commands that drive nsboxd over api.md: create, ls, exec, cp, stop and rm, and the
// global options that say where the daemon is (--socket, or --url with --token).
// cli.cc declares them (CLI11's set-up: each command, its options) and dispatches to their
// handlers, a file per command or group in runtime/cli/ (sandboxes, ports, images, exec, cp),
// whose shared plumbing (finding the daemon, printing errors, progress) is runtime/cli/client.h.

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace nsbox::runtime {

class ClientCommands {
 public:
  // Adds the commands and the global options to `app`, which must outlive this.
  explicit ClientCommands(CLI::App& app);
  ~ClientCommands();
  ClientCommands(const ClientCommands&) = delete;
  ClientCommands& operator=(const ClientCommands&) = delete;

  // After parsing: the exit code of the client command that was given (having run it), or
  // nullopt when the subcommand is none of them.
  std::optional<int> Dispatch();
  // The global --socket as given ("" when it was not), so that `nsbox --socket S serve` listens
  // where `nsbox --socket S exec ...` connects.
  std::string GlobalSocket() const;

  struct Options;

 private:
  std::unique_ptr<Options> options_;
};

// CLI11 reads a word "[a,b]" given to an option or positional that takes several values as the
// list "a", "b" (its syntax for vector values): `nsbox rm '[x,y]'` removed the sandboxes x and y,
// and `nsbox exec ID -- '[ -d /x ]'` ran "-d /x". Every word is taken whole instead:
// ProtectWords marks the words that would be read so (those starting with '[', and a
// `--name=[...]` value), before the parse; UnmarkValues, called on the app once every option is
// added, gives each option a transform that takes the mark off again, so that the values are the
// words as typed. A word that starts with the mark byte (0x01) gets another, so none is changed.
std::vector<std::string> ProtectWords(int argc, char** argv);
void UnmarkValues(CLI::App& app);

// The shell command string for exec's COMMAND arguments: one argument is used as it is (it is a
// shell command already); several are each quoted for a POSIX shell and joined with spaces, so
// the shell sees exactly those arguments.
std::string ShellCommand(const std::vector<std::string>& args);

}  // namespace nsbox::runtime

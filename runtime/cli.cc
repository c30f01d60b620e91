#include "runtime/cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/cli/client.h"
#include "runtime/cli/commands.h"
#include "runtime/paths.h"

namespace nsbox::runtime {

namespace {

using Options = ClientCommands::Options;

// ---- what the parse left over ----

// Runs after the parse, before CLI11 checks what is required and what is left over, to say
// what to do where CLI11 would not: a word no command took is an unknown command (CLI11: "A
// subcommand is required"), and an option exec or shell does not know is most likely the
// command's, given without "--" before it.
void CheckLeftovers(const CLI::App& app, const Options& o, const std::vector<std::string>& stray) {
  // The innermost command given, and its name: "image " for `nsbox image bogus`.
  const CLI::App* cmd = &app;
  std::string name;
  while (!cmd->get_subcommands().empty()) {
    cmd = cmd->get_subcommands().front();
    name += cmd->get_name() + " ";
  }
  std::vector<std::string> words;
  std::copy_if(stray.begin(), stray.end(), std::back_inserter(words),
               [](const std::string& w) { return !w.empty(); });
  if (!words.empty()) {
    if (cmd->get_require_subcommand_min() > 0) {
      throw CLI::ExtrasError("unknown command '" + name + words.front() + "'",
                             CLI::ExitCodes::ExtrasError);
    }
    throw CLI::ExtrasError(words);  // extra arguments of a command: CLI11's own message
  }
  if (cmd != o.exec && cmd != o.shell) return;
  std::vector<std::string> unknown;
  for (const std::string& arg : app.remaining(/*recurse=*/true)) {
    if (arg.size() > 1 && arg[0] == '-' && arg != "--") unknown.push_back(arg);
  }
  if (unknown.empty()) return;
  std::string text;
  for (const std::string& arg : unknown) text += (text.empty() ? "'" : ", '") + arg + "'";
  // The example puts the options right after the command's name: where they were, mostly. The
  // options' own callbacks have not run yet: their values are read as given.
  const std::vector<std::string>& id = cmd->get_option("id")->results();
  const std::vector<std::string>& command = cmd->get_option("command")->results();
  std::string example = "nsbox " + cmd->get_name() + " ID -- COMMAND...";
  if (id.size() == 1 && !command.empty()) {
    std::vector<std::string> words_of = {"nsbox", cmd->get_name(), id[0], "--", command[0]};
    words_of.insert(words_of.end(), unknown.begin(), unknown.end());
    words_of.insert(words_of.end(), command.begin() + 1, command.end());
    example = ShellCommand(words_of);
  }
  throw CLI::ExtrasError(cmd->get_name() + ": unknown option" + (unknown.size() > 1 ? "s " : " ") +
                             text + " (for the command's own options, put the command after " +
                             "'--': " + example + ")",
                         CLI::ExitCodes::ExtrasError);
}

}  // namespace

// ---- the commands ----

std::string ShellCommand(const std::vector<std::string>& args) {
  if (args.size() == 1) return args[0];
  std::string out;
  for (const std::string& arg : args) {
    if (!out.empty()) out += ' ';
    bool plain = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             std::string_view("-_./:,+%@").find(c) != std::string_view::npos;
    });
    // '=' is not plain: an unquoted NAME=VALUE first word would be an assignment, not argv[0].
    if (plain) {
      out += arg;
      continue;
    }
    // Single quotes keep everything but a single quote, which is closed, escaped, reopened.
    out += '\'';
    for (char c : arg) {
      if (c == '\'') {
        out += "'\\''";
      } else {
        out += c;
      }
    }
    out += '\'';
  }
  return out;
}

ClientCommands::ClientCommands(CLI::App& app) : options_(std::make_unique<Options>()) {
  Options& o = *options_;
  const std::string group =
      "Daemon connection (for create, ls, exec, shell, cp, stop, rm, network, image, port)";
  // A normal user's default is their own daemon's socket, then the system's.
  const std::string default_socket = DefaultSocketPath() == SystemSocketPath()
                                         ? SystemSocketPath()
                                         : DefaultSocketPath() + ", then " + SystemSocketPath();
  o.socket_opt =
      app.add_option("--socket", o.socket,
                     "nsboxd's Unix socket (env NSBOX_SOCKET; default " + default_socket + ")")
          ->group(group);
  o.url_opt = app.add_option("--url", o.url,
                             "reach nsboxd over TCP instead, http://HOST:PORT (env NSBOX_URL)")
                  ->group(group);
  o.token_opt =
      app.add_option("--token", o.token, "bearer token for --url (env NSBOX_TOKEN)")->group(group);

  o.create = app.add_subcommand(
      "create", "Create a persistent sandbox, or find the existing one: nsbox create ID");
  o.create->add_option("id", o.id, "the sandbox's id (any UTF-8, up to 256 bytes)")->required();
  o.create->add_option("--image", o.image, "root file system (default: host)");
  o.create->add_option("--memory,-m", o.memory,
                       "memory limit, e.g. 512M, 1.5G or 2G (at least 16M)");
  o.create->add_option("--disk", o.disk,
                       "the sandbox's own disk for its workspace and home (its image's changes), "
                       "e.g. 1G or 20G (16M to 8T), reserved on the host's disk now");
  o.create->add_option("--idle-stop", o.idle_stop,
                       "stop it (ending its processes, emptying /tmp; files stay) once it has "
                       "been idle this long, e.g. 15m or 2h (1s to 30d): no request using it "
                       "and no process of its own running; never: not even by the daemon's "
                       "--idle-stop");
  o.create->add_option("--pids", o.pids, "most processes and threads at once");
  o.create->add_option("--cpus", o.cpus, "CPU time limit in CPUs, e.g. 1.5");
  // allow_extra_args(false): one value per --env, so `--env A=1 ID` leaves ID alone.
  o.create->add_option("--env,-e", o.env, "base environment, NAME=VALUE (repeatable)")
      ->allow_extra_args(false);
  o.create->add_option("--network", o.network_mode,
                       "none (default: loopback only), open (all egress but the host, link-local "
                       "and other sandboxes) or allow (only --allow entries)");
  o.create->add_option("--allow", o.allow,
                       "reachable name, *.wildcard, IPv4 address or CIDR, with an optional :PORT "
                       "(repeatable; implies --network allow)");
  o.create->add_flag("--json", o.json, "print the API's JSON");

  o.network = app.add_subcommand("network",
                                 "Show a sandbox's network policy, or replace it (running or not): "
                                 "nsbox network ID [none|open|allow] [--allow ENTRY]...");
  o.network->add_option("id", o.id, "the sandbox's id")->required();
  o.network->add_option("mode", o.network_mode, "none, open or allow (the new policy)");
  o.network->add_option("--allow", o.allow, "reachable name, *.wildcard, IPv4 or CIDR[:PORT]");
  o.network->add_flag("--json", o.json, "print the API's JSON");

  o.ls = app.add_subcommand("ls", "List sandboxes");
  o.ls->add_flag("--json", o.json, "print the API's JSON");

  o.exec = app.add_subcommand(
      "exec", "Run a command in a sandbox, output live: nsbox exec ID [OPTIONS] -- COMMAND...");
  o.exec->add_option("id", o.id, "the sandbox's id")->required();
  o.exec->add_option("--cwd", o.cwd, "working directory, relative to the sandbox's cwd");
  o.exec->add_option("--env,-e", o.env, "set a variable, NAME=VALUE (repeatable)")
      ->allow_extra_args(false);
  o.exec->add_option("--timeout", o.timeout,
                     "kill the command after this many milliseconds (exit code 124; 0: never)");
  o.exec->add_flag("--interactive,-i", o.interactive,
                   "stream standard input to the command until EOF (over a WebSocket)");
  o.exec->add_flag("--tty,-t", o.tty,
                   "run the command on a terminal; this terminal goes raw and its size follows");
  o.exec
      ->add_option("command", o.command,
                   "one argument: a shell command line, as is; several: the command's argv")
      ->required();

  o.shell = app.add_subcommand(
      "shell",
      "An interactive login shell in a sandbox, on a terminal: nsbox shell ID [-- COMMAND...]");
  o.shell->add_option("id", o.id, "the sandbox's id")->required();
  o.shell->add_option("--cwd", o.cwd, "working directory, relative to the sandbox's cwd");
  o.shell->add_option("--env,-e", o.env, "set a variable, NAME=VALUE (repeatable)")
      ->allow_extra_args(false);
  o.shell->add_option("command", o.command,
                      "run this instead of a login shell (bash, else sh), on the terminal");

  o.cp = app.add_subcommand(
      "cp", "Copy files between the host and a sandbox: nsbox cp SRC DST, one side ID:PATH");
  o.cp->add_option("src", o.src, "host path, '-' for standard input, or ID:PATH")->required();
  o.cp->add_option("dst", o.dst, "host path, '-' for standard output, or ID:PATH")->required();
  o.cp->footer(
      "A file's permission bits go with it both ways: a new host file gets them less set-uid,\n"
      "set-gid and sticky (and less the umask), an existing host file keeps its own mode, and\n"
      "standard input makes a new sandbox file 0644. Directories' modes are not copied.\n"
      "Inside a copied directory, symlinks are skipped (each named on stderr); a symlink given\n"
      "as SRC is followed. ID:PATH splits at the first ':', so an id with a ':' in it cannot be\n"
      "named here (nor a host path, unless it starts with '/' or '.': ./a:b).");

  o.stop = app.add_subcommand("stop", "Stop sandboxes (their processes end; files stay)");
  o.stop->add_option("id", o.ids, "the sandboxes' ids")->required();
  o.rm = app.add_subcommand("rm", "Remove sandboxes and all their files");
  o.rm->add_option("id", o.ids, "the sandboxes' ids")->required();

  o.image_cmd = app.add_subcommand("image", "Import, list and remove images");
  o.image_cmd->require_subcommand(1);
  o.image_import = o.image_cmd->add_subcommand(
      "import",
      "Import an image: nsbox image import NAME FILE (an OCI layout, a docker save tarball or a "
      "root file system tarball; or an OCI layout directory)");
  o.image_import->add_option("name", o.image_name, "the image's name, e.g. debian-12")->required();
  o.image_import->add_option("source", o.image_source, "the tarball or OCI layout directory")
      ->required();
  o.image_import->add_flag("--replace", o.replace,
                           "replace an image of that name (its sandboxes keep the old root)");
  o.image_import->add_option("--max-bytes", o.image_max_bytes,
                             "refuse the image if its import would write more than this, e.g. "
                             "2G (the daemon's --image-max-bytes bounds it too)");
  o.image_import->add_flag("--json", o.json, "print the API's JSON");
  o.image_ls = o.image_cmd->add_subcommand("ls", "List images");
  o.image_ls->add_flag("--json", o.json, "print the API's JSON");
  o.image_inspect = o.image_cmd->add_subcommand("inspect", "Print an image's JSON");
  o.image_inspect->add_option("name", o.image_name, "the image's name")->required();
  o.image_rm = o.image_cmd->add_subcommand("rm", "Remove images no sandbox uses");
  o.image_rm->add_option("name", o.image_names, "the images' names")->required();

  o.port_cmd = app.add_subcommand("port", "Expose a sandbox's TCP ports on the host");
  o.port_cmd->require_subcommand(1);
  o.port_add = o.port_cmd->add_subcommand(
      "add", "Listen on the host for a port inside: nsbox port add ID PORT; prints its URL");
  o.port_add->add_option("id", o.id, "the sandbox's id")->required();
  o.port_add->add_option("port", o.port, "the port inside, on 127.0.0.1 (1 to 65535)")->required();
  o.port_add->add_option("--host-port", o.host_port, "the host port (default: a free one)");
  o.port_add->add_option("--address", o.address,
                         "the host address to listen on (default 127.0.0.1)");
  o.port_ls = o.port_cmd->add_subcommand("ls", "List a sandbox's exposed ports");
  o.port_ls->add_option("id", o.id, "the sandbox's id")->required();
  o.port_ls->add_flag("--json", o.json, "print the API's JSON");
  o.port_rm = o.port_cmd->add_subcommand("rm", "Close an exposed port and its connections");
  o.port_rm->add_option("id", o.id, "the sandbox's id")->required();
  o.port_rm->add_option("port", o.port, "the port inside")->required();

  // The words no command took, for CheckLeftovers: a positional of a nameless option group
  // (hidden from the usage line, which lists the app's own), whose callback force_callback runs
  // even when there are none, after the parse and before CLI11's checks of requirements and
  // extras.
  app.add_option_group("")
      ->add_option_function<std::vector<std::string>>(
          "stray",
          [&app, &o](const std::vector<std::string>& stray) { CheckLeftovers(app, o, stray); })
      ->force_callback();
}

namespace {
constexpr char kWordMark = '\x01';
}  // namespace

std::vector<std::string> ProtectWords(int argc, char** argv) {
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(argc));
  for (int i = 0; i < argc; ++i) {
    std::string word = argv[i];
    size_t at = 0;  // where a value begins: the word, or after "--name="
    if (word.starts_with("--")) {
      const size_t eq = word.find('=');
      at = eq == std::string::npos ? word.size() : eq + 1;
    }
    if (i > 0 && at < word.size() && (word[at] == '[' || word[at] == kWordMark)) {
      word.insert(at, 1, kWordMark);
    }
    out.push_back(std::move(word));
  }
  return out;
}

void UnmarkValues(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    opt->transform(
        [](const std::string& value) -> std::string {
          return value.starts_with(kWordMark) ? value.substr(1) : value;
        },
        "", "unmark");
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) UnmarkValues(*sub);
}

ClientCommands::~ClientCommands() = default;

std::string ClientCommands::GlobalSocket() const { return options_->socket; }

std::optional<int> ClientCommands::Dispatch() {
  const Options& o = *options_;
  CLI::App* chosen = nullptr;
  for (CLI::App* cmd :
       {o.create, o.ls, o.exec, o.shell, o.cp, o.stop, o.rm, o.network, o.image_import, o.image_ls,
        o.image_inspect, o.image_rm, o.port_add, o.port_ls, o.port_rm}) {
    if (cmd->parsed()) chosen = cmd;
  }
  if (chosen == nullptr) return std::nullopt;
  auto endpoint = cli::Endpoint(o);
  if (!endpoint.ok())
    return cli::Fail(chosen->get_name(), endpoint.error().message(), cli::kExitUsage);
  ApiClient client(std::move(*endpoint));
  if (chosen == o.create) return cli::Create(o, client);
  if (chosen == o.ls) return cli::List(o, client);
  if (chosen == o.exec) return cli::Exec(o, client);
  if (chosen == o.shell) return cli::Shell(o, client);
  if (chosen == o.cp) return cli::Copy(o, client);
  if (chosen == o.stop) return cli::ForEachId(o, client, "stop");
  if (chosen == o.network) return cli::Network(o, client);
  if (chosen == o.image_import) return cli::ImportImage(o, client);
  if (chosen == o.image_ls) return cli::ListImages(o, client);
  if (chosen == o.image_inspect) return cli::InspectImage(o, client);
  if (chosen == o.image_rm) return cli::RemoveImages(o, client);
  if (chosen == o.port_add) return cli::AddPort(o, client);
  if (chosen == o.port_ls) return cli::ListPorts(o, client);
  if (chosen == o.port_rm) return cli::RemovePort(o, client);
  return cli::ForEachId(o, client, "rm");
}

}  // namespace nsbox::runtime

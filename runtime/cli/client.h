#pragma once

// Internal to the CLI's client commands: runtime/cli.cc declares them (CLI11's set-up and the
// dispatch), runtime/cli/ holds their handlers, a file per command or group. This is what they
// share: the parsed options, the exit codes, and the plumbing of client.cc (finding the daemon,
// printing errors and tables) and the progress line.

#include <unistd.h>

#include <boost/json.hpp>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/strings.h"
#include "runtime/api_client.h"
#include "runtime/cli.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace nsbox::runtime {

struct ClientCommands::Options {
  // Where the daemon is.
  std::string socket;
  std::string url;
  std::string token;
  CLI::Option* socket_opt = nullptr;
  CLI::Option* url_opt = nullptr;
  CLI::Option* token_opt = nullptr;

  CLI::App* create = nullptr;
  CLI::App* ls = nullptr;
  CLI::App* exec = nullptr;
  CLI::App* shell = nullptr;
  CLI::App* cp = nullptr;
  CLI::App* stop = nullptr;
  CLI::App* rm = nullptr;
  CLI::App* network = nullptr;

  std::string id;  // create, exec, network
  bool json = false;

  std::optional<std::string> image;
  std::optional<std::string> memory;
  std::optional<std::string> disk;
  std::optional<std::string> idle_stop;  // create
  std::optional<std::string> pids;
  std::optional<std::string> cpus;
  std::vector<std::string> env;             // create, exec
  std::optional<std::string> network_mode;  // create --network, network ID MODE
  std::vector<std::string> allow;           // --allow

  std::string cwd;
  std::optional<std::string> timeout;
  std::vector<std::string> command;
  bool interactive = false;  // exec -i: stdin streamed to the command
  bool tty = false;          // exec -t: on a terminal

  std::string src;
  std::string dst;

  std::vector<std::string> ids;  // stop, rm

  // nsbox image ...
  CLI::App* image_cmd = nullptr;
  CLI::App* image_import = nullptr;
  CLI::App* image_ls = nullptr;
  CLI::App* image_rm = nullptr;
  CLI::App* image_inspect = nullptr;
  std::string image_name;
  std::string image_source;
  bool replace = false;
  std::string image_max_bytes;           // image import --max-bytes
  std::vector<std::string> image_names;  // image rm

  // nsbox port ...
  CLI::App* port_cmd = nullptr;
  CLI::App* port_add = nullptr;
  CLI::App* port_ls = nullptr;
  CLI::App* port_rm = nullptr;
  std::string port;  // checked by ParsePort, for a message that says what a port is
  std::optional<std::string> host_port;
  std::string address;
};

namespace cli {

namespace json = boost::json;
using Options = ClientCommands::Options;

constexpr int kExitApiError = 1;
constexpr int kExitUsage = 125;
constexpr int kExitInterrupted = 130;

// ---- errors ----

// The message on stderr as "nsbox: WHAT: MESSAGE", escaped; returns `code`.
int Fail(std::string_view what, std::string_view message, int code = kExitApiError);
Error Transport(const ApiClient& client, Error error);
Result<ApiResponse> Check(const ApiClient& client, Result<ApiResponse> answer);

// ---- small helpers ----

Result<json::object> EnvObject(const std::vector<std::string>& items);
void PrintBody(const ApiResponse& answer);
std::string JsonText(const json::object& o, std::string_view key);
void PrintTable(const std::vector<std::vector<std::string>>& rows);

// ---- where the daemon is ----

// From --socket, --url and --token, else NSBOX_URL, NSBOX_TOKEN and NSBOX_SOCKET; with none of
// them, the user's own socket (DefaultSocketPath) with the system's as its fallback. A socket
// given is tried alone.
Result<ApiEndpoint> Endpoint(const Options& o);

// ---- progress ----

std::string Mebibytes(uint64_t bytes);

// One progress line on a terminal, rewritten in place; nothing when stderr is not one.
class ProgressLine {
 public:
  ProgressLine() : tty_(::isatty(STDERR_FILENO) == 1) {}
  ~ProgressLine() { Done(); }
  void Show(const std::string& text) {
    if (!tty_) return;
    std::fprintf(stderr, "\r\033[K%s", EscapeControl(text).c_str());
    shown_ = true;
  }
  void Done() {
    if (shown_) std::fputs("\r\033[K", stderr);
    shown_ = false;
  }

 private:
  bool tty_;
  bool shown_ = false;
};

}  // namespace cli

}  // namespace nsbox::runtime

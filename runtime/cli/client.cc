#include "runtime/cli/client.h"

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/strings.h"
#include "runtime/paths.h"
#include "runtime/socket_group.h"

namespace nsbox::runtime::cli {

// ---- errors ----

// Everything printed below that comes from the daemon (its messages, names from an image or from
// inside a sandbox, ids) goes through EscapeControl first: such text is hostile, and a name with
// escape sequences would otherwise act on the user's terminal (retitle it, clear it, forge lines
// of output). The JSON of --json is left to the daemon's serializer, which escapes them.
int Fail(std::string_view what, std::string_view message, int code) {
  std::fprintf(stderr, "nsbox: %s: %s\n", EscapeControl(what).c_str(),
               EscapeControl(message).c_str());
  return code;
}

namespace {

// Why the daemon's Unix socket refused this user (EACCES): it is there (nsboxd makes it 0660),
// but its mode and group keep this user out: the way in is root, or the socket's group.
std::string SocketAccessHint(const std::string& socket_path) {
  struct stat st {};
  if (::stat(socket_path.c_str(), &st) != 0) {
    return "the daemon's socket is not accessible to this user (it is 0660): run as root or as "
           "a member of the socket's group";
  }
  const std::string id = std::to_string(st.st_gid);
  const std::string name = GroupName(st.st_gid);
  const std::string join = name.empty() ? id : name;
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
  const std::string what =
      "the daemon's socket is not accessible to this user (mode " + std::string(mode) +
      (name.empty() ? ", group id " + id : ", group " + name + " (id " + id + ")") + "): ";
  if (st.st_gid == 0) {
    // Root's group is never the way in: its members may read what is root's by group on most
    // hosts. The socket needs a group of nsbox's users, which only root can give it.
    return what +
           "run as root (sudo nsbox ...); group root is not one to join: whoever runs nsboxd can "
           "give its socket a group for nsbox's users (nsbox serve --socket-group GROUP; the "
           "Debian package's service uses group nsbox), which a user then joins";
  }
  return what + "run as root, or join group " + join + " (sudo usermod -aG " + join +
         " $USER, then log in again)";
}

// One socket of the default ones, and why it did not answer.
std::string TriedSocket(const ApiClient::ConnectFailure& f) {
  std::string text = f.socket + ": " + ErrnoText(f.code);
  if (f.code == ENOENT) return text + ", no daemon there";
  if (f.code == ECONNREFUSED) return text + ", no daemon listens there";
  if (f.code == EACCES) return text + ", " + SocketAccessHint(f.socket);
  return text;
}

}  // namespace

// A transport error, with the hint a user needs when the daemon is not there at all.
Error Transport(const ApiClient& client, Error error) {
  if (!client.connect_failed()) return error;
  const std::vector<ApiClient::ConnectFailure>& tried = client.connect_failures();
  if (tried.size() > 1) {
    // The default sockets (no --socket, --url, NSBOX_SOCKET or NSBOX_URL): each, and why.
    std::string text = "no nsboxd answers on the default sockets: ";
    bool refused = false;
    for (size_t i = 0; i < tried.size(); ++i) {
      text += (i == 0 ? "" : "; ") + TriedSocket(tried[i]);
      refused = refused || tried[i].code == EACCES;
    }
    if (!refused) {
      text += "; start it with 'sudo nsbox serve' (it listens on " + SystemSocketPath() +
              "), or point --socket or --url at a daemon";
    }
    return Error(error.code(), text);
  }
  if (error.code() == EACCES && !client.endpoint().socket_path.empty()) {
    return Error(EACCES, error.message() + "; " + SocketAccessHint(client.endpoint().socket_path));
  }
  std::string flag = client.endpoint().socket_path.empty() ? "--url" : "--socket";
  return Error(error.code(), error.message() + "; is nsboxd running? Start it with 'nsbox serve'" +
                                 " or point " + flag + " at it");
}

// The answer of a call that must succeed: transport errors and API errors alike become an Error
// whose message is what the user is shown.
Result<ApiResponse> Check(const ApiClient& client, Result<ApiResponse> answer) {
  if (!answer.ok()) return Transport(client, std::move(answer).error());
  if (!answer->ok()) {
    // A TCP listener's 401: the API's message speaks of HTTP headers; the user sets a flag.
    if (answer->status == 401) {
      return Error::Msg(answer->error().message +
                        (client.endpoint().token.empty()
                             ? "; give the daemon's token with --token TOKEN or NSBOX_TOKEN"
                             : "; check the token given with --token or NSBOX_TOKEN"));
    }
    return Error::Msg(answer->error().message);
  }
  return answer;
}

// ---- small helpers ----

namespace {

Result<std::pair<std::string, std::string>> ParseEnv(std::string_view flag,
                                                     const std::string& item) {
  size_t eq = item.find('=');
  if (eq == std::string::npos || eq == 0) {
    return Error(EINVAL, std::string(flag) + " '" + item + "': expected NAME=VALUE");
  }
  return std::make_pair(item.substr(0, eq), item.substr(eq + 1));
}

}  // namespace

Result<json::object> EnvObject(const std::vector<std::string>& items) {
  json::object env;
  for (const std::string& item : items) {
    NSBOX_ASSIGN_OR_RETURN(auto kv, ParseEnv("--env", item));
    env[kv.first] = kv.second;
  }
  return env;
}

void PrintBody(const ApiResponse& answer) {
  std::string_view body = answer.body;
  while (!body.empty() && (body.back() == '\n' || body.back() == ' ')) body.remove_suffix(1);
  std::fwrite(body.data(), 1, body.size(), stdout);
  std::fputc('\n', stdout);
}

std::string JsonText(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return "-";
  if (v->is_string()) return std::string(v->get_string());
  return json::serialize(*v);
}

namespace {

// Width on a terminal, counted in code points: ids may be any UTF-8.
size_t DisplayWidth(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

}  // namespace

void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  std::vector<std::vector<std::string>> shown;
  for (const auto& row : rows) {
    shown.emplace_back();
    for (const std::string& cell : row) shown.back().push_back(EscapeControl(cell));
  }
  for (const auto& row : shown) {
    widths.resize(std::max(widths.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], DisplayWidth(row[i]));
  }
  for (const auto& row : shown) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(widths[i] - DisplayWidth(row[i]) + 3, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

// ---- where the daemon is ----

namespace {

// ApiEndpoint::FromUrl, with a message for the two common slips it lumps together with https://
// (whose hint, TLS in front, it keeps): no scheme at all, and another scheme.
Result<ApiEndpoint> EndpointFromUrl(std::string_view url, std::string token) {
  auto bad = [&](std::string_view why) {
    return Error(EINVAL, "--url '" + std::string(url) + "': " + std::string(why));
  };
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) {
    return bad("no scheme; write http://" + std::string(url));
  }
  std::string scheme(url.substr(0, scheme_end));
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (!url.starts_with("http://") && scheme != "https") {
    return bad("only http://HOST:PORT is supported");
  }
  return ApiEndpoint::FromUrl(url, std::move(token));
}

}  // namespace

Result<ApiEndpoint> Endpoint(const Options& o) {
  bool socket_flag = o.socket_opt->count() > 0;
  bool url_flag = o.url_opt->count() > 0;
  if (socket_flag && url_flag) return Error(EINVAL, "--socket and --url exclude each other");
  std::string token = o.token;
  if (o.token_opt->count() == 0) {
    const char* env_token = std::getenv("NSBOX_TOKEN");
    if (env_token != nullptr) token = env_token;
  }
  if (url_flag) return EndpointFromUrl(o.url, token);
  if (socket_flag) {
    if (o.socket.empty()) return Error(EINVAL, "--socket: empty path");
    return ApiEndpoint::Unix(o.socket);
  }
  const char* env_url = std::getenv("NSBOX_URL");
  if (env_url != nullptr && *env_url != '\0') {
    auto endpoint = EndpointFromUrl(env_url, token);
    if (!endpoint.ok()) return std::move(endpoint).error().Context("NSBOX_URL");
    return endpoint;
  }
  if (const char* env_socket = std::getenv("NSBOX_SOCKET");
      env_socket != nullptr && *env_socket != '\0') {
    return ApiEndpoint::Unix(env_socket);
  }
  // Nothing said: the user's own daemon's socket, then the system's (a normal user's `nsbox ls`
  // reaches the root daemon of `sudo nsbox serve`). As root they are one.
  ApiEndpoint endpoint = ApiEndpoint::Unix(DefaultSocketPath());
  if (endpoint.socket_path != SystemSocketPath()) {
    endpoint.socket_fallbacks.push_back(SystemSocketPath());
  }
  return endpoint;
}

// ---- progress ----

std::string Mebibytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace nsbox::runtime::cli

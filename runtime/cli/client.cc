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
// but its mode and group keep this user out. Both are given when the socket can be looked at;
// the group by number, as nsbox is linked statically (no NSS).
std::string SocketAccessHint(const std::string& socket_path) {
  struct stat st {};
  if (::stat(socket_path.c_str(), &st) != 0) {
    return "; the daemon's socket is not accessible to this user (it is 0660): run as root or as "
           "a member of the socket's group";
  }
  char text[160];
  std::snprintf(text, sizeof text,
                "; the daemon's socket is not accessible to this user (mode %04o, group id %u): "
                "run as root or as a member of that group",
                st.st_mode & 07777, st.st_gid);
  return text;
}

}  // namespace

// A transport error, with the hint a user needs when the daemon is not there at all.
Error Transport(const ApiClient& client, Error error) {
  if (!client.connect_failed()) return error;
  if (error.code() == EACCES && !client.endpoint().socket_path.empty()) {
    return Error(EACCES, error.message() + SocketAccessHint(client.endpoint().socket_path));
  }
  std::string flag = client.endpoint().socket_path.empty() ? "--url" : "--socket";
  return Error(error.code(), error.message() + "; is nsboxd running? Start it with 'nsbox serve'" +
                                 " or point " + flag + " at it");
}

// The answer of a call that must succeed: transport errors and API errors alike become an Error
// whose message is what the user is shown.
Result<ApiResponse> Check(const ApiClient& client, Result<ApiResponse> answer) {
  if (!answer.ok()) return Transport(client, std::move(answer).error());
  if (!answer->ok()) return Error::Msg(answer->error().message);
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
  return ApiEndpoint::Unix(ClientSocketPath());
}

// ---- progress ----

std::string Mebibytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace nsbox::runtime::cli

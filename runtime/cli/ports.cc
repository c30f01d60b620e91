#include "runtime/cli/commands.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "base/strings.h"
#include "runtime/cli/client.h"
#include "runtime/units.h"

namespace nsbox::runtime::cli {

namespace {

// A port of the command line: a number from `least` to 65535.
Result<int> ParsePort(std::string_view what, const std::string& text, int least) {
  auto port = ParseCount(what, text, static_cast<uint64_t>(least), 65535);
  if (!port.ok()) {
    return Error(EINVAL, std::string(what) + " '" + text + "': the port must be a number from " +
                             std::to_string(least) + " to 65535");
  }
  return static_cast<int>(*port);
}

}  // namespace

int AddPort(const Options& o, ApiClient& client) {
  auto port = ParsePort("PORT", o.port, 1);
  auto host_port = ParsePort("--host-port", o.host_port.value_or("0"), 0);
  for (const auto* parsed : {&port, &host_port}) {
    if (!parsed->ok()) {
      return Fail("port add", parsed->error().message() + " (see nsbox port add --help)",
                  kExitUsage);
    }
  }
  json::object body;
  body["port"] = *port;
  body["hostPort"] = *host_port;
  if (!o.address.empty()) body["address"] = o.address;
  auto answer = Check(client, client.Call(Method::kPost, SandboxTarget(o.id, "/ports"), body));
  if (!answer.ok()) return Fail("port add " + o.id, answer.error().message());
  auto parsed = answer->Json();
  const json::object* top = parsed.ok() ? parsed->if_object() : nullptr;
  if (top == nullptr) return Fail("port add " + o.id, "the daemon's answer is not an object");
  std::printf("%s\n", EscapeControl(JsonText(*top, "url")).c_str());
  return 0;
}

int ListPorts(const Options& o, ApiClient& client) {
  auto answer = Check(client, client.Call(Method::kGet, SandboxTarget(o.id, "/ports")));
  if (!answer.ok()) return Fail("port ls " + o.id, answer.error().message());
  if (o.json) {
    PrintBody(*answer);
    return 0;
  }
  auto parsed = answer->Json();
  const json::object* top = parsed.ok() ? parsed->if_object() : nullptr;
  const json::value* list = top != nullptr ? top->if_contains("ports") : nullptr;
  if (list == nullptr || !list->is_array()) {
    return Fail("port ls " + o.id, "the daemon's answer has no \"ports\" list");
  }
  std::vector<std::vector<std::string>> rows = {{"PORT", "ADDRESS", "HOST PORT", "URL"}};
  for (const json::value& item : list->get_array()) {
    if (!item.is_object()) continue;
    const json::object& p = item.get_object();
    rows.push_back(
        {JsonText(p, "port"), JsonText(p, "address"), JsonText(p, "hostPort"), JsonText(p, "url")});
  }
  PrintTable(rows);
  return 0;
}

int RemovePort(const Options& o, ApiClient& client) {
  auto port = ParsePort("PORT", o.port, 1);
  if (!port.ok()) {
    return Fail("port rm", port.error().message() + " (see nsbox port rm --help)", kExitUsage);
  }
  auto answer = Check(
      client, client.Call(Method::kDelete, SandboxTarget(o.id, "/ports/" + std::to_string(*port))));
  if (!answer.ok()) return Fail("port rm " + o.id, answer.error().message());
  return 0;
}

}  // namespace nsbox::runtime::cli

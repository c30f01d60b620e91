#include "runtime/cli/commands.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/json.hpp>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/strings.h"
#include "isolate/cgroup.h"
#include "isolate/disk.h"
#include "runtime/cli/client.h"
#include "runtime/registry.h"
#include "runtime/units.h"

namespace nsbox::runtime::cli {

namespace {

// The least and most memoryBytes of a sandbox the daemon takes (api.md, limits).
constexpr uint64_t kMinSandboxMemory = uint64_t{16} << 20;
constexpr uint64_t kMaxSandboxMemory = uint64_t{1} << 50;

// The API's network policy from --network/MODE and --allow (docs/network.md); nullopt when
// neither was given.
Result<std::optional<json::value>> NetworkPolicyOf(const Options& o) {
  if (!o.network_mode && o.allow.empty()) return std::optional<json::value>();
  const std::string mode = o.network_mode.value_or(o.allow.empty() ? "none" : "allow");
  if (mode != "none" && mode != "open" && mode != "allow") {
    return Error::Msg("network '" + mode + "' is not one of none, open or allow");
  }
  if (mode == "none") {
    if (!o.allow.empty()) return Error::Msg("--allow contradicts a network of none");
    return std::optional<json::value>(json::string("none"));
  }
  if (mode == "allow" && o.allow.empty()) {
    // It would start a network (a veth pair, nsbox-net's rules) that reaches nothing.
    const bool create = o.create != nullptr && o.create->parsed();
    return Error::Msg(std::string(create ? "--network allow" : "network mode allow") +
                      " needs an allow list: at least one --allow ENTRY (a name, *.wildcard, "
                      "IPv4 address or CIDR, with an optional :PORT); for no network at all, " +
                      (create ? "--network none" : "'nsbox network " + o.id + " none'"));
  }
  if (mode == "open" && o.allow.empty()) {
    return std::optional<json::value>(json::string("open"));
  }
  json::object policy;
  if (mode == "open") policy["open"] = true;
  json::array allow;
  for (const std::string& entry : o.allow) allow.emplace_back(entry);
  policy["allow"] = std::move(allow);
  return std::optional<json::value>(std::move(policy));
}

std::string PolicyText(const json::value* policy) {
  if (policy == nullptr) return "?";
  if (policy->is_string()) return std::string(policy->get_string());
  if (!policy->is_object()) return json::serialize(*policy);
  const json::object& p = policy->get_object();
  std::string text = p.contains("open") ? "open, and allow:" : "allow:";
  if (const json::value* allow = p.if_contains("allow"); allow != nullptr && allow->is_array()) {
    if (allow->get_array().empty()) text += " (nothing)";
    for (const json::value& e : allow->get_array()) {
      text += " ";
      text += e.is_string() ? std::string(e.get_string()) : json::serialize(e);
    }
  }
  return text;
}

}  // namespace

// nsbox network ID [none|open|allow] [--allow ENTRY]...: shows or replaces the policy.
int Network(const Options& o, ApiClient& client) {
  const std::string what = "network " + o.id;
  auto policy = NetworkPolicyOf(o);
  if (!policy.ok()) return Fail(what, policy.error().message(), kExitUsage);
  Result<ApiResponse> answer = Error::Msg("");
  if (policy->has_value()) {
    json::object body;
    body["network"] = **policy;
    answer = Check(client, client.Call(Method::kPut, SandboxTarget(o.id, "/network"), body));
  } else {
    answer = Check(client, client.Call(Method::kGet, SandboxTarget(o.id, "/network")));
  }
  if (!answer.ok()) return Fail(what, answer.error().message());
  if (o.json) {
    PrintBody(*answer);
    return 0;
  }
  auto parsed = answer->Json();
  const json::object* top = parsed.ok() ? parsed->if_object() : nullptr;
  if (top == nullptr) return Fail(what, "the daemon's answer is not a JSON object");
  std::printf("network: %s\n", EscapeControl(PolicyText(top->if_contains("network"))).c_str());
  const json::value* address = top->if_contains("address");
  std::printf("address: %s\n", address != nullptr && address->is_string()
                                   ? EscapeControl(address->get_string()).c_str()
                                   : "none (stopped, or no network)");
  return 0;
}

int Create(const Options& o, ApiClient& client) {
  std::string what = "create " + o.id;
  json::object body;
  json::object limits;
  bool options_given = false;
  if (o.image) {
    body["image"] = *o.image;
    options_given = true;
  }
  if (o.memory) {
    auto bytes = ParseBytes("--memory", *o.memory);
    if (!bytes.ok()) return Fail("create", bytes.error().message(), kExitUsage);
    // Said here, in the words `nsbox run --memory` uses for its own least (4M).
    if (*bytes < kMinSandboxMemory) {
      return Fail("create", "--memory '" + *o.memory + "': at least 16M is needed to start",
                  kExitUsage);
    }
    if (*bytes > kMaxSandboxMemory) {
      return Fail("create", "--memory '" + *o.memory + "': at most 1024T", kExitUsage);
    }
    limits["memoryBytes"] = *bytes;
  }
  if (o.disk) {
    auto bytes = ParseBytes("--disk", *o.disk);
    if (!bytes.ok()) return Fail("create", bytes.error().message(), kExitUsage);
    if (*bytes < isolate::kMinDiskBytes || *bytes > isolate::kMaxDiskBytes) {
      return Fail("create", "--disk '" + *o.disk + "': expected 16M to 8T", kExitUsage);
    }
    limits["diskBytes"] = *bytes;
  }
  if (o.pids) {
    auto pids = ParseCount("--pids", *o.pids, isolate::kMinPids, isolate::kMaxPids);
    if (!pids.ok()) return Fail("create", pids.error().message(), kExitUsage);
    limits["pids"] = *pids;
  }
  if (o.cpus) {
    auto cpus = ParseDecimal("--cpus", *o.cpus, isolate::kMinCpus, isolate::kMaxCpus);
    if (!cpus.ok()) return Fail("create", cpus.error().message(), kExitUsage);
    limits["cpus"] = *cpus;
  }
  if (!limits.empty()) {
    body["limits"] = std::move(limits);
    options_given = true;
  }
  if (o.idle_stop) {
    // "never" (or 0, as the API takes it): none, whatever the daemon's --idle-stop says.
    uint64_t ms = 0;
    if (*o.idle_stop != "never" && *o.idle_stop != "0") {
      auto parsed = ParseDurationMs("--idle-stop", *o.idle_stop, kMinIdleStopMs, kMaxIdleStopMs);
      if (!parsed.ok()) {
        return Fail("create", parsed.error().message() + ", or never", kExitUsage);
      }
      ms = *parsed;
    }
    body["idleStopMs"] = ms;
    options_given = true;
  }
  if (!o.env.empty()) {
    auto env = EnvObject(o.env);
    if (!env.ok()) return Fail("create", env.error().message(), kExitUsage);
    body["env"] = std::move(*env);
    options_given = true;
  }
  auto network = NetworkPolicyOf(o);
  if (!network.ok()) return Fail("create", network.error().message(), kExitUsage);
  if (network->has_value()) {
    body["network"] = std::move(**network);
    options_given = true;
  }
  auto answer = Check(client, client.Call(Method::kPut, SandboxTarget(o.id), body));
  if (!answer.ok()) return Fail(what, answer.error().message());
  bool created = answer->status == 201;
  if (o.json) {
    PrintBody(*answer);
  } else {
    std::printf("%s %s\n", o.id.c_str(), created ? "created" : "existed");
  }
  if (!created && options_given) {
    std::fprintf(stderr,
                 "nsbox: create %s: the sandbox existed; options apply at creation only, its "
                 "configuration is unchanged\n",
                 o.id.c_str());
  }
  return 0;
}

int List(const Options& o, ApiClient& client) {
  auto answer = Check(client, client.Call(Method::kGet, "/v1/sandboxes"));
  if (!answer.ok()) return Fail("ls", answer.error().message());
  if (o.json) {
    PrintBody(*answer);
    return 0;
  }
  auto parsed = answer->Json();
  const json::object* top = parsed.ok() ? parsed->if_object() : nullptr;
  const json::value* list = top != nullptr ? top->if_contains("sandboxes") : nullptr;
  if (list == nullptr || !list->is_array()) {
    return Fail("ls", "the daemon's answer has no \"sandboxes\" list");
  }
  std::vector<std::vector<std::string>> rows;
  for (const json::value& item : list->get_array()) {
    if (!item.is_object()) continue;
    const json::object& s = item.get_object();
    rows.push_back(
        {JsonText(s, "id"), JsonText(s, "state"), JsonText(s, "image"), JsonText(s, "createdAt")});
  }
  std::sort(rows.begin(), rows.end());
  rows.insert(rows.begin(), {"ID", "STATE", "IMAGE", "CREATED"});
  PrintTable(rows);
  return 0;
}

// stop and rm: each id in turn; the exit code is 1 if any failed.
int ForEachId(const Options& o, ApiClient& client, std::string_view verb) {
  int rc = 0;
  for (const std::string& id : o.ids) {
    Result<ApiResponse> answer = verb == "stop"
                                     ? client.Call(Method::kPost, SandboxTarget(id, "/stop"))
                                     : client.Call(Method::kDelete, SandboxTarget(id));
    answer = Check(client, std::move(answer));
    if (!answer.ok()) {
      rc = Fail(std::string(verb) + " " + id, answer.error().message());
      if (client.connect_failed()) break;
      continue;
    }
    std::printf("%s\n", id.c_str());
  }
  return rc;
}

}  // namespace nsbox::runtime::cli

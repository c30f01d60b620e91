// A sandbox's id, its names on the host and inside, and its config.json (registry.h).

#include <algorithm>
#include <boost/json.hpp>
#include <boost/uuid/name_generator_sha1.hpp>
#include <boost/uuid/uuid_io.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "base/log.h"
#include "base/utf8.h"
#include "runtime/limits_json.h"
#include "runtime/registry.h"
#include "runtime/registry_internal.h"

namespace nsbox::runtime {

namespace json = boost::json;

namespace {

// The namespace of nsbox's name-based UUIDs (any fixed UUID will do; this one is random).
constexpr boost::uuids::uuid kIdNamespace = {{0x6e, 0x73, 0x62, 0x6f, 0x78, 0x2d, 0x4b, 0x1e, 0x9d,
                                              0x3a, 0x51, 0x0c, 0x7e, 0x22, 0x90, 0xa4}};

}  // namespace

std::string FormatCpus(double cpus) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", cpus);
  return buf;
}

double CanonicalCpus(double cpus) { return std::strtod(FormatCpus(cpus).c_str(), nullptr); }

std::optional<std::string> InvalidIdReason(std::string_view id) {
  if (id.empty()) return "a sandbox id must not be empty";
  if (id.size() > 256) {
    return "a sandbox id has at most 256 bytes; this one has " + std::to_string(id.size());
  }
  if (!utf8::IsValid(id)) return "a sandbox id must be valid UTF-8";
  for (size_t i = 0; i < id.size(); ++i) {
    auto c = static_cast<unsigned char>(id[i]);
    // C0 controls and DEL; C1 controls (U+0080..U+009F) are C2 80..C2 9F in UTF-8.
    bool c1 = c == 0xC2 && i + 1 < id.size() && static_cast<unsigned char>(id[i + 1]) <= 0x9F;
    if (c < 0x20 || c == 0x7F || c1) {
      char code[16];
      if (c1) {
        std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned char>(id[i + 1]));
      } else {
        std::snprintf(code, sizeof code, "0x%02X", c);
      }
      return "a sandbox id must not contain control characters (" + std::string(code) +
             " at byte " + std::to_string(i) + ")";
    }
  }
  return std::nullopt;
}

std::string IdHash(std::string_view id) {
  boost::uuids::name_generator_sha1 generate(kIdNamespace);
  boost::uuids::uuid u = generate(id.data(), id.size());
  std::string text = boost::uuids::to_string(u);
  text.erase(std::remove(text.begin(), text.end(), '-'), text.end());
  return text;
}

std::string HostnameFor(std::string_view id, std::string_view hash) {
  bool ok = !id.empty() && id.size() <= 63 && id.front() != '-' && id.back() != '-';
  for (char c : id) {
    ok = ok &&
         ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-');
  }
  return ok ? std::string(id) : "sb-" + std::string(hash.substr(0, 12));
}

json::object LimitsJson(const SandboxLimits& limits) {
  json::object o;
  if (limits.memory_bytes) o["memoryBytes"] = *limits.memory_bytes;
  if (limits.pids) o["pids"] = *limits.pids;
  if (limits.cpus) o["cpus"] = *limits.cpus;
  if (limits.output_bytes) o["outputBytes"] = *limits.output_bytes;
  if (limits.disk_bytes) o["diskBytes"] = *limits.disk_bytes;
  return o;
}

std::string EncodeConfig(const SandboxConfig& c) {
  json::object o;
  o["version"] = 1;
  o["id"] = c.id;
  o["image"] = c.image;
  if (!c.image_id.empty()) o["imageId"] = c.image_id;
  o["cwd"] = c.cwd;
  json::object env;
  for (const auto& [k, v] : c.env) env[k] = v;
  o["env"] = std::move(env);
  o["limits"] = LimitsJson(c.limits);
  o["network"] = net::PolicyToJson(c.network);
  o["createdAt"] = c.created_at;
  if (c.idle_stop_ms) o["idleStopMs"] = *c.idle_stop_ms;
  return json::serialize(o) + "\n";
}

Result<SandboxConfig> DecodeConfig(std::string_view text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) return Error(EINVAL, "config.json is not JSON: " + ec.message());
  const json::object* o = v.if_object();
  if (o == nullptr) return Error(EINVAL, "config.json is not a JSON object");
  auto str = [&](const char* key, std::string* out) -> Status {
    const json::value* f = o->if_contains(key);
    if (f == nullptr || !f->is_string()) {
      return Error(EINVAL, std::string("config.json: \"") + key + "\" is not a string");
    }
    *out = std::string(f->get_string());
    return Ok();
  };
  SandboxConfig c;
  NSBOX_TRY(str("id", &c.id));
  NSBOX_TRY(str("image", &c.image));
  NSBOX_TRY(str("cwd", &c.cwd));
  if (const json::value* network = o->if_contains("network")) {
    auto policy = net::ParseStoredPolicy(*network);
    if (!policy.ok()) return Error(EINVAL, "config.json: " + policy.error().message());
    c.network = std::move(policy).value();
  }
  NSBOX_TRY(str("createdAt", &c.created_at));
  if (auto reason = InvalidIdReason(c.id)) return Error(EINVAL, "config.json: " + *reason);
  if (c.image != images::kHostImage) {
    if (auto reason = images::InvalidImageNameReason(c.image)) {
      return Error(EINVAL, "config.json: " + *reason);
    }
    NSBOX_TRY(str("imageId", &c.image_id));
    if (c.image_id.size() != 32 ||
        c.image_id.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return Error(EINVAL, "config.json: \"imageId\" is not 32 hex digits");
    }
  }
  if (c.cwd.empty() || c.cwd[0] != '/') return Error(EINVAL, "config.json: cwd is not absolute");
  if (const json::value* env = o->if_contains("env")) {
    if (!env->is_object()) return Error(EINVAL, "config.json: \"env\" is not an object");
    for (const auto& [k, val] : env->get_object()) {
      if (!val.is_string()) return Error(EINVAL, "config.json: env value is not a string");
      c.env.emplace_back(std::string(k), std::string(val.get_string()));
    }
    std::sort(c.env.begin(), c.env.end());
  }
  if (const json::value* limits = o->if_contains("limits")) {
    if (!limits->is_object()) return Error(EINVAL, "config.json: \"limits\" is not an object");
    const json::object& l = limits->get_object();
    // A hand-edited file may hold anything: a negative, fractional or huge number is an error,
    // never an exception (case found by fuzz_config).
    auto count = [&](const char* key, std::optional<uint64_t>* out) -> Status {
      const json::value* field = l.if_contains(key);
      if (field == nullptr || field->is_null()) return Ok();
      boost::system::error_code number_ec;
      uint64_t n = field->is_number() ? field->to_number<uint64_t>(number_ec) : 0;
      if (!field->is_number() || number_ec) {
        return Error(EINVAL, std::string("config.json: limits.") + key +
                                 " is not a whole number of at most 2^64-1");
      }
      *out = n;
      return Ok();
    };
    NSBOX_TRY(count("memoryBytes", &c.limits.memory_bytes));
    NSBOX_TRY(count("pids", &c.limits.pids));
    NSBOX_TRY(count("outputBytes", &c.limits.output_bytes));
    NSBOX_TRY(count("diskBytes", &c.limits.disk_bytes));
    if (c.limits.disk_bytes && (*c.limits.disk_bytes < isolate::kMinDiskBytes ||
                                *c.limits.disk_bytes > isolate::kMaxDiskBytes ||
                                *c.limits.disk_bytes % isolate::kDiskBlockBytes != 0)) {
      return Error(EINVAL,
                   "config.json: limits.diskBytes is not a multiple of 4096 from 16 MiB to 8 TiB");
    }
    if (const json::value* cpu = l.if_contains("cpus"); cpu != nullptr && !cpu->is_null()) {
      boost::system::error_code number_ec;
      double cpus = cpu->is_number() ? cpu->to_number<double>(number_ec) : 0;
      if (!cpu->is_number() || number_ec ||
          !(cpus >= isolate::kMinCpus && cpus <= isolate::kMaxCpus)) {
        return Error(EINVAL, "config.json: limits.cpus is not a number of CPUs from 0.01 to 4096");
      }
      c.limits.cpus = CanonicalCpus(cpus);
    }
  }
  if (const json::value* idle = o->if_contains("idleStopMs"); idle != nullptr && !idle->is_null()) {
    boost::system::error_code number_ec;
    uint64_t ms = idle->is_number() ? idle->to_number<uint64_t>(number_ec) : 0;
    if (!idle->is_number() || number_ec || !ValidIdleStopMs(ms)) {
      return Error(EINVAL,
                   "config.json: \"idleStopMs\" is neither 0 nor a whole number of ms from " +
                       std::to_string(kMinIdleStopMs) + " to " + std::to_string(kMaxIdleStopMs));
    }
    c.idle_stop_ms = ms;
  }
  return c;
}

}  // namespace nsbox::runtime

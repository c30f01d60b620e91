#include "runtime/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace nsbox::runtime {
namespace {

// Seeded at zero so that every series a dashboard expects exists from the first scrape:
// rate() and absent() work without waiting for the first event of each kind.
constexpr std::string_view kExecReasons[] = {"exited",       "signaled", "timeout", "cancelled",
                                             "output_limit", "oom",      "stopped"};
constexpr std::string_view kKillReasons[] = {"timeout", "cancelled", "output_limit", "stopped"};
constexpr std::string_view kFileVerbs[] = {"readFile", "writeFile", "stat", "readdir",
                                           "exists",   "mkdir",     "rm"};
// RFC 9110 section 9 and PATCH (RFC 5789). The method is whatever the client sent, so anything
// else is folded into "other".
constexpr std::string_view kMethods[] = {"GET",     "HEAD",    "POST",  "PUT",  "DELETE",
                                         "CONNECT", "OPTIONS", "TRACE", "PATCH"};
constexpr std::string_view kOther = "other";

// A label value as the format wants it: backslash, double quote and line feed escaped.
void AppendLabelValue(std::string& out, std::string_view value) {
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
}

std::string Label(std::string_view name, std::string_view value) {
  std::string out(name);
  out += "=\"";
  AppendLabelValue(out, value);
  out += '"';
  return out;
}

// A float as Go's strconv.FormatFloat(v, 'g', -1, 64) writes it, which is what the Prometheus
// client libraries print (so `le` values look the same as everyone else's): the shortest digits
// that read back exactly, in plain notation for exponents -4..5, else as 1.5e+06.
void AppendFloat(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
    return;
  }
  // Shortest round-trip digits in scientific notation first, to learn the decimal exponent
  // exactly; then plain notation if the exponent is in Go's range for it.
  char buf[64];  // the longest shortest double is 24 characters
  auto result = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  const std::string_view scientific(buf, static_cast<size_t>(result.ptr - buf));
  const size_t e = scientific.find('e');
  int exponent = 0;
  for (char c : scientific.substr(e + 2)) exponent = exponent * 10 + (c - '0');
  if (scientific[e + 1] == '-') exponent = -exponent;
  if (exponent >= -4 && exponent < 6) {
    result = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed);
  }
  out.append(buf, result.ptr);
}

void AppendFamilyHeader(std::string& out, std::string_view name, std::string_view type,
                        std::string_view help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;  // constant text below: no backslash or newline to escape
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void AppendSample(std::string& out, std::string_view name, std::string_view labels,
                  uint64_t value) {
  out += name;
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  out += ' ';
  out += std::to_string(value);
  out += '\n';
}

void AppendCounters(std::string& out, std::string_view name, std::string_view label_name,
                    const std::map<std::string, uint64_t, std::less<>>& counters) {
  for (const auto& [value, count] : counters)
    AppendSample(out, name, Label(label_name, value), count);
}

}  // namespace

Metrics::Histogram::Histogram(std::span<const double> bucket_bounds)
    : bounds(bucket_bounds), counts(bucket_bounds.size() + 1, 0) {}

void Metrics::Histogram::Observe(double seconds) {
  if (!(seconds >= 0)) seconds = 0;  // also NaN: a clock that went backwards is not a latency
  // `le` buckets: a value equal to a bound belongs to that bound's bucket.
  const auto it = std::lower_bound(bounds.begin(), bounds.end(), seconds);
  ++counts[static_cast<size_t>(it - bounds.begin())];
  sum += seconds;
  ++count;
}

Metrics::Metrics() : exec_duration_(kExecDurationBuckets) {
  for (std::string_view reason : kExecReasons) execs_finished_.emplace(reason, 0);
  for (std::string_view reason : kKillReasons) kills_.emplace(reason, 0);
  for (std::string_view verb : kFileVerbs) {
    file_verb_duration_.emplace(verb, Histogram(kFileVerbDurationBuckets));
  }
}

uint64_t& Metrics::CounterFor(Counters& counters, std::string_view label) {
  if (auto it = counters.find(label); it != counters.end()) return it->second;
  if (counters.size() >= kMaxLabelValues) label = kOther;
  return counters.try_emplace(std::string(label), 0).first->second;
}

void Metrics::ExecStarted() {
  std::lock_guard lock(mu_);
  ++execs_started_;
  ++execs_running_;
}

void Metrics::ExecSessionsRetained(int delta) {
  std::lock_guard lock(mu_);
  if (delta > 0) ++exec_sessions_retained_;
  if (delta < 0 && exec_sessions_retained_ > 0) --exec_sessions_retained_;
}

void Metrics::PortsExposed(int delta) {
  std::lock_guard lock(mu_);
  if (delta > 0) ++ports_exposed_;
  if (delta < 0 && ports_exposed_ > 0) --ports_exposed_;
}

void Metrics::PortConnection() {
  std::lock_guard lock(mu_);
  ++port_connections_;
}

void Metrics::IdleStop() {
  std::lock_guard lock(mu_);
  ++idle_stops_;
}

void Metrics::ExecFinished(std::string_view reason, double seconds) {
  std::lock_guard lock(mu_);
  // Never below zero, even if a caller reports an exec it did not report as started.
  if (execs_running_ > 0) --execs_running_;
  ++CounterFor(execs_finished_, reason);
  exec_duration_.Observe(seconds);
}

void Metrics::FileVerb(std::string_view verb, double seconds) {
  std::lock_guard lock(mu_);
  auto it = file_verb_duration_.find(verb);
  if (it == file_verb_duration_.end()) {
    if (file_verb_duration_.size() >= kMaxLabelValues) verb = kOther;
    it = file_verb_duration_.try_emplace(std::string(verb), kFileVerbDurationBuckets).first;
  }
  it->second.Observe(seconds);
}

void Metrics::BytesIn(uint64_t n) {
  std::lock_guard lock(mu_);
  bytes_in_ += n;
}

void Metrics::BytesOut(uint64_t n) {
  std::lock_guard lock(mu_);
  bytes_out_ += n;
}

void Metrics::Kill(std::string_view reason) {
  std::lock_guard lock(mu_);
  ++CounterFor(kills_, reason);
}

void Metrics::Error(std::string_view code) {
  std::lock_guard lock(mu_);
  ++CounterFor(errors_, code);
}

void Metrics::Request(std::string_view method, int status) {
  const bool known =
      std::find(std::begin(kMethods), std::end(kMethods), method) != std::end(kMethods);
  std::lock_guard lock(mu_);
  ++requests_[{std::string(known ? method : kOther), status}];
}

void Metrics::RenderHistogram(std::string& out, std::string_view name, std::string_view labels,
                              const Histogram& histogram) {
  const std::string prefix = labels.empty() ? std::string() : std::string(labels) + ",";
  const std::string bucket = std::string(name) + "_bucket";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= histogram.bounds.size(); ++i) {
    cumulative += histogram.counts[i];
    std::string le = prefix + "le=\"";
    if (i < histogram.bounds.size()) {
      AppendFloat(le, histogram.bounds[i]);
    } else {
      le += "+Inf";
    }
    le += '"';
    AppendSample(out, bucket, le, cumulative);
  }
  out += name;
  out += "_sum";
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  out += ' ';
  AppendFloat(out, histogram.sum);
  out += '\n';
  AppendSample(out, std::string(name) + "_count", labels, histogram.count);
}

std::string Metrics::Render(const std::map<std::string, uint64_t>& sandboxes_by_state) const {
  std::map<std::string, uint64_t> states = {{"running", 0}, {"stopped", 0}};
  for (const auto& [state, count] : sandboxes_by_state) states[state] = count;

  std::string out;
  out.reserve(16384);
  std::lock_guard lock(mu_);

  AppendFamilyHeader(out, "nsbox_sandboxes", "gauge", "Sandboxes known to nsboxd, by state.");
  for (const auto& [state, count] : states) {
    AppendSample(out, "nsbox_sandboxes", Label("state", state), count);
  }

  AppendFamilyHeader(out, "nsbox_execs_started_total", "counter", "Commands started by exec.");
  AppendSample(out, "nsbox_execs_started_total", "", execs_started_);

  AppendFamilyHeader(out, "nsbox_execs_running", "gauge", "Commands running now.");
  AppendSample(out, "nsbox_execs_running", "", execs_running_);

  AppendFamilyHeader(out, "nsbox_exec_sessions_retained", "gauge",
                     "Ended commands whose output is kept for re-attach.");
  AppendSample(out, "nsbox_exec_sessions_retained", "", exec_sessions_retained_);

  AppendFamilyHeader(out, "nsbox_ports_exposed", "gauge",
                     "Sandbox ports the daemon listens for on the host (POST .../ports).");
  AppendSample(out, "nsbox_ports_exposed", "", ports_exposed_);

  AppendFamilyHeader(out, "nsbox_port_connections_total", "counter",
                     "Connections accepted on exposed ports and relayed into a sandbox.");
  AppendSample(out, "nsbox_port_connections_total", "", port_connections_);

  AppendFamilyHeader(out, "nsbox_idle_stops_total", "counter",
                     "Sandboxes stopped because they were idle for their idleStopMs.");
  AppendSample(out, "nsbox_idle_stops_total", "", idle_stops_);

  AppendFamilyHeader(out, "nsbox_execs_finished_total", "counter",
                     "Commands that ended, by how they ended (the exec answer's reason).");
  AppendCounters(out, "nsbox_execs_finished_total", "reason", execs_finished_);

  AppendFamilyHeader(out, "nsbox_exec_duration_seconds", "histogram",
                     "Wall-clock duration of commands, from start to exit.");
  RenderHistogram(out, "nsbox_exec_duration_seconds", "", exec_duration_);

  AppendFamilyHeader(out, "nsbox_file_verb_duration_seconds", "histogram",
                     "Latency of the file verbs, by verb.");
  for (const auto& [verb, histogram] : file_verb_duration_) {
    RenderHistogram(out, "nsbox_file_verb_duration_seconds", Label("verb", verb), histogram);
  }

  AppendFamilyHeader(out, "nsbox_bytes_in_total", "counter",
                     "Bytes of request bodies and uploads received from clients.");
  AppendSample(out, "nsbox_bytes_in_total", "", bytes_in_);

  AppendFamilyHeader(out, "nsbox_bytes_out_total", "counter",
                     "Bytes of response bodies sent to clients.");
  AppendSample(out, "nsbox_bytes_out_total", "", bytes_out_);

  AppendFamilyHeader(out, "nsbox_kills_total", "counter", "Process trees nsbox killed, by reason.");
  AppendCounters(out, "nsbox_kills_total", "reason", kills_);

  AppendFamilyHeader(out, "nsbox_errors_total", "counter", "Error responses, by API error code.");
  AppendCounters(out, "nsbox_errors_total", "code", errors_);

  AppendFamilyHeader(out, "nsbox_http_requests_total", "counter",
                     "HTTP responses, by request method and status.");
  for (const auto& [key, count] : requests_) {
    AppendSample(out, "nsbox_http_requests_total",
                 Label("method", key.first) + "," + Label("status", std::to_string(key.second)),
                 count);
  }
  return out;
}

std::string RenderPool(size_t ready, size_t size, size_t adopted_ahead) {
  std::string out;
  AppendFamilyHeader(out, "nsbox_pool_ready", "gauge",
                     "Jails of the host image started ahead and waiting for a sandbox.");
  AppendSample(out, "nsbox_pool_ready", "", ready);
  AppendFamilyHeader(out, "nsbox_pool_size", "gauge", "Jails the pool keeps ready (--pool).");
  AppendSample(out, "nsbox_pool_size", "", size);
  AppendFamilyHeader(out, "nsbox_pool_adopted_ahead", "gauge",
                     "Jails of the pool adopted ahead for the next new sandbox's directory.");
  AppendSample(out, "nsbox_pool_adopted_ahead", "", adopted_ahead);
  return out;
}

std::string RenderTrash(size_t pending, uint64_t failures) {
  std::string out;
  AppendFamilyHeader(out, "nsbox_sandbox_removals_pending", "gauge",
                     "Deleted sandboxes whose files are not all removed yet (retried).");
  AppendSample(out, "nsbox_sandbox_removals_pending", "", pending);
  AppendFamilyHeader(out, "nsbox_sandbox_removal_failures_total", "counter",
                     "Removals of a deleted sandbox's files that failed, retries included.");
  AppendSample(out, "nsbox_sandbox_removal_failures_total", "", failures);
  return out;
}

std::string RenderNetworkConnections(const std::map<std::string, NetworkConnections>& by_sandbox) {
  std::string out;
  AppendFamilyHeader(out, "nsbox_network_connections_total", "counter",
                     "New connections of sandboxes with a network, by verdict of the filter.");
  for (const auto& [id, counts] : by_sandbox) {
    const std::string sandbox = Label("sandbox", id);
    AppendSample(out, "nsbox_network_connections_total",
                 sandbox + "," + Label("verdict", "allowed"), counts.allowed);
    AppendSample(out, "nsbox_network_connections_total",
                 sandbox + "," + Label("verdict", "refused"), counts.refused);
  }
  return out;
}

}  // namespace nsbox::runtime

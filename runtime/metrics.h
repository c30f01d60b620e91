#pragma once

// nsboxd's `GET /metrics` (api.md "Service"): counters, gauges and latency histograms in the
// Prometheus text exposition format, version 0.0.4, formatted by hand. Every method is safe to
// call from any thread; one mutex guards everything, as each update is a few increments.

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nsbox::runtime {

// The Content-Type of Render()'s output.
inline constexpr std::string_view kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

// Upper bounds of the histogram buckets, in seconds (a `+Inf` bucket follows the last).
inline constexpr double kExecDurationBuckets[] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
inline constexpr double kFileVerbDurationBuckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                      1,      2.5,     5,      10};

// A label family never grows beyond this many values: past it, new values are counted under
// "other", so that a client cannot grow the daemon's memory or the scrape without bound.
inline constexpr size_t kMaxLabelValues = 64;

class Metrics {
 public:
  Metrics();

  void ExecStarted();
  // reason: "exited", "signaled", "timeout", "cancelled", "output_limit", "oom", "stopped".
  // seconds: the command's wall-clock duration (negative or NaN counts as 0).
  void ExecFinished(std::string_view reason, double seconds);
  // An ended exec kept for re-attach (docs/exec.md) gained (+1) or dropped (-1).
  void ExecSessionsRetained(int delta);
  // Exposed ports (runtime/ports.h): one more (+1) or fewer (-1); a connection accepted on one.
  void PortsExposed(int delta);
  void PortConnection();
  // A sandbox stopped by its idleStopMs (docs/daemon.md "Idle stop").
  void IdleStop();
  // verb: "readFile", "writeFile", "stat", "readdir", "exists", "mkdir", "rm".
  void FileVerb(std::string_view verb, double seconds);
  void BytesIn(uint64_t n);   // request bodies / uploads received from clients
  void BytesOut(uint64_t n);  // response bodies sent
  // A kill nsbox made: "timeout", "cancelled", "output_limit", "stopped".
  void Kill(std::string_view reason);
  // Every error response, by API code ("ENOENT", "invalid_request", ...).
  void Error(std::string_view code);
  // Every HTTP response. A method outside RFC 9110's list is counted as "other".
  void Request(std::string_view method, int status);

  // The whole exposition. sandboxes_by_state: e.g. {{"running", 3}, {"stopped", 5}}; "running"
  // and "stopped" are always printed (0 when absent), any other state as given.
  std::string Render(const std::map<std::string, uint64_t>& sandboxes_by_state) const;

 private:
  struct Histogram {
    explicit Histogram(std::span<const double> bucket_bounds);
    void Observe(double seconds);

    std::span<const double> bounds;
    std::vector<uint64_t> counts;  // per bucket, not cumulative; the last one is +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  using Counters = std::map<std::string, uint64_t, std::less<>>;

  static uint64_t& CounterFor(Counters& counters, std::string_view label);
  static void RenderHistogram(std::string& out, std::string_view name, std::string_view labels,
                              const Histogram& histogram);

  mutable std::mutex mu_;
  uint64_t execs_started_ = 0;
  uint64_t execs_running_ = 0;
  uint64_t exec_sessions_retained_ = 0;
  uint64_t ports_exposed_ = 0;
  uint64_t port_connections_ = 0;
  uint64_t idle_stops_ = 0;
  Counters execs_finished_;  // by reason
  Histogram exec_duration_;
  std::map<std::string, Histogram, std::less<>> file_verb_duration_;  // by verb
  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
  Counters kills_;                                            // by reason
  Counters errors_;                                           // by code
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // by (method, status)
};

// The connections the network filter allowed and refused, per sandbox id (docs/network.md), as
// the family nsbox_network_connections_total{sandbox, verdict}. Read from nsbox-net's counters
// at each scrape, so they are not part of Metrics; one sample pair per sandbox with a network.
struct NetworkConnections {
  uint64_t allowed = 0;
  uint64_t refused = 0;
};
std::string RenderNetworkConnections(const std::map<std::string, NetworkConnections>& by_sandbox);

// nsbox_pool_ready, nsbox_pool_size and nsbox_pool_adopted_ahead: the jails started ahead
// (docs/daemon.md "The pool").
std::string RenderPool(size_t ready, size_t size, size_t adopted_ahead);

// nsbox_sandbox_removals_pending and nsbox_sandbox_removal_failures_total: deleted sandboxes
// whose files are not all removed yet, and the removals that failed (runtime/trash.h,
// docs/daemon.md "Deleting a sandbox").
std::string RenderTrash(size_t pending, uint64_t failures);

}  // namespace nsbox::runtime

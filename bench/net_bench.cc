// nsbox-net-bench: the cost of a sandbox's network (issue 9), side by side with the host in one
// run, against the tests' small internet (tests/common/test_inet.h). It starts its own test
// internet and its own daemon (a network range of its own, the test internet's DNS server as
// the upstream) on a private socket and state directory.
//
//   sudo build/bench/nsbox-net-bench [--runs N] [--downloads N] [--bytes N] [--held N]
//                                    [--nsbox PATH] [--dir DIR (default /var/tmp)]
//                                    [--log-level LEVEL]
//
// Medians with p10/p90; in each run the sandbox and the host are measured one after the other
// (order alternating), so that the machine's noise hits both:
// 1. HTTP GET of allowed.test/ by curl, from a sandbox with {"allow": ["allowed.test"]} (name
//    through the daemon's resolver and the filter) vs from the host (curl --resolve, no DNS):
//    curl's own time_namelookup, time_connect and time_total;
// 2. a download of --bytes (1 GiB) with `curl -o /dev/null`, sandbox vs host: MB/s;
// 3. creation + first exec (PUT a new id + POST exec `true`) of a networked sandbox vs a "none"
//    one.
// With --held N, N other sandboxes with an allowlist run throughout (what grows with them shows).

#include <unistd.h>

#include <boost/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "bench/bench_daemon.h"
#include "runtime/api_client.h"
#include "tests/common/test_inet.h"

namespace {

using nsbox::bench::Clock;
using nsbox::bench::Daemon;
using nsbox::bench::Die;
using nsbox::bench::Micros;
using nsbox::bench::Must;
using nsbox::bench::Stats;
using nsbox::bench::Summarize;
using nsbox::runtime::ApiClient;
using nsbox::runtime::ApiEndpoint;
using nsbox::runtime::Method;
using nsbox::runtime::SandboxTarget;

void Row(const char* what, const Stats& s, const char* unit) {
  std::printf("| %s | %.1f | %.1f | %.1f | %s |\n", what, s.median, s.p10, s.p90, unit);
  std::fflush(stdout);
}

// Runs `command` in the sandbox; its stdout (dies unless it exits 0).
std::string ExecOut(ApiClient& api, const std::string& id, const std::string& command) {
  boost::json::object body;
  body["command"] = command;
  auto r = Must(api.Call(Method::kPost, SandboxTarget(id, "/exec"), body), "exec");
  auto json = r.Json();
  if (!json.ok() || !json->is_object() || json->as_object().at("exitCode").as_int64() != 0) {
    Die("exec `" + command + "` in " + id + ": " + r.body);
  }
  return std::string(json->as_object().at("stdout").as_string());
}

std::string HostOut(const std::vector<std::string>& argv) {
  std::string out;
  const int rc = nsbox::testinet::RunCommand(argv, &out, std::chrono::minutes(10));
  if (rc != 0) Die(argv[0] + " on the host: exit " + std::to_string(rc) + ": " + out);
  return out;
}

// curl -w fields, in the order asked for.
std::vector<double> Fields(const std::string& text, size_t n) {
  std::istringstream in(text);
  std::vector<double> v(n, -1);
  for (size_t i = 0; i < n; ++i) in >> v[i];
  if (v.back() < 0) Die("unexpected curl output: " + text);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  nsbox::bench::g_program = "nsbox-net-bench";
  int runs = 50, downloads = 5, held = 0;
  unsigned long long bytes = 1ULL << 30;
  std::string nsbox, log_level = "info", base = "/var/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--runs") {
      runs = std::atoi(argv[i + 1]);
    } else if (a == "--downloads") {
      downloads = std::atoi(argv[i + 1]);
    } else if (a == "--bytes") {
      bytes = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (a == "--nsbox") {
      nsbox = argv[i + 1];
    } else if (a == "--log-level") {
      log_level = argv[i + 1];
    } else if (a == "--dir") {
      base = argv[i + 1];
    } else if (a == "--held") {
      held = std::atoi(argv[i + 1]);
    } else {
      Die("unknown flag " + a +
          " (--runs N --downloads N --bytes N --held N --nsbox PATH --log-level L --dir D)");
    }
  }
  if (geteuid() != 0) Die("run as root");
  if (runs < 1 || downloads < 1) Die("--runs and --downloads must be at least 1");
  if (held < 0 || held > 3000) Die("--held is 0 to 3000");
  auto self = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  if (nsbox.empty()) nsbox = (self / "../runtime/nsbox").lexically_normal().string();
  if (access(nsbox.c_str(), X_OK) != 0) Die("no nsbox at " + nsbox + " (--nsbox PATH)");

  // Die() exits without unwinding: the test internet is removed by an atexit handler then.
  static nsbox::testinet::TestInternet inet;
  std::atexit([] { inet.Stop(); });
  if (!inet.Start()) Die("the test internet: " + inet.error());
  // A /24 holds 253 sandboxes; with --held, a /20 (4093) of 10.216.0.0/16.
  const std::string range = held == 0 ? "10.216." + std::to_string(getpid() % 250 + 1) + ".0/24"
                                      : "10.216." + std::to_string(getpid() % 16 * 16) + ".0/20";
  const std::string dir = base + "/nsbox-net-bench-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  Daemon daemon;
  daemon.Start(nsbox, dir, log_level,
               {"--network-range", range, "--dns-upstream", inet.dns_upstream()});
  ApiClient api(ApiEndpoint::Unix(daemon.socket));

  boost::json::object allow_body;
  allow_body["network"] = boost::json::parse(R"({"allow": ["allowed.test"]})");
  const std::string sb = "net-bench";
  Must(api.Call(Method::kPut, SandboxTarget(sb), allow_body), "PUT", 201);
  // --held N: that many other sandboxes with an allowlist, running, during every measurement
  // (each has its chain, sets and counters in the table; what grows with them shows).
  for (int i = 0; i < held; ++i) {
    const std::string id = "held-" + std::to_string(i);
    Must(api.Call(Method::kPut, SandboxTarget(id), allow_body), "PUT", 201);
    Must(api.Call(Method::kPost, SandboxTarget(id, "/exec"),
                  boost::json::object{{"command", "true"}}),
         "exec");
  }
  const std::string resolve = "allowed.test:80:" + inet.allowed_address();
  const std::string w = "%{time_namelookup} %{time_connect} %{time_total}";
  // Warm-up: both paths once (the first exec, the resolver's first query).
  ExecOut(api, sb, "curl -sS -o /dev/null http://allowed.test/");
  HostOut({"curl", "-sS", "--noproxy", "*", "-o", "/dev/null", "--resolve", resolve,
           "http://allowed.test/"});

  std::printf(
      "nsbox-net-bench: %d runs, %d downloads of %llu bytes, %d other networked sandboxes held; "
      "range %s, test internet %s\n\n",
      runs, downloads, bytes, held, range.c_str(), inet.allowed_address().c_str());
  std::printf("| measurement | median | p10 | p90 | unit |\n|---|---|---|---|---|\n");

  // 1. GET latency.
  std::vector<double> sb_dns, sb_connect, sb_total, host_connect, host_total;
  for (int i = 0; i < runs; ++i) {
    for (int k = 0; k < 2; ++k) {
      if ((i + k) % 2 == 0) {
        auto v = Fields(
            ExecOut(api, sb, "curl -sS -o /dev/null -w '" + w + "' http://allowed.test/"), 3);
        sb_dns.push_back(v[0] * 1e3);
        sb_connect.push_back((v[1] - v[0]) * 1e3);
        sb_total.push_back(v[2] * 1e3);
      } else {
        auto v = Fields(HostOut({"curl", "-sS", "--noproxy", "*", "-o", "/dev/null", "-w", w,
                                 "--resolve", resolve, "http://allowed.test/"}),
                        3);
        host_connect.push_back((v[1] - v[0]) * 1e3);
        host_total.push_back(v[2] * 1e3);
      }
    }
  }
  Row("GET allowed.test/, sandbox (allowlist): name lookup via the resolver", Summarize(sb_dns),
      "ms");
  Row("GET allowed.test/, sandbox: TCP connect", Summarize(sb_connect), "ms");
  Row("GET allowed.test/, host (--resolve): TCP connect", Summarize(host_connect), "ms");
  Row("GET allowed.test/, sandbox: total", Summarize(sb_total), "ms");
  Row("GET allowed.test/, host: total (no DNS)", Summarize(host_total), "ms");

  // 2. Throughput.
  const std::string bytes_url = "http://allowed.test/bytes?n=" + std::to_string(bytes);
  std::vector<double> sb_mbs, host_mbs;
  for (int i = 0; i < downloads; ++i) {
    for (int k = 0; k < 2; ++k) {
      if ((i + k) % 2 == 0) {
        auto v = Fields(ExecOut(api, sb,
                                "curl -sS -o /dev/null -w '%{size_download} %{time_total}' '" +
                                    bytes_url + "'"),
                        2);
        if (static_cast<unsigned long long>(v[0]) != bytes) Die("short download in the sandbox");
        sb_mbs.push_back(v[0] / v[1] / 1e6);
      } else {
        auto v =
            Fields(HostOut({"curl", "-sS", "--noproxy", "*", "-o", "/dev/null", "-w",
                            "%{size_download} %{time_total}", "--resolve", resolve, bytes_url}),
                   2);
        if (static_cast<unsigned long long>(v[0]) != bytes) Die("short download on the host");
        host_mbs.push_back(v[0] / v[1] / 1e6);
      }
    }
  }
  Row("download (curl -o /dev/null), sandbox", Summarize(sb_mbs), "MB/s");
  Row("download (curl -o /dev/null), host", Summarize(host_mbs), "MB/s");

  // 3. Creation + first exec.
  boost::json::object none_body;
  none_body["network"] = "none";
  boost::json::object true_body;
  true_body["command"] = "true";
  std::vector<double> net_ms, none_ms;
  for (int i = 0; i < runs; ++i) {
    for (int k = 0; k < 2; ++k) {
      const bool networked = (i + k) % 2 == 0;
      const std::string id = (networked ? "new-net-" : "new-none-") + std::to_string(i);
      const auto t0 = Clock::now();
      Must(api.Call(Method::kPut, SandboxTarget(id), networked ? allow_body : none_body), "PUT",
           201);
      Must(api.Call(Method::kPost, SandboxTarget(id, "/exec"), true_body), "exec");
      const double ms = Micros(Clock::now() - t0) / 1e3;
      (networked ? net_ms : none_ms).push_back(ms);
      Must(api.Call(Method::kDelete, SandboxTarget(id)), "DELETE", 204);
    }
  }
  Row("PUT + first exec `true`, {\"allow\": [...]}", Summarize(net_ms), "ms");
  Row("PUT + first exec `true`, \"none\"", Summarize(none_ms), "ms");

  Must(api.Call(Method::kDelete, SandboxTarget(sb)), "DELETE", 204);
  for (int i = 0; i < held; ++i) {
    Must(api.Call(Method::kDelete, SandboxTarget("held-" + std::to_string(i))), "DELETE", 204);
  }
  const bool clean = daemon.Stop();
  std::filesystem::remove_all(dir);
  inet.Stop();
  if (!clean) Die("the daemon did not exit 0 on SIGTERM; see " + daemon.log);
  return 0;
}

#include "runtime/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace nsbox::runtime {
namespace {

// A parsed exposition: every sample by its series text exactly as printed
// ("name{label=\"v\",...}"), and each family's TYPE. The parser checks the 0.0.4 grammar as it
// goes: comments are HELP or TYPE, each family's HELP and TYPE come once and before its samples,
// no series appears twice, and the text ends with a newline.
struct Exposition {
  std::map<std::string, std::string> samples;
  std::map<std::string, std::string> types;
  std::vector<std::string> order;  // series in the order printed

  const std::string& at(const std::string& series) const {
    static const std::string kMissing = "<missing>";
    auto it = samples.find(series);
    return it == samples.end() ? kMissing : it->second;
  }
};

// The family a sample belongs to: histogram samples carry a suffix.
std::string FamilyOf(const std::string& name, const std::map<std::string, std::string>& types) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      const std::string base = name.substr(0, name.size() - s.size());
      auto it = types.find(base);
      if (it != types.end() && it->second == "histogram") return base;
    }
  }
  return name;
}

Exposition Parse(const std::string& text) {
  Exposition e;
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  std::set<std::string> helped;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    EXPECT_FALSE(line.empty());
    if (line.rfind("# HELP ", 0) == 0) {
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(helped.insert(name).second) << "HELP twice: " << name;
      EXPECT_EQ(e.types.count(name), 0u) << "HELP after TYPE: " << name;
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream words(line.substr(7));
      std::string name, type;
      words >> name >> type;
      EXPECT_TRUE(helped.count(name)) << "TYPE without HELP: " << name;
      EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram") << line;
      EXPECT_TRUE(e.types.emplace(name, type).second) << "TYPE twice: " << name;
      continue;
    }
    EXPECT_NE(line[0], '#') << line;
    // The value follows the last space; label values here never hold a space before it ends.
    const size_t space = line.rfind(' ');
    EXPECT_NE(space, std::string::npos) << line;
    const std::string series = line.substr(0, space);
    const std::string name = series.substr(0, series.find('{'));
    EXPECT_EQ(name.rfind("nsbox_", 0), 0u) << line;
    EXPECT_TRUE(e.types.count(FamilyOf(name, e.types))) << "sample before its TYPE: " << line;
    EXPECT_TRUE(e.samples.emplace(series, line.substr(space + 1)).second) << "twice: " << line;
    e.order.push_back(series);
  }
  return e;
}

std::string Bucket(const std::string& family, const std::string& labels, const std::string& le) {
  return family + "_bucket{" + (labels.empty() ? "" : labels + ",") + "le=\"" + le + "\"}";
}

TEST(Metrics, FreshExpositionHasEveryFamilyAtZero) {
  Metrics m;
  const Exposition e = Parse(m.Render({}));
  EXPECT_EQ(e.types.at("nsbox_sandboxes"), "gauge");
  EXPECT_EQ(e.types.at("nsbox_execs_started_total"), "counter");
  EXPECT_EQ(e.types.at("nsbox_execs_running"), "gauge");
  EXPECT_EQ(e.types.at("nsbox_execs_finished_total"), "counter");
  EXPECT_EQ(e.types.at("nsbox_exec_duration_seconds"), "histogram");
  EXPECT_EQ(e.types.at("nsbox_file_verb_duration_seconds"), "histogram");
  EXPECT_EQ(e.types.at("nsbox_bytes_in_total"), "counter");
  EXPECT_EQ(e.types.at("nsbox_bytes_out_total"), "counter");
  EXPECT_EQ(e.types.at("nsbox_kills_total"), "counter");
  EXPECT_EQ(e.types.at("nsbox_errors_total"), "counter");
  EXPECT_EQ(e.types.at("nsbox_http_requests_total"), "counter");
  EXPECT_EQ(e.types.at("nsbox_exec_sessions_retained"), "gauge");
  EXPECT_EQ(e.types.at("nsbox_ports_exposed"), "gauge");
  EXPECT_EQ(e.types.at("nsbox_port_connections_total"), "counter");
  EXPECT_EQ(e.types.at("nsbox_idle_stops_total"), "counter");
  EXPECT_EQ(e.types.size(), 15u);

  EXPECT_EQ(e.at("nsbox_sandboxes{state=\"running\"}"), "0");
  EXPECT_EQ(e.at("nsbox_sandboxes{state=\"stopped\"}"), "0");
  EXPECT_EQ(e.at("nsbox_execs_started_total"), "0");
  EXPECT_EQ(e.at("nsbox_execs_running"), "0");
  EXPECT_EQ(e.at("nsbox_exec_sessions_retained"), "0");
  EXPECT_EQ(e.at("nsbox_ports_exposed"), "0");
  EXPECT_EQ(e.at("nsbox_port_connections_total"), "0");
  EXPECT_EQ(e.at("nsbox_idle_stops_total"), "0");
  EXPECT_EQ(e.at("nsbox_bytes_in_total"), "0");
  EXPECT_EQ(e.at("nsbox_bytes_out_total"), "0");
  for (const char* reason :
       {"exited", "signaled", "timeout", "cancelled", "output_limit", "oom", "stopped"}) {
    EXPECT_EQ(e.at("nsbox_execs_finished_total{reason=\"" + std::string(reason) + "\"}"), "0");
  }
  for (const char* reason : {"timeout", "cancelled", "output_limit", "stopped"}) {
    EXPECT_EQ(e.at("nsbox_kills_total{reason=\"" + std::string(reason) + "\"}"), "0");
  }
  for (const char* verb : {"readFile", "writeFile", "stat", "readdir", "exists", "mkdir", "rm"}) {
    const std::string labels = "verb=\"" + std::string(verb) + "\"";
    EXPECT_EQ(e.at(Bucket("nsbox_file_verb_duration_seconds", labels, "+Inf")), "0");
    EXPECT_EQ(e.at("nsbox_file_verb_duration_seconds_count{" + labels + "}"), "0");
    EXPECT_EQ(e.at("nsbox_file_verb_duration_seconds_sum{" + labels + "}"), "0");
  }
  EXPECT_EQ(e.at("nsbox_exec_duration_seconds_sum"), "0");
  EXPECT_EQ(e.at("nsbox_exec_duration_seconds_count"), "0");
}

TEST(Metrics, ExactValuesAfterAKnownSequence) {
  Metrics m;
  m.ExecStarted();
  m.ExecStarted();
  m.ExecStarted();
  m.ExecFinished("exited", 0.5);
  m.ExecFinished("timeout", 30);
  m.Kill("timeout");
  m.FileVerb("readFile", 0.0002);
  m.FileVerb("readFile", 0.003);
  m.FileVerb("stat", 0.00005);
  m.BytesIn(100);
  m.BytesIn(23);
  m.BytesOut(1ull << 40);
  m.Error("ENOENT");
  m.Error("ENOENT");
  m.Error("invalid_request");
  m.Request("GET", 200);
  m.Request("GET", 200);
  m.Request("POST", 404);
  m.Request("BREW", 400);
  m.IdleStop();
  m.IdleStop();

  const Exposition e = Parse(m.Render({{"running", 3}, {"stopped", 5}, {"starting", 1}}));
  EXPECT_EQ(e.at("nsbox_idle_stops_total"), "2");
  EXPECT_EQ(e.at("nsbox_sandboxes{state=\"running\"}"), "3");
  EXPECT_EQ(e.at("nsbox_sandboxes{state=\"stopped\"}"), "5");
  EXPECT_EQ(e.at("nsbox_sandboxes{state=\"starting\"}"), "1");
  EXPECT_EQ(e.at("nsbox_execs_started_total"), "3");
  EXPECT_EQ(e.at("nsbox_execs_running"), "1");
  EXPECT_EQ(e.at("nsbox_execs_finished_total{reason=\"exited\"}"), "1");
  EXPECT_EQ(e.at("nsbox_execs_finished_total{reason=\"timeout\"}"), "1");
  EXPECT_EQ(e.at("nsbox_execs_finished_total{reason=\"oom\"}"), "0");
  EXPECT_EQ(e.at("nsbox_kills_total{reason=\"timeout\"}"), "1");
  EXPECT_EQ(e.at("nsbox_kills_total{reason=\"cancelled\"}"), "0");

  const std::string exec = "nsbox_exec_duration_seconds";
  EXPECT_EQ(e.at(Bucket(exec, "", "0.25")), "0");
  EXPECT_EQ(e.at(Bucket(exec, "", "0.5")), "1");  // le: a value equal to the bound is in it
  EXPECT_EQ(e.at(Bucket(exec, "", "10")), "1");
  EXPECT_EQ(e.at(Bucket(exec, "", "30")), "2");
  EXPECT_EQ(e.at(Bucket(exec, "", "600")), "2");
  EXPECT_EQ(e.at(Bucket(exec, "", "+Inf")), "2");
  EXPECT_EQ(e.at(exec + "_sum"), "30.5");
  EXPECT_EQ(e.at(exec + "_count"), "2");

  const std::string verb = "nsbox_file_verb_duration_seconds";
  const std::string read = "verb=\"readFile\"";
  EXPECT_EQ(e.at(Bucket(verb, read, "0.0001")), "0");
  EXPECT_EQ(e.at(Bucket(verb, read, "0.00025")), "1");
  EXPECT_EQ(e.at(Bucket(verb, read, "0.0025")), "1");
  EXPECT_EQ(e.at(Bucket(verb, read, "0.005")), "2");
  EXPECT_EQ(e.at(Bucket(verb, read, "10")), "2");
  EXPECT_EQ(e.at(Bucket(verb, read, "+Inf")), "2");
  EXPECT_EQ(e.at(verb + "_sum{" + read + "}"), "0.0032");
  EXPECT_EQ(e.at(verb + "_count{" + read + "}"), "2");
  EXPECT_EQ(e.at(Bucket(verb, "verb=\"stat\"", "0.0001")), "1");
  EXPECT_EQ(e.at(verb + "_sum{verb=\"stat\"}"), "5e-05");
  EXPECT_EQ(e.at(verb + "_count{verb=\"mkdir\"}"), "0");

  EXPECT_EQ(e.at("nsbox_bytes_in_total"), "123");
  EXPECT_EQ(e.at("nsbox_bytes_out_total"), "1099511627776");
  EXPECT_EQ(e.at("nsbox_errors_total{code=\"ENOENT\"}"), "2");
  EXPECT_EQ(e.at("nsbox_errors_total{code=\"invalid_request\"}"), "1");
  EXPECT_EQ(e.at("nsbox_http_requests_total{method=\"GET\",status=\"200\"}"), "2");
  EXPECT_EQ(e.at("nsbox_http_requests_total{method=\"POST\",status=\"404\"}"), "1");
  EXPECT_EQ(e.at("nsbox_http_requests_total{method=\"other\",status=\"400\"}"), "1");
  EXPECT_EQ(e.samples.count("nsbox_http_requests_total{method=\"BREW\",status=\"400\"}"), 0u);
}

TEST(Metrics, BucketsAreCumulativeAndEndWithInf) {
  Metrics m;
  // Spread over every bucket and beyond the last.
  for (double s = 0.0001; s < 2000; s *= 1.7) {
    m.ExecFinished("exited", s);
    m.FileVerb("rm", s / 100);
  }
  const std::string text = m.Render({});
  const Exposition e = Parse(text);
  for (const auto& [family, labels] :
       {std::pair<std::string, std::string>{"nsbox_exec_duration_seconds", ""},
        {"nsbox_file_verb_duration_seconds", "verb=\"rm\""}}) {
    const std::string prefix = family + "_bucket{" + (labels.empty() ? "" : labels + ",") + "le=\"";
    double last_le = -1;
    uint64_t last_count = 0;
    std::string last_bucket;
    int buckets = 0;
    for (const std::string& series : e.order) {
      if (series.rfind(prefix, 0) != 0) continue;
      ++buckets;
      const std::string le = series.substr(prefix.size(), series.size() - prefix.size() - 2);
      const double bound = le == "+Inf" ? 1e300 : std::strtod(le.c_str(), nullptr);
      EXPECT_GT(bound, last_le) << series;
      const uint64_t count = std::stoull(e.at(series));
      EXPECT_GE(count, last_count) << series;
      last_le = bound;
      last_count = count;
      last_bucket = le;
    }
    EXPECT_EQ(last_bucket, "+Inf");
    const std::string suffix = labels.empty() ? "" : "{" + labels + "}";
    EXPECT_EQ(std::to_string(last_count), e.at(family + "_count" + suffix));
    EXPECT_GT(last_count, 0u);
    EXPECT_EQ(buckets, family == "nsbox_exec_duration_seconds"
                           ? static_cast<int>(std::size(kExecDurationBuckets)) + 1
                           : static_cast<int>(std::size(kFileVerbDurationBuckets)) + 1);
  }
  // The bounds the brief asks for, printed as Prometheus clients print them.
  EXPECT_NE(text.find("nsbox_exec_duration_seconds_bucket{le=\"0.001\"}"), std::string::npos);
  EXPECT_NE(text.find("nsbox_exec_duration_seconds_bucket{le=\"600\"}"), std::string::npos);
  EXPECT_NE(text.find("{verb=\"rm\",le=\"0.0001\"}"), std::string::npos);
  EXPECT_NE(text.find("{verb=\"rm\",le=\"10\"}"), std::string::npos);
}

TEST(Metrics, LabelValuesAreEscaped) {
  Metrics m;
  m.Error("a\"b\\c\nd");
  m.Kill("x}y,z=\"");
  const std::string text = m.Render({{"we\"ird\n", 2}});
  EXPECT_NE(text.find("nsbox_errors_total{code=\"a\\\"b\\\\c\\nd\"} 1\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("nsbox_kills_total{reason=\"x}y,z=\\\"\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("nsbox_sandboxes{state=\"we\\\"ird\\n\"} 2\n"), std::string::npos);
  // No raw newline escaped into a sample line: every line still parses.
  const Exposition e = Parse(text);
  EXPECT_EQ(e.at("nsbox_errors_total{code=\"a\\\"b\\\\c\\nd\"}"), "1");
}

TEST(Metrics, OddDurationsCountAsZero) {
  Metrics m;
  m.ExecFinished("exited", -1);
  m.ExecFinished("exited", std::nan(""));
  const Exposition e = Parse(m.Render({}));
  EXPECT_EQ(e.at("nsbox_exec_duration_seconds_bucket{le=\"0.001\"}"), "2");
  EXPECT_EQ(e.at("nsbox_exec_duration_seconds_sum"), "0");
  EXPECT_EQ(e.at("nsbox_execs_running"), "0");  // never below zero
}

TEST(Metrics, LabelCardinalityIsBounded) {
  Metrics m;
  for (int i = 0; i < 1000; ++i) m.Error("E" + std::to_string(i));
  m.Error("E0");  // an existing value keeps its own series
  const Exposition e = Parse(m.Render({}));
  size_t series = 0;
  for (const auto& [name, value] : e.samples) series += name.rfind("nsbox_errors_total{", 0) == 0;
  EXPECT_EQ(series, kMaxLabelValues + 1);
  EXPECT_EQ(e.at("nsbox_errors_total{code=\"E0\"}"), "2");
  EXPECT_EQ(e.at("nsbox_errors_total{code=\"other\"}"), std::to_string(1000 - kMaxLabelValues));
}

TEST(Metrics, ConcurrentUpdatesAreAllCounted) {
  Metrics m;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&m] {
      for (int i = 0; i < 1000; ++i) {
        m.ExecStarted();
        m.ExecFinished("exited", 0.01);
        m.BytesOut(2);
        m.Request("GET", 200);
        if (i % 100 == 0) (void)m.Render({});
      }
    });
  }
  for (auto& t : threads) t.join();
  const Exposition e = Parse(m.Render({}));
  EXPECT_EQ(e.at("nsbox_execs_started_total"), "4000");
  EXPECT_EQ(e.at("nsbox_execs_running"), "0");
  EXPECT_EQ(e.at("nsbox_execs_finished_total{reason=\"exited\"}"), "4000");
  EXPECT_EQ(e.at("nsbox_exec_duration_seconds_count"), "4000");
  EXPECT_EQ(e.at("nsbox_bytes_out_total"), "8000");
  EXPECT_EQ(e.at("nsbox_http_requests_total{method=\"GET\",status=\"200\"}"), "4000");
}

}  // namespace
}  // namespace nsbox::runtime

// nsbox-import-cost: what an image import under way costs the daemon's other requests (issue 53),
// side by side in one run. It starts its own daemon on a private socket and state directory.
//
//   sudo build/bench/nsbox-import-cost [--image FILE] [--runs N] [--blocks N] [--nsbox PATH]
//                                      [--dir DIR (default /var/tmp)]
//
// Two figures, each measured in blocks that alternate between a quiet daemon and one that imports
// an image the whole block long (a thread of the bench re-imports it, under a new name each
// time, as soon as the last import ended):
//   1. first use of a new id: PUT + POST exec `/bin/true` (the pool full before each, as in
//      nsbox-api-bench; the sandbox deleted after, untimed);
//   2. a 4 KiB file read: GET /v1/sandboxes/{id}/files of a running sandbox.
// A sample of an "import under way" block counts only when an import was in flight from its
// start to its end (upload, unpacking and its final syncfs included). Medians with p10/p90, and
// the ratio of the medians (issue 53's target: at most 1.20).
//
// FILE is an image tarball (images/debian/build-image.sh makes a 127 MB Debian root); without
// it, a root file system tarball of 6,000 files (512 B to 64 KiB, 94 MiB, half-compressible
// bytes, gzip) is made in DIR first.

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <atomic>
#include <boost/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_common.h"
#include "bench/bench_daemon.h"
#include "runtime/api_client.h"

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
using nsbox::runtime::FilesTarget;
using nsbox::runtime::Method;
using nsbox::runtime::SandboxTarget;

void Row(const char* what, const Stats& quiet, const Stats& busy, double scale, const char* unit) {
  std::printf("| %s | %.1f (%.1f-%.1f) %s | %.1f (%.1f-%.1f) %s | %.2fx | <= 1.20x |\n", what,
              quiet.median / scale, quiet.p10 / scale, quiet.p90 / scale, unit, busy.median / scale,
              busy.p10 / scale, busy.p90 / scale, unit, busy.median / quiet.median);
}

// A root file system tarball of `files` files, 512 B to 64 KiB (cycling), each half random bytes
// and half a repeated line (so that gzip has work, as with real binaries and text).
std::string MakeImage(const std::string& dir, int files) {
  const std::string root = dir + "/image-root";
  std::mt19937_64 rng(53);
  for (int i = 0; i < files; ++i) {
    const std::string sub = root + "/usr/share/d" + std::to_string(i / 200);
    std::filesystem::create_directories(sub);
    const size_t size = size_t{512} << (i % 8);
    std::string data(size, '\0');
    for (size_t j = 0; j < size / 2; j += 8) {
      const uint64_t v = rng();
      std::memcpy(&data[j], &v, std::min<size_t>(8, size / 2 - j));
    }
    for (size_t j = size / 2; j < size; ++j) data[j] = "nsbox import cost\n"[j % 18];
    std::ofstream(sub + "/f" + std::to_string(i), std::ios::binary) << data;
  }
  const std::string tarball = dir + "/image.tar.gz";
  const std::string cmd =
      "tar --numeric-owner -C " + root + " -czf " + tarball + " . && rm -rf " + root;
  if (std::system(cmd.c_str()) != 0) Die("failed: " + cmd);
  return tarball;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string Now() {
  char buf[64];
  std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&t));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  nsbox::bench::g_program = "nsbox-import-cost";
  int runs = 20, blocks = 10;
  bool burner = false;
  std::string nsbox, image, base = "/var/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--runs") {
      runs = std::atoi(argv[i + 1]);
    } else if (a == "--blocks") {
      blocks = std::atoi(argv[i + 1]);
    } else if (a == "--nsbox") {
      nsbox = argv[i + 1];
    } else if (a == "--image") {
      image = argv[i + 1];
    } else if (a == "--dir") {
      base = argv[i + 1];
    } else if (a == "--busy") {
      burner = std::string(argv[i + 1]) == "burner";
      if (!burner && std::string(argv[i + 1]) != "import") Die("--busy import|burner");
    } else {
      Die("unknown flag " + a +
          " (--image FILE --runs N --blocks N --busy import|burner --nsbox PATH --dir D)");
    }
  }
  if (geteuid() != 0) Die("run as root");
  auto self = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  if (nsbox.empty()) nsbox = (self / "../runtime/nsbox").lexically_normal().string();
  const std::string dir = base + "/nsbox-import-cost-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  if (image.empty() && !burner) image = MakeImage(dir, 6000);
  if (burner) image = "/dev/null";
  struct stat st {};
  if (stat(image.c_str(), &st) != 0) Die("no image file " + image);

  Daemon daemon;
  daemon.Start(nsbox, dir, "warn");
  ApiClient api(ApiEndpoint::Unix(daemon.socket));
  struct utsname u {};
  uname(&u);
  struct statfs fs {};
  statfs(dir.c_str(), &fs);
  std::printf("nsbox-import-cost: %s (%.1f MiB), %d blocks of %d samples each side, %s\n",
              image.c_str(), static_cast<double>(st.st_size) / (1 << 20), blocks, runs,
              Now().c_str());
  std::printf("machine: %ld CPUs, kernel %s, state dir %s (file system magic 0x%lx); load %s\n\n",
              sysconf(_SC_NPROCESSORS_ONLN), u.release, dir.c_str(),
              static_cast<unsigned long>(fs.f_type), LoadAverage().c_str());

  // The sandbox read from, and a warm-up of both figures.
  const std::string reader = "reader";
  Must(api.Call(Method::kPut, SandboxTarget(reader)), "PUT", 201);
  {
    const std::string f4k = dir + "/f4k";
    std::ofstream(f4k) << std::string(4096, 'x');
    int fd = open(f4k.c_str(), O_RDONLY | O_CLOEXEC);
    Must(api.Upload(Method::kPut, FilesTarget(reader, "f4k"), fd), "upload", 204);
    close(fd);
  }
  boost::json::object exec_body;
  exec_body["command"] = "/bin/true";
  int next_id = 0;
  double put_us = 0;  // the PUT's part of the last first use
  auto first_use = [&]() -> double {
    const std::string id = "first-" + std::to_string(next_id++);
    nsbox::bench::WaitPoolFull(api, std::chrono::seconds(30));
    auto t0 = Clock::now();
    Must(api.Call(Method::kPut, SandboxTarget(id)), "PUT", 201);
    put_us = Micros(Clock::now() - t0);
    auto r = Must(api.Call(Method::kPost, SandboxTarget(id, "/exec"), exec_body), "exec");
    const double us = Micros(Clock::now() - t0);
    auto json = r.Json();
    if (!json.ok() || json->at("exitCode").as_int64() != 0) Die("exec /bin/true: " + r.body);
    Must(api.Call(Method::kDelete, SandboxTarget(id)), "DELETE", 204);
    return us;
  };
  const auto read_target = FilesTarget(reader, "f4k");
  auto read_4k = [&]() -> double {
    auto t0 = Clock::now();
    auto r = Must(api.Call(Method::kGet, read_target), "GET file");
    const double us = Micros(Clock::now() - t0);
    if (r.body.size() != 4096) Die("GET file: " + std::to_string(r.body.size()) + " bytes");
    return us;
  };
  for (int i = 0; i < 5; ++i) {
    first_use();
    read_4k();
  }

  // The importer: while `busy`, one import after the other, each under a new name.
  std::atomic<bool> busy{false}, stop{false};
  std::atomic<uint64_t> imports_started{0}, imports_done{0};
  // What the import in flight is doing: its NDJSON progress (docs/images.md), "upload" before.
  static constexpr const char* kPhases[] = {"upload", "reading", "layer", "publishing"};
  std::atomic<int> phase{0};
  std::vector<std::string> names;  // the importer's alone until it is joined
  std::vector<double> import_s;
  std::thread importer([&] {
    ApiClient client(ApiEndpoint::Unix(daemon.socket));
    while (!stop.load()) {
      if (!busy.load()) {
        usleep(1000);
        continue;
      }
      if (burner) {
        // The control: a thread that only computes, at the lowest priority there is, for as long
        // as the block lasts (what the machine itself makes of a busy second CPU).
        struct sched_param param {};
        if (sched_setscheduler(0, SCHED_IDLE, &param) != 0) Die("sched_setscheduler");
        phase.store(1);
        ++imports_started;
        uint64_t x = 53;
        while (busy.load()) {
          for (int i = 0; i < 100000; ++i) x = x * 6364136223846793005u + 1442695040888963407u;
        }
        if (x == 0) std::printf(" ");
        ++imports_done;
        param = {};
        if (sched_setscheduler(0, SCHED_OTHER, &param) != 0) Die("sched_setscheduler");
        continue;
      }
      const std::string name = "img" + std::to_string(names.size());
      names.push_back(name);
      int fd = open(image.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) Die("open " + image);
      phase.store(0);
      ++imports_started;
      auto t0 = Clock::now();
      ApiClient::UploadOptions watch;
      watch.on_line = [&phase](std::string_view line) -> nsbox::Status {
        for (int p = 1; p < 4; ++p) {
          if (line.find(std::string("\"phase\":\"") + kPhases[p] + "\"") != line.npos) phase = p;
        }
        if (line.find("\"type\":\"error\"") != line.npos) Die("import: " + std::string(line));
        return nsbox::Ok();
      };
      Must(client.Upload(Method::kPost, "/v1/images/" + name, fd, watch), "import", 200);
      import_s.push_back(Micros(Clock::now() - t0) / 1e6);
      ++imports_done;
      close(fd);
    }
  });
  // An import is in flight from before `start` (an import started then) to now (none ended).
  auto in_flight_since = [&](uint64_t started, uint64_t done) {
    return imports_started.load() > imports_done.load() && imports_done.load() == done &&
           started > done;
  };

  std::vector<double> first_quiet, first_busy, read_quiet, read_busy, put_quiet, put_busy;
  std::vector<double> by_phase[4][2];  // [phase][first use, read], import under way
  for (int b = 0; b < blocks; ++b) {
    for (int side = 0; side < 2; ++side) {
      // Which side comes first alternates, so that neither always follows the other.
      const bool importing = (side == 0) == (b % 2 == 0);
      busy.store(importing);
      if (importing) {
        while (imports_started.load() == imports_done.load()) usleep(1000);
      } else {
        while (imports_started.load() != imports_done.load()) usleep(1000);
      }
      int kept = 0;
      for (int attempts = 0; kept < runs && attempts < runs * 20; ++attempts) {
        const uint64_t started = imports_started.load(), done = imports_done.load();
        const int phase_before = phase.load();
        const double f = first_use();
        const double put = put_us;
        const int phase_between = phase.load();
        const double r = read_4k();
        if (importing && !in_flight_since(started, done)) continue;
        (importing ? first_busy : first_quiet).push_back(f);
        (importing ? put_busy : put_quiet).push_back(put);
        (importing ? read_busy : read_quiet).push_back(r);
        if (importing && phase_before == phase_between) by_phase[phase_before][0].push_back(f);
        if (importing && phase_between == phase.load()) by_phase[phase_between][1].push_back(r);
        ++kept;
      }
    }
  }
  busy.store(false);
  stop.store(true);
  importer.join();

  std::printf(
      "| operation | quiet daemon, median (p10-p90) | import under way, median (p10-p90) "
      "| ratio | target |\n|---|---|---|---|---|\n");
  Row("first use: PUT new id + POST exec `/bin/true`", Summarize(first_quiet),
      Summarize(first_busy), 1e3, "ms");
  Row("  of which the PUT", Summarize(put_quiet), Summarize(put_busy), 1e3, "ms");
  Row("4 KiB read: GET /v1/sandboxes/{id}/files", Summarize(read_quiet), Summarize(read_busy), 1,
      "us");
  std::printf(
      "\nduring each phase of the import (samples that began and ended in it):\n\n"
      "| phase | first use, median (n) | 4 KiB read, median (n) |\n|---|---|---|\n");
  for (int p = 0; p < 4; ++p) {
    std::printf("| %s | %.1f ms (%zu) | %.1f us (%zu) |\n", kPhases[p],
                Summarize(by_phase[p][0]).median / 1e3, by_phase[p][0].size(),
                Summarize(by_phase[p][1]).median, by_phase[p][1].size());
  }
  const Stats imp = Summarize(import_s);
  std::printf(
      "\nsamples: %zu quiet, %zu during an import; %zu imports of %.1f s median "
      "(%.1f-%.1f); load at the end %s\n",
      first_quiet.size(), first_busy.size(), names.size(), imp.median, imp.p10, imp.p90,
      LoadAverage().c_str());

  Must(api.Call(Method::kDelete, SandboxTarget(reader)), "DELETE", 204);
  for (const auto& name : names) {
    Must(api.Call(Method::kDelete, "/v1/images/" + name), "DELETE image", 204);
  }
  if (!daemon.Stop()) Die("the daemon did not exit cleanly; see " + daemon.log);
  std::filesystem::remove_all(dir);
  return 0;
}

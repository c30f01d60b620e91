// nsbox-image-bench: imported images measured through nsboxd's API (issue 6), side by side in
// one run. It starts its own daemon on a private socket and state directory.
//
//   sudo build/bench/nsbox-image-bench --image FILE [--runs N] [--imports N] [--nsbox PATH]
//                                      [--dir DIR (default /var/tmp)]
//
// FILE is an image tarball (images/debian/build-image.sh makes a 127 MB Debian root). Each
// figure is a median with p10/p90; the two sides of a comparison alternate within one loop, so
// that the machine's noise hits both.
// 1. import: POST /v1/images/{name} of FILE (upload, unpack, owners shifted, published) vs
//    `tar -x --numeric-owner` of the same file into a fresh directory (as root: it chowns too);
// 2. first use of a new id on the imported image (PUT + POST exec /bin/true: overlay mount and
//    jail start) vs the same on the host image.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
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
using nsbox::runtime::Method;
using nsbox::runtime::SandboxTarget;

void Row(const char* what, const Stats& s, double scale, const char* unit) {
  std::printf("| %s | %.1f | %.1f | %.1f | %s |\n", what, s.median / scale, s.p10 / scale,
              s.p90 / scale, unit);
}

// `sh -c script`, waited for; wall microseconds. Dies unless it exits 0.
double Shell(const std::string& script) {
  auto t0 = Clock::now();
  int rc = std::system(("sh -c '" + script + "'").c_str());
  if (rc != 0) Die("command failed (" + std::to_string(rc) + "): " + script);
  return Micros(Clock::now() - t0);
}

double Import(ApiClient& api, const std::string& name, const std::string& file) {
  int fd = open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("open " + file);
  auto t0 = Clock::now();
  Must(api.Upload(Method::kPost, "/v1/images/" + name, fd), "import", 201);
  double us = Micros(Clock::now() - t0);
  close(fd);
  return us;
}

double FirstUse(ApiClient& api, const std::string& id, const std::string& image) {
  boost::json::object put;
  put["image"] = image;
  boost::json::object exec;
  exec["command"] = "/bin/true";
  auto t0 = Clock::now();
  Must(api.Call(Method::kPut, SandboxTarget(id), put), "PUT", 201);
  auto r = Must(api.Call(Method::kPost, SandboxTarget(id, "/exec"), exec), "exec");
  double us = Micros(Clock::now() - t0);
  auto json = r.Json();
  if (!json.ok() || json->at("exitCode").as_int64() != 0) Die("exec /bin/true: " + r.body);
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  nsbox::bench::g_program = "nsbox-image-bench";
  int runs = 50, imports = 5;
  std::string nsbox, image, base = "/var/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--runs") {
      runs = std::atoi(argv[i + 1]);
    } else if (a == "--imports") {
      imports = std::atoi(argv[i + 1]);
    } else if (a == "--nsbox") {
      nsbox = argv[i + 1];
    } else if (a == "--image") {
      image = argv[i + 1];
    } else if (a == "--dir") {
      base = argv[i + 1];
    } else {
      Die("unknown flag " + a + " (--image FILE --runs N --imports N --nsbox PATH --dir D)");
    }
  }
  if (geteuid() != 0) Die("run as root");
  if (image.empty()) Die("--image FILE is required (images/debian/build-image.sh makes one)");
  struct stat st {};
  if (stat(image.c_str(), &st) != 0) Die("no image file " + image);
  auto self = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  if (nsbox.empty()) nsbox = (self / "../runtime/nsbox").lexically_normal().string();

  std::string dir = base + "/nsbox-image-bench-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  Daemon daemon;
  daemon.Start(nsbox, dir, "warn");
  ApiClient api(ApiEndpoint::Unix(daemon.socket));
  std::printf("nsbox-image-bench: %s (%.1f MiB), %d imports, %d first uses of each image\n",
              image.c_str(), static_cast<double>(st.st_size) / (1 << 20), imports, runs);
  std::printf("machine: %ld CPUs; state dir %s\n\n", sysconf(_SC_NPROCESSORS_ONLN), dir.c_str());
  std::printf("| operation | median | p10 | p90 | unit |\n|---|---|---|---|---|\n");

  // 1. Import vs tar -x, alternating; every import under a new name, every tar into a new dir.
  std::vector<double> t_import, t_tar;
  const std::string tar_dir = dir + "/tar";
  for (int i = 0; i < imports; ++i) {
    const std::string name = "img" + std::to_string(i);
    const std::string into = tar_dir + std::to_string(i);
    auto tar = [&] {
      std::filesystem::create_directories(into);
      t_tar.push_back(
          Shell("tar --numeric-owner -xf " + image + " -C " + into + " && sync -f " + into));
    };
    if (i % 2 == 0) {
      t_import.push_back(Import(api, name, image));
      tar();
    } else {
      tar();
      t_import.push_back(Import(api, name, image));
    }
    std::filesystem::remove_all(into);
    if (i > 0) Must(api.Call(Method::kDelete, "/v1/images/" + name), "DELETE image", 204);
  }
  auto s_import = Summarize(t_import), s_tar = Summarize(t_tar);
  Row("import: POST /v1/images/{name} (upload, unpack, shift owners, publish)", s_import, 1e6, "s");
  Row("`tar --numeric-owner -xf` of the same file, then `sync -f`", s_tar, 1e6, "s");
  std::printf("| ratio import / tar (medians) | %.2fx | | | |\n", s_import.median / s_tar.median);

  // 2. First use of a new id: imported image vs host image, alternating.
  std::vector<double> t_image, t_host;
  std::vector<std::string> ids;
  for (int i = -3; i < runs; ++i) {
    const std::string a = "on-image-" + std::to_string(i + 3);
    const std::string b = "on-host-" + std::to_string(i + 3);
    ids.push_back(a);
    ids.push_back(b);
    double image_us = 0, host_us = 0;
    if (i % 2 == 0) {
      image_us = FirstUse(api, a, "img0");
      host_us = FirstUse(api, b, "host");
    } else {
      host_us = FirstUse(api, b, "host");
      image_us = FirstUse(api, a, "img0");
    }
    if (i < 0) continue;
    t_image.push_back(image_us);
    t_host.push_back(host_us);
  }
  auto s_image = Summarize(t_image), s_host = Summarize(t_host);
  Row("first use on the imported image: PUT + exec `/bin/true`", s_image, 1e3, "ms");
  Row("first use on the host image: PUT + exec `/bin/true`", s_host, 1e3, "ms");
  std::printf("| ratio imported / host (medians) | %.2fx | | | target <= 1.5x |\n",
              s_image.median / s_host.median);

  for (const auto& id : ids) Must(api.Call(Method::kDelete, SandboxTarget(id)), "DELETE", 204);
  Must(api.Call(Method::kDelete, "/v1/images/img0"), "DELETE image", 204);
  if (!daemon.Stop()) Die("the daemon did not exit cleanly; see " + daemon.log);
  std::filesystem::remove_all(dir);
  return 0;
}

// What removing a sandbox's tree costs (docs/perf-notes.md "Removing a deleted sandbox's files"):
// base's RemoveTree (a few fds at any depth) against std::filesystem::remove_all (one open
// directory per level, what the daemon used before issue 44), on the same trees in DIR:
//   wide: FILES files of 64 bytes spread over directories of 100, two levels deep;
//   deep: a chain of DEPTH directories (remove_all only runs where the fd limit allows it).
// Usage: nsbox-remove-tree-bench DIR [FILES] [DEPTH] [RUNS]; prints the median of RUNS per tree.

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "base/files.h"

namespace {

using Clock = std::chrono::steady_clock;

void MakeWide(const std::string& top, long files) {
  std::filesystem::create_directories(top);
  const std::string data(64, 'x');
  for (long i = 0; i < files; ++i) {
    const std::string dir = top + "/d" + std::to_string(i / 10000) + "/e" + std::to_string(i / 100);
    if (i % 100 == 0) std::filesystem::create_directories(dir);
    const int fd = ::open((dir + "/f" + std::to_string(i)).c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ::write(fd, data.data(), data.size()) != static_cast<ssize_t>(data.size())) {
      std::perror("make the wide tree");
      std::exit(1);
    }
    ::close(fd);
  }
}

void MakeDeep(const std::string& top, long depth) {
  std::filesystem::create_directories(top);
  int fd = ::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  for (long i = 0; i < depth && fd >= 0; ++i) {
    if (::mkdirat(fd, "d", 0755) != 0) break;
    const int next = ::openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ::close(fd);
    fd = next;
  }
  if (fd >= 0) ::close(fd);
}

// The median wall time of `remove` over `runs` fresh trees made by `make`, in ms; -1 if a
// removal failed.
double Median(int runs, const std::function<void()>& make, const std::function<bool()>& remove) {
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    make();
    ::sync();
    const auto t0 = Clock::now();
    const bool ok = remove();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (!ok) return -1;
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [FILES] [DEPTH] [RUNS]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const long files = argc > 2 ? std::atol(argv[2]) : 100000;
  const long depth = argc > 3 ? std::atol(argv[3]) : 10000;
  const int runs = argc > 4 ? std::atoi(argv[4]) : 5;
  struct rlimit nofile {};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  const std::string wide = dir + "/wide";
  const std::string deep = dir + "/deep";
  auto ours = [](const std::string& path) {
    return [path] { return nsbox::RemoveTree(path).ok(); };
  };
  auto theirs = [](const std::string& path) {
    return [path] {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
      return !ec;
    };
  };
  std::printf("wide, %ld files: RemoveTree %.1f ms, remove_all %.1f ms\n", files,
              Median(
                  runs, [&] { MakeWide(wide, files); }, ours(wide)),
              Median(
                  runs, [&] { MakeWide(wide, files); }, theirs(wide)));
  const double ours_deep = Median(
      runs, [&] { MakeDeep(deep, depth); }, ours(deep));
  if (static_cast<rlim_t>(depth) + 64 < nofile.rlim_cur) {
    std::printf("deep, %ld levels: RemoveTree %.1f ms, remove_all %.1f ms\n", depth, ours_deep,
                Median(
                    runs, [&] { MakeDeep(deep, depth); }, theirs(deep)));
  } else {
    std::printf("deep, %ld levels: RemoveTree %.1f ms, remove_all not run (fd limit %llu)\n", depth,
                ours_deep, static_cast<unsigned long long>(nofile.rlim_cur));
  }
  return 0;
}

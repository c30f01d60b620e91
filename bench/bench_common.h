#pragma once

// What every nsbox benchmark measures with: a clock, medians and percentiles, and the floor of
// every exec figure (vfork + execve + waitpid of /bin/true on the host). Header-only: each
// benchmark is one binary.

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace nsbox::bench {

using Clock = std::chrono::steady_clock;

inline double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

struct Stats {
  double median = 0, p10 = 0, p90 = 0;
};

inline Stats Summarize(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))]; };
  return {at(0.5), at(0.1), at(0.9)};
}

// Microseconds for vfork + execve + waitpid of /bin/true with an empty environment.
inline double VforkExecTrue() {
  auto t0 = Clock::now();
  pid_t pid = vfork();
  if (pid == 0) {
    char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
    char* const envp[] = {nullptr};
    execve("/bin/true", argv, envp);
    _exit(127);
  }
  int status;
  waitpid(pid, &status, 0);
  return Micros(Clock::now() - t0);
}

}  // namespace nsbox::bench

#include "policy/limits.h"

#include <algorithm>

namespace nsbox::policy {

namespace {

constexpr rlim_t kMiB = 1024 * 1024;

const RlimitRule kDefaultRlimits[] = {
    {RLIMIT_CORE, "core", 0, 0, "no core dumps: they fill the workspace and can hold secrets"},
    {RLIMIT_NOFILE, "nofile", 1024, 65536,
     "enough for builds and servers; a leak fails fast instead of eating the host's file table"},
    {RLIMIT_STACK, "stack", 8 * kMiB, RLIM_INFINITY, "the usual 8 MiB main stack"},
    {RLIMIT_MEMLOCK, "memlock", 8 * kMiB, 8 * kMiB, "locked memory escapes the memory limit"},
    {RLIMIT_MSGQUEUE, "msgqueue", 800 * 1024, 800 * 1024, "POSIX queues are kernel memory"},
    {RLIMIT_SIGPENDING, "sigpending", 4096, 4096, "queued signals are kernel memory"},
};

}  // namespace

std::span<const RlimitRule> DefaultRlimits() { return kDefaultRlimits; }

struct rlimit ClampRlimit(const RlimitRule& rule, const struct rlimit& host) {
  struct rlimit out {};
  out.rlim_max = std::min(rule.hard, host.rlim_max);
  out.rlim_cur = std::min(rule.soft, out.rlim_max);
  return out;
}

}  // namespace nsbox::policy

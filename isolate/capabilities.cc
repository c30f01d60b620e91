#include "isolate/capabilities.h"

#include <errno.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <charconv>
#include <string>

#include "base/files.h"

namespace nsbox::isolate {

namespace {

constexpr const char* kCapLastCapPath = "/proc/sys/kernel/cap_last_cap";
// capset's version 3 carries 64 capability bits in two 32-bit words.
constexpr int kCapBits = 64;

}  // namespace

Result<CapabilityPlan> PlanCapabilities(const policy::CapabilitySet& set, int last_cap) {
  if (last_cap < 0 || last_cap >= kCapBits) {
    return Error::Msg("cap_last_cap " + std::to_string(last_cap) + " is out of range");
  }
  for (const policy::CapabilityEntry& e : set.keep) {
    if (e.cap < 0 || e.cap > last_cap) {
      return Error::Msg(std::string(e.name) + " (" + std::to_string(e.cap) +
                        ") is beyond this kernel's last capability " + std::to_string(last_cap));
    }
  }
  return CapabilityPlan(set.Mask(), last_cap);
}

Result<CapabilityPlan> PlanCapabilities(const policy::CapabilitySet& set) {
  auto text = ReadFile(kCapLastCapPath);
  if (!text.ok()) return std::move(text).error().Context("plan capabilities");
  int last_cap = -1;
  const std::string& s = *text;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), last_cap);
  if (ec != std::errc() || (end != s.data() + s.size() && *end != '\n')) {
    return Error::Msg(std::string("plan capabilities: ") + kCapLastCapPath + " holds \"" + s +
                      "\"");
  }
  return PlanCapabilities(set, last_cap);
}

int ApplyCapabilities(const CapabilityPlan& plan) noexcept {
  const uint64_t keep = plan.keep();
  // The bounding set first, while CAP_SETPCAP is still effective: it is what an execve can grant
  // back, so it is what really limits the command.
  for (int cap = 0; cap <= plan.last_cap(); ++cap) {
    if ((keep & (uint64_t{1} << cap)) != 0) continue;
    // SAFETY: plain integer arguments; the kernel checks CAP_SETPCAP and the capability number.
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) return errno;
  }
  // SAFETY: plain integer arguments. Ambient capabilities would survive execve into the command.
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) return errno;

  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};  // 0: this thread
  struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  for (int word = 0; word < _LINUX_CAPABILITY_U32S_3; ++word) {
    const auto bits = static_cast<uint32_t>(keep >> (32 * word));
    data[word].effective = bits;
    data[word].permitted = bits;
    data[word].inheritable = 0;  // nothing passes through execve by inheritance
  }
  // SAFETY: header and data are on this stack frame and sized for version 3 (two words), which
  // the header names; capset only lowers sets here (raising permitted fails with EPERM). glibc
  // declares no capset wrapper.
  if (syscall(SYS_capset, &header, data) != 0) return errno;
  return 0;
}

Result<CapabilityPlan> PlanCapabilityMask(uint64_t keep, int last_cap) {
  if (last_cap < 0 || last_cap > 63) {
    return Error::Msg("capabilities: last capability " + std::to_string(last_cap) +
                      " is out of range");
  }
  if (last_cap < 63 && (keep >> (last_cap + 1)) != 0) {
    return Error::Msg("capabilities: the mask names capabilities above " +
                      std::to_string(last_cap));
  }
  return CapabilityPlan(keep, last_cap);
}

}  // namespace nsbox::isolate

#include "policy/capabilities.h"

#include <linux/capability.h>

#include <cstdio>

namespace nsbox::policy {

// Docker's default (moby oci/caps/defaults.go) minus CAP_SYS_CHROOT: chroot is denied by the
// seccomp profile anyway (policy/seccomp_profile.cc), and a second root inside the jail serves no
// command we know of. Everything else is dropped from all five sets, the bounding set included.
CapabilitySet DefaultCommandCapabilities() {
  return CapabilitySet{{
      {CAP_CHOWN, "CAP_CHOWN", "package managers and tar chown the files they unpack"},
      {CAP_DAC_OVERRIDE, "CAP_DAC_OVERRIDE", "root in the jail reads and writes any of its files"},
      {CAP_FOWNER, "CAP_FOWNER", "chmod and utime on files owned by other users of the jail"},
      {CAP_FSETID, "CAP_FSETID", "keeps set-id bits when root in the jail modifies a file"},
      {CAP_KILL, "CAP_KILL", "signals processes of other users inside the jail's pid namespace"},
      {CAP_SETGID, "CAP_SETGID", "su, sudo and daemons switch to the jail's other groups"},
      {CAP_SETUID, "CAP_SETUID", "su, sudo and daemons switch to the jail's other users"},
      {CAP_SETPCAP, "CAP_SETPCAP", "lets a process shrink its bounding set before exec"},
      {CAP_NET_BIND_SERVICE, "CAP_NET_BIND_SERVICE", "binds ports below 1024 in the jail's netns"},
      {CAP_NET_RAW, "CAP_NET_RAW", "ping and raw sockets, in the jail's own network namespace"},
      {CAP_MKNOD, "CAP_MKNOD", "Docker parity; device nodes need the host's CAP_MKNOD anyway"},
      {CAP_AUDIT_WRITE, "CAP_AUDIT_WRITE", "su and sshd write audit records and fail without it"},
      {CAP_SETFCAP, "CAP_SETFCAP", "package managers set file capabilities (ping, for one)"},
  }};
}

uint64_t CapabilitySet::Mask() const {
  uint64_t mask = 0;
  for (const CapabilityEntry& e : keep) mask |= uint64_t{1} << e.cap;
  return mask;
}

std::string FormatCapabilityMask(uint64_t mask) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(mask));
  return buf;
}

}  // namespace nsbox::policy

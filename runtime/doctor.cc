#include "runtime/doctor.h"

#include <fcntl.h>
#include <sys/capability.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>
#include <tuple>

#include "base/process.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "isolate/disk.h"
#include "net/net_client.h"

namespace nsbox::runtime {
namespace {

// The io_uring opcodes without which the reactor uses epoll. WAITID (6.7) is not among them:
// without it exits are seen by polling the pidfd.
constexpr std::string_view kUringEssentialOps[] = {
    "READ", "WRITE", "POLL_ADD", "TIMEOUT", "LINK_TIMEOUT", "ASYNC_CANCEL", "RECVMSG", "SENDMSG",
};

// Splits a Features detail of the form "what went wrong; fix: how" into its two halves.
std::pair<std::string, std::string> SplitFix(const std::string& detail, std::string default_fix) {
  size_t at = detail.find("; fix: ");
  if (at == std::string::npos) return {detail, std::move(default_fix)};
  return {detail.substr(0, at), detail.substr(at + 7)};
}

DoctorLayer Layer(std::string key, std::string name, bool required) {
  DoctorLayer l;
  l.key = std::move(key);
  l.name = std::move(name);
  l.required = required;
  return l;
}

DoctorLayer FromItem(std::string key, std::string name, bool required, const Features::Item& item,
                     std::string ok_detail, std::string default_fix) {
  DoctorLayer l = Layer(std::move(key), std::move(name), required);
  if (item.available) {
    l.status = "ok";
    l.detail = std::move(ok_detail);
  } else {
    l.status = "missing";
    std::tie(l.detail, l.fix) = SplitFix(item.detail, std::move(default_fix));
  }
  return l;
}

// `l` for a host whose cgroup layout could not be read.
DoctorLayer NoLayout(const DoctorInput& in, DoctorLayer l) {
  l.status = "missing";
  l.detail = "cannot read the cgroup layout: " + in.layout.error().message();
  l.fix = "mount cgroupfs (cgroup2 at /sys/fs/cgroup, or the v1 hierarchies)";
  return l;
}

// Which hierarchy enforces `controller`, found by planning a sandbox with that limit alone: the
// same decision the daemon will make.
DoctorLayer CgroupLimitLayer(const DoctorInput& in, const char* controller,
                             const isolate::CgroupLimits& limits) {
  DoctorLayer l =
      Layer(std::string("cgroup_") + controller, std::string("cgroup ") + controller, false);
  if (!in.layout.ok()) return NoLayout(in, std::move(l));
  auto plan = isolate::PlanCgroups(*in.layout, limits, "nsbox-doctor");
  if (!plan.ok()) {
    l.status = "missing";
    std::tie(l.detail, l.fix) = SplitFix(plan.error().message(), "");
    size_t at = l.detail.find(". Fix: ");
    if (at != std::string::npos) {
      l.fix = l.detail.substr(at + 7);
      l.detail.resize(at);
    }
    return l;
  }
  for (const isolate::CgroupDirPlan& d : plan->dirs) {
    if (std::find(d.controllers.begin(), d.controllers.end(), controller) == d.controllers.end()) {
      continue;
    }
    const char* version = d.version == isolate::CgroupVersion::kV2 ? "v2" : "v1";
    l.status = "ok";
    l.detail = std::string("cgroup ") + version + " under " + d.parent;
    l.fields = {{"hierarchy", version}, {"parent", d.parent}};
    return l;
  }
  l.status = "missing";
  l.detail = "no hierarchy enforces it";
  return l;
}

// Where the sandboxes' cgroups would be made, and why (docs/cgroups.md "Placement").
DoctorLayer PlacementLayer(const DoctorInput& in) {
  DoctorLayer l = Layer("cgroup_placement", "cgroup placement", false);
  if (!in.placement.ok()) {
    l.status = "missing";
    std::tie(l.detail, l.fix) = SplitFix(in.placement.error().message(), "");
    size_t at = l.detail.find(". Fix: ");
    if (at != std::string::npos) {
      l.fix = l.detail.substr(at + 7);
      l.detail.resize(at);
    }
    return l;
  }
  const isolate::PlacementPlan& p = *in.placement;
  l.status = "ok";
  l.detail = std::string(isolate::PlacementKindName(p.kind)) + ": ";
  switch (p.kind) {
    case isolate::PlacementKind::kAsFound:
      l.detail += "sandboxes under " + p.base;
      break;
    case isolate::PlacementKind::kOwnLeaf:
      l.detail += "nsbox moves into " + p.leaf + ", sandboxes beside it";
      break;
    case isolate::PlacementKind::kSystemdScope:
      l.detail += "nsbox asks systemd for a scope of its own (Delegate=yes), sandboxes in it";
      break;
    case isolate::PlacementKind::kCgroupfs:
      l.detail += "sandboxes under " + p.base;
      break;
  }
  l.detail += " (" + p.why + "); controllers: " +
              (p.controllers.empty() ? std::string("none in v2") : Join(p.controllers, " "));
  l.fields = {{"kind", std::string(isolate::PlacementKindName(p.kind))}, {"base", p.base}};
  l.lists = {{"controllers", p.controllers}};
  return l;
}

// Where the figures of an exec's `usage` come from on this host (docs/cgroups.md "Per-exec
// usage"): the same order of sources exec/usage.cc reads.
DoctorLayer UsageLayer(const DoctorInput& in) {
  DoctorLayer l = Layer("exec_usage", "exec usage", false);
  if (!in.layout.ok()) return NoLayout(in, std::move(l));
  const isolate::CgroupLayout& layout = *in.layout;
  auto in_v2 = [&layout](const char* c) {
    return layout.v2.has_value() &&
           std::find(layout.v2->controllers.begin(), layout.v2->controllers.end(), c) !=
               layout.v2->controllers.end();
  };
  std::vector<std::string> have, null;
  auto source = [&](const char* key, const std::string& fields, std::string from) {
    if (from.empty()) {
      null.push_back(fields);
    } else {
      have.push_back(fields + " from " + from);
    }
    l.fields.emplace_back(key, from.empty() ? "null" : from);
  };
  source("cpu", "cpuUserMs, cpuSystemMs", layout.v2.has_value() ? "cgroup v2 cpu.stat" : "");
  source("memory", "memoryPeakBytes",
         in_v2("memory")    ? "cgroup v2 memory.peak"
         : layout.memory_v1 ? "cgroup v1 memory.max_usage_in_bytes"
                            : "");
  source("pids", "pidsPeak",
         in_v2("pids")    ? "cgroup v2 pids.peak"
         : layout.pids_v1 ? "cgroup v1 pids.peak"
                          : "");
  source("io", "ioReadBytes, ioWriteBytes", in_v2("io") ? "cgroup v2 io.stat" : "");
  l.detail = Join(have, "; ");
  if (!null.empty()) {
    l.detail += std::string(have.empty() ? "" : "; ") + "null: " + Join(null, ", ");
    if (!in_v2("io")) {
      l.detail +=
          " (io needs the v2 io controller: v1 blkio does not charge buffered "
          "writeback to the writer)";
    }
  }
  const bool core = layout.v2.has_value() && (in_v2("memory") || layout.memory_v1.has_value()) &&
                    (in_v2("pids") || layout.pids_v1.has_value());
  l.status = core ? "ok" : "degraded";
  if (!core) l.fix = "a cgroup v2 mount and the memory and pids controllers (v2 or v1)";
  return l;
}

// Whether moving a jail or a command into its v1 cgroups waits for an RCU grace period
// (docs/cgroups.md "Moves into v1").
DoctorLayer MovesLayer(const DoctorInput& in) {
  DoctorLayer l = Layer("cgroup_moves", "cgroup v1 moves", false);
  if (!in.layout.ok()) return NoLayout(in, std::move(l));
  const isolate::CgroupLayout& layout = *in.layout;
  l.status = "ok";
  if (!isolate::MovesIntoV1(layout)) {
    l.detail = "none: no v1 hierarchy is used, every process is born in its cgroup";
    return l;
  }
  if (isolate::HasFavorDynmods(layout)) {
    l.detail = "fast: cgroup2 has favordynmods, a move does not wait for an RCU grace period";
    return l;
  }
  l.status = "degraded";
  l.detail =
      "each move of a jail or a command into its v1 cgroups may wait for an RCU grace period "
      "(milliseconds on a quiet host): cgroup2 has no favordynmods";
  l.fix = layout.v2 ? "nsbox serve and nsbox run turn it on at start (unless "
                      "--leave-cgroup-mount); or boot with cgroup_favordynmods=true"
                    : "boot with cgroup_favordynmods=true (Linux 6.6), or mount cgroup2";
  return l;
}

}  // namespace

DoctorInput ProbeDoctorInput() {
  DoctorInput in;
  in.features = ProbeFeatures();
  in.layout = isolate::LoadCgroupLayout();
  // The doctor never places itself: its layout is its own cgroup's.
  auto facts = in.layout.ok() ? isolate::GatherPlacementFacts(*in.layout)
                              : Result<isolate::PlacementFacts>(in.layout.error());
  if (facts.ok()) {
    in.placement = isolate::PlanPlacement(*facts);
  } else {
    in.placement = std::move(facts).error();
  }
  // The limits are judged where the sandboxes would be made: in the placement's base, which
  // nsbox manages (a scope's is not there yet: the cgroup it is made from stands for it).
  if (in.layout.ok() && in.layout->v2.has_value() && in.placement.ok() &&
      in.placement->kind != isolate::PlacementKind::kAsFound) {
    isolate::CgroupHierarchy& v2 = *in.layout->v2;
    if (!in.placement->base.empty()) v2.dir = in.placement->base;
    v2.delegated = true;
  }
  in.euid = ::geteuid();
  cap_t caps = cap_get_proc();
  for (auto [cap, name] :
       {std::pair{CAP_SYS_ADMIN, "CAP_SYS_ADMIN"}, std::pair{CAP_SETUID, "CAP_SETUID"},
        std::pair{CAP_SETGID, "CAP_SETGID"}}) {
    cap_flag_value_t value = CAP_CLEAR;
    if (caps == nullptr || cap_get_flag(caps, cap, CAP_EFFECTIVE, &value) != 0 ||
        value != CAP_SET) {
      in.missing_caps.emplace_back(name);
    }
  }
  if (caps != nullptr) cap_free(caps);
  struct utsname u {};
  if (::uname(&u) == 0) in.kernel = u.release;
  if (auto binary = net::DefaultNetBinary(); binary.ok()) in.network_binary = *binary;
  in.network_probe = ProbeNetwork();
  in.disks = isolate::DiskSupport();
  return in;
}

Result<std::string> ProbeNetwork() {
  NSBOX_ASSIGN_OR_RETURN(std::string binary, net::DefaultNetBinary());
  NSBOX_ASSIGN_OR_RETURN(ProgramRun run, RunProgram({binary, "--probe"}, nullptr, 1u << 20));
  if (run.output.empty()) {
    return Error::Msg(binary + " --probe printed nothing (" + DescribeExit(run.status) + ")");
  }
  return std::move(run.output);
}

std::vector<DoctorLayer> DoctorLayers(const DoctorInput& in) {
  const Features& f = in.features;
  std::vector<DoctorLayer> out;

  DoctorLayer priv = Layer("privileges", "privileges", true);
  if (in.euid == 0 && in.missing_caps.empty()) {
    priv.status = "ok";
    priv.detail = "root with CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID";
  } else {
    priv.status = "missing";
    priv.detail = in.euid != 0 ? "running as uid " + std::to_string(in.euid) + ", not root"
                               : "root without " + Join(in.missing_caps, ", ");
    priv.detail +=
        ": nsbox needs root (CAP_SYS_ADMIN for namespaces, mounts and cgroups; CAP_SETUID and "
        "CAP_SETGID to write the uid/gid maps of its jails)";
    priv.fix = "run nsbox as root (sudo), with the full capability set";
  }
  out.push_back(std::move(priv));

  out.push_back(FromItem("user_namespaces", "user namespaces", true, f.user_namespaces,
                         "user.max_user_namespaces = " + std::to_string(f.max_user_namespaces),
                         "a kernel with CONFIG_USER_NS and user namespaces allowed"));
  out.push_back(FromItem("namespaces", "namespaces", true, f.mount_namespaces,
                         "mount, pid, net, ipc, uts, cgroup: in one clone with the user namespace",
                         "a kernel with CONFIG_{PID,NET,IPC,UTS,CGROUP}_NS"));
  out.push_back(FromItem("seccomp", "seccomp", true, f.seccomp_filter,
                         "filters with SECCOMP_RET_KILL_PROCESS and SECCOMP_RET_ERRNO",
                         "a kernel with CONFIG_SECCOMP_FILTER=y"));
  DoctorLayer caps = Layer("capabilities", "capabilities", false);
  caps.status = "ok";
  caps.detail = "libcap: commands keep a Docker-like set, with no_new_privs";
  out.push_back(std::move(caps));
  out.push_back(FromItem("pidfd", "pidfd", true, f.pidfd,
                         "pidfd_open, pidfd_send_signal, waitid(P_PIDFD)", "Linux >= 5.4"));

  out.push_back(PlacementLayer(in));
  out.push_back(CgroupLimitLayer(in, "memory", {.memory_bytes = uint64_t{1} << 30}));
  out.push_back(CgroupLimitLayer(in, "pids", {.pids = 1024}));
  out.push_back(CgroupLimitLayer(in, "cpu", {.cpus = 1.0}));

  DoctorLayer kill = Layer("kill_scope", "kill scope", false);
  std::string v2_dir = in.layout.ok() && in.layout->v2.has_value() ? in.layout->v2->dir : "";
  if (f.cgroup_v2.available && f.cgroup_kill.available) {
    kill.status = "ok";
    kill.detail = "cgroup.kill in a cgroup v2 child of " + (v2_dir.empty() ? "?" : v2_dir);
  } else if (f.cgroup_v2.available) {
    auto [why, fix] = SplitFix(f.cgroup_kill.detail, "Linux >= 5.14");
    kill.status = "degraded";
    kill.detail = "cgroup v2 without cgroup.kill (" + why +
                  "): SIGKILL to each pid of the cgroup, repeated until it is empty";
    kill.fix = fix;
  } else {
    kill.status = "missing";
    kill.detail = "no cgroup v2 (" + f.cgroup_v2.detail +
                  "): a command is killed by its process group, which a process can leave";
    kill.fix =
        SplitFix(f.cgroup_v2.detail, "mount cgroup2 (hybrid hosts: /sys/fs/cgroup/unified)").second;
  }
  kill.lists = {{"cgroup_v2_controllers", f.cgroup_v2_controllers},
                {"cgroup_v1_controllers", f.cgroup_v1_controllers}};
  out.push_back(std::move(kill));
  out.push_back(UsageLayer(in));
  out.push_back(MovesLayer(in));

  DoctorLayer clone = Layer("clone_into_cgroup", "clone3/CLONE_INTO_CGROUP", false);
  if (f.clone3.available && f.clone_into_cgroup.available && f.cgroup_v2.available) {
    clone.status = "ok";
    clone.detail = "a jail is born in its cgroup v2 directory";
  } else if (f.clone3.available && f.clone_into_cgroup.available) {
    clone.status = "degraded";
    clone.detail = "available, but without cgroup v2 there is no directory to be born in";
  } else {
    clone.status = "degraded";
    clone.detail = (f.clone3.available ? f.clone_into_cgroup.detail : f.clone3.detail) +
                   "; the child is moved into its cgroups right after clone";
    clone.fix = "Linux >= 5.7";
  }
  out.push_back(std::move(clone));

  out.push_back(FromItem("openat2", "openat2", false, f.openat2,
                         "RESOLVE_IN_ROOT for the file verbs", "Linux >= 5.6"));
  out.push_back(FromItem("mount_setattr", "mount_setattr", false, f.mount_setattr,
                         "recursive read-only binds in one call", "Linux >= 5.12"));
  out.push_back(FromItem("overlayfs", "overlayfs", false, f.overlayfs,
                         "images with a persistent upper layer", "modprobe overlay"));

  DoctorLayer uring = FromItem("io_uring", "io_uring", false, f.io_uring, "all opcodes nsbox uses",
                               "Linux >= 5.6 with io_uring enabled");
  std::vector<std::string> essential_missing;
  for (const std::string& op : f.io_uring_missing_ops) {
    if (std::find(std::begin(kUringEssentialOps), std::end(kUringEssentialOps), op) !=
        std::end(kUringEssentialOps)) {
      essential_missing.push_back(op);
    }
  }
  if (f.io_uring.available && !f.io_uring_missing_ops.empty()) {
    uring.status = "degraded";
    uring.detail = "missing opcodes: " + Join(f.io_uring_missing_ops, ", ");
    if (std::find(f.io_uring_missing_ops.begin(), f.io_uring_missing_ops.end(), "WAITID") !=
        f.io_uring_missing_ops.end()) {
      uring.detail += " (WAITID: Linux 6.7; exits are seen by polling pidfds instead)";
    }
    uring.fix = "a newer kernel";
  }
  uring.lists = {{"missing_ops", f.io_uring_missing_ops}};
  out.push_back(std::move(uring));

  DoctorLayer loop = Layer("event_loop", "event loop", false);
  if (f.io_uring.available && essential_missing.empty()) {
    loop.status = "ok";
    loop.detail = "io_uring";
    loop.fields = {{"backend", "io_uring"}};
  } else {
    loop.status = "degraded";
    loop.detail =
        "epoll (io_uring unavailable: " +
        (f.io_uring.available ? "missing " + Join(essential_missing, ", ") : f.io_uring.detail) +
        ")";
    loop.fields = {{"backend", "epoll"}};
  }
  out.push_back(std::move(loop));

  // A sandbox's own disk (limits.diskBytes, isolate/disk.h): optional; without it such a
  // sandbox is refused (422) and the others keep their files on the state directory's disk.
  DoctorLayer disks = Layer("disks", "sandbox disks", false);
  if (in.disks.ok()) {
    disks.status = "ok";
    disks.detail = "limits.diskBytes: an ext4 image per sandbox on a loop device";
  } else {
    disks.status = "missing";
    const std::string& why = in.disks.error().message();
    disks.detail = "limits.diskBytes is refused: " + why;
    // The fix for what DiskSupport found missing, not a list of everything it checks.
    disks.fix = why.find("open_tree") != std::string::npos
                    ? "Linux 6.15 or later (the jail clones a directory of the disk's detached "
                      "mount, which earlier kernels refuse)"
                : why.find("mkfs.ext4") != std::string::npos
                    ? "apt-get install e2fsprogs"
                    : "load the loop and ext4 modules (modprobe loop ext4)";
  }
  out.push_back(std::move(disks));

  // Sandbox networking (docs/network.md): optional; without it every sandbox has loopback only
  // and the daemon refuses a network policy other than "none".
  if (!in.network_probe.ok()) {
    DoctorLayer net = Layer("network", "network policies", false);
    net.status = "missing";
    net.detail = in.network_probe.error().message();
    // nsbox-net is a target of the same build as nsbox (net/netd.cmake), installed into the same
    // bin/ by `cmake --install`, and looked for beside nsbox or in the build tree's net/.
    net.fix = in.network_binary.empty()
                  ? "build nsbox-net with nsbox (cmake --build build, as sudo scripts/start "
                    "does) and put it beside this nsbox: cmake --install build installs both, "
                    "or copy build/net/nsbox-net next to it"
                  : "run " + in.network_binary +
                        " --probe as root to see why (it is linked with libnftables and libmnl: "
                        "apt-get install libnftables1 libmnl0)";
    out.push_back(std::move(net));
  } else {
    for (std::string_view line : Split(*in.network_probe, '\n')) {
      const size_t colon = line.find(": ");
      if (colon == std::string_view::npos || colon == 0) continue;
      const std::string name(line.substr(0, colon));
      std::string_view rest = line.substr(colon + 2);
      std::string key = "network_";
      for (char ch : name) key += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      DoctorLayer net = Layer(key, "network: " + name, false);
      const bool ok = rest.rfind("ok", 0) == 0;
      net.status = ok ? "ok" : "missing";
      const size_t word_end = rest.find(' ');  // "ok", "missing": the status word
      rest.remove_prefix(word_end == std::string_view::npos ? rest.size() : word_end);
      while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
      if (rest.size() >= 2 && rest.front() == '(' && rest.back() == ')') {
        rest = rest.substr(1, rest.size() - 2);
      }
      net.detail = rest.empty() ? std::string(ok ? "usable" : "unusable") : std::string(rest);
      out.push_back(std::move(net));
    }
  }
  return out;
}

bool DoctorOk(const std::vector<DoctorLayer>& layers) {
  return std::all_of(layers.begin(), layers.end(),
                     [](const DoctorLayer& l) { return !l.required || l.status == "ok"; });
}

std::string DoctorText(const DoctorInput& input, const std::vector<DoctorLayer>& layers) {
  size_t name_width = 5;
  for (const DoctorLayer& l : layers) name_width = std::max(name_width, l.name.size());
  auto pad = [](std::string s, size_t width) {
    s.resize(std::max(s.size(), width), ' ');
    return s;
  };
  const size_t status_width = 10;
  const size_t required_width = 10;
  const std::string indent(name_width + 2 + status_width + required_width, ' ');

  std::string out = "nsbox doctor: Linux " + (input.kernel.empty() ? "?" : input.kernel) + "\n\n";
  out += pad("LAYER", name_width + 2) + pad("STATUS", status_width) +
         pad("REQUIRED", required_width) + "DETAIL\n";
  int degraded = 0;
  int missing_optional = 0;
  int missing_required = 0;
  for (const DoctorLayer& l : layers) {
    out += pad(l.name, name_width + 2) + pad(l.status, status_width) +
           pad(l.required ? "yes" : "no", required_width) + l.detail + "\n";
    if (!l.fix.empty()) out += indent + "fix: " + l.fix + "\n";
    if (l.status == "degraded") ++degraded;
    if (l.status == "missing") ++(l.required ? missing_required : missing_optional);
  }
  out += "\n";
  if (missing_required == 0) {
    out += "Every required layer is present";
  } else {
    out += std::to_string(missing_required) + " required layer(s) missing: nsbox cannot run here";
  }
  out += " (" + std::to_string(degraded) + " degraded, " + std::to_string(missing_optional) +
         " optional missing).\n";
  return out;
}

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;  // UTF-8 passes through; paths are bytes, but this is a report
        }
    }
  }
  out += '"';
  return out;
}

std::string DoctorJson(const DoctorInput& input, const std::vector<DoctorLayer>& layers) {
  std::string out = "{\n  \"ok\": ";
  out += DoctorOk(layers) ? "true" : "false";
  out += ",\n  \"kernel\": " + JsonString(input.kernel) + ",\n  \"layers\": {";
  bool first = true;
  for (const DoctorLayer& l : layers) {
    out += first ? "\n" : ",\n";
    first = false;
    out += "    " + JsonString(l.key) + ": {\"name\": " + JsonString(l.name) +
           ", \"status\": " + JsonString(l.status) +
           ", \"required\": " + (l.required ? "true" : "false") +
           ", \"detail\": " + JsonString(l.detail) + ", \"fix\": " + JsonString(l.fix);
    for (const auto& [key, value] : l.fields) {
      out += ", " + JsonString(key) + ": " + JsonString(value);
    }
    for (const auto& [key, values] : l.lists) {
      out += ", " + JsonString(key) + ": [";
      for (size_t i = 0; i < values.size(); ++i) {
        out += (i == 0 ? "" : ", ") + JsonString(values[i]);
      }
      out += "]";
    }
    out += "}";
  }
  out += "\n  }\n}\n";
  return out;
}

int RunDoctor(bool json, std::FILE* out) {
  DoctorInput input = ProbeDoctorInput();
  std::vector<DoctorLayer> layers = DoctorLayers(input);
  std::string text = json ? DoctorJson(input, layers) : DoctorText(input, layers);
  std::fwrite(text.data(), 1, text.size(), out);
  std::fflush(out);
  return DoctorOk(layers) ? 0 : 1;
}

}  // namespace nsbox::runtime

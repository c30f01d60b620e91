#include "runtime/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/files.h"
#include "base/log.h"
#include "isolate/capabilities.h"
#include "isolate/cgroup_placement.h"
#include "isolate/seccomp.h"
#include "policy/capabilities.h"
#include "policy/seccomp_profile.h"

namespace nsbox::runtime {

namespace {

std::string ProgramBytes(const isolate::SeccompProgram& program) {
  auto insns = program.instructions();
  return std::string(reinterpret_cast<const char*>(insns.data()),
                     insns.size() * sizeof(struct sock_filter));
}

// How long nsbox-init may take to answer its hello: its CPU limit (cpu.max, which it is under
// from its exec) slows its start as much as its commands, so a sandbox of 0.1 CPU gets ten times
// InitClient::kHelloAnswerLimit.
std::chrono::milliseconds HelloLimit(const isolate::CgroupLimits& limits) {
  const auto base = fs::InitClient::kHelloAnswerLimit;
  if (!limits.cpus || *limits.cpus >= 1.0) return base;
  const double scaled = static_cast<double>(base.count()) / std::max(*limits.cpus, 0.01);
  return std::chrono::milliseconds(static_cast<int64_t>(scaled));
}

// nsbox-init's answer to the ping sent with its hello: the hello is carried out.
Status Confirm(const fs::InitClient::StartWait& started, std::chrono::milliseconds limit) {
  auto pong = started(limit);
  if (!pong.ok()) {
    return Error(pong.error().err, "nsbox-init did not answer: " + pong.error().message);
  }
  return Ok();
}

}  // namespace

Result<std::string> DefaultInitBinary() {
  return FindBesideSelf({"/nsbox-init", kInitInLibexec, "/../runtime/nsbox-init"}, "nsbox-init");
}

Result<fs::proto::Hello> MakeHello(const PreparedJail& prepared) {
  fs::proto::Hello hello;
  // nsbox-init runs under the default profile less clone3 and io_uring, which only it needs; each
  // command adds a small filter that takes exactly those back. Filters stack (the stricter
  // answer wins), so a command runs under the whole default profile.
  NSBOX_ASSIGN_OR_RETURN(auto init_program, isolate::CompileSeccomp(policy::InitSeccompProfile()));
  NSBOX_ASSIGN_OR_RETURN(auto command_program,
                         isolate::CompileSeccomp(policy::CommandOverInitSeccompProfile()));
  hello.command_seccomp = ProgramBytes(command_program);
  hello.init_seccomp = ProgramBytes(init_program);
  NSBOX_ASSIGN_OR_RETURN(auto caps,
                         isolate::PlanCapabilities(policy::DefaultCommandCapabilities()));
  hello.capabilities = caps.keep();
  hello.last_cap = static_cast<uint32_t>(caps.last_cap());
  for (const auto& [resource, limit] : prepared.spec.rlimits) {
    hello.rlimits.push_back({static_cast<uint32_t>(resource), limit.rlim_cur, limit.rlim_max});
  }
  hello.shell = prepared.image.shell;
  return hello;
}

Result<std::unique_ptr<Sandbox>> Sandbox::Start(const SandboxOptions& options) {
  std::unique_ptr<Sandbox> box(new Sandbox());
  JailOptions jail = options.jail;
  // A sandbox lives long: bind the host's /etc files rather than keep copies in its tmpfs.
  jail.copy_etc_files = false;
  // Only for the start: a running sandbox keeps none of the plan (its mounts, its image's
  // layout), which would cost the daemon memory for every sandbox it holds.
  NSBOX_ASSIGN_OR_RETURN(PreparedJail prepared, PrepareJail(jail));
  auto& spec = prepared.spec;
  box->shell_ = prepared.image.shell;

  std::string init_binary = options.init_binary;
  if (init_binary.empty()) {
    NSBOX_ASSIGN_OR_RETURN(init_binary, DefaultInitBinary());
  }
  // Opened here, on the host: the jail executes this very file, whatever its root holds.
  UniqueFd init_fd(::open(init_binary.c_str(), O_PATH | O_CLOEXEC));
  if (!init_fd.valid()) return Error::Sys("open", init_binary, errno).Context("nsbox-init");
  NSBOX_ASSIGN_OR_RETURN(auto hello, MakeHello(prepared));

  isolate::RetryFailedPlacement();  // a daemon that could not place itself at start
  NSBOX_ASSIGN_OR_RETURN(auto layout, isolate::LoadCgroupLayout());
  NSBOX_ASSIGN_OR_RETURN(auto plan,
                         isolate::PlanCgroups(layout, prepared.limits, options.cgroup_name));
  NSBOX_ASSIGN_OR_RETURN(box->cgroups_, isolate::Cgroups::Create(plan));
  if (box->cgroups_.v2_dir_fd() >= 0) {
    // nsbox-init makes a cgroup per command under the sandbox's: hand the directory to the
    // jail's root (cgroup-v2 "Delegation"; the limits stay in files it does not own).
    NSBOX_TRY_CTX(box->cgroups_.DelegateV2(spec.ids.uid.outside, spec.ids.gid.outside),
                  "delegate the sandbox's cgroup");
  }
  // The v1 memory and pids directories too (made also without a limit, for accounting): the
  // jail's root makes a cgroup per command there, to measure what it used.
  NSBOX_TRY_CTX(box->cgroups_.DelegateV1(spec.ids.uid.outside, spec.ids.gid.outside),
                "delegate the sandbox's cgroup v1 directories");

  spec.init_fd = init_fd.get();
  spec.init_argv = {"nsbox-init", "--control-fd", "3"};
  if (box->cgroups_.v2_dir_fd() >= 0) {
    spec.init_argv.insert(spec.init_argv.end(), {"--cgroup-fd", "4"});
  }
  spec.cgroup_v1_memory_fd = box->cgroups_.v1_dir_fd("memory");
  spec.cgroup_v1_pids_fd = box->cgroups_.v1_dir_fd("pids");
  if (spec.cgroup_v1_memory_fd >= 0) {
    spec.init_argv.insert(spec.init_argv.end(), {"--memory-cgroup-fd", "5"});
  }
  if (spec.cgroup_v1_pids_fd >= 0) {
    spec.init_argv.insert(spec.init_argv.end(), {"--pids-cgroup-fd", "6"});
  }
  if (options.pooled) {
    if (!jail.adopt_later) return Error::Msg("a pooled sandbox needs a jail adopted later");
    spec.init_argv.insert(spec.init_argv.end(),
                          {"--adopt", "1", "--own-etc-fd", std::to_string(isolate::kInitOwnEtcFd)});
  }
  std::string reactor = options.reactor;
  if (reactor.empty() && ::getenv("NSBOX_REACTOR") != nullptr) reactor = ::getenv("NSBOX_REACTOR");
  if (!reactor.empty()) spec.init_argv.insert(spec.init_argv.end(), {"--reactor", reactor});
  spec.cgroup_v2_fd = box->cgroups_.v2_dir_fd();
  isolate::Cgroups* cgroups = &box->cgroups_;
  spec.place_in_cgroups = [cgroups](pid_t pid, bool joined_v2) {
    return cgroups->AddProcess(pid, !joined_v2);
  };
  NSBOX_ASSIGN_OR_RETURN(box->jail_, isolate::Jail::Start(spec));
  // The jail has attached its mounts: the host's handles on them would only keep them (an
  // image's overlay above all, whose upper layer must be free for the next start) alive.
  prepared.root_tree.reset();
  prepared.private_trees.clear();
  prepared.workspace_tree.reset();
  prepared.home_tree.reset();
  prepared.workspace.reset();
  prepared.home.reset();
  if (options.watch_channel) {
    box->client_ =
        std::make_shared<fs::InitClient>(box->jail_.TakeControl(), fs::InitClient::CallerReads{});
    options.watch_channel(box->client_);
  } else {
    box->client_ = std::make_shared<fs::InitClient>(box->jail_.TakeControl());
  }
  // nsbox-init runs (the jail reported its exec) and is our child, not yet waited for: its pid
  // is its own until Stop reaps it. (After the client: a failure here closes the channel, and
  // nsbox-init, waiting for its hello, exits at once.)
  const std::string netns = "/proc/" + std::to_string(box->jail_.pid()) + "/ns/net";
  box->netns_fd_.reset(::open(netns.c_str(), O_RDONLY | O_CLOEXEC));
  if (!box->netns_fd_.valid()) return Error::Sys("open", netns, errno);
  if (options.pooled) {
    // nsbox-init waits for its sandbox (Adopt); its start is confirmed by the jail's own report.
    box->pending_hello_ = std::move(hello);
    box->pool_ = std::make_unique<PoolFacts>(PoolFacts{jail.shared_etc_dir, prepared.shared_etc,
                                                       jail.nameserver, options.cgroup_name,
                                                       std::move(layout), spec.ids});
    return box;
  }
  auto started = box->client_->SendHello(hello);
  if (!started.ok()) return std::move(started).error().Context("configure nsbox-init");
  NSBOX_TRY(Confirm(*started, HelloLimit(prepared.limits)));
  return box;
}

Status Sandbox::Adopt(const JailOptions& jail) {
  NSBOX_ASSIGN_OR_RETURN(auto workspace, PinDirectory(jail.workspace));
  NSBOX_ASSIGN_OR_RETURN(auto home, PinDirectory(jail.home));
  return Adopt(jail, std::move(workspace), std::move(home));
}

Status Sandbox::Adopt(const JailOptions& jail, PinnedDir workspace, PinnedDir home) {
  return Adopt(jail, std::move(workspace), std::move(home), false);
}

Status Sandbox::AdoptAhead(const JailOptions& jail, PinnedDir workspace, PinnedDir home) {
  if (!pooled()) return Error(EINVAL, "this sandbox was not started for the pool");
  if (jail.memory || jail.pids || jail.cpus) {
    return Error(EINVAL, "a jail adopted ahead gets its sandbox's limits when it is assigned");
  }
  auto ahead = std::make_unique<Ahead>(Ahead{*pool_, UniqueFd(), UniqueFd()});
  NSBOX_TRY(Adopt(jail, std::move(workspace), std::move(home), true));
  // nsbox-init now holds, at the same fd, a writable clone of its own /etc directory's mount (its
  // root is read-only, and its /proc covers the path inside): opened from here, as a root of the
  // host may open another process's fds.
  const std::string proc = "/proc/" + std::to_string(jail_.pid());
  const std::string own_etc = proc + "/fd/" + std::to_string(isolate::kInitOwnEtcFd);
  ahead->own_etc.reset(::open(own_etc.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!ahead->own_etc.valid()) {
    return Error::Sys("open", own_etc, errno).Context("the jail's own /etc directory");
  }
  const std::string uts = proc + "/ns/uts";
  ahead->uts.reset(::open(uts.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ahead->uts.valid()) return Error::Sys("open", uts, errno);
  ahead_ = std::move(ahead);
  return Ok();
}

namespace {

// Sets the hostname of the UTS namespace `uts` from this thread, which joins it for the call and
// then goes back to its own.
Status SetHostnameIn(int uts, const std::string& hostname) {
  constexpr char kOwn[] = "/proc/thread-self/ns/uts";
  UniqueFd own(::open(kOwn, O_RDONLY | O_CLOEXEC));
  if (!own.valid()) return Error::Sys("open", kOwn, errno);
  if (::setns(uts, CLONE_NEWUTS) != 0) {
    return Error::Sys("setns", "the jail's UTS namespace", errno);
  }
  const int err = ::sethostname(hostname.data(), hostname.size()) == 0 ? 0 : errno;
  if (::setns(own.get(), CLONE_NEWUTS) != 0) {
    // Only this thread's uname() would say the jail's name: nothing of the daemon asks it.
    log::error("setns {}: {} (a thread of the daemon stays in a jail's UTS namespace)", kOwn,
               ErrnoText(errno));
  }
  if (err != 0) return Error::Sys("sethostname", hostname, err);
  return Ok();
}

}  // namespace

Status Sandbox::Assign(const JailOptions& jail) {
  if (ahead_ == nullptr) return Error(EINVAL, "this jail was not adopted ahead");
  const PoolFacts& facts = ahead_->facts;
  NSBOX_TRY(facts.Fits(jail));
  NSBOX_TRY(CheckHostname(jail.hostname));
  NSBOX_ASSIGN_OR_RETURN(auto limits, ParseLimits(jail));
  if (limits.memory_bytes) {
    return Error(EOPNOTSUPP, "a memory limit sizes /tmp and /dev/shm, which only an adoption does");
  }
  NSBOX_ASSIGN_OR_RETURN(auto cgroup_plan,
                         isolate::PlanCgroups(facts.layout, limits, facts.cgroup_name));
  NSBOX_TRY_CTX(cgroups_.CheckLimitTargets(cgroup_plan), "assign a jail adopted ahead");
  NSBOX_TRY(facts.CheckEtcCurrent());
  NSBOX_TRY_CTX(cgroups_.ApplyLimits(cgroup_plan), "assign a jail adopted ahead");
  for (const auto& file : isolate::GeneratedEtcFiles(jail.hostname, facts.nameserver)) {
    if (file.name == "hosts" || file.name == "hostname") {
      NSBOX_TRY(isolate::RewriteOwnEtcFile(ahead_->own_etc.get(), file.name, file.content));
    }
  }
  NSBOX_TRY(SetHostnameIn(ahead_->uts.get(), jail.hostname));
  ahead_.reset();
  return Ok();
}

Status Sandbox::Adopt(const JailOptions& jail, PinnedDir workspace, PinnedDir home, bool ahead) {
  if (!pooled()) return Error(EINVAL, "this sandbox was not started for the pool");
  const PoolFacts& pool = *pool_;
  NSBOX_TRY(pool.Fits(jail));
  NSBOX_TRY(CheckHostname(jail.hostname));
  NSBOX_ASSIGN_OR_RETURN(auto limits, ParseLimits(jail));
  NSBOX_ASSIGN_OR_RETURN(auto cgroup_plan,
                         isolate::PlanCgroups(pool.layout, limits, pool.cgroup_name));
  if (!workspace.tree.valid() || !home.tree.valid()) {
    return Error(ENOSYS, "open_tree: the kernel cannot clone the sandbox's directories");
  }
  // A limit no cgroup of the jail can take (ENOENT) leaves it as it was, still pooled(); a write
  // that fails after the first one may have left limits on it: then it is no longer poolable.
  NSBOX_TRY_CTX(cgroups_.CheckLimitTargets(cgroup_plan), "adopt a pooled jail");
  if (auto st = cgroups_.ApplyLimits(cgroup_plan); !st.ok()) {
    pending_hello_.reset();
    return std::move(st).error().Context("adopt a pooled jail");
  }

  fs::proto::Hello hello = std::move(*pending_hello_);
  pending_hello_.reset();
  auto& adoption = hello.adoption.emplace();
  adoption.hostname = jail.hostname;
  for (const auto& file : isolate::GeneratedEtcFiles(jail.hostname, pool.nameserver)) {
    if (file.name == "hosts") adoption.etc_hosts = file.content;
    if (file.name == "hostname") adoption.etc_hostname = file.content;
  }
  if (limits.memory_bytes) {
    // As PlanMounts sizes it: /tmp and /dev/shm together half the memory.
    adoption.tmpfs_size = *limits.memory_bytes / 2;
  }
  adoption.ahead = ahead;
  const std::unique_ptr<PoolFacts> facts = std::move(pool_);
  auto started = client_->SendHello(hello, {workspace.tree.get(), home.tree.get()});
  if (!started.ok()) return std::move(started).error().Context("adopt a pooled jail");
  // Checked while nsbox-init adopts, before the adoption is confirmed: a jail found stale here
  // never runs a command (the caller stops it, and the sandbox starts a jail of its own).
  NSBOX_TRY(facts->CheckEtcCurrent());
  return Confirm(*started, HelloLimit(limits));
}

Status Sandbox::PoolFacts::Fits(const JailOptions& jail) const {
  if (jail.image != "host" || jail.overlay || jail.shared_etc_dir != shared_etc_dir ||
      jail.nameserver != nameserver) {
    return Error(EINVAL, "a pooled jail is of the host image, with the daemon's /etc and resolver");
  }
  return Ok();
}

Status Sandbox::PoolFacts::CheckEtcCurrent() const {
  // The host's /etc as it is now: a jail made before a change would show the old one.
  NSBOX_ASSIGN_OR_RETURN(auto host_etc, isolate::ScanHostEtc("/etc"));
  NSBOX_ASSIGN_OR_RETURN(std::string etc, SharedEtcFor(shared_etc_dir, host_etc, nameserver, ids));
  if (etc != shared_etc) {
    return Error(ESTALE, "the host's /etc changed since this pooled jail was made");
  }
  return Ok();
}

Sandbox::~Sandbox() { (void)Stop(); }

Status Sandbox::Stop() {
  if (stopped_) return Ok();
  stopped_ = true;
  // Closes the channel, but keeps the client: a request on the worker pool may still hold this
  // sandbox and call it (case ConcurrentCreateDeleteExecOnOneId); it then gets EPIPE.
  if (client_ != nullptr) client_->Close();
  if (jail_.pid() > 0) {
    // nsbox-init kills its commands (SIGTERM, then SIGKILL after 2 s) and exits; it is given a
    // little more, then killed, which kills everything else in its PID namespace.
    struct pollfd p = {jail_.pidfd().fd(), POLLIN, 0};
    if (::poll(&p, 1, 3000) == 0) (void)jail_.Signal(SIGKILL);
    (void)jail_.Wait();
  }
  return cgroups_.Destroy();
}

}  // namespace nsbox::runtime

#pragma once

// A running sandbox: a jail whose PID 1 is nsbox-init, driven over the control channel. This is
// what nsboxd will hold per sandbox id; the integration tests and benchmarks use it directly.

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "base/error.h"
#include "base/unique_fd.h"
#include "fs/client.h"
#include "isolate/cgroup.h"
#include "isolate/jail.h"
#include "runtime/jail_setup.h"

namespace nsbox::runtime {

struct SandboxOptions {
  JailOptions jail;         // workspace, home, hostname, limits...; `command` stays empty
  std::string cgroup_name;  // the sandbox's cgroup directories (unique among running sandboxes)
  std::string init_binary;  // path of nsbox-init; default: beside the running executable
  // nsbox-init's event loop: "" (io_uring where the kernel allows it, else epoll), "epoll" or
  // "io_uring". Default: NSBOX_REACTOR of the caller's environment, so tests run on both.
  std::string reactor;
  // Who reads nsbox-init's answers: empty for a thread of the client's own; else the client is
  // made with fs::InitClient::CallerReads and handed to this, which has the caller's loop read it
  // (Start's handshake waits for that loop, so Start must not run on it).
  std::function<void(std::shared_ptr<fs::InitClient>)> watch_channel;
  // Started ahead of its sandbox, for nsboxd's pool (jail.adopt_later must be set too): nsbox-init
  // waits, still privileged, for Adopt.
  bool pooled = false;
};

class Sandbox {
 public:
  // Starts the jail with nsbox-init as PID 1, sends it the configuration and waits for its
  // first answer. Nothing is left behind when a step fails.
  static Result<std::unique_ptr<Sandbox>> Start(const SandboxOptions& options);
  // Makes a sandbox started with `pooled` the one `jail` describes (workspace, home, hostname,
  // limits; the host image and the same shared /etc and resolver): its cgroups get the limits,
  // then nsbox-init attaches the directories and goes on as after Start. On an error (ESTALE:
  // the host's /etc changed since it was made, found while nsbox-init adopts; ENOENT before the
  // hello: a limit needs a cgroup it has not, and it is still pooled()) the caller stops it, or
  // keeps it pooled, and starts the sandbox the usual way.
  Status Adopt(const JailOptions& jail);
  // The same, with the workspace and home already pinned by the caller (PinDirectory; their
  // paths in `jail` are then not used): a caller that renames their directory while the adoption
  // runs pins them first.
  Status Adopt(const JailOptions& jail, PinnedDir workspace, PinnedDir home);
  // Adoption ahead, for nsboxd's directories made ahead of their sandbox: Adopt with `jail`'s
  // directories (pinned by the caller) and a placeholder hostname, no limits, before any sandbox
  // asks for it. Assign then makes it the sandbox's with no work of nsbox-init's: what names the
  // sandbox is written from the host. Until then no command has run in it, and nsbox-init keeps
  // what it made ahead for the first command (Adoption::ahead).
  Status AdoptAhead(const JailOptions& jail, PinnedDir workspace, PinnedDir home);
  // Makes a jail adopted ahead the sandbox `jail` describes, whose directories must be the ones
  // it was adopted with (renamed since, maybe): its limits into its cgroups, its `hosts` and
  // `hostname` files (through the jail's own /etc directory, opened by AdoptAhead), its hostname
  // (set by this thread in the jail's UTS namespace, which it then leaves). Refused, the jail
  // unchanged, where only an adoption could do it (EOPNOTSUPP: a memory limit sizes /tmp and
  // /dev/shm; ENOENT: a limit needs a cgroup the jail has not) or the jail is stale (ESTALE: the
  // host's /etc changed since it was made): the caller stops it and starts the sandbox the usual
  // way, as it does on any other error.
  Status Assign(const JailOptions& jail);
  bool pooled() const { return pending_hello_.has_value(); }
  bool adopted_ahead() const { return ahead_ != nullptr; }
  // Stop(), if it was not called.
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  fs::InitClient& client() { return *client_; }
  pid_t init_pid() const { return jail_.pid(); }
  // Its network namespace (/proc/<init>/ns/net, opened at the start: nsbox-init is the daemon's
  // child, and its pid stays its own until Stop waits for it): where the
  // daemon makes the sockets of exposed ports (runtime/netns.h).
  int netns_fd() const { return netns_fd_.get(); }
  const isolate::Cgroups& cgroups() const { return cgroups_; }
  // The image's shell ("/bin/bash", else "/bin/sh"): what `command` runs under, and $SHELL.
  const std::string& shell() const { return shell_; }

  // Closes the channel: nsbox-init ends every process of the sandbox and exits (SIGKILL after a
  // grace if it does not); then the cgroups are removed. The workspace stays.
  Status Stop();

 private:
  Sandbox() = default;

  std::string shell_;
  isolate::Cgroups cgroups_;
  isolate::Jail jail_;
  std::shared_ptr<fs::InitClient> client_;  // shared with the loop that reads it, if any
  UniqueFd netns_fd_;
  // While pooled: the hello Adopt completes, and what the jail was made with.
  std::optional<fs::proto::Hello> pending_hello_;
  struct PoolFacts {
    std::string shared_etc_dir;  // the daemon's cache directory
    std::string shared_etc;      // the version attached at /etc
    std::string nameserver;
    std::string cgroup_name;
    isolate::CgroupLayout layout;
    isolate::IdMapping ids;
    // EINVAL unless `jail` is of the host image, with this /etc and resolver.
    Status Fits(const JailOptions& jail) const;
    // ESTALE when the host's /etc is no longer the version the jail attached.
    Status CheckEtcCurrent() const;
  };
  std::unique_ptr<PoolFacts> pool_;
  // Adopted ahead, until Assign: what the jail was made with, and the host's handles on what
  // names the sandbox.
  struct Ahead {
    PoolFacts facts;
    UniqueFd own_etc;  // the jail's own /etc directory (isolate::kOwnEtcDir), O_PATH
    UniqueFd uts;      // its UTS namespace
  };
  std::unique_ptr<Ahead> ahead_;
  Status Adopt(const JailOptions& jail, PinnedDir workspace, PinnedDir home, bool ahead);
  bool stopped_ = false;
};

// The hello nsbox-init gets: the commands' and its own seccomp programs, capabilities, rlimits.
Result<fs::proto::Hello> MakeHello(const PreparedJail& prepared);

// Where the package and `cmake --install` put nsbox-init, from nsbox's directory (bin/).
inline constexpr const char* kInitInLibexec = "/../libexec/nsbox/nsbox-init";
// nsbox-init beside the running executable (/proc/self/exe's directory), else in
// ../libexec/nsbox, else in the build tree's runtime/.
Result<std::string> DefaultInitBinary();

}  // namespace nsbox::runtime

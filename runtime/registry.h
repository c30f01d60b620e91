#pragma once

// nsboxd's registry: every sandbox id mapped to its directory in the state dir, its
// configuration, and while it runs its nsbox-init (runtime::Sandbox). design.md "State on disk":
//
//   <state>/sandboxes/<hash of id>/config.json   written atomically (temp, fsync, rename)
//   <state>/sandboxes/<hash of id>/workspace/    /workspace inside
//   <state>/sandboxes/<hash of id>/home/         /root inside
//   <state>/sandboxes/<hash of id>/upper/, work/ an imported image's sandbox: its overlay's
//                                                own layer, the whole root file system's changes
//   <state>/images/                              the imported images (images/store.h)
//
// Every method may block (mkdir, fsync, starting a jail): the HTTP server calls them on its
// worker pool, never on its event loop. Thread-safe.

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "images/store.h"
#include "isolate/disk.h"
#include "net/policy.h"
#include "runtime/api_error.h"
#include "runtime/metrics.h"
#include "runtime/sandbox.h"
#include "runtime/trash.h"

namespace nsbox::runtime {

struct SandboxLimits {
  std::optional<uint64_t> memory_bytes;
  std::optional<uint64_t> pids;
  std::optional<double> cpus;
  // The cap on a command's stdout and stderr together (api.md: 64 MiB, configurable per
  // sandbox); none: 64 MiB.
  std::optional<uint64_t> output_bytes;
  // The size of the sandbox's own disk (isolate/disk.h, a multiple of 4096), which holds its
  // workspace and home (its image's upper layer); none: its files live on the state dir's disk.
  std::optional<uint64_t> disk_bytes;
};

struct SandboxConfig {
  std::string id;
  std::string image = "host";
  // An imported image's content id (images/store.h): the unpacked root this sandbox's upper
  // layer was built on, kept even when the name is later replaced. "" for the host image.
  std::string image_id;
  std::string cwd = "/workspace";                        // absolute, normalised
  std::vector<std::pair<std::string, std::string>> env;  // sorted by name
  SandboxLimits limits;
  net::NetworkPolicy network;  // as given at creation, or the last PUT .../network
  std::string created_at;      // "2026-11-30T09:00:00.000Z"
  // Stopped once idle this long (docs/daemon.md "Idle stop"); 0: never; none: as the daemon's
  // --idle-stop says (RegistryOptions::idle_stop_ms).
  std::optional<uint64_t> idle_stop_ms;
};

// The bounds of `idleStopMs` (besides 0, never): a second (the daemon looks once a second) to 30
// days.
inline constexpr uint64_t kMinIdleStopMs = 1000;
inline constexpr uint64_t kMaxIdleStopMs = uint64_t{30} * 24 * 3600 * 1000;
// 0 (never), or within those bounds.
inline constexpr bool ValidIdleStopMs(uint64_t ms) {
  return ms == 0 || (ms >= kMinIdleStopMs && ms <= kMaxIdleStopMs);
}
// While the idle stop sees a process of its own in a sandbox, it looks again this often: the idle
// time counts from when it last saw one.
inline constexpr std::chrono::seconds kIdleBusyRecheck{1};

// Why `id` is not a valid sandbox id (api.md "Sandbox ids": 1 to 256 bytes of UTF-8 without
// control characters), or nullopt.
std::optional<std::string> InvalidIdReason(std::string_view id);
// The on-disk name of an id: a name-based UUID (RFC 4122 version 5, SHA-1) of it, as 32 hex
// digits. Never the id itself, so "..", "/" and friends are harmless.
std::string IdHash(std::string_view id);
// The hostname inside: the id when it is a valid host name label (letters, digits and inner
// '-', at most 63), else "sb-" and 12 hex digits of its hash.
std::string HostnameFor(std::string_view id, std::string_view hash);

// A CPU limit as nsbox keeps it: the value with the 6 significant digits it is applied with
// (cpu.max). config.json stores this, so that reading it back (Boost.JSON's parser may be one
// unit in the last place off) gives the same value again (case found by fuzz_config).
double CanonicalCpus(double cpus);
// config.json, both ways. Decode checks every field (the file may have been edited by hand).
std::string EncodeConfig(const SandboxConfig& config);
Result<SandboxConfig> DecodeConfig(std::string_view json);

class ExecSession;  // runtime/exec_session.h
class Registry;
}  // namespace nsbox::runtime
namespace nsbox::net {
class NetHelper;  // net/net_client.h
}  // namespace nsbox::net
namespace nsbox::runtime {

// One sandbox id. Shared by the registry and the requests that use it.
class SandboxEntry {
 public:
  // `idle_stop_ms`: the idle stop in force, its config's or else the daemon's default; 0: none.
  SandboxEntry(SandboxConfig config, std::string hash, std::string dir, uint64_t idle_stop_ms = 0);

  // The configuration at creation; its `network` may since have been replaced (network()).
  const SandboxConfig& config() const { return config_; }
  // The network policy now in force (docs/network.md).
  net::NetworkPolicy network() const;
  // The sandbox's IPv4 address while it runs with a network, else "".
  std::string address() const;
  const std::string& hash() const { return hash_; }
  const std::string& dir() const { return dir_; }
  bool running() const;

  // The exec sessions (docs/exec.md): running execs and ended ones kept for re-attach until
  // their retention ends. The sessions themselves are used on the daemon's event loop only.
  // A fresh exec id ("e-" and 12 hex digits) that no session of this sandbox has.
  std::string NewExecId() const;
  void AddSession(std::shared_ptr<ExecSession> session);
  std::shared_ptr<ExecSession> FindSession(const std::string& exec_id) const;
  // Removes `session` if it is still the one registered under its id.
  void RemoveSession(const ExecSession* session, const std::string& exec_id);
  // In the order they were started.
  std::vector<std::shared_ptr<ExecSession>> Sessions() const;
  // Every session, taken out (the sandbox was deleted, or the daemon stops).
  std::vector<std::shared_ptr<ExecSession>> TakeSessions();
  // <dir>/execs: the spill files of the sessions' output.
  std::string execs_dir() const { return dir_ + "/execs"; }

  // A request that uses what runs inside (exec, execs, files, fs, ports) begins and ends: the
  // idle stop (Registry::StopIfIdle) waits for the last to end, then for idle_stop_ms.
  void BeginUse();
  void EndUse();
  // The idle stop in force (docs/daemon.md "Idle stop"), in ms; 0: none.
  uint64_t idle_stop_ms() const { return idle_stop_ms_; }
  // When the idle stop should look at it next (Registry::StopIfIdle): idle_stop_ms after it was
  // last used or last seen with a process of its own, or kIdleBusyRecheck after a look that saw
  // one. None unless it runs, has idle_stop_ms and no request uses it.
  std::optional<std::chrono::steady_clock::time_point> IdleCheckAt() const;

 private:
  friend class Registry;
  const SandboxConfig config_;
  const std::string hash_;
  const std::string dir_;
  const uint64_t idle_stop_ms_;
  // Serialises start, stop and delete of this sandbox.
  std::mutex lifecycle_mu_;
  mutable std::mutex mu_;
  std::shared_ptr<Sandbox> box_;  // while nsbox-init runs
  // Its own disk, mounted at its first start and kept until it is deleted or the daemon ends
  // (under lifecycle_mu_): every start clones its directories from this one mount.
  std::unique_ptr<isolate::Disk> disk_;
  // While its creation's thread adopts a pooled jail for it (Registry::Create), and what waits
  // for that adoption to end (Registry::WhenAdopted).
  bool adopting_ = false;
  std::vector<std::function<void()>> on_adopted_;
  net::NetworkPolicy network_;
  std::string address_;  // while attached to nsbox-net
  bool deleted_ = false;
  // Requests using it now, and when the last one ended (or the entry was made).
  int users_ = 0;
  std::chrono::steady_clock::time_point last_used_ = std::chrono::steady_clock::now();
  // What the idle stop last saw: a process of its own (busy_), and when it last saw one, or
  // first saw none after seeing one.
  bool busy_ = false;
  std::chrono::steady_clock::time_point last_busy_{};
  std::optional<std::chrono::steady_clock::time_point> IdleCheckAtLocked() const;
  // Thousands when commands are many and short (each kept for --exec-retention): found by hash,
  // and ended in about the order they started, so removed from near the order's front.
  std::unordered_map<std::string, std::shared_ptr<ExecSession>> sessions_;
  std::deque<std::string> session_order_;  // ids, oldest first
};

struct RegistryOptions {
  std::string state_dir;
  std::string init_binary;  // "" for the default (beside the running executable)
  // Sandbox networking (docs/network.md): the daemon's address range, whose first address is the
  // resolver every sandbox's /etc/resolv.conf names; the resolver's upstreams ("" for the host's
  // /etc/resolv.conf); nsbox-net ("" for the one beside the running executable); its log level.
  std::string network_range = "10.213.0.0/16";
  std::vector<std::string> dns_upstreams;
  std::string net_binary;
  std::string log_level = "info";
  // Who reads the sandboxes' control channels (SandboxOptions::watch_channel): nsboxd's loop.
  std::function<void(std::shared_ptr<fs::InitClient>)> watch_channel;
  // Jails of the host image kept started ahead (docs/daemon.md "The pool"): a sandbox that
  // starts adopts one instead of starting its own. 0: none.
  size_t pool_size = 1;
  // The idle stop of the sandboxes whose config does not say (docs/daemon.md "Idle stop"), in
  // ms; 0: none.
  uint64_t idle_stop_ms = 0;
};

class Registry {
 public:
  // Makes the state directory, takes its lock (one daemon per state dir), removes what a dead
  // daemon left (half-created or half-deleted sandboxes, stale cgroups; never a workspace) and
  // loads every sandbox, stopped.
  static Result<std::unique_ptr<Registry>> Open(const RegistryOptions& options);
  ~Registry();

  // Find-or-create: the entry and whether this call created it. Race-free: of concurrent
  // calls with one id, exactly one creates.
  ApiOutcome<std::pair<std::shared_ptr<SandboxEntry>, bool>> Create(SandboxConfig config);
  std::shared_ptr<SandboxEntry> Find(std::string_view id) const;
  std::vector<std::shared_ptr<SandboxEntry>> List() const;  // sorted by id
  std::map<std::string, uint64_t> CountByState() const;

  // The sandbox's running nsbox-init, started on demand.
  ApiOutcome<std::shared_ptr<Sandbox>> Running(SandboxEntry& entry);
  // Its running nsbox-init when Running would return it without waiting for anything: running,
  // answering, and its network (if it has one) attached to a live nsbox-net. Else null.
  std::shared_ptr<Sandbox> RunningNow(const SandboxEntry& entry);
  // Whether the thread of the entry's creation is adopting a pooled jail for it; if so, `done`
  // is called once that adoption has ended, well or not (on that thread, after it let go of the
  // lifecycle lock). The daemon's loop waits so, instead of a worker thread on that lock: one
  // hand-off fewer before a new sandbox's first command.
  bool WhenAdopted(SandboxEntry& entry, std::function<void()> done);
  // Ends every process (running execs answer "stopped") and nsbox-init; the files stay.
  ApiOutcome<bool> Stop(SandboxEntry& entry);
  // The idle stop (docs/daemon.md "Idle stop"), once the entry's IdleCheckAt has come: looks for
  // processes in the sandbox besides nsbox-init and the child it made ahead, and stops it as Stop
  // does if there are none and it has been idle for its idle_stop_ms, counted from its last use
  // or the last look that saw one. Never waits for the sandbox's lifecycle lock: a start, stop or
  // delete under way is left to finish. Whether it stopped it.
  bool StopIfIdle(SandboxEntry& entry);
  // What a DELETE did. The sandbox is gone (stopped, out of the registry, its id free); when
  // `files_left` is set, some of its files are still on the host (docs/daemon.md "Deleting a
  // sandbox"): the answer is that error, not 204, and the removal is retried.
  struct Deleted {
    std::optional<ApiError> files_left;
  };
  // Stop, then removes the sandbox and all its files, and retries the removal of what earlier
  // DELETEs of the same id left (TrashBin::RetryNow). sandbox_not_found when there is neither.
  ApiOutcome<Deleted> Delete(std::string_view id);
  // At shutdown: stops every sandbox.
  void StopAll();
  // Image imports under way end unpublished (images::ImageStore::CancelImports).
  void CancelImports() { images_->CancelImports(); }

  // Replaces the network policy of a sandbox, running or not: written to its config.json, and
  // on a running sandbox applied at once to new connections (its interface added or removed when
  // it gains or loses a network). Refused (422 network_unavailable) when the host cannot
  // enforce it.
  ApiOutcome<bool> SetNetwork(SandboxEntry& entry, const net::NetworkPolicy& policy);
  // Whether the host can enforce a policy with a network: starts nsbox-net if it is not running.
  ApiOutcome<bool> CheckNetwork(const net::NetworkPolicy& policy);
  // Connections allowed and refused per sandbox id, of the sandboxes with a network now.
  std::map<std::string, NetworkConnections> NetworkCounters();

  // Images. Removing one that a sandbox uses is refused (409 image_in_use, naming them);
  // content no name and no sandbox refers to any more is deleted.
  const images::ImageStore& images() const { return *images_; }
  // `budget` (images/import_budget.h): what it may write; its refusals are 413 and 507.
  ApiOutcome<images::ImageInfo> ImportImage(const std::string& name, const std::string& source,
                                            bool replace, const images::ProgressFn& progress,
                                            images::ImportBudget* budget = nullptr);
  ApiOutcome<bool> RemoveImage(const std::string& name);
  // The ids of the sandboxes made from the image `name`, sorted.
  std::vector<std::string> SandboxesOfImage(std::string_view name) const;
  // Where the daemon spools an image upload before importing it (removed at the next start).
  std::string NewUploadPath() const;

  const std::string& state_dir() const { return state_dir_; }
  // The host image's shared /etc versions (isolate/shared_etc.h); removed at every daemon start.
  // The shared /etc's versions, and the layers of the jails' own overlays (jail_setup.h), in a
  // directory (0711) of one that keeps host users out (0700), removed at every start.
  std::string HostEtcDir() const { return state_dir_ + "/host-etc"; }
  std::string SharedEtcDir() const { return HostEtcDir() + "/layers"; }
  // Jails of the pool started and waiting for a sandbox, and how many it keeps.
  size_t PoolReady() const;
  // Whether a directory made ahead has a jail of the pool adopted ahead for it (0 or 1): the next
  // creation of a host-image sandbox takes both (docs/daemon.md "The pool").
  size_t AdoptedAheadReady() const;
  size_t pool_size() const { return options_.pool_size; }
  // Deleted sandboxes whose files are not all removed yet, and the removals that failed.
  const TrashBin& trash() const { return trash_; }

 private:
  Registry() = default;
  Status Load();
  Status RemoveStaleCgroups();
  Status StopLocked(SandboxEntry& entry);
  // The rest of a stop, once `box` was taken out of the entry; `what` ends its log line.
  Status StopBoxLocked(SandboxEntry& entry, std::shared_ptr<Sandbox> box, const std::string& what);
  // Content ids the sandboxes use; the caller holds mu_.
  std::set<std::string> ImageIdsInUseLocked() const;
  // The overlay a sandbox of an imported image runs on.
  Result<isolate::RootSpec::Overlay> OverlayOf(const SandboxEntry& entry) const;
  void CollectImagesLocked();
  // nsbox-net, started on first need; the error of the last failed start otherwise.
  Result<net::NetHelper*> Net();
  // Whether the sandboxes' networks may be gone: nsbox-net is dead, or is being started (its
  // lock is held). Never waits.
  bool NetLost();
  // Gives the running `box` of `entry` its network (the caller holds its lifecycle lock).
  Status AttachLocked(SandboxEntry& entry, Sandbox& box, const net::NetworkPolicy& policy);
  void DetachLocked(SandboxEntry& entry);
  // The pool: a thread keeps options_.pool_size jails started; Running takes one.
  void PoolLoop();
  Result<std::unique_ptr<Sandbox>> StartPooled();
  std::unique_ptr<Sandbox> TakePooled();
  // Starts a jail for the pool and adopts it ahead for the first directory made ahead, if none
  // has one (or is getting one): the pool's thread. Whether it tried.
  bool AdoptAheadOnce();
  // Stops, on the pool's thread, a jail taken from the pool and not used: off a request's path.
  void RetireJail(std::unique_ptr<Sandbox> jail);
  std::vector<std::unique_ptr<Sandbox>> retired_;           // under pool_mu_
  std::chrono::steady_clock::time_point ahead_not_before_;  // after a failure; pool thread's
  // The placeholder hostname of a jail adopted ahead, until its sandbox's (Sandbox::Assign).
  static constexpr char kAheadHostname[] = "nsbox-ahead";
  // Adoptions at creation under way (Create), each on a detached thread of its own.
  std::mutex adopting_mu_;
  std::condition_variable adopting_cv_;
  int adopting_ = 0;
  // A started sandbox for `entry`: a pooled jail adopted where one fits, else a new one.
  Result<std::unique_ptr<Sandbox>> StartFor(const SandboxEntry& entry, const SandboxOptions& o);
  // After `pooled` failed to adopt with `error`: put back in the pool when nothing was done to it
  // (ENOENT: a limit needs a cgroup it has not), else stopped.
  void AdoptionFailed(const std::string& id, std::unique_ptr<Sandbox> pooled, const Error& error);
  // How a sandbox of `config` whose directory is `dir` starts (its image's overlay aside); its
  // workspace and home are those of `disk` when it has its own.
  SandboxOptions OptionsFor(const SandboxConfig& config, const std::string& hash,
                            const std::string& dir, const isolate::Disk* disk = nullptr) const;
  // Mounts the sandbox's own disk if it has one and it is not mounted (under lifecycle_mu_).
  Status MountDiskLocked(SandboxEntry& entry);

  std::string state_dir_;
  std::string sandboxes_dir_;
  std::string init_binary_;
  std::string cgroup_prefix_;  // "nsbox-<8 hex of the state dir>-": ours, not another daemon's
  RegistryOptions options_;
  std::string nameserver_;  // the range's first address
  std::mutex net_mu_;
  std::unique_ptr<net::NetHelper> net_;
  UniqueFd lock_fd_;
  isolate::IdMapping ids_;
  std::unique_ptr<images::ImageStore> images_;
  // Deletes image content taken out of use (ImageStore::PurgeTrash) on a thread of its own:
  // removing a distribution's thousands of files takes seconds on a slow disk (20 s for Debian's
  // 6,600 on this project's CI machines), which neither the registry's lock nor an API answer
  // should wait for.
  void WakeJanitor();
  void JanitorLoop();
  // A host-image sandbox's directory made ahead, by the janitor: <sandboxes>/.spare-<hex> with
  // workspace/ and home/, durable, so that a PUT only writes config.json in it and renames it
  // (three mkdirs, two chowns and a directory fsync fewer on the request's path). Taken by
  // Create.
  static constexpr char kSparePrefix[] = ".spare-";
  // The image of a sandbox's own disk, in its directory (isolate/disk.h).
  static constexpr char kDiskImage[] = "disk.ext4";
  // config.json's slot in a spare directory: one block, more than a config with a few dozen
  // environment variables takes (a longer one grows the file).
  static constexpr size_t kConfigSlotBytes = 4096;
  Result<std::string> MakeSpareDir() const;
  // The directories at the top of a sandbox's directory, or of its own disk: workspace/ and
  // home/ owned by the jail's root (HostTopDirs), or an imported image's upper/ and work/.
  std::vector<isolate::DiskDir> HostTopDirs() const;
  Result<std::vector<isolate::DiskDir>> TopDirs(const SandboxConfig& config) const;
  // Makes them in `parent` on the host: each new (mkdir), then its owner, then its mode.
  static Status MakeTopDirs(const std::string& parent, const std::vector<isolate::DiskDir>& dirs);
  // A directory made ahead, and the jail of the pool adopted ahead for it, if any.
  struct Spare {
    std::string dir;
    std::unique_ptr<Sandbox> jail;  // Sandbox::AdoptAhead
    bool adopting = false;          // the pool's thread adopts a jail ahead for it
  };
  // One with a jail adopted ahead first if `with_jail`, else one without; an empty `dir` when none
  // is ready. Taking the last one has the janitor make the next at once.
  Spare TakeSpare(bool with_jail);
  // Has the janitor make the next skeleton, kSpareDelay from now if one is still ready: after a
  // creation's fsyncs and, most often, its first command, which it would otherwise compete with.
  void AskForSpareDir();
  static constexpr size_t kSpares = 2;  // two: creations in a burst of two find one each
  static constexpr std::chrono::milliseconds kSpareDelay{50};
  std::chrono::steady_clock::time_point spare_not_before_;  // under janitor_mu_
  mutable std::mutex janitor_mu_;
  std::condition_variable janitor_cv_;
  bool janitor_work_ = false;
  // .trash- directories of DELETEs that did not finish: one a previous daemon left is removed by
  // the janitor, so that a start does not wait for a workspace of 300,000 files (1.3 s) to go;
  // one whose removal failed is retried by the janitor when it is due.
  TrashBin trash_;
  // A removal failed and was kept: the janitor's wait takes its due time into account.
  bool janitor_trash_kept_ = false;
  bool janitor_spare_ = false;
  bool janitor_stop_ = false;
  std::vector<Spare> spares_;  // under janitor_mu_, oldest first
  std::thread janitor_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<SandboxEntry>, std::less<>> by_id_;
  // Ids whose creation is under way, with their configuration (Create); under mu_.
  std::map<std::string, SandboxConfig, std::less<>> creating_;
  std::condition_variable creating_cv_;
  mutable std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::vector<std::unique_ptr<Sandbox>> pool_;
  bool pool_stop_ = false;
  bool pool_taken_ = false;       // since the loop last looked: it lets the taker's first exec run
  bool pool_spare_made_ = false;  // the janitor made a directory, for AdoptAheadOnce
  uint64_t pool_seq_ = 0;
  std::thread pool_thread_;
};

}  // namespace nsbox::runtime

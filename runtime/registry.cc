// nsboxd's registry (registry.h): a sandbox's life, created, found, started (Running), stopped,
// deleted. Its other parts: registry_config.cc, registry_entry.cc, registry_open.cc,
// registry_pool.cc, registry_janitor.cc, registry_network.cc, registry_idle.cc,
// registry_images.cc.

#include "runtime/registry.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <thread>

#include "base/files.h"
#include "base/log.h"
#include "base/strings.h"
#include "images/image.h"
#include "net/net_client.h"
#include "runtime/exec_session.h"
#include "runtime/registry_internal.h"

namespace nsbox::runtime {

ApiOutcome<std::pair<std::shared_ptr<SandboxEntry>, bool>> Registry::Create(SandboxConfig config) {
  // A policy the host cannot enforce is refused, never silently widened (docs/network.md).
  // Checked before the registry's lock: starting nsbox-net takes a while, and Net() takes that
  // lock itself.
  if (config.network.networked() && Find(config.id) == nullptr) {
    if (auto ok = CheckNetwork(config.network); !ok.ok()) return ok.error();
  }
  std::unique_lock<std::mutex> lock(mu_);
  // One creation of an id at a time: a concurrent one waits for it and finds what it made.
  for (;;) {
    if (auto it = by_id_.find(config.id); it != by_id_.end()) return std::pair{it->second, false};
    if (creating_.find(config.id) == creating_.end()) break;
    creating_cv_.wait(lock);
  }
  const std::string hash = IdHash(config.id);
  const std::string dir = sandboxes_dir_ + "/" + hash;
  // A directory of this id that is not a sandbox of the registry: one the start could not load
  // (Load logged it), or one put there since. Refused before anything is taken for the creation.
  if (struct stat st; ::lstat(dir.c_str(), &st) == 0) return UnloadableDir(config.id, dir);
  config.created_at = NowRfc3339();
  // An imported image is looked up under the registry's lock, which RemoveImage also takes: the
  // content a new sandbox is built on cannot be collected under it.
  std::optional<images::ImageInfo> image;
  if (config.image != images::kHostImage) {
    auto info = images_->InfoOf(config.image_id);
    if (config.image_id.empty() || !info.ok()) return ApiError::ImageNotFound(config.image);
    image = std::move(info).value();
  }
  // The registry's lock is not held while the sandbox's directory is made durable: its fsyncs
  // take a millisecond or more (seconds on a busy disk), and every request takes that lock to
  // find its sandbox. Meanwhile the id is marked as being created: its image counts as in use,
  // and a concurrent creation of the same id waits. Unmarked on every way out, under the lock.
  creating_.emplace(config.id, config);
  struct Unmark {
    Registry& r;
    std::unique_lock<std::mutex>& lock;
    const std::string& id;
    ~Unmark() {
      if (!lock.owns_lock()) lock.lock();
      r.creating_.erase(id);
      r.creating_cv_.notify_all();
    }
  } unmark{*this, lock, config.id};
  lock.unlock();
  bool made_dir = false;
  bool from_spare = false;
  // What only an adoption does (the memory limit sizes /tmp), or what comes after a start (a
  // network) or before it (a disk), rules the jail adopted ahead out: such a creation leaves it to
  // the next.
  const bool may_take_ahead =
      !config.network.networked() && !config.limits.disk_bytes && !config.limits.memory_bytes;
  Spare taken = image ? Spare() : TakeSpare(may_take_ahead);
  std::string spare = std::move(taken.dir);
  // A directory made ahead with a jail adopted ahead for it: the jail becomes the sandbox's here,
  // from the host (Sandbox::Assign: its limits, hosts, hostname), with no work of nsbox-init's
  // on this request's or its first command's path. One that does not fit is stopped on the
  // pool's thread, and the sandbox goes the usual way.
  std::unique_ptr<Sandbox> assigned;
  if (taken.jail != nullptr) {
    if (!taken.jail->client().connected()) {
      log::warn("sandbox={} the jail adopted ahead (pid {}) is gone; not taken", config.id,
                taken.jail->init_pid());
    } else if (may_take_ahead) {
      const SandboxOptions o = OptionsFor(config, hash, spare);
      if (auto st = taken.jail->Assign(o.jail); st.ok()) {
        assigned = std::move(taken.jail);
      } else {
        const int err = st.error().code();
        log::log(err == EOPNOTSUPP || err == ENOENT || err == ESTALE ? spdlog::level::info
                                                                     : spdlog::level::warn,
                 "sandbox={} did not take the jail adopted ahead (pid {}): {}", config.id,
                 taken.jail->init_pid(), st.error().message());
      }
    }
    if (taken.jail != nullptr) RetireJail(std::move(taken.jail));
  }
  // A host-image sandbox adopts a pooled jail while its config.json is made durable, on a thread
  // of its own: the PUT's fdatasync is most of its time, and the adoption (≈ 0.8 ms, most of it
  // nsbox-init's work) would otherwise be on its first command's path. The thread holds the
  // entry's lifecycle lock from before the entry is published until the jail is its box (or has
  // failed), so a request that needs the sandbox meanwhile waits for it in Running, and a stop or
  // delete comes after it. The directories are the spare's, pinned (open_tree) here, before the
  // rename below, which the thread might come after. Not for a sandbox with a network, which
  // Running attaches after its start.
  auto entry = std::make_shared<SandboxEntry>(config, hash, dir,
                                              config.idle_stop_ms.value_or(options_.idle_stop_ms));
  std::thread adopter;
  std::future<void> adopter_holds_lifecycle;
  pid_t ahead_pid = 0;
  if (assigned != nullptr) {
    ahead_pid = assigned->init_pid();
    entry->box_ = std::move(assigned);  // not yet published: nobody else sees it
  } else if (!spare.empty() && !config.network.networked() && !config.limits.disk_bytes) {
    if (std::unique_ptr<Sandbox> pooled = TakePooled()) {
      SandboxOptions o = OptionsFor(config, hash, spare);
      auto workspace = PinDirectory(o.jail.workspace);
      auto home = workspace.ok() ? PinDirectory(o.jail.home) : Result<PinnedDir>(workspace.error());
      if (!home.ok()) {
        log::warn("sandbox={} adopt a pooled jail: {}", config.id, home.error().message());
        std::lock_guard<std::mutex> pool_lock(pool_mu_);
        pool_.insert(pool_.begin(), std::move(pooled));
      } else {
        std::promise<void> holds;
        adopter_holds_lifecycle = holds.get_future();
        {
          std::lock_guard<std::mutex> adopting(adopting_mu_);
          ++adopting_;
        }
        entry->adopting_ = true;  // not yet published: nobody else sees it
        try {
          adopter = std::thread([this, entry, pooled = std::move(pooled), holds = std::move(holds),
                                 jail = std::move(o.jail), workspace = std::move(workspace).value(),
                                 home = std::move(home).value()]() mutable {
            pid_t adopted_pid = 0;
            {
              std::lock_guard<std::mutex> lifecycle(entry->lifecycle_mu_);
              holds.set_value();
              auto adopted = pooled->Adopt(jail, std::move(workspace), std::move(home));
              if (adopted.ok()) {
                adopted_pid = pooled->init_pid();
                std::lock_guard<std::mutex> entry_lock(entry->mu_);
                entry->box_ = std::move(pooled);
              } else {
                AdoptionFailed(entry->config_.id, std::move(pooled), adopted.error());
              }
            }
            // Its log line after the lifecycle lock, but before what waits for the adoption
            // goes on: the log keeps the order of events.
            if (adopted_pid > 0) {
              log::info("sandbox={} adopted a jail of the pool (pid {})", entry->config_.id,
                        adopted_pid);
            }
            {
              std::vector<std::function<void()>> waiting;
              {
                std::lock_guard<std::mutex> entry_lock(entry->mu_);
                entry->adopting_ = false;
                waiting.swap(entry->on_adopted_);
              }
              // Gone before this adoption counts as ended (below): what they hold belongs to
              // the daemon's loop, which StopAll's wait for the adoptions comes before.
              for (auto& done : waiting) done();
            }
            std::lock_guard<std::mutex> adopting(adopting_mu_);
            --adopting_;
            adopting_cv_.notify_all();
          });
        } catch (const std::system_error& e) {
          // The jail went with the thread's function, stopped; the sandbox starts on first use.
          log::warn("sandbox={} adopt a pooled jail: {}", config.id, e.what());
          adopter_holds_lifecycle = std::future<void>();
          entry->adopting_ = false;
          std::lock_guard<std::mutex> adopting(adopting_mu_);
          --adopting_;
          adopting_cv_.notify_all();  // StopAll may be waiting for the count
        }
      }
    }
  }
  // A sandbox's own disk, in `in` (its directory, or the skeleton that becomes it), before its
  // config.json: a directory with a disk but no config is a creation that did not finish. It
  // holds what the sandbox's directory would (TopDirs).
  auto MakeDisk = [&](const std::string& in) -> Status {
    if (!config.limits.disk_bytes) return Ok();
    NSBOX_ASSIGN_OR_RETURN(auto dirs, TopDirs(config));
    NSBOX_TRY(isolate::MakeDiskImage(in + "/" + kDiskImage, *config.limits.disk_bytes, dirs));
    // A skeleton made ahead has its own empty workspace/ and home/: not this sandbox's.
    for (const char* sub : {"/workspace", "/home"}) {
      const std::string path = in + sub;
      if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return Error::Sys("rmdir", path, errno);
    }
    return Ok();
  };
  auto made = [&]() -> Status {
    if (!spare.empty()) {
      // A skeleton made ahead (MakeSpareDir: workspace/ and home/, and config.json's slot,
      // durable): config.json is written over its slot and made durable, then the skeleton is
      // renamed into place, never over anything. The rename is not waited for (no fsync of
      // sandboxes/, a journal commit of 0.3-1 ms here): what the sandbox is, is durable in its
      // config, and a start that finds it still under its .spare- name after a crash puts it
      // in place (Load).
      NSBOX_TRY(MakeDisk(spare));
      NSBOX_TRY(FillSlotDurable(spare, "config.json", EncodeConfig(config)));
      if (::renameat2(AT_FDCWD, spare.c_str(), AT_FDCWD, dir.c_str(), RENAME_NOREPLACE) != 0) {
        return Error::Sys("rename", spare + " to " + dir, errno);
      }
      spare.clear();
      made_dir = true;
      from_spare = true;
      return Ok();
    }
    // config.json last: a directory without it is a creation that did not finish. A directory
    // that is already there (made since the check above) is refused, never reused or removed:
    // it may hold someone's files.
    // 0700: a sandbox may make its files setuid to its own uid (or its image has such files);
    // no host user may reach them (case SetuidFilesOfSandboxesAreOutOfHostUsersReach). The jail
    // attaches its directories through fds, never walking this path as its own uid.
    if (::mkdir(dir.c_str(), 0700) != 0) return Error::Sys("mkdir", dir, errno);
    made_dir = true;
    if (config.limits.disk_bytes) {
      NSBOX_TRY(MakeDisk(dir));
    } else {
      NSBOX_ASSIGN_OR_RETURN(auto dirs, TopDirs(config));
      NSBOX_TRY(MakeTopDirs(dir, dirs));
    }
    return WriteFileAtomic(dir, "config.json", EncodeConfig(config));
  }();
  if (!made.ok()) {
    if (adopter.joinable()) adopter.join();
    std::shared_ptr<Sandbox> box;
    {
      std::lock_guard<std::mutex> entry_lock(entry->mu_);
      box = std::move(entry->box_);
    }
    if (box != nullptr) (void)box->Stop();        // adopted, or assigned, for nothing
    if (!spare.empty()) (void)RemoveTree(spare);  // not used, or its config.json half-written
    if (made_dir) (void)RemoveTree(dir);
    if (!image) AskForSpareDir();
    // A directory of the id that came since the check above (the rename and the mkdir never
    // replace one): refused as that check refuses it, without the skeleton's name.
    if (struct stat st; made.error().code() == EEXIST && ::lstat(dir.c_str(), &st) == 0) {
      return UnloadableDir(config.id, dir);
    }
    const std::string message = "create sandbox '" + config.id + "': " + made.error().message();
    if (made.error().code() == ENOSPC || made.error().code() == EDQUOT) {
      return ApiError::Of(507, ErrnoName(made.error().code()), message);  // api.md's full disk
    }
    if (config.limits.disk_bytes &&
        (made.error().code() == EOPNOTSUPP || made.error().code() == EFBIG)) {
      // The state dir's file system cannot reserve (fallocate) a disk, or one that large.
      return ApiError::Unsupported(message);
    }
    return ApiError::Internal(message);
  }
  if (!from_spare) {
    // The new directory's name is all there is of it in sandboxes/: made durable.
    if (auto st = FsyncPath(sandboxes_dir_); !st.ok()) {
      log::warn("sandbox={} fsync {}: {}", config.id, sandboxes_dir_, st.error().message());
    }
  }
  // The next skeleton, once the fsyncs above are done and a little later: made during them, its
  // own mkdirs and fsyncs would join this creation's journal commits and make them wait; made
  // at once after them, it would compete with the new sandbox's first command (docs/daemon.md).
  if (!image) AskForSpareDir();
  if (adopter.joinable()) {
    adopter_holds_lifecycle.wait();
    adopter.detach();  // it ends holding the entry's lifecycle lock, which StopAll waits for
  }
  lock.lock();
  by_id_[config.id] = entry;
  if (ahead_pid > 0) {
    log::info("sandbox={} created in {} with the jail adopted ahead (pid {})", config.id, dir,
              ahead_pid);
  } else {
    log::info("sandbox={} created in {}", config.id, dir);
  }
  return std::pair{entry, true};
}

std::shared_ptr<SandboxEntry> Registry::Find(std::string_view id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<SandboxEntry>> Registry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<SandboxEntry>> out;
  for (const auto& [id, e] : by_id_) out.push_back(e);
  return out;
}

std::map<std::string, uint64_t> Registry::CountByState() const {
  std::map<std::string, uint64_t> out{{"running", 0}, {"stopped", 0}};
  for (const auto& e : List()) ++out[e->running() ? "running" : "stopped"];
  return out;
}

std::shared_ptr<Sandbox> Registry::RunningNow(const SandboxEntry& entry) {
  bool networked = false;
  std::shared_ptr<Sandbox> box;
  {
    std::lock_guard<std::mutex> lock(entry.mu_);
    if (entry.deleted_ || entry.box_ == nullptr || !entry.box_->client().connected()) {
      return nullptr;
    }
    networked = entry.network_.networked();
    // Its network went with a dead nsbox-net: Running attaches it again.
    if (networked && entry.address_.empty()) return nullptr;
    box = entry.box_;
  }
  // nsbox-net may have died a moment ago, before its watcher cleared the addresses: a request
  // that reached the sandbox now would find no network.
  if (networked && NetLost()) return nullptr;
  return box;
}

ApiOutcome<std::shared_ptr<Sandbox>> Registry::Running(SandboxEntry& entry) {
  if (std::shared_ptr<Sandbox> box = RunningNow(entry)) return box;
  bool may_have_lost_network = false;
  {
    std::lock_guard<std::mutex> lock(entry.mu_);
    if (entry.deleted_) return ApiError::SandboxNotFound(entry.config_.id);
    may_have_lost_network = entry.network_.networked() && entry.box_ != nullptr;
  }
  // A dead nsbox-net is replaced now, and every sandbox's address cleared, so that the check
  // below attaches this running one again (a failed start is reported by that attach). A
  // stopped sandbox starts nsbox-net as it attaches.
  if (may_have_lost_network) (void)Net();
  std::lock_guard<std::mutex> lifecycle(entry.lifecycle_mu_);
  std::shared_ptr<Sandbox> dead;
  std::shared_ptr<Sandbox> running;
  {
    std::lock_guard<std::mutex> lock(entry.mu_);
    if (entry.deleted_) return ApiError::SandboxNotFound(entry.config_.id);
    if (entry.box_ != nullptr && entry.box_->client().connected()) {
      if (!entry.network_.networked() || !entry.address_.empty()) return entry.box_;
      running = entry.box_;
    } else {
      dead = std::move(entry.box_);
    }
  }
  if (running != nullptr) {
    // Its network was lost with nsbox-net (Net() started a new one): attached again, with the
    // policy in force, before anything else reaches the sandbox.
    const net::NetworkPolicy policy = entry.network();
    if (auto st = AttachLocked(entry, *running, policy); !st.ok()) {
      log::error("sandbox={} network: {}", entry.config_.id, st.error().message());
      return ApiError::Of(422, "network_unavailable",
                          "sandbox '" + entry.config_.id + "' lost its network (" +
                              net::PolicySummary(policy) +
                              ") and it could not be restored: " + st.error().message());
    }
    log::warn("sandbox={} network restored after nsbox-net restarted", entry.config_.id);
    return running;
  }
  if (dead != nullptr) {
    log::warn("sandbox={} nsbox-init had exited; starting it again", entry.config_.id);
    (void)dead->Stop();
  }
  const SandboxConfig& c = entry.config_;
  if (auto st = MountDiskLocked(entry); !st.ok()) {
    log::error("sandbox={} start: {}", c.id, st.error().message());
    return ApiError::Unavailable("start sandbox '" + c.id + "': " + st.error().message());
  }
  SandboxOptions o = OptionsFor(c, entry.hash_, entry.dir_, entry.disk_.get());
  if (!c.image_id.empty()) {
    auto overlay = OverlayOf(entry);
    if (!overlay.ok()) {
      log::error("sandbox={} start: {}", c.id, overlay.error().message());
      return ApiError::Unavailable("start sandbox '" + c.id + "': " + overlay.error().message());
    }
    o.jail.overlay = std::move(overlay).value();
  }
  auto started = StartFor(entry, o);
  if (!started.ok()) {
    log::error("sandbox={} start: {}", c.id, started.error().message());
    return ApiError::Unavailable("start sandbox '" + c.id + "': " + started.error().message());
  }
  std::shared_ptr<Sandbox> box(std::move(started).value());
  log::info("sandbox={} started, nsbox-init is pid {}", c.id, box->init_pid());
  if (const net::NetworkPolicy policy = entry.network(); policy.networked()) {
    // Before any command runs: never a moment with a network other than the policy's.
    if (auto st = AttachLocked(entry, *box, policy); !st.ok()) {
      log::error("sandbox={} network: {}", c.id, st.error().message());
      (void)box->Stop();
      return ApiError::Of(422, "network_unavailable",
                          "start sandbox '" + c.id + "': its network policy (" +
                              net::PolicySummary(policy) +
                              ") cannot be enforced: " + st.error().message());
    }
  }
  std::lock_guard<std::mutex> lock(entry.mu_);
  entry.box_ = box;
  return box;
}

SandboxOptions Registry::OptionsFor(const SandboxConfig& c, const std::string& hash,
                                    const std::string& dir, const isolate::Disk* disk) const {
  SandboxOptions o;
  o.jail.image = c.image;
  if (c.image_id.empty()) {
    // With a disk of its own, the jail's setup pins and clones the directories of the disk's
    // detached mount through the daemon's fd on it.
    o.jail.workspace = disk != nullptr ? disk->PathOf("workspace") : dir + "/workspace";
    o.jail.home = disk != nullptr ? disk->PathOf("home") : dir + "/home";
    o.jail.shared_etc_dir = SharedEtcDir();
  }
  // Every jail's own overlays of the host's read-only trees and device nodes find their layers
  // there (jail_setup.h).
  o.jail.layers_dir = SharedEtcDir();
  o.jail.hostname = HostnameFor(c.id, hash);
  if (c.limits.memory_bytes) o.jail.memory = std::to_string(*c.limits.memory_bytes);
  if (c.limits.pids) o.jail.pids = std::to_string(*c.limits.pids);
  if (c.limits.cpus) o.jail.cpus = FormatCpus(*c.limits.cpus);
  o.jail.warn_unwritable_workspace = false;
  o.jail.nameserver = nameserver_;
  o.cgroup_name = cgroup_prefix_ + hash.substr(0, 16);
  o.init_binary = init_binary_;
  o.watch_channel = options_.watch_channel;
  return o;
}

Status Registry::StopLocked(SandboxEntry& entry) {
  std::shared_ptr<Sandbox> box;
  {
    std::lock_guard<std::mutex> lock(entry.mu_);
    box = std::move(entry.box_);
    entry.busy_ = false;  // what the idle stop saw was of this box
  }
  return StopBoxLocked(entry, std::move(box), "stopped");
}

Status Registry::StopBoxLocked(SandboxEntry& entry, std::shared_ptr<Sandbox> box,
                               const std::string& what) {
  if (box == nullptr) return Ok();
  // Every command first, so that their answers say "stopped"; then nsbox-init itself.
  if (box->client().connected()) {
    auto stopped = box->client().StopAll();
    if (!stopped.ok()) {
      log::warn("sandbox={} stop commands: {}", entry.config_.id, stopped.error().message);
    }
  }
  auto st = box->Stop();
  DetachLocked(entry);
  log::info("sandbox={} {}", entry.config_.id, what);
  return st;
}

ApiOutcome<bool> Registry::Stop(SandboxEntry& entry) {
  std::lock_guard<std::mutex> lifecycle(entry.lifecycle_mu_);
  {
    std::lock_guard<std::mutex> lock(entry.mu_);
    if (entry.deleted_) return ApiError::SandboxNotFound(entry.config_.id);
  }
  if (auto st = StopLocked(entry); !st.ok()) {
    return ApiError::Internal("stop sandbox '" + entry.config_.id + "': " + st.error().message());
  }
  return true;
}

namespace {

// The answer to a DELETE whose sandbox is gone but some of whose files are not: api.md's 204 says
// the data is deleted, which would not be true.
ApiError FilesLeft(std::string_view id, const Error& error) {
  return ApiError::Internal(
      "delete sandbox '" + std::string(id) +
      "': it is stopped and gone, but its files are not all removed from the host yet: " +
      error.message() +
      ". The daemon retries the removal (nsbox_sandbox_removals_pending in GET /metrics); a "
      "DELETE of this id retries it at once and answers 204 when they are gone");
}

}  // namespace

ApiOutcome<Registry::Deleted> Registry::Delete(std::string_view id) {
  // Files that earlier DELETEs of this id left: ".trash-<hash>-<hex>".
  const std::string leftovers = ".trash-" + IdHash(id) + "-";
  std::shared_ptr<SandboxEntry> entry = Find(id);
  if (entry == nullptr) {
    std::optional<Status> retried = trash_.RetryNow(leftovers);
    if (!retried) return ApiError::SandboxNotFound(std::string(id));
    if (!retried->ok()) return Deleted{FilesLeft(id, retried->error())};
    log::info("sandbox={} the files an earlier delete left are removed", id);
    return Deleted{};
  }
  std::lock_guard<std::mutex> lifecycle(entry->lifecycle_mu_);
  {
    std::lock_guard<std::mutex> lock(entry->mu_);
    if (entry->deleted_) return ApiError::SandboxNotFound(std::string(id));
  }
  if (auto st = StopLocked(*entry); !st.ok()) {
    log::warn("sandbox={} delete: {}", entry->config_.id, st.error().message());
  }
  // Its disk is unmounted with the last of its users (the jail is gone; a download's fd may
  // still hold it a moment), and its loop device detached then.
  entry->disk_.reset();
  // Out of the registry and renamed aside in one step (under the registry's lock, so that a PUT
  // of the same id makes a fresh directory); a crash from here on leaves a .trash- directory
  // that the next start removes.
  const std::string trash = sandboxes_dir_ + "/" + leftovers + RandomHex(8);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (::rename(entry->dir_.c_str(), trash.c_str()) != 0) {
      return ApiError::Internal(Error::Sys("rename", entry->dir_, errno)
                                    .Context("delete sandbox '" + entry->config_.id + "'")
                                    .message());
    }
    {
      std::lock_guard<std::mutex> entry_lock(entry->mu_);
      entry->deleted_ = true;
    }
    by_id_.erase(entry->config_.id);
  }
  (void)FsyncPath(sandboxes_dir_);
  // Any depth, a few fds (base/remove_tree.cc). What cannot be removed now is kept and retried
  // (TrashBin), and the answer says so.
  Status removed = trash_.Remove(trash);
  if (removed.ok()) {
    if (std::optional<Status> older = trash_.RetryNow(leftovers)) removed = std::move(*older);
  }
  if (!entry->config_.image_id.empty()) {
    // It may have been the last user of an image that was since replaced or removed.
    std::lock_guard<std::mutex> lock(mu_);
    CollectImagesLocked();
  }
  if (!removed.ok()) {
    {
      std::lock_guard<std::mutex> lock(janitor_mu_);
      janitor_trash_kept_ = true;  // the janitor retries it when it is due
    }
    janitor_cv_.notify_one();
    log::error("sandbox={} deleted, but its files are not all removed: {}", entry->config_.id,
               removed.error().message());
    return Deleted{FilesLeft(entry->config_.id, removed.error())};
  }
  log::info("sandbox={} deleted", entry->config_.id);
  return Deleted{};
}

Status Registry::MountDiskLocked(SandboxEntry& entry) {
  if (!entry.config_.limits.disk_bytes || entry.disk_ != nullptr) return Ok();
  NSBOX_ASSIGN_OR_RETURN(entry.disk_, isolate::Disk::Open(entry.dir_ + "/" + kDiskImage));
  log::debug("sandbox={} its disk is mounted through {}", entry.config_.id, entry.disk_->device());
  return Ok();
}

void Registry::StopAll() {
  // All at once: each stop gives the sandbox's commands a grace of 2 s after SIGTERM, and one
  // after the other, 30 sandboxes would outlast systemd's stop timeout (case
  // SigtermWithSandboxesRunning).
  {
    // A sandbox adopting a jail at its creation has no box yet: its adoption ends first.
    std::unique_lock<std::mutex> lock(adopting_mu_);
    adopting_cv_.wait(lock, [this] { return adopting_ == 0; });
  }
  std::vector<std::thread> stoppers;
  for (const auto& entry : List()) {
    {
      std::lock_guard<std::mutex> lock(entry->mu_);
      if (entry->box_ == nullptr) continue;  // stopped already: nothing to wait for
    }
    stoppers.emplace_back([this, entry] {
      std::lock_guard<std::mutex> lifecycle(entry->lifecycle_mu_);
      (void)StopLocked(*entry);
    });
  }
  for (auto& t : stoppers) t.join();
}

}  // namespace nsbox::runtime

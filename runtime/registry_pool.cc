// The pool (docs/daemon.md "The pool"): the jails of the host image that a thread keeps started
// ahead, the one adopted ahead for a directory made ahead, and a sandbox's start that adopts one.

#include <errno.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "runtime/registry.h"

namespace nsbox::runtime {

bool Registry::WhenAdopted(SandboxEntry& entry, std::function<void()> done) {
  std::lock_guard<std::mutex> lock(entry.mu_);
  if (!entry.adopting_) return false;
  entry.on_adopted_.push_back(std::move(done));
  return true;
}

Result<std::unique_ptr<Sandbox>> Registry::StartFor(const SandboxEntry& entry,
                                                    const SandboxOptions& o) {
  if (entry.config_.image_id.empty()) {
    if (std::unique_ptr<Sandbox> pooled = TakePooled()) {
      auto adopted = pooled->Adopt(o.jail);
      if (adopted.ok()) {
        log::info("sandbox={} adopted a jail of the pool (pid {})", entry.config_.id,
                  pooled->init_pid());
        return pooled;
      }
      AdoptionFailed(entry.config_.id, std::move(pooled), adopted.error());
    }
  }
  return Sandbox::Start(o);
}

void Registry::AdoptionFailed(const std::string& id, std::unique_ptr<Sandbox> pooled,
                              const Error& error) {
  const int err = error.code();
  if (err == ENOENT && pooled->pooled()) {
    // A limit needs a cgroup the pooled jail has not (a CPU limit on a hybrid host): nothing
    // was done to it (it still waits for its hello), and it waits for the next sandbox.
    log::info("sandbox={} starts its own jail: {}", id, error.message());
    std::lock_guard<std::mutex> lock(pool_mu_);
    pool_.insert(pool_.begin(), std::move(pooled));
    return;
  }
  // ESTALE: the host's /etc changed since the jail was made. Anything else is worth a look; the
  // sandbox starts its own jail either way.
  log::log(err == ESTALE ? spdlog::level::info : spdlog::level::warn,
           "sandbox={} did not adopt the pooled jail (pid {}): {}; starting its own", id,
           pooled->init_pid(), error.message());
  (void)pooled->Stop();
}

std::unique_ptr<Sandbox> Registry::TakePooled() {
  for (;;) {
    std::unique_ptr<Sandbox> box;
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      if (pool_.empty()) return nullptr;
      box = std::move(pool_.front());
      pool_.erase(pool_.begin());
      pool_taken_ = true;
    }
    pool_cv_.notify_one();
    if (box->client().connected()) return box;
    // Its nsbox-init died while it waited (killed from the host): the loop saw the channel close.
    log::warn("the pooled jail (pid {}) is gone; dropped", box->init_pid());
    (void)box->Stop();
  }
}

size_t Registry::PoolReady() const {
  std::lock_guard<std::mutex> lock(pool_mu_);
  return pool_.size();
}

size_t Registry::AdoptedAheadReady() const {
  std::lock_guard<std::mutex> lock(janitor_mu_);
  return static_cast<size_t>(std::count_if(spares_.begin(), spares_.end(),
                                           [](const Spare& s) { return s.jail != nullptr; }));
}

void Registry::RetireJail(std::unique_ptr<Sandbox> jail) {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    retired_.push_back(std::move(jail));
  }
  pool_cv_.notify_one();
}

bool Registry::AdoptAheadOnce() {
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(janitor_mu_);
    // One jail adopted ahead at most: the next creation's; a burst's second takes the pool's.
    for (const Spare& s : spares_) {
      if (s.jail != nullptr || s.adopting) return false;
    }
    if (spares_.empty()) return false;
    spares_.front().adopting = true;
    dir = spares_.front().dir;
  }
  auto adopted = [&]() -> Result<std::unique_ptr<Sandbox>> {
    NSBOX_ASSIGN_OR_RETURN(std::unique_ptr<Sandbox> jail, StartPooled());
    // As OptionsFor has a host-image sandbox's, less what names it and its limits.
    JailOptions o;
    o.workspace = dir + "/workspace";
    o.home = dir + "/home";
    o.shared_etc_dir = SharedEtcDir();
    o.layers_dir = SharedEtcDir();
    o.hostname = kAheadHostname;
    o.nameserver = nameserver_;
    o.warn_unwritable_workspace = false;
    NSBOX_ASSIGN_OR_RETURN(PinnedDir workspace, PinDirectory(o.workspace));
    NSBOX_ASSIGN_OR_RETURN(PinnedDir home, PinDirectory(o.home));
    NSBOX_TRY(jail->AdoptAhead(o, std::move(workspace), std::move(home)));
    return jail;
  }();
  std::unique_ptr<Sandbox> stray;
  bool taken = false;
  {
    std::lock_guard<std::mutex> lock(janitor_mu_);
    auto it = std::find_if(spares_.begin(), spares_.end(),
                           [&dir](const Spare& s) { return s.dir == dir; });
    if (it == spares_.end()) {
      // A creation took the directory meanwhile (it went the usual way): a jail adopted for it
      // has its directories attached, and no command ever runs in it. A failure was most likely
      // the rename (ENOENT): not one to wait after.
      taken = true;
      if (adopted.ok()) stray = std::move(adopted).value();
    } else {
      it->adopting = false;
      if (adopted.ok()) it->jail = std::move(adopted).value();
    }
  }
  if (stray != nullptr) (void)stray->Stop();
  if (!adopted.ok() && !taken) {
    constexpr std::chrono::seconds kAgain(30);
    log::warn("the pool could not adopt a jail ahead for {}: {} (again in {} s)", dir,
              adopted.error().message(), kAgain.count());
    ahead_not_before_ = std::chrono::steady_clock::now() + kAgain;
  }
  return true;
}

Result<std::unique_ptr<Sandbox>> Registry::StartPooled() {
  SandboxOptions o;
  o.jail.adopt_later = true;
  o.jail.shared_etc_dir = SharedEtcDir();
  o.jail.layers_dir = SharedEtcDir();
  o.jail.nameserver = nameserver_;
  o.jail.warn_unwritable_workspace = false;
  o.init_binary = init_binary_;
  o.watch_channel = options_.watch_channel;
  o.pooled = true;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    o.cgroup_name = cgroup_prefix_ + "pool-" + std::to_string(++pool_seq_);
  }
  return Sandbox::Start(o);
}

void Registry::PoolLoop() {
  // A start takes milliseconds of both CPUs of a small host: the refill waits a moment after a
  // take, so that it does not compete with the first command of the sandbox that took the jail.
  constexpr auto kAfterTake = std::chrono::milliseconds(10);
  constexpr std::chrono::seconds kFirstRetry(1);
  constexpr std::chrono::seconds kLastRetry(60);
  constexpr std::chrono::seconds kCheckAlive(5);
  auto retry = kFirstRetry;
  std::unique_lock<std::mutex> lock(pool_mu_);
  while (!pool_stop_) {
    if (!retired_.empty()) {
      std::vector<std::unique_ptr<Sandbox>> retired = std::move(retired_);
      retired_.clear();
      lock.unlock();
      for (auto& jail : retired) (void)jail->Stop();
      lock.lock();
      continue;
    }
    if (pool_taken_) {
      pool_taken_ = false;
      pool_cv_.wait_for(lock, kAfterTake, [this] { return pool_stop_; });
      continue;
    }
    if (pool_.size() >= options_.pool_size) {
      // Full. Then a jail adopted ahead for the next creation's directory (none with --pool 0).
      pool_spare_made_ = false;
      if (options_.pool_size > 0 && std::chrono::steady_clock::now() >= ahead_not_before_) {
        lock.unlock();
        const bool tried = AdoptAheadOnce();
        lock.lock();
        if (tried) continue;
      }
      // Looked at again every few seconds, so that a jail whose nsbox-init died while it
      // waited (killed from the host, the OOM killer) is replaced before a sandbox needs it.
      if (pool_cv_.wait_for(lock, kCheckAlive, [this] {
            return pool_stop_ || pool_taken_ || pool_spare_made_ || !retired_.empty();
          })) {
        continue;
      }
      std::vector<std::unique_ptr<Sandbox>> dead;
      for (auto it = pool_.begin(); it != pool_.end();) {
        if ((*it)->client().connected()) {
          ++it;
          continue;
        }
        dead.push_back(std::move(*it));
        it = pool_.erase(it);
      }
      {
        // The same for a jail adopted ahead: adopted again at the next turn.
        std::lock_guard<std::mutex> spares_lock(janitor_mu_);
        for (Spare& spare : spares_) {
          if (spare.jail != nullptr && !spare.jail->client().connected()) {
            dead.push_back(std::move(spare.jail));
          }
        }
      }
      lock.unlock();
      for (auto& box : dead) {
        log::warn("the pooled jail (pid {}) is gone; starting another", box->init_pid());
        (void)box->Stop();
      }
      lock.lock();
      continue;
    }
    lock.unlock();
    auto started = StartPooled();
    lock.lock();
    if (started.ok()) {
      pool_.push_back(std::move(started).value());
      retry = kFirstRetry;
      continue;
    }
    log::warn("the pool could not start a jail ahead: {} (again in {} s)",
              started.error().message(), retry.count());
    pool_cv_.wait_for(lock, retry, [this] { return pool_stop_; });
    retry = std::min(retry * 2, kLastRetry);
  }
  std::vector<std::unique_ptr<Sandbox>> boxes = std::move(pool_);
  pool_.clear();
  for (auto& jail : retired_) boxes.push_back(std::move(jail));
  retired_.clear();
  lock.unlock();
  {
    std::lock_guard<std::mutex> spares_lock(janitor_mu_);
    for (Spare& spare : spares_) {
      if (spare.jail != nullptr) boxes.push_back(std::move(spare.jail));
    }
  }
  for (auto& box : boxes) (void)box->Stop();
}

}  // namespace nsbox::runtime

// The janitor's thread (Registry::JanitorLoop): the host-image sandbox directories made ahead
// (what goes in them: TopDirs), the removals of deleted sandboxes' files that it retries, the
// image content it purges.

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "base/files.h"
#include "base/log.h"
#include "runtime/registry.h"

namespace nsbox::runtime {

std::vector<isolate::DiskDir> Registry::HostTopDirs() const {
  return {{"workspace", 0700, ids_.uid.outside, ids_.gid.outside},
          {"home", 0700, ids_.uid.outside, ids_.gid.outside}};
}

Result<std::vector<isolate::DiskDir>> Registry::TopDirs(const SandboxConfig& config) const {
  if (config.image_id.empty()) return HostTopDirs();
  // The overlay's own layer: its top directory is the root directory inside, so it gets the
  // image's root's owner and mode; work/ is the overlay's private scratch space.
  NSBOX_ASSIGN_OR_RETURN(std::string lower, images_->RootfsOf(config.image_id));
  struct stat root {};
  if (::stat(lower.c_str(), &root) != 0) return Error::Sys("stat", lower, errno);
  return std::vector<isolate::DiskDir>{{"upper", root.st_mode & 07777, root.st_uid, root.st_gid},
                                       {"work", 0700, 0, 0}};
}

Status Registry::MakeTopDirs(const std::string& parent, const std::vector<isolate::DiskDir>& dirs) {
  for (const isolate::DiskDir& d : dirs) {
    const std::string path = parent + "/" + d.name;
    if (::mkdir(path.c_str(), 0700) != 0) return Error::Sys("mkdir", path, errno);
    // SAFETY: a directory we just made, given the owner it has inside (the jail's root, or the
    // image's root's); its mode after, as a chown clears set-id bits.
    if (::chown(path.c_str(), d.uid, d.gid) != 0) return Error::Sys("chown", path, errno);
    if (::chmod(path.c_str(), d.mode & 07777) != 0) return Error::Sys("chmod", path, errno);
  }
  return Ok();
}

Result<std::string> Registry::MakeSpareDir() const {
  const std::string spare = sandboxes_dir_ + "/" + kSparePrefix + RandomHex(16);
  NSBOX_TRY(MakeDir(spare, 0700));
  auto made = [&]() -> Status {
    NSBOX_TRY(MakeTopDirs(spare, HostTopDirs()));
    // The slot a PUT writes config.json over: a file whose blocks are already on disk, so that
    // making the config durable needs no journal commit (base/files.h, FillSlotDurable).
    NSBOX_TRY(MakeSlotDurable(spare, "config.json", kConfigSlotBytes));
    NSBOX_TRY(FsyncPath(spare));
    return FsyncPath(sandboxes_dir_);
  }();
  if (!made.ok()) {
    (void)RemoveTree(spare);
    return std::move(made).error().Context("make a sandbox directory ahead");
  }
  return spare;
}

Registry::Spare Registry::TakeSpare(bool with_jail) {
  Spare spare;
  {
    std::lock_guard<std::mutex> lock(janitor_mu_);
    if (spares_.empty()) return spare;
    // One whose jail is adopted ahead (else one without, that the pool's thread is not adopting a
    // jail for: that jail would be stopped as soon as it is ready), or the reverse; else the
    // first.
    auto it = spares_.end();
    if (with_jail) {
      it = std::find_if(spares_.begin(), spares_.end(),
                        [](const Spare& s) { return s.jail != nullptr; });
    }
    if (it == spares_.end()) {
      it = std::find_if(spares_.begin(), spares_.end(),
                        [](const Spare& s) { return s.jail == nullptr && !s.adopting; });
    }
    if (it == spares_.end()) it = spares_.begin();
    spare = std::move(*it);
    spares_.erase(it);
    if (!spares_.empty()) return spare;  // the next one after this creation (AskForSpareDir)
    // Creations in a burst: the next one now, beside this creation's fsyncs.
    janitor_spare_ = true;
  }
  janitor_cv_.notify_one();
  return spare;
}

void Registry::AskForSpareDir() {
  {
    std::lock_guard<std::mutex> lock(janitor_mu_);
    janitor_spare_ = true;
    spare_not_before_ = std::chrono::steady_clock::now() + kSpareDelay;
  }
  janitor_cv_.notify_one();
}

void Registry::WakeJanitor() {
  {
    std::lock_guard<std::mutex> lock(janitor_mu_);
    janitor_work_ = true;
  }
  janitor_cv_.notify_one();
}

void Registry::JanitorLoop() {
  std::unique_lock<std::mutex> lock(janitor_mu_);
  for (;;) {
    auto ready = [this] {
      return janitor_work_ || janitor_spare_ || janitor_stop_ || janitor_trash_kept_;
    };
    // A removal that failed is retried when it is due (TrashBin).
    if (std::optional<TrashBin::Clock::time_point> due = trash_.NextDue()) {
      janitor_cv_.wait_until(lock, *due, ready);
    } else {
      janitor_cv_.wait(lock, ready);
    }
    if (janitor_stop_) break;
    janitor_trash_kept_ = false;
    if (!janitor_work_ && !janitor_spare_) {
      // Woken for a removal that is due only.
      lock.unlock();
      (void)trash_.RetryDue();
      lock.lock();
      continue;
    }
    if (!janitor_work_ && !spares_.empty() &&
        std::chrono::steady_clock::now() < spare_not_before_) {
      // One skeleton is still ready: the next waits for the delay (AskForSpareDir), unless a
      // creation takes that one meanwhile.
      janitor_cv_.wait_until(lock, spare_not_before_,
                             [this] { return janitor_work_ || janitor_stop_ || spares_.empty(); });
      continue;
    }
    const bool purge = janitor_work_;
    const bool spare = janitor_spare_ && spares_.size() < kSpares;
    janitor_work_ = false;
    janitor_spare_ = false;
    lock.unlock();
    (void)trash_.RetryDue();
    if (purge) {
      if (auto st = images_->PurgeTrash(); !st.ok()) {
        log::error("remove unused image content: {}", st.error().message());
      }
    }
    std::string made;
    bool failed = false;
    if (spare) {
      // A failure is no error for anyone: the next creation makes its directories itself.
      auto dir = MakeSpareDir();
      if (dir.ok()) {
        made = std::move(dir).value();
      } else {
        failed = true;
        log::warn("{}", dir.error().message());
      }
    }
    lock.lock();
    bool for_pool = false;
    if (!made.empty()) {
      if (spares_.size() < kSpares) {
        log::debug("sandbox directory made ahead: {}", made);
        spares_.push_back(Spare{std::move(made), nullptr, false});
        for_pool = true;
      } else {
        (void)RemoveTree(made);
      }
    }
    if (for_pool) {
      // The pool's thread adopts a jail ahead for it (AdoptAheadOnce).
      lock.unlock();
      {
        std::lock_guard<std::mutex> pool_lock(pool_mu_);
        pool_spare_made_ = true;
      }
      pool_cv_.notify_one();
      lock.lock();
    }
    // Until there are kSpares; after a failure, at the next creation's request.
    if (spare && !failed && spares_.size() < kSpares) janitor_spare_ = true;
  }
  // The skeletons nobody took: removed now, or by the next start. (Their jails adopted ahead
  // were stopped by the pool's thread, which ended before this one was asked to.)
  for (const Spare& spare : spares_) (void)RemoveTree(spare.dir);
}

}  // namespace nsbox::runtime

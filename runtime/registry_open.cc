// Opening the state directory (Registry::Open): its lock, what a dead daemon left, the
// sandboxes loaded; and closing it (~Registry).

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/stat.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <thread>

#include "base/files.h"
#include "base/log.h"
#include "exec/spawn.h"
#include "images/image.h"
#include "isolate/cgroup.h"
#include "isolate/idmap.h"
#include "net/net_client.h"
#include "runtime/image_imports.h"
#include "runtime/registry.h"
#include "runtime/registry_internal.h"

namespace nsbox::runtime {

namespace json = boost::json;

Result<std::unique_ptr<Registry>> Registry::Open(const RegistryOptions& options) {
  std::unique_ptr<Registry> r(new Registry());
  if (options.state_dir.empty() || options.state_dir[0] != '/') {
    return Error(EINVAL,
                 "the state directory must be an absolute path, not '" + options.state_dir + "'");
  }
  r->state_dir_ = options.state_dir;
  while (r->state_dir_.size() > 1 && r->state_dir_.back() == '/') r->state_dir_.pop_back();
  r->sandboxes_dir_ = r->state_dir_ + "/sandboxes";
  r->init_binary_ = options.init_binary;
  r->options_ = options;
  {
    // The range: an IPv4 network from /8 to /24 (a /24 holds 253 sandboxes with a network at
    // once); its first address is the resolver and gateway.
    auto range = net::ParseAllowEntry(options.network_range);
    if (!range.ok() || range->kind != net::AllowEntry::Kind::kCidr || range->port ||
        range->prefix < 8 || range->prefix > 24) {
      return Error(EINVAL, "--network-range '" + options.network_range +
                               "' is not an IPv4 network from /8 to /24 such as 10.213.0.0/16" +
                               (range.ok() ? "" : " (" + range.error().message() + ")"));
    }
    r->nameserver_ = net::Ipv4Text(range->address + 1);
  }
  if (r->init_binary_.empty()) {
    NSBOX_ASSIGN_OR_RETURN(r->init_binary_, DefaultInitBinary());
  }
  NSBOX_ASSIGN_OR_RETURN(r->ids_, isolate::DefaultIdMapping());

  // 0711: the jails' roots (unprivileged host uids) must pass through to bind their /root;
  // nobody else may list the sandboxes, and each workspace is 0700 to its jail's root.
  std::error_code ec;
  std::filesystem::create_directories(r->state_dir_, ec);
  if (ec) return Error(ec.value(), "create " + r->state_dir_ + ": " + ec.message());
  NSBOX_TRY(MakeDir(r->sandboxes_dir_, 0711));
  for (const std::string& dir : {r->state_dir_, r->sandboxes_dir_}) {
    if (::chmod(dir.c_str(), 0711) != 0) return Error::Sys("chmod", dir, errno);
  }
  const std::string lock_path = r->state_dir_ + "/nsboxd.lock";
  pid_t holder = 0;
  Result<UniqueFd> locked = LockFileExclusive(lock_path, &holder);
  if (!locked.ok()) {
    if (locked.error().code() != EBUSY) return locked.error();
    return Error(EBUSY, "another nsboxd" +
                            (holder > 0 ? " (pid " + std::to_string(holder) + ")" : std::string()) +
                            " is using the state directory " + r->state_dir_);
  }
  r->lock_fd_ = std::move(*locked);
  char real[PATH_MAX];
  if (::realpath(r->state_dir_.c_str(), real) == nullptr) {
    return Error::Sys("realpath", r->state_dir_, errno);
  }
  r->cgroup_prefix_ = "nsbox-" + IdHash(real).substr(0, 8) + "-";
  NSBOX_TRY(r->RemoveStaleCgroups());
  // The shared /etc is a cache of the host's: what a previous daemon made (maybe half-written by
  // a crash) is not trusted, and nothing binds it any more.
  NSBOX_TRY(RemoveTree(r->HostEtcDir()));
  NSBOX_ASSIGN_OR_RETURN(r->images_, images::ImageStore::Open(r->state_dir_ + "/images", r->ids_));
  NSBOX_TRY(r->Load());
  // nsbox-net removes what a dead predecessor left (its table, interfaces) as it starts; with
  // sandboxes that have a network it is needed soon anyway. A daemon whose sandboxes all have
  // "none" never starts it.
  for (const auto& [id, entry] : r->by_id_) {
    if (!entry->network_.networked()) continue;
    if (auto net = r->Net(); !net.ok()) {
      log::warn("sandboxes with a network will not start until this is fixed: {}",
                net.error().message());
    }
    break;
  }
  r->janitor_spare_ = true;  // the first creation's directories, made ahead
  r->janitor_work_ = r->trash_.pending() > 0;
  r->janitor_ = std::thread([registry = r.get()] { registry->JanitorLoop(); });
  if (options.pool_size > 0) {
    r->pool_thread_ = std::thread([registry = r.get()] { registry->PoolLoop(); });
  }
  std::lock_guard<std::mutex> lock(r->mu_);
  r->CollectImagesLocked();
  return r;
}

Registry::~Registry() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    pool_stop_ = true;
  }
  pool_cv_.notify_one();
  // The sandboxes first: those that adopted a jail of the pool are children of the pool's
  // thread, and nsbox-init's PR_SET_PDEATHSIG would kill them (without their commands' grace)
  // the moment that thread ends.
  StopAll();
  if (pool_thread_.joinable()) {
    pool_thread_.join();  // a start under way is finished, then every pooled jail stopped
  }
  {
    // nsbox-net removes its interfaces and rules as it exits.
    std::lock_guard<std::mutex> lock(net_mu_);
    net_.reset();
  }
  if (janitor_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(janitor_mu_);
      janitor_stop_ = true;
    }
    janitor_cv_.notify_one();
    janitor_.join();  // a removal under way is finished; what is left, the next start removes
  }
}

Status Registry::RemoveStaleCgroups() {
  NSBOX_ASSIGN_OR_RETURN(auto layout, isolate::LoadCgroupLayout());
  NSBOX_ASSIGN_OR_RETURN(auto stale, isolate::Cgroups::AdoptStale(layout, cgroup_prefix_));
  for (const std::string& path : stale.paths()) {
    log::warn("removing the cgroup {} that a previous nsboxd left", path);
  }
  return stale.Destroy();
}

namespace {

// Whether `path` holds nothing but what a creation makes before its config.json is written or
// filled: the empty directories workspace/ and home/ (upper/ and work/ for an imported image),
// and config.json or its temp file. Only such a directory is removed as a creation that did not
// finish; anything else may be someone's files.
bool IsBareSkeleton(const std::string& path) {
  auto empty_dir = [](const std::string& dir) {
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
    if (!d) return false;
    while (struct dirent* e = ::readdir(d.get())) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) return false;
    }
    return true;
  };
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(path.c_str()), ::closedir);
  if (!dir) return false;
  while (struct dirent* e = ::readdir(dir.get())) {
    const std::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string child = path + "/" + std::string(name);
    struct stat st {};
    if (::lstat(child.c_str(), &st) != 0) return false;
    if (name == "workspace" || name == "home" || name == "upper" || name == "work") {
      if (!S_ISDIR(st.st_mode) || !empty_dir(child)) return false;
    } else if (name == "config.json" || name == ".config.json.tmp") {
      if (!S_ISREG(st.st_mode)) return false;
    } else if (name == "disk.ext4") {
      // A sandbox's own disk holds all of its files: bare only if no sandbox ever used it (it
      // was mounted once, by its creation), so that a directory whose config.json was lost is
      // never taken for an unfinished creation and removed with them.
      auto mounts = isolate::DiskMountCount(child);
      if (!S_ISREG(st.st_mode) || !mounts.ok() || *mounts > 1) return false;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

ApiError UnloadableDir(const std::string& id, const std::string& dir) {
  std::string why;
  auto text = ReadFile(dir + "/config.json");
  if (!text.ok()) {
    why = text.error().code() == ENOENT ? "it has no config.json" : text.error().message();
  } else if (auto config = DecodeConfig(*text); !config.ok()) {
    why = config.error().message();
  } else if (dir.substr(dir.rfind('/') + 1) != IdHash(config->id)) {
    why = "its config.json is of another id, which does not hash to the directory's name";
  } else {
    // Loadable now: it was put there after the daemon's start, or mended since.
    why =
        "it was not there, or did not load, when the daemon started; restart the daemon to load "
        "it";
  }
  return ApiError::Of(409, "sandbox_unloadable",
                      "sandbox '" + id + "' cannot be created: its directory " + dir +
                          " exists but cannot be loaded (" + why +
                          "); move the directory away to reuse the id (it is kept: it may hold "
                          "files)");
}

Status Registry::Load() {
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(sandboxes_dir_.c_str()), ::closedir);
  if (!dir) return Error::Sys("opendir", sandboxes_dir_, errno);
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(dir.get())) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  bool renamed = false;
  for (std::string name : names) {
    std::string path = sandboxes_dir_ + "/" + name;
    if (name.rfind(kSparePrefix, 0) == 0) {
      // Made ahead by the previous daemon: workspace/ and home/, and config.json's slot. None
      // or spaces: never used. Not JSON: a PUT that never answered, its write cut short. A
      // config: a creation whose config was made durable and whose rename into place the disk
      // had not yet committed when the host went down (Create does not wait for that commit);
      // it may have answered 201, so it is the sandbox, put in place now.
      auto text = ReadFile(path + "/config.json");
      if (!text.ok() && text.error().code() != ENOENT) {
        // Unread (EIO, EACCES...) is not unused: it may be a sandbox that answered 201.
        log::error("skipping {}: {}", path, text.error().message());
        continue;
      }
      const bool unused = !text.ok() || text->find_first_not_of(" \n") == std::string::npos;
      auto config = unused ? Result<SandboxConfig>(Error(EINVAL, "unused")) : DecodeConfig(*text);
      if (!config.ok()) {
        boost::system::error_code not_json;
        if (!unused) (void)json::parse(*text, not_json);
        if ((!unused && !not_json) || !IsBareSkeleton(path)) {
          // JSON that is not a config this daemon reads (one of a later version?), or files
          // beside the empty directories: never deleted, it may be someone's sandbox.
          log::error("skipping {}: {}", path,
                     unused || not_json ? std::string("it holds files, yet no config")
                                        : config.error().message());
          continue;
        }
        if (auto st = RemoveTree(path); !st.ok()) log::error("{}", st.error().message());
        continue;
      }
      const std::string hash = IdHash(config->id);
      const std::string in_place = sandboxes_dir_ + "/" + hash;
      if (::renameat2(AT_FDCWD, path.c_str(), AT_FDCWD, in_place.c_str(), RENAME_NOREPLACE) != 0) {
        // EEXIST: a directory of the id is there too (a DELETE of the id and its next PUT, both
        // lost). That one is loaded; this one is kept, never deleted: it may hold files.
        const Error e = Error::Sys("rename", path + " to " + in_place, errno);
        log::error(
            "skipping {} (a creation of sandbox '{}' whose rename did not reach the disk): {}",
            path, config->id, e.message());
        continue;
      }
      log::warn(
          "sandbox={} put in place: {} was renamed to {} before the host went down, and "
          "the disk had not committed the rename",
          config->id, path, in_place);
      renamed = true;
      name = hash;
      path = in_place;
    }
    if (name.rfind(".trash-", 0) == 0) {
      // A DELETE the previous daemon did not finish: the sandbox was already gone. Removed by
      // the janitor, once the daemon serves.
      trash_.Add(path);
      continue;
    }
    auto text = ReadFile(path + "/config.json");
    if (!text.ok() && text.error().code() == ENOENT && IsBareSkeleton(path)) {
      // A PUT the previous daemon did not finish: config.json is written last, after the empty
      // directories.
      log::info("removing the half-created sandbox directory {}", path);
      if (auto st = RemoveTree(path); !st.ok()) log::error("{}", st.error().message());
      continue;
    }
    if (!text.ok()) {
      // Not a sandbox directory, or one whose config is gone or unreadable: kept, never deleted
      // (it may hold someone's files), and no reason to keep every other sandbox down.
      log::error("skipping {}: {}", path,
                 text.error().code() == ENOENT
                     ? "it has no config.json, and holds more than the empty directories of a "
                       "creation that did not finish"
                     : text.error().message());
      continue;
    }
    auto config = DecodeConfig(*text);
    if (!config.ok() || IdHash(config->id) != name) {
      // Never delete what we cannot read: it may be someone's workspace.
      log::error(
          "skipping {}: {}", path,
          config.ok() ? "its id does not hash to its directory name" : config.error().message());
      continue;
    }
    // Directories made by earlier versions were 0711.
    if (::chmod(path.c_str(), 0700) != 0) return Error::Sys("chmod", path, errno);
    std::string id = config->id;
    const uint64_t idle_stop_ms = config->idle_stop_ms.value_or(options_.idle_stop_ms);
    by_id_[id] =
        std::make_shared<SandboxEntry>(std::move(config).value(), name, path, idle_stop_ms);
  }
  if (renamed) NSBOX_TRY(FsyncPath(sandboxes_dir_));
  log::info("state directory {}: {} sandboxes", state_dir_, by_id_.size());
  return Ok();
}

}  // namespace nsbox::runtime

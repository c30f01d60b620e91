#include "runtime/jail_setup.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/log.h"
#include "base/syscalls.h"
#include "exec/command.h"
#include "fs/path.h"
#include "isolate/private_trees.h"
#include "isolate/shared_etc.h"
#include "policy/environment.h"
#include "policy/limits.h"
#include "runtime/units.h"

namespace nsbox::runtime {

namespace {

constexpr uint64_t kDefaultPids = 4096;

// The shared /etc (plan->shared_etc) attached from a clone made here, with the daemon's rights:
// the state dir is not the jail's root's to traverse.
Status CloneSharedEtc(const JailOptions& o, PreparedJail* plan, isolate::JailFsConfig* fs) {
  // SAFETY: open_tree only reads the path and returns a new fd.
  int tree = sys::OpenTree(AT_FDCWD, plan->shared_etc.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (tree >= 0) {
    plan->etc_tree.reset(tree);
    fs->shared_etc = plan->shared_etc;
    fs->shared_etc_tree = tree;
    return Ok();
  }
  if (errno != ENOSYS) {
    return Error::Sys("open_tree", plan->shared_etc, errno).Context("shared /etc");
  }
  if (o.adopt_later) {
    return Error::Sys("open_tree", plan->shared_etc, errno).Context("a jail adopted later");
  }
  fs->shared_etc.clear();  // before 5.2: /etc is assembled in the jail
  return Ok();
}

// The jail's own overlays of the host's read-only trees (isolate/private_trees.h): `trees` (the
// image's read-only binds) and the layers over /etc, for the plan. On a host without overlayfs
// (ENODEV) or the new mount API (ENOSYS) the host's trees are bound as they are, said once.
Status MakePrivateTrees(const JailOptions& o, const std::vector<std::string>& trees,
                        PreparedJail* plan, isolate::JailFsConfig* fs) {
  if (o.layers_dir.empty()) return Ok();
  isolate::PrivateTreesRequest request;
  request.layers_dir = o.layers_dir;
  request.trees = trees;
  auto made = isolate::MakePrivateTrees(request);
  if (!made.ok()) {
    const int err = made.error().code();
    if (err != ENODEV && err != ENOSYS) return std::move(made).error();
    static std::once_flag said;
    std::call_once(said, [&] {
      log::warn(
          "jails bind the host's /usr, /etc entries and device nodes as they are: {}; a "
          "sandbox can then see through inotify which of them others use "
          "(docs/security.md)",
          made.error().message());
    });
    return Ok();
  }
  for (auto& [path, tree] : made->trees) {
    fs->private_binds[path] = tree.get();
    plan->private_trees.push_back(std::move(tree));
  }
  fs->layers_tree = made->layers.get();
  plan->private_trees.push_back(std::move(made->layers));
  return Ok();
}

// Opens the workspace (and the home directory) of a host-image jail once: the binds use these
// fds, so a symlink swapped in later cannot redirect them (CVE-2024-42472).
Status PinWorkspaceAndHome(const JailOptions& o, const isolate::IdMapping& ids, PreparedJail* plan,
                           isolate::JailFsConfig* fs) {
  plan->workspace_path = o.workspace;
  if (plan->workspace_path.empty()) {
    char buf[4096];
    if (::getcwd(buf, sizeof buf) == nullptr) {
      return Error::Sys("getcwd", "", errno)
          .Context("--workspace (default: the current directory)");
    }
    plan->workspace_path = buf;
  }
  int wfd = ::open(plan->workspace_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (wfd < 0) {
    int err = errno;
    return Error(err, "--workspace '" + plan->workspace_path + "': " +
                          (err == ENOTDIR ? std::string("not a directory") : ErrnoText(err)));
  }
  plan->workspace.reset(wfd);
  if (char* real = ::realpath(plan->workspace_path.c_str(), nullptr); real != nullptr) {
    plan->workspace_path = real;
    std::free(real);
  }
  struct stat st {};
  if (o.warn_unwritable_workspace && ::fstat(wfd, &st) == 0 && st.st_uid != ids.uid.outside &&
      !(st.st_mode & S_IWOTH)) {
    // Root inside is ids.uid.outside on the host; to it, a directory of another owner is
    // "nobody"'s and not writable. Said once, so a read-only workspace is no mystery. Without
    // search permission for others (mkdtemp's 0700, a home directory of Debian 12's adduser)
    // it cannot even enter it, and the jail's chdir fails: the note says that instead (an ACL
    // could still let it in, so this is not a refusal).
    const bool closed =
        st.st_gid == ids.gid.outside ? !(st.st_mode & S_IXGRP) : !(st.st_mode & S_IXOTH);
    char access[96];
    if (closed) {
      std::snprintf(access, sizeof access,
                    "cannot enter it (mode %04o: chmod o+rx it to let commands read it)",
                    static_cast<unsigned>(st.st_mode & 07777));
    } else {
      std::snprintf(access, sizeof access, "can only read it");
    }
    std::fprintf(stderr,
                 "nsbox run: note: the workspace %s belongs to host uid %u; root in the jail is "
                 "host uid %u and %s (chown -R %u:%u it to let commands write)\n",
                 plan->workspace_path.c_str(), st.st_uid, ids.uid.outside, access, ids.uid.outside,
                 ids.gid.outside);
  }

  fs->workspace_source = plan->workspace_path;
  fs->workspace_fd = wfd;
  // A detached copy of the workspace mount, made here with the caller's rights: the jail attaches
  // it without walking the path, which may pass through directories its root cannot traverse.
  // SAFETY: open_tree only reads the fd and returns a new one (or fails, then the path is used).
  int tree = sys::OpenTree(wfd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
  if (tree >= 0) {
    plan->workspace_tree.reset(tree);
    fs->workspace_fd = tree;
    fs->workspace_fd_is_tree = true;
  } else if (errno != ENOSYS) {
    return Error::Sys("open_tree", plan->workspace_path, errno).Context("--workspace");
  }
  if (!o.home.empty()) {
    // Pinned and cloned like the workspace: the jail's root need not traverse the host path.
    fs->home_tmpfs = false;
    fs->home_source = o.home;
    auto home = PinDirectory(o.home);
    if (!home.ok()) return std::move(home).error().Context("the home directory");
    plan->home = std::move(home->fd);
    plan->home_tree = std::move(home->tree);
    fs->home_fd = plan->home.get();
    if (plan->home_tree.valid()) {
      fs->home_fd = plan->home_tree.get();
      fs->home_fd_is_tree = true;
    }
  }
  return Ok();
}

}  // namespace

Status CheckHostname(const std::string& hostname) {
  if (hostname.empty() || hostname.size() > 64 ||
      hostname.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                 "0123456789-.") != std::string::npos) {
    return Error(EINVAL,
                 "--hostname '" + hostname + "': expected 1 to 64 letters, digits, '-' or '.'");
  }
  return Ok();
}

Result<isolate::CgroupLimits> ParseLimits(const JailOptions& o) {
  isolate::CgroupLimits limits;
  if (o.memory) {
    NSBOX_ASSIGN_OR_RETURN(uint64_t bytes, ParseBytes("--memory", *o.memory));
    if (bytes < (4ULL << 20)) {
      return Error(EINVAL, "--memory '" + *o.memory + "': at least 4M is needed to start");
    }
    limits.memory_bytes = bytes;
  }
  if (o.pids) {
    NSBOX_ASSIGN_OR_RETURN(uint64_t pids,
                           ParseCount("--pids", *o.pids, isolate::kMinPids, isolate::kMaxPids));
    limits.pids = pids;
  } else {
    // A default that stops a fork bomb long before the host feels it.
    limits.pids = kDefaultPids;
  }
  if (o.cpus) {
    NSBOX_ASSIGN_OR_RETURN(double cpus,
                           ParseDecimal("--cpus", *o.cpus, isolate::kMinCpus, isolate::kMaxCpus));
    limits.cpus = cpus;
  }
  return limits;
}

Result<PinnedDir> PinDirectory(const std::string& path) {
  PinnedDir out;
  out.fd.reset(::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!out.fd.valid()) return Error::Sys("open", path, errno);
  // SAFETY: open_tree only reads the fd and returns a new one.
  out.tree.reset(
      sys::OpenTree(out.fd.get(), "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH));
  if (!out.tree.valid() && errno != ENOSYS) return Error::Sys("open_tree", path, errno);
  return out;
}

Result<std::string> SharedEtcFor(const std::string& cache_dir,
                                 const std::vector<isolate::JailFsConfig::EtcEntry>& host_etc,
                                 const std::string& nameserver, const isolate::IdMapping& ids) {
  isolate::SharedEtcRequest shared;
  shared.cache_dir = cache_dir;
  shared.host_etc_dir = "/etc";
  shared.entries = host_etc;
  shared.nameserver = nameserver;
  shared.owner_uid = ids.uid.outside;
  shared.owner_gid = ids.gid.outside;
  return isolate::PrepareSharedEtc(shared);
}

Result<PreparedJail> PrepareJail(const JailOptions& o) {
  PreparedJail plan;
  NSBOX_TRY(CheckHostname(o.hostname));
  NSBOX_ASSIGN_OR_RETURN(plan.limits, ParseLimits(o));

  auto& spec = plan.spec;
  NSBOX_ASSIGN_OR_RETURN(spec.ids, isolate::DefaultIdMapping());
  if (o.uid_base) {
    NSBOX_ASSIGN_OR_RETURN(uint64_t base,
                           ParseCount("--uid-base", *o.uid_base, 1, 0xffffffffULL - 65536));
    spec.ids.uid = {0, static_cast<uint32_t>(base), isolate::kDefaultIdCount};
    spec.ids.gid = spec.ids.uid;
  }
  NSBOX_TRY_CTX(isolate::ValidateIdRange(spec.ids.uid, "uid"), "--uid-base");

  isolate::JailFsConfig fs;
  fs.hostname = o.hostname;
  fs.nameserver = o.nameserver;
  if (plan.limits.memory_bytes) fs.tmpfs_size_bytes = *plan.limits.memory_bytes;
  if (!o.copy_etc_files) fs.etc_copy_limit = 0;
  if (o.overlay) {
    // An imported image: the overlay, mounted here with the caller's rights, is the whole root
    // (workspace and home included); the jail only attaches it.
    auto image = images::OverlayImage(o.image, *o.overlay);
    if (!image.ok()) return std::move(image).error().Context("image '" + o.image + "'");
    plan.image = std::move(*image);
    NSBOX_ASSIGN_OR_RETURN(plan.root_tree, isolate::MountOverlay(*o.overlay));
    fs.root_tree_fd = plan.root_tree.get();
    // Its /dev's nodes from the layers (its /etc is the image's).
    NSBOX_TRY(MakePrivateTrees(o, {}, &plan, &fs));
  } else {
    auto image = images::ResolveImage(o.image);
    if (!image.ok()) return std::move(image).error().Context("--image");
    plan.image = std::move(*image);
    fs.root = plan.image.root;
    if (o.adopt_later) {
      if (o.shared_etc_dir.empty()) return Error::Msg("a jail adopted later needs a shared /etc");
      fs.adopt_later = true;
    } else {
      NSBOX_TRY(PinWorkspaceAndHome(o, spec.ids, &plan, &fs));
    }
    NSBOX_ASSIGN_OR_RETURN(fs.host_etc, isolate::ScanHostEtc("/etc"));
    if (!o.shared_etc_dir.empty()) {
      NSBOX_ASSIGN_OR_RETURN(std::string shared_etc,
                             SharedEtcFor(o.shared_etc_dir, fs.host_etc, o.nameserver, spec.ids));
      plan.shared_etc = shared_etc;
      const std::string in_layers = o.layers_dir + "/";
      if (!o.layers_dir.empty() && shared_etc.rfind(in_layers, 0) == 0 &&
          shared_etc.find('/', in_layers.size()) == std::string::npos) {
        // In the layers directory: bound from the jail's layers overlay (below).
        fs.shared_etc = shared_etc;
        fs.shared_etc_layer = shared_etc.substr(in_layers.size());
      } else {
        NSBOX_TRY(CloneSharedEtc(o, &plan, &fs));
      }
    }
    // After the shared /etc's version is made: the jail binds it from the layers overlay.
    std::vector<std::string> trees;
    for (const auto& bind : fs.root.binds) {
      if (bind.readonly) trees.push_back(bind.source);
    }
    NSBOX_TRY(MakePrivateTrees(o, trees, &plan, &fs));
    if (fs.layers_tree < 0 && !fs.shared_etc_layer.empty()) {
      fs.shared_etc_layer.clear();  // no overlays here after all
      NSBOX_TRY(CloneSharedEtc(o, &plan, &fs));
    }
  }
  // The new root is assembled on a directory of the host that exists everywhere; nothing of it
  // is visible outside the jail's mount namespace.
  NSBOX_ASSIGN_OR_RETURN(spec.mounts, isolate::PlanMounts(fs));

  spec.hostname = o.hostname;
  spec.cwd = fs::ResolvePath("/workspace", o.cwd);
  spec.argv = o.command;
  policy::EnvironmentInput env;
  env.hostname = o.hostname;
  env.shell = plan.image.shell;
  for (const auto& kv : o.env) {
    NSBOX_ASSIGN_OR_RETURN(auto parsed, policy::ParseEnvAssignment(kv));
    env.overrides.emplace_back(parsed.first, parsed.second);
  }
  spec.env = policy::BuildEnvironment(env);
  if (!o.command.empty()) {
    spec.exec_candidates = exec::CommandCandidates(o.command[0], exec::PathOf(spec.env));
  }
  spec.tty = o.tty;
  if (o.tty && ::isatty(STDIN_FILENO)) {
    struct winsize ws {};
    if (::ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0) {
      spec.tty_rows = ws.ws_row;
      spec.tty_cols = ws.ws_col;
    }
  }
  for (const auto& rule : policy::DefaultRlimits()) {
    struct rlimit host {};
    if (::getrlimit(static_cast<__rlimit_resource>(rule.resource), &host) < 0) {
      return Error::Sys("getrlimit", rule.name, errno);
    }
    spec.rlimits.emplace_back(rule.resource, policy::ClampRlimit(rule, host));
  }
  return plan;
}

}  // namespace nsbox::runtime

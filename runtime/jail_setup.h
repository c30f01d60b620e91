#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "images/image.h"
#include "isolate/cgroup.h"
#include "isolate/jail.h"

namespace nsbox::runtime {

// What a jail is asked to be, as the user said it (flags of `nsbox run`, a sandbox's
// configuration). Values are strings where the user typed them, so that errors name them.
struct JailOptions {
  std::string image = "host";
  // An imported image's root (its unpacked layers and this sandbox's upper layer): the jail runs
  // on their overlay, which holds /workspace and /root too (`workspace` and `home` are unused).
  std::optional<isolate::RootSpec::Overlay> overlay;
  std::string workspace;  // host directory bound at /workspace; default: the current directory
  std::string home;       // host directory bound at /root; empty: a tmpfs
  std::string cwd;        // inside; relative to /workspace; default /workspace
  std::string hostname = "nsbox";
  // The resolver /etc/resolv.conf names; "" for a sandbox with loopback only.
  std::string nameserver;
  std::vector<std::string> env;  // "K=V"
  std::optional<std::string> memory;
  std::optional<std::string> pids;
  std::optional<std::string> cpus;
  std::optional<std::string> uid_base;
  bool tty = false;
  std::vector<std::string> command;  // empty for a jail that runs nsbox-init
  bool warn_unwritable_workspace = true;
  // Copy small host /etc files into the jail (fast for a one-shot run) rather than bind them
  // (no copy held in memory for a long-lived sandbox's whole life).
  bool copy_etc_files = true;
  // Long-lived sandboxes of the host image (nsboxd): /etc is the shared, read-only one made under
  // this host directory (isolate/shared_etc.h), with the sandbox's own hosts and hostname bound
  // on it. Empty: /etc is assembled in the jail's root (copy_etc_files says how).
  std::string shared_etc_dir;
  // A directory of nsbox's where the jail's own overlays of the host's read-only trees find
  // their layers (isolate/private_trees.h): nsboxd's shared /etc directory (the versions of the
  // shared /etc are then in it), `nsbox run`'s kRunLayersDir. Empty: the host's trees are bound
  // as they are (tests of the jail alone).
  std::string layers_dir;
  // A jail started ahead of its sandbox (nsboxd's pool; the host image with a shared /etc): no
  // workspace or home yet, and `hostname` is a placeholder. Sandbox::Adopt makes it a sandbox's.
  bool adopt_later = false;
};

// Everything decided before anything is started: plain values (`nsbox run --dry-run` prints
// them). The workspace is opened once, here: the jail binds this very directory.
struct PreparedJail {
  images::Image image;
  UniqueFd workspace;       // O_PATH
  UniqueFd workspace_tree;  // open_tree(OPEN_TREE_CLONE) of it, where the kernel has it
  UniqueFd home;            // O_PATH of the host directory bound at /root, when there is one
  UniqueFd home_tree;       // its open_tree clone
  UniqueFd root_tree;       // an imported image's overlay, mounted detached (fsmount)
  UniqueFd etc_tree;        // open_tree clone of the shared /etc (JailOptions::shared_etc_dir)
  // The jail's own overlays (JailOptions::layers_dir): of the image's read-only trees, and of
  // the layers over the host's /etc. Attached by the jail; closed once it has.
  std::vector<UniqueFd> private_trees;
  std::string workspace_path;
  std::string shared_etc;  // the version of the shared /etc attached (JailOptions::shared_etc_dir)
  isolate::CgroupLimits limits;
  isolate::JailSpec spec;
};

// `nsbox run`'s layers directory (JailOptions::layers_dir).
inline constexpr char kRunLayersDir[] = "/run/nsbox-run/layers";

// Validates the options (errors name the flag and the value) and plans the jail.
Result<PreparedJail> PrepareJail(const JailOptions& options);

// The parts of that validation a sandbox adopted from the pool goes through.
Status CheckHostname(const std::string& hostname);
Result<isolate::CgroupLimits> ParseLimits(const JailOptions& options);

// The version of the shared /etc (isolate/shared_etc.h) for these host entries, made if new.
Result<std::string> SharedEtcFor(const std::string& cache_dir,
                                 const std::vector<isolate::JailFsConfig::EtcEntry>& host_etc,
                                 const std::string& nameserver, const isolate::IdMapping& ids);

// A host directory opened once (O_PATH) and its open_tree(OPEN_TREE_CLONE) copy, which a jail
// attaches without walking the path; `tree` is invalid where the kernel has no open_tree (5.2).
struct PinnedDir {
  UniqueFd fd;
  UniqueFd tree;
};
Result<PinnedDir> PinDirectory(const std::string& path);

}  // namespace nsbox::runtime

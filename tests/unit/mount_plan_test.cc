#include "isolate/mount_plan.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "images/image.h"

namespace nsbox::isolate {
namespace {

using Kind = MountOp::Kind;

JailFsConfig Config() {
  JailFsConfig c;
  c.root.binds = {{"/usr", "/usr", true}};
  c.root.symlinks = {{"/bin", "usr/bin"}, {"/lib", "usr/lib"}};
  c.workspace_source = "/home/me/project";
  c.workspace_fd = 7;
  c.hostname = "box";
  c.host_etc = {{JailFsConfig::EtcEntry::Type::kFile, "ld.so.cache", "", 41779},
                {JailFsConfig::EtcEntry::Type::kFile, "big", "", 1 << 20},
                {JailFsConfig::EtcEntry::Type::kDirectory, "ssl", ""},
                {JailFsConfig::EtcEntry::Type::kSymlink, "os-release", "../usr/lib/os-release"}};
  return c;
}

std::vector<std::string> Described(const MountPlan& plan) {
  std::vector<std::string> out;
  for (const auto& op : plan.ops) out.push_back(op.Describe());
  return out;
}

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(MountPlan, StartsWithTheRootAndEndsFrozen) {
  auto plan = PlanMounts(Config());
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->staging, "/tmp");
  ASSERT_GE(plan->ops.size(), 3u);
  EXPECT_EQ(plan->ops.front().kind, Kind::kRootTmpfs);
  EXPECT_EQ(plan->ops.front().staged, "/tmp");
  EXPECT_EQ(plan->ops[plan->ops.size() - 2].kind, Kind::kPivotRoot);
  EXPECT_EQ(plan->ops.back().kind, Kind::kRemountRootReadonly);
}

TEST(MountPlan, DescribesEveryMountExactly) {
  auto plan = PlanMounts(Config());
  ASSERT_TRUE(plan.ok());
  auto d = Described(*plan);
  EXPECT_TRUE(Contains(d, "rbind /usr -> /usr (ro,nosuid,nodev)"));
  EXPECT_TRUE(Contains(d, "symlink /bin -> usr/bin"));
  EXPECT_TRUE(Contains(d, "bind /home/me/project -> /workspace (rw,nosuid,nodev)"));
  EXPECT_TRUE(Contains(d, "bind /tmp/dev -> /dev (rw,nosuid,noexec)"));
  EXPECT_TRUE(Contains(d, "bind /tmp/dev/pts/nsbox-tmp -> /tmp (rw,nosuid,nodev)"));
  EXPECT_TRUE(Contains(d, "tmpfs /root (rw,nosuid,nodev,mode=0700)"));
  EXPECT_TRUE(Contains(d, "proc /proc (hidepid=ptraceable)"));
  EXPECT_TRUE(Contains(d, "mask /proc/kcore"));
  EXPECT_TRUE(Contains(d, "mask /proc/keys"));
  EXPECT_TRUE(Contains(d, "read-only /proc/sys"));
  EXPECT_TRUE(Contains(d, "bind /dev/null -> /dev/null (rw)"));
  EXPECT_TRUE(Contains(d, "devpts /dev/pts (newinstance,ptmxmode=0666,mode=0620,gid=5,max=128)"));
  EXPECT_TRUE(Contains(d, "symlink /dev/ptmx -> pts/ptmx"));
  EXPECT_TRUE(Contains(d, "bind /tmp/dev/shm -> /dev/shm (rw,nosuid,nodev,noexec)"));
  EXPECT_TRUE(Contains(d, "copy /etc/ld.so.cache -> /etc/ld.so.cache"));
  EXPECT_TRUE(Contains(d, "bind /etc/big -> /etc/big (ro,nosuid,nodev)"));
  EXPECT_TRUE(Contains(d, "rbind /etc/ssl -> /etc/ssl (ro,nosuid,nodev)"));
  EXPECT_TRUE(Contains(d, "symlink /etc/os-release -> ../usr/lib/os-release"));
  // Nothing of /sys, and no host /etc entry that is not on the allowlist.
  for (const auto& line : d) {
    EXPECT_EQ(line.find("/sys "), std::string::npos) << line;
    EXPECT_EQ(line.find("shadow"), std::string::npos) << line;
  }
}

TEST(MountPlan, WorkspaceComesBeforeProcAndStagedPathsAreUnderTheStaging) {
  auto plan = PlanMounts(Config());
  ASSERT_TRUE(plan.ok());
  size_t workspace = 0, proc = 0;
  for (size_t i = 0; i < plan->ops.size(); ++i) {
    const auto& op = plan->ops[i];
    if (op.kind == Kind::kBind && op.target == "/workspace") workspace = i;
    if (op.kind == Kind::kProc) proc = i;
    if (op.kind != Kind::kPivotRoot && op.kind != Kind::kRemountRootReadonly && op.target != "/") {
      EXPECT_EQ(op.staged, "/tmp" + op.target);
    }
  }
  EXPECT_LT(workspace, proc);
  EXPECT_EQ(plan->ops[workspace].source_fd, 7);
}

// /dev, /tmp, /dev/shm and the masks of /proc's directories are the root's tmpfs, whose hidden
// directories the devpts covers only once everything that binds them is in place.
TEST(MountPlan, TheScratchPlacesShareOneTmpfs) {
  JailFsConfig c = Config();
  c.tmpfs_size_bytes = 64u << 20;
  auto plan = PlanMounts(c);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  std::vector<std::string> tmpfs;
  size_t devpts = 0, last_hidden_use = 0, masks = 0;
  for (size_t i = 0; i < plan->ops.size(); ++i) {
    const auto& op = plan->ops[i];
    if (op.kind == Kind::kTmpfs) tmpfs.push_back(op.target + " " + op.data);
    if (op.kind == Kind::kDevpts) devpts = i;
    if (op.source.rfind("/tmp/dev/pts/", 0) == 0) last_hidden_use = i;
    if (op.kind == Kind::kMaskPath) {
      EXPECT_EQ(op.source, "/tmp" + std::string(kScratchEmptyDir)) << op.Describe();
      ++masks;
    }
    if (op.kind == Kind::kBind && (op.target == "/tmp" || op.target == "/dev")) {
      EXPECT_TRUE(op.exact_flags) << op.Describe();  // neither keeps the root's flags
    }
  }
  // /tmp and /dev/shm together hold half of the memory limit; /root is a one-shot run's own.
  EXPECT_EQ(plan->ops.front().data, "mode=0755,size=33554432");
  EXPECT_EQ(tmpfs, (std::vector<std::string>{"/root mode=0700"}));
  EXPECT_GT(masks, 0u);
  EXPECT_GT(last_hidden_use, 0u);
  EXPECT_LT(last_hidden_use, devpts);
}

TEST(MountPlan, AnImageOverlayIsTheWholeWritableRoot) {
  JailFsConfig c;
  c.root.overlay =
      RootSpec::Overlay{"/state/images/content/ab/rootfs", "/state/sb/upper", "/state/sb/work"};
  c.root_tree_fd = 9;
  c.hostname = "box";
  c.host_etc = Config().host_etc;  // ignored: the image brings its own /etc
  auto plan = PlanMounts(c);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->ops.front().kind, Kind::kRootTree);
  EXPECT_EQ(plan->ops.front().source_fd, 9);
  EXPECT_EQ(plan->ops.back().kind, Kind::kPivotRoot);  // the root stays writable
  auto d = Described(*plan);
  EXPECT_EQ(d.front(), "new root: the image's overlay at /tmp");
  EXPECT_TRUE(Contains(d, "mkdir (if absent) /workspace"));
  EXPECT_TRUE(Contains(d, "mkdir (if absent) /root"));
  EXPECT_TRUE(Contains(d, "mkdir /tmp"));
  EXPECT_TRUE(Contains(d, "tmpfs /dev (rw,nosuid,noexec,mode=0755)"));
  EXPECT_TRUE(Contains(d, "bind /tmp/dev/pts/nsbox-tmp -> /tmp (rw,nosuid,nodev)"));
  EXPECT_TRUE(Contains(d, "proc /proc (hidepid=ptraceable)"));
  EXPECT_TRUE(Contains(d, "devpts /dev/pts (newinstance,ptmxmode=0666,mode=0620,gid=5,max=128)"));
  for (const auto& op : plan->ops) {
    // Nothing of the host's /etc, and nothing bound over the persistent /workspace or /root.
    EXPECT_NE(op.target.rfind("/etc", 0), 0u) << op.Describe();
    if (op.target == "/workspace" || op.target == "/root") {
      EXPECT_EQ(op.kind, Kind::kMkdir) << op.Describe();
    }
  }
  // An overlay root with host binds is a contradiction.
  c.root.binds = {{"/usr", "/usr", true}};
  EXPECT_FALSE(PlanMounts(c).ok());
}

TEST(MountPlan, GeneratedEtcHasNoSecrets) {
  auto files = GeneratedEtcFiles("box");
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(f.name);
  EXPECT_EQ(names, (std::vector<std::string>{"passwd", "group", "hosts", "hostname", "resolv.conf",
                                             "nsswitch.conf"}));
  EXPECT_EQ(files[0].content,
            "root:x:0:0:root:/root:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
  EXPECT_EQ(files[3].content, "box\n");
  EXPECT_NE(files[2].content.find("127.0.1.1\tbox\n"), std::string::npos);
  EXPECT_EQ(files[4].content.find("nameserver"), std::string::npos);
}

TEST(MountPlan, ResolvConfNamesTheDaemonsResolver) {
  auto files = GeneratedEtcFiles("box", "10.213.0.1");
  ASSERT_EQ(files[4].name, "resolv.conf");
  EXPECT_NE(files[4].content.find("\nnameserver 10.213.0.1\n"), std::string::npos)
      << files[4].content;
}

TEST(MountPlan, RefusesBadInput) {
  auto c = Config();
  c.staging = "relative";
  EXPECT_FALSE(PlanMounts(c).ok());
  c = Config();
  c.root.binds.push_back({"/opt", "/opt/../etc", true});
  EXPECT_FALSE(PlanMounts(c).ok());
  c = Config();
  c.workspace_source.clear();
  EXPECT_FALSE(PlanMounts(c).ok());
}

TEST(MountPlan, ASharedEtcIsBoundWithOnlyTheHostsDirectoriesAndTheSandboxsOwnFiles) {
  JailFsConfig c = Config();
  c.shared_etc = "/state/host-etc/0123";
  c.shared_etc_tree = 11;
  auto plan = PlanMounts(c);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  std::vector<std::string> etc;  // every step for /etc, in order
  for (const auto& op : plan->ops) {
    if (op.target == "/etc" || op.target.rfind("/etc/", 0) == 0 ||
        op.target.rfind("/proc/.nsbox-etc/", 0) == 0) {
      etc.push_back(op.Describe());
    }
  }
  EXPECT_EQ(etc, (std::vector<std::string>{
                     "mkdir /etc",
                     "bind /state/host-etc/0123 -> /etc (ro,nosuid,nodev)",
                     "rbind /etc/ssl -> /etc/ssl (ro,nosuid,nodev)",
                     "write /proc/.nsbox-etc/hosts",
                     "bind /tmp/proc/.nsbox-etc/hosts -> /etc/hosts (ro,nosuid,nodev)",
                     "write /proc/.nsbox-etc/hostname",
                     "bind /tmp/proc/.nsbox-etc/hostname -> /etc/hostname (ro,nosuid,nodev)",
                 }));
  // Attached from the host's clone, never by walking the state dir's path.
  for (const auto& op : plan->ops) {
    if (op.target != "/etc" || op.kind != Kind::kBind) continue;
    EXPECT_TRUE(op.source_is_tree);
    EXPECT_EQ(op.source_fd, 11);
  }
  for (const auto& op : plan->ops) {
    if (op.kind != Kind::kWriteFile) continue;
    if (op.target == "/proc/.nsbox-etc/hostname") {
      EXPECT_EQ(op.data, "box\n");
    }
    if (op.target == "/proc/.nsbox-etc/hosts") {
      EXPECT_NE(op.data.find("127.0.1.1\tbox\n"), std::string::npos) << op.data;
    }
  }
  // Kept under /proc's mount point, which the jail's procfs covers afterwards.
  size_t last_write = 0, proc = 0;
  for (size_t i = 0; i < plan->ops.size(); ++i) {
    if (plan->ops[i].kind == Kind::kWriteFile) last_write = i;
    if (plan->ops[i].kind == Kind::kProc) proc = i;
  }
  EXPECT_GT(proc, last_write);
  c.shared_etc_tree = -1;
  EXPECT_FALSE(PlanMounts(c).ok());
  c = Config();
  c.shared_etc = "/state/host-etc/0123";
  c.root = {};
  c.root_tree_fd = 9;
  auto overlay = PlanMounts(c);
  ASSERT_FALSE(overlay.ok());
  EXPECT_EQ(overlay.error().message(), "an overlay root has its own /etc");
}

// Issue 44: with overlays of its own, nothing the jail binds is a host inode others use: the
// image's read-only trees are its overlays, /etc's host entries, the device nodes, the masks'
// null device and the shared /etc come from its layers overlay, attached for the time of the
// binds and unmounted before the pivot.
TEST(MountPlan, TheHostsReadOnlyTreesComeFromTheJailsOwnOverlays) {
  JailFsConfig c = Config();
  c.private_binds = {{"/usr", 11}};
  c.layers_tree = 12;
  c.shared_etc = "/state/etc/0123";
  c.shared_etc_layer = "0123";
  auto plan = PlanMounts(c);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  auto d = Described(*plan);
  EXPECT_EQ(d[1], "mkdir /.nsbox-layers");
  EXPECT_EQ(d[2], "bind (the jail's layers overlay) -> /.nsbox-layers (rw)");
  EXPECT_EQ(plan->ops[2].source_fd, 12);
  EXPECT_TRUE(plan->ops[2].source_is_tree);
  EXPECT_EQ(d[d.size() - 3], "unmount /.nsbox-layers");
  EXPECT_EQ(plan->ops[plan->ops.size() - 3].staged, "/tmp/.nsbox-layers");
  EXPECT_TRUE(Contains(d, "bind /tmp/.nsbox-layers/0123 -> /etc (ro,nosuid,nodev)"));
  EXPECT_TRUE(Contains(d, "bind /tmp/.nsbox-layers/ssl -> /etc/ssl (ro,nosuid,nodev)"));
  EXPECT_TRUE(Contains(d, "bind /tmp/.nsbox-layers/.nsbox-dev/null -> /dev/null (rw)"));
  EXPECT_TRUE(Contains(d, "bind /tmp/.nsbox-layers/.nsbox-dev/urandom -> /dev/urandom (rw)"));
  for (const auto& op : plan->ops) {
    if (op.target == "/usr" && op.kind == Kind::kBind) {
      EXPECT_EQ(op.source_fd, 11) << op.Describe();
      EXPECT_TRUE(op.source_is_tree) << op.Describe();
    }
    if (op.kind == Kind::kMaskPath) {
      EXPECT_EQ(op.data, "/tmp/.nsbox-layers/.nsbox-dev/null");
    }
    // No bind of a host path but the workspace.
    if (op.kind == Kind::kBind && !op.source_is_tree && op.target != "/workspace") {
      EXPECT_EQ(op.source.rfind("/tmp/", 0), 0u) << op.Describe();
    }
  }
  // Without a shared /etc: its big files and directories from the layers too.
  c.shared_etc.clear();
  c.shared_etc_layer.clear();
  plan = PlanMounts(c);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  d = Described(*plan);
  EXPECT_TRUE(Contains(d, "bind /tmp/.nsbox-layers/big -> /etc/big (ro,nosuid,nodev)"));
  EXPECT_TRUE(Contains(d, "bind /tmp/.nsbox-layers/ssl -> /etc/ssl (ro,nosuid,nodev)"));
  EXPECT_TRUE(Contains(d, "copy /etc/ld.so.cache -> /etc/ld.so.cache")) << "small files copied";
  // On an image's persistent root: attached in its /dev's tmpfs, for the device nodes.
  JailFsConfig image;
  image.root.overlay = RootSpec::Overlay{"/l", "/u", "/w"};
  image.root_tree_fd = 9;
  image.layers_tree = 12;
  plan = PlanMounts(image);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  d = Described(*plan);
  auto at = [&](const std::string& line) {
    return std::find(d.begin(), d.end(), line) - d.begin();
  };
  EXPECT_LT(at("tmpfs /dev (rw,nosuid,noexec,mode=0755)"), at("mkdir /dev/.nsbox-layers"));
  EXPECT_LT(at("bind (the jail's layers overlay) -> /dev/.nsbox-layers (rw)"),
            at("bind /tmp/dev/.nsbox-layers/.nsbox-dev/null -> /dev/null (rw)"));
  EXPECT_EQ(d[d.size() - 2], "unmount /dev/.nsbox-layers");
  EXPECT_FALSE(Contains(d, "mkdir /.nsbox-layers")) << "nothing in the persistent root";
}

TEST(MountPlan, AJailAdoptedLaterLeavesTheSandboxsPartsToTheAdoption) {
  JailFsConfig c = Config();
  c.workspace_source.clear();
  c.workspace_fd = -1;
  c.home_tmpfs = false;
  c.shared_etc = "/state/host-etc/0123";
  c.shared_etc_tree = 11;
  c.adopt_later = true;
  auto plan = PlanMounts(c);
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  auto d = Described(*plan);
  // Empty mount points for ApplyAdoption, nothing mounted on them; the root stays writable.
  EXPECT_TRUE(Contains(d, "mkdir /workspace")) << ::testing::PrintToString(d);
  EXPECT_TRUE(Contains(d, "mkdir /root")) << ::testing::PrintToString(d);
  for (const auto& op : plan->ops) {
    for (const char* dir : {"/workspace", "/root"}) {
      EXPECT_TRUE(op.target != dir || op.kind == Kind::kMkdir) << op.Describe();
    }
    EXPECT_NE(op.kind, Kind::kRemountRootReadonly);
  }
  EXPECT_EQ(plan->ops.back().kind, Kind::kPivotRoot);
  // Its own hosts and hostname are where ApplyAdoption rewrites them, and bound as usual.
  EXPECT_TRUE(Contains(d, std::string("write ") + kOwnEtcDir + "/hosts"));
  // ... through their directory, held from before the procfs covers it.
  auto at = [&d](const std::string& step) {
    return std::find(d.begin(), d.end(), step) - d.begin();
  };
  EXPECT_LT(at(std::string("hold ") + kOwnEtcDir), at("proc /proc (hidepid=ptraceable)"))
      << ::testing::PrintToString(d);
  EXPECT_LT(at(std::string("hold ") + kOwnEtcDir), static_cast<long>(d.size()));
  EXPECT_TRUE(Contains(
      d, "bind /tmp" + std::string(kOwnEtcDir) + "/hostname -> /etc/hostname (ro,nosuid,nodev)"));
  // Only the host image with a shared /etc can be adopted.
  c.shared_etc.clear();
  c.shared_etc_tree = -1;
  EXPECT_FALSE(PlanMounts(c).ok());
}

TEST(MountPlan, ScanHostEtcTakesOnlyTheAllowlist) {
  char tmpl[] = "/tmp/nsbox-etc-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::filesystem::path dir(tmpl);
  std::ofstream(dir / "shadow") << "root:$6$secret:::\n";
  std::ofstream(dir / "ld.so.cache") << "cache";
  std::filesystem::create_directory(dir / "ssl");
  std::filesystem::create_symlink("../usr/lib/os-release", dir / "os-release");
  ::mkfifo((dir / "localtime").c_str(), 0644);  // not a file a program needs: skipped
  auto entries = ScanHostEtc(dir.string());
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(entries.ok()) << entries.error().message();
  std::vector<std::string> names;
  for (const auto& e : *entries) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ld.so.cache", "os-release", "ssl"}));
  for (const auto& e : *entries) {
    if (e.name == "os-release") {
      EXPECT_EQ(e.type, JailFsConfig::EtcEntry::Type::kSymlink);
      EXPECT_EQ(e.pointee, "../usr/lib/os-release");
    }
  }
}

TEST(HostImage, ReproducesMergedUsrAndRealDirectories) {
  char tmpl[] = "/tmp/nsbox-host-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::filesystem::path root(tmpl);
  std::filesystem::create_directories(root / "usr/bin");
  std::filesystem::create_directory_symlink("usr/bin", root / "bin");
  std::filesystem::create_directory(root / "lib64");  // a real directory, bound as it is
  auto image = images::HostImage(root.string());
  auto missing = images::HostImage((root / "nope").string());
  std::filesystem::remove_all(root);
  ASSERT_TRUE(image.ok()) << image.error().message();
  ASSERT_EQ(image->root.binds.size(), 2u);
  EXPECT_EQ(image->root.binds[0].target, "/usr");
  EXPECT_EQ(image->root.binds[1].target, "/lib64");
  ASSERT_EQ(image->root.symlinks.size(), 1u);
  EXPECT_EQ(image->root.symlinks[0].target, "/bin");
  EXPECT_EQ(image->root.symlinks[0].pointee, "usr/bin");
  EXPECT_EQ(image->shell, "/bin/sh");  // no bash in this tree
  EXPECT_FALSE(missing.ok());
  auto unknown = images::ResolveImage("debian");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().message(), "image 'debian' does not exist (available: host)");
}

}  // namespace
}  // namespace nsbox::isolate

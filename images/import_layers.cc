#include "images/import_layers.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

#include "base/files.h"
#include "base/strings.h"
#include "base/syscalls.h"
#include "images/import.h"
#include "images/xattrs.h"

namespace nsbox::images::internal {

namespace {

// Real images nest a few dozen levels at most; a deeper path is a hostile archive's.
constexpr size_t kMaxPathComponents = 128;

// The paths the unpacking keeps while it runs (every path a layer made, for its whiteouts; every
// directory, for its mtime), counted as their bytes and 96 for each one's node: a million files
// of 40-byte paths fit, the most any public image has by far; a hostile layer of millions of
// 4 KiB names is refused before it costs the daemon more.
constexpr uint64_t kMaxHeldBytes = 128 * kMiB;
constexpr uint64_t kHeldNodeBytes = 96;

// Off only in tests: the walk that replaces openat2 before Linux 5.6 (conventions.md: both
// paths tested).
std::atomic<bool> g_use_openat2{true};

}  // namespace

void SetUseOpenat2ForTesting(bool enabled) { g_use_openat2.store(enabled); }

std::string Child(const std::string& dir, std::string_view name) {
  return dir.empty() ? std::string(name) : dir + "/" + std::string(name);
}

Result<std::vector<std::string>> SplitEntryPath(std::string_view path, std::string_view what) {
  std::vector<std::string> parts;
  for (std::string_view part : Split(path, '/')) {
    if (part == "..") {
      return BadInput(std::string(what) + ": the path has a '..' component, which could lead " +
                      "outside the image");
    }
    if (!part.empty() && part != ".") parts.emplace_back(part);
  }
  if (parts.size() > kMaxPathComponents) {
    return BadInput(std::string(what) + ": more than " + std::to_string(kMaxPathComponents) +
                    " path components");
  }
  return parts;
}

std::string JoinParts(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += '/';
    out += parts[i];
  }
  return out;
}

Unpacker::Unpacker(int root_fd, const isolate::IdMapping& ids, ImportBudget& budget)
    : root_fd_(root_fd), ids_(ids), budget_(budget), use_openat2_(g_use_openat2.load()) {}

Status Unpacker::ApplyLayer(TarStream& tar, const RangeReader& reader) {
  written_.clear();
  held_bytes_ -= written_bytes_;
  written_bytes_ = 0;
  for (;;) {
    struct archive_entry* e = nullptr;
    NSBOX_ASSIGN_OR_RETURN(bool more, tar.Next(&e));
    if (!more) return Ok();
    NSBOX_TRY(budget_.Entry());  // its inode and name, and a look at the free space
    NSBOX_TRY(ApplyEntry(tar.archive(), reader, e));
  }
}

Status Unpacker::Finish() {
  for (const auto& [rel, mtime] : dir_mtimes_) {
    UniqueFd fd;
    if (rel.empty()) {
      NSBOX_ASSIGN_OR_RETURN(fd, OpenAt(root_fd_, ".", O_RDONLY | O_DIRECTORY));
    } else {
      std::vector<std::string> parts;
      NSBOX_ASSIGN_OR_RETURN(parts, SplitEntryPath(rel, rel));
      auto parent = OpenDir("/" + rel, parts, parts.size() - 1, /*create=*/false);
      if (!parent.ok() || !parent->valid()) continue;
      fd.reset(::openat(parent->get(), parts.back().c_str(),
                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd.valid()) continue;
    }
    const struct timespec times[2] = {mtime, mtime};
    if (::futimens(fd.get(), times) != 0) return Error::Sys("futimens", "/" + rel, errno);
  }
  return Ok();
}

std::vector<std::string> Unpacker::Warnings() const {
  std::vector<std::string> out;
  if (devices_.count > 0) {
    out.push_back("skipped " + Plural(devices_.count, "device node", "device nodes") +
                  " (first: " + devices_.first + "); a sandbox has its own /dev");
  }
  if (sockets_.count > 0) {
    out.push_back("skipped " + Plural(sockets_.count, "socket", "sockets") +
                  " (first: " + sockets_.first + ")");
  }
  if (unknown_.count > 0) {
    out.push_back("skipped " + Plural(unknown_.count, "entry", "entries") +
                  " of an unknown type (first: " + unknown_.first + ")");
  }
  if (dropped_xattrs_.count > 0) {
    out.push_back("dropped " + Plural(dropped_xattrs_.count, "xattr", "xattrs") +
                  " outside user.* and security.capability (trusted.*, security.selinux and "
                  "the like are the host's, not the image's; first: " +
                  dropped_xattrs_.first + ")");
  }
  if (refused_xattrs_.count > 0) {
    out.push_back("could not keep " + Plural(refused_xattrs_.count, "xattr", "xattrs") +
                  " (first: " + refused_xattrs_.first + ")");
  }
  if (acls_.count > 0) {
    out.push_back("dropped the ACLs of " + Plural(acls_.count, "entry", "entries") +
                  " (first: " + acls_.first + "); their modes are kept");
  }
  if (fflags_.count > 0) {
    out.push_back("dropped the file flags (chattr) of " +
                  Plural(fflags_.count, "entry", "entries") + " (first: " + fflags_.first + ")");
  }
  return out;
}

Result<uint32_t> Unpacker::Shift(int64_t id, const isolate::IdRange& range, std::string_view kind,
                                 const std::string& what) {
  if (id < range.inside || static_cast<uint64_t>(id) - range.inside >= range.count) {
    return BadInput(what + ": " + std::string(kind) + " " + std::to_string(id) +
                    " is outside the sandbox's " + std::to_string(range.count) + " ids");
  }
  return static_cast<uint32_t>(range.outside + (static_cast<uint64_t>(id) - range.inside));
}

Status Unpacker::Hold(uint64_t bytes, bool written) {
  const uint64_t cost = kHeldNodeBytes + bytes;
  held_bytes_ += cost;
  if (written) written_bytes_ += cost;
  if (held_bytes_ > kMaxHeldBytes) {
    return BadInput("the image's paths take more than " + std::to_string(kMaxHeldBytes / kMiB) +
                    " MiB of nsboxd's memory while they are unpacked (" +
                    std::to_string(written_.size()) + " in this layer, " +
                    std::to_string(dir_mtimes_.size()) + " directories in all)");
  }
  return Ok();
}

Result<UniqueFd> Unpacker::OpenDir(const std::string& what, const std::vector<std::string>& parts,
                                   size_t n, bool create) {
  if (n == 0) return OpenAt(root_fd_, ".", O_PATH | O_DIRECTORY);
  const std::string rel = JoinParts(parts, n);
  if (use_openat2_) {
    struct open_how how {};
    how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    // SAFETY: `how` is a fully initialised open_how of the size passed; `rel` is a
    // NUL-terminated string that outlives the call.
    int fd = sys::Openat2(root_fd_, rel.c_str(), &how, sizeof how);
    if (fd >= 0) return UniqueFd(fd);
    if (errno == ENOSYS) {
      use_openat2_ = false;  // before Linux 5.6: the walk below does the same, one step at a time
    } else if (errno != ENOENT && errno != ELOOP && errno != ENOTDIR && errno != EAGAIN) {
      return Error::Sys("openat2", "/" + rel, errno);
    }
  }
  // One component at a time from the root: the way to make missing directories, to name the
  // component at fault, and the fallback without openat2. Nothing else writes into the
  // private .import- directory, so what fstatat saw is what openat opens.
  UniqueFd cur;
  NSBOX_ASSIGN_OR_RETURN(cur, OpenAt(root_fd_, ".", O_PATH | O_DIRECTORY));
  for (size_t i = 0; i < n; ++i) {
    const std::string prefix = JoinParts(parts, i + 1);
    const char* name = parts[i].c_str();
    struct stat st {};
    if (::fstatat(cur.get(), name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) return Error::Sys("fstatat", "/" + prefix, errno);
      if (!create) return UniqueFd();
      if (::mkdirat(cur.get(), name, 0755) != 0) {
        return Error::Sys("mkdirat", "/" + prefix, errno);
      }
      const Owner root = RootOwner();
      if (::fchownat(cur.get(), name, root.uid, root.gid, AT_SYMLINK_NOFOLLOW) != 0) {
        return Error::Sys("fchownat", "/" + prefix, errno);
      }
      // After the chown, and explicit: mkdirat's mode went through the daemon's umask.
      if (::fchmodat(cur.get(), name, 0755, 0) != 0) {
        return Error::Sys("fchmodat", "/" + prefix, errno);
      }
      if (written_.insert(prefix).second) NSBOX_TRY(Hold(prefix.size(), true));
    } else if (S_ISLNK(st.st_mode)) {
      return BadInput(what + ": its parent " + Quote(prefix) +
                      " is a symlink (refused: an entry is never written through a symlink, "
                      "which could lead outside the image)");
    } else if (!S_ISDIR(st.st_mode)) {
      return BadInput(what + ": its parent " + Quote(prefix) + " is not a directory");
    }
    NSBOX_ASSIGN_OR_RETURN(cur, OpenAt(cur.get(), name, O_PATH | O_DIRECTORY | O_NOFOLLOW));
  }
  return cur;
}

Status Unpacker::ApplyXattrs(int fd, struct archive_entry* e, const std::string& path) {
  std::vector<Xattr> xattrs;
  archive_entry_xattr_reset(e);
  const char* name = nullptr;
  const void* value = nullptr;
  size_t size = 0;
  while (archive_entry_xattr_next(e, &name, &value, &size) == ARCHIVE_OK) {
    xattrs.emplace_back(name, std::string(static_cast<const char*>(value), size));
  }
  NSBOX_ASSIGN_OR_RETURN(XattrPlan plan, PlanXattrs(xattrs, ids_.uid, "entry " + Quote(path)));
  for (const std::string& n : plan.others) dropped_xattrs_.Add(Shown(n) + " on " + Shown(path));
  for (const auto& [n, v] : plan.apply) {
    if (fd < 0) {  // a symlink: Linux keeps no user.* xattrs on one, and there is no fd to use
      refused_xattrs_.Add(Shown(n) + " on the symlink " + Shown(path));
      continue;
    }
    if (::fsetxattr(fd, n.c_str(), v.data(), v.size(), 0) != 0) {
      // The file system does not take it (no xattr support, a value too large, no room left
      // in the inode's xattr block): said once in the warnings, the import goes on.
      if (errno == EPERM || errno == ENOTSUP || errno == EOPNOTSUPP || errno == E2BIG ||
          errno == ERANGE || errno == EINVAL || errno == ENOSPC) {
        refused_xattrs_.Add(Shown(n) + " on " + Shown(path) + ": " + ErrnoName(errno));
        continue;
      }
      return Error::Sys("fsetxattr", Shown(path) + " " + Shown(n), errno);
    }
  }
  if (!plan.acls.empty() || archive_entry_acl_count(e, ARCHIVE_ENTRY_ACL_TYPE_POSIX1E |
                                                           ARCHIVE_ENTRY_ACL_TYPE_NFS4) > 0) {
    acls_.Add(Shown(path));
  }
  unsigned long set = 0;
  unsigned long clear = 0;
  archive_entry_fflags(e, &set, &clear);
  if (set != 0) fflags_.Add(Shown(path));
  return Ok();
}

Status Unpacker::SetMetadata(int fd, struct archive_entry* e, const Owner& owner,
                             const std::string& path) {
  if (::fchown(fd, owner.uid, owner.gid) != 0) return Error::Sys("fchown", path, errno);
  if (::fchmod(fd, archive_entry_perm(e) & 07777) != 0) return Error::Sys("fchmod", path, errno);
  return ApplyXattrs(fd, e, path);
}

struct timespec Unpacker::MtimeOf(struct archive_entry* e) {
  struct timespec ts {};
  if (!archive_entry_mtime_is_set(e)) {
    ts.tv_nsec = UTIME_OMIT;
    return ts;
  }
  ts.tv_sec = archive_entry_mtime(e);
  ts.tv_nsec = archive_entry_mtime_nsec(e);
  return ts;
}

Status Unpacker::Clear(int parent_fd, const std::string& name, const std::string& path) {
  return RemoveTreeAt(parent_fd, name, path);
}

Status Unpacker::MakeDirectory(struct archive_entry* e, int parent, const std::string& name,
                               const std::string& rel, const Owner& owner) {
  const std::string path = "/" + rel;
  if (::mkdirat(parent, name.c_str(), 0700) != 0) {
    if (errno != EEXIST) return Error::Sys("mkdirat", path, errno);
    struct stat st {};
    if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return Error::Sys("fstatat", path, errno);
    }
    if (!S_ISDIR(st.st_mode)) {  // a directory stays a directory; anything else is replaced
      NSBOX_TRY(Clear(parent, name, path));
      if (::mkdirat(parent, name.c_str(), 0700) != 0) return Error::Sys("mkdirat", path, errno);
    }
  }
  NSBOX_ASSIGN_OR_RETURN(UniqueFd fd, OpenAt(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
  NSBOX_TRY(SetMetadata(fd.get(), e, owner, path));
  if (dir_mtimes_.insert_or_assign(rel, MtimeOf(e)).second) NSBOX_TRY(Hold(rel.size(), false));
  return Ok();
}

Status Unpacker::WriteRegular(struct archive* a, const RangeReader& reader, struct archive_entry* e,
                              int parent, const std::string& name, const std::string& rel,
                              const Owner& owner) {
  const std::string path = "/" + rel;
  // A file larger than the import may write is refused before its first byte; a sparse one
  // is counted by the data it really has, block by block below.
  if (archive_entry_sparse_count(e) == 0) {
    NSBOX_TRY(budget_.Expect(ImportBudget::Step::kUnpacked,
                             static_cast<uint64_t>(std::max<la_int64_t>(archive_entry_size(e), 0)),
                             "entry " + Quote(rel)));
  }
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  UniqueFd fd(::openat(parent, name.c_str(), flags, 0600));
  if (!fd.valid() && errno == EEXIST) {
    NSBOX_TRY(Clear(parent, name, path));
    fd.reset(::openat(parent, name.c_str(), flags, 0600));
  }
  if (!fd.valid()) return Error::Sys("openat", path, errno);
  uint64_t end = 0;
  for (;;) {
    const void* data = nullptr;
    size_t size = 0;
    la_int64_t offset = 0;
    int rc = archive_read_data_block(a, &data, &size, &offset);
    if (rc == ARCHIVE_EOF) break;
    if (rc != ARCHIVE_OK) return ArchiveError(a, reader, "entry " + Quote(rel) + ": its data");
    NSBOX_TRY(budget_.Charge(ImportBudget::Step::kUnpacked, size, "entry " + Quote(rel)));
    // Sparse entries come as blocks at offsets; the holes stay holes.
    const char* p = static_cast<const char*>(data);
    uint64_t at = static_cast<uint64_t>(offset);
    while (size > 0) {
      ssize_t n = ::pwrite(fd.get(), p, size, static_cast<off_t>(at));
      if (n < 0) {
        if (errno == EINTR) continue;
        return Error::Sys("write", path, errno);
      }
      p += n;
      at += static_cast<uint64_t>(n);
      size -= static_cast<size_t>(n);
    }
    end = std::max(end, at);
  }
  const uint64_t size = static_cast<uint64_t>(std::max<la_int64_t>(archive_entry_size(e), 0));
  if (end < size && ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return Error::Sys("ftruncate", path, errno);  // a sparse file's trailing hole
  }
  size_bytes_ += size;
  NSBOX_TRY(SetMetadata(fd.get(), e, owner, path));
  const struct timespec mtime = MtimeOf(e);
  const struct timespec times[2] = {mtime, mtime};
  if (::futimens(fd.get(), times) != 0) return Error::Sys("futimens", path, errno);
  return Ok();
}

Status Unpacker::MakeSymlink(struct archive_entry* e, int parent, const std::string& name,
                             const std::string& raw, const std::string& rel, const Owner& owner) {
  const std::string path = "/" + rel;
  const char* target = archive_entry_symlink(e);
  if (target == nullptr) target = archive_entry_symlink_utf8(e);
  if (target == nullptr || *target == '\0') {
    return BadInput("entry " + Quote(raw) + ": a symlink with no target");
  }
  // The target is data, stored verbatim: absolute links (/bin/sh -> /bin/busybox) are normal,
  // and nothing in the import ever follows one.
  if (::symlinkat(target, parent, name.c_str()) != 0) {
    if (errno != EEXIST) return Error::Sys("symlinkat", path, errno);
    NSBOX_TRY(Clear(parent, name, path));
    if (::symlinkat(target, parent, name.c_str()) != 0) {
      return Error::Sys("symlinkat", path, errno);
    }
  }
  if (::fchownat(parent, name.c_str(), owner.uid, owner.gid, AT_SYMLINK_NOFOLLOW) != 0) {
    return Error::Sys("fchownat", path, errno);
  }
  NSBOX_TRY(ApplyXattrs(-1, e, path));
  const struct timespec mtime = MtimeOf(e);
  const struct timespec times[2] = {mtime, mtime};
  if (::utimensat(parent, name.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0) {
    return Error::Sys("utimensat", path, errno);
  }
  return Ok();
}

Status Unpacker::MakeHardlink(const char* hardlink, int parent, const std::string& name,
                              const std::string& raw, const std::string& rel) {
  const std::string path = "/" + rel;
  const std::string what = "entry " + Quote(raw) + ": hardlink target " + Quote(hardlink);
  NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> target, SplitEntryPath(hardlink, what));
  if (target.empty()) return BadInput(what + " is the image's root");
  NSBOX_ASSIGN_OR_RETURN(UniqueFd tdir, OpenDir(what, target, target.size() - 1, false));
  struct stat tst {};
  if (!tdir.valid() ||
      ::fstatat(tdir.get(), target.back().c_str(), &tst, AT_SYMLINK_NOFOLLOW) != 0) {
    if (tdir.valid() && errno != ENOENT) {
      return Error::Sys("fstatat", "/" + JoinParts(target, target.size()), errno);
    }
    return BadInput(what + " does not exist (a hardlink's target must come before it)");
  }
  if (S_ISDIR(tst.st_mode)) return BadInput(what + " is a directory");
  // flags 0: a hardlink to a symlink links the symlink itself.
  if (::linkat(tdir.get(), target.back().c_str(), parent, name.c_str(), 0) != 0) {
    if (errno != EEXIST) return Error::Sys("linkat", path, errno);
    struct stat st {};
    if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_ino == tst.st_ino &&
        st.st_dev == tst.st_dev) {
      return Ok();  // already that very file
    }
    NSBOX_TRY(Clear(parent, name, path));
    if (::linkat(tdir.get(), target.back().c_str(), parent, name.c_str(), 0) != 0) {
      return Error::Sys("linkat", path, errno);
    }
  }
  return Ok();
}

Status Unpacker::MakeFifo(struct archive_entry* e, int parent, const std::string& name,
                          const std::string& rel, const Owner& owner) {
  const std::string path = "/" + rel;
  if (::mkfifoat(parent, name.c_str(), 0600) != 0) {
    if (errno != EEXIST) return Error::Sys("mkfifoat", path, errno);
    NSBOX_TRY(Clear(parent, name, path));
    if (::mkfifoat(parent, name.c_str(), 0600) != 0) return Error::Sys("mkfifoat", path, errno);
  }
  // Opening a FIFO for reading with O_NONBLOCK does not wait for a writer; the fd is what
  // fchown, fchmod, fsetxattr and futimens need.
  NSBOX_ASSIGN_OR_RETURN(UniqueFd fd, OpenAt(parent, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW));
  NSBOX_TRY(SetMetadata(fd.get(), e, owner, path));
  const struct timespec mtime = MtimeOf(e);
  const struct timespec times[2] = {mtime, mtime};
  if (::futimens(fd.get(), times) != 0) return Error::Sys("futimens", path, errno);
  return Ok();
}

Status Unpacker::ApplyEntry(struct archive* a, const RangeReader& reader, struct archive_entry* e) {
  const char* raw_c = archive_entry_pathname(e);
  if (raw_c == nullptr) raw_c = archive_entry_pathname_utf8(e);
  if (raw_c == nullptr || *raw_c == '\0') return BadInput("an entry has no name");
  const std::string raw = raw_c;
  const std::string what = "entry " + Quote(raw);
  NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> parts, SplitEntryPath(raw, what));
  const mode_t type = archive_entry_filetype(e);
  const char* hardlink = archive_entry_hardlink(e);

  if (!parts.empty() && parts.back().rfind(".wh.", 0) == 0) return ApplyWhiteout(raw, parts);

  const std::string rel = JoinParts(parts, parts.size());
  if (hardlink == nullptr && (type == AE_IFCHR || type == AE_IFBLK)) {
    devices_.Add(Shown("/" + rel));  // a sandbox gets its own /dev; an image's nodes are moot
    return Ok();
  }
  if (hardlink == nullptr && type == AE_IFSOCK) {
    sockets_.Add(Shown("/" + rel));
    return Ok();
  }
  if (hardlink == nullptr && type != AE_IFDIR && type != AE_IFREG && type != AE_IFLNK &&
      type != AE_IFIFO) {
    unknown_.Add(Shown("/" + rel));
    return Ok();
  }
  Owner owner{};
  NSBOX_ASSIGN_OR_RETURN(owner.uid, Shift(archive_entry_uid(e), ids_.uid, "owner", what));
  NSBOX_ASSIGN_OR_RETURN(owner.gid, Shift(archive_entry_gid(e), ids_.gid, "group", what));

  if (parts.empty()) {  // "./": the root itself, whose owner and mode an image may set
    if (hardlink != nullptr || type != AE_IFDIR) return BadInput(what + " is not a directory");
    NSBOX_ASSIGN_OR_RETURN(UniqueFd root, OpenAt(root_fd_, ".", O_RDONLY | O_DIRECTORY));
    NSBOX_TRY(SetMetadata(root.get(), e, owner, "/"));
    dir_mtimes_[""] = MtimeOf(e);
    return Ok();
  }

  NSBOX_ASSIGN_OR_RETURN(UniqueFd parent, OpenDir(what, parts, parts.size() - 1, true));
  const std::string& name = parts.back();
  if (hardlink != nullptr) {
    NSBOX_TRY(MakeHardlink(hardlink, parent.get(), name, raw, rel));
  } else if (type == AE_IFDIR) {
    NSBOX_TRY(MakeDirectory(e, parent.get(), name, rel, owner));
  } else if (type == AE_IFREG) {
    NSBOX_TRY(WriteRegular(a, reader, e, parent.get(), name, rel, owner));
  } else if (type == AE_IFLNK) {
    NSBOX_TRY(MakeSymlink(e, parent.get(), name, raw, rel, owner));
  } else {
    NSBOX_TRY(MakeFifo(e, parent.get(), name, rel, owner));
  }
  if (written_.insert(rel).second) NSBOX_TRY(Hold(rel.size(), true));
  ++files_;
  return Ok();
}

namespace {

// The sha256 of a compressed layer's decompressed stream: a docker save layer that is
// compressed and not named by its digest can only be checked against its diff_id this way.
Result<std::string> UncompressedDigest(const LayerPlan& layer, const std::string& what) {
  RangeReader reader(layer.blob.fd, layer.blob.offset, layer.blob.size, layer.blob.name, nullptr);
  NSBOX_ASSIGN_OR_RETURN(ArchiveReader a, OpenRaw(&reader, what));
  struct archive_entry* e = nullptr;
  if (archive_read_next_header(a.get(), &e) != ARCHIVE_OK) {
    return ArchiveError(a.get(), reader, what + ": cannot decompress");
  }
  Sha256 hash;
  const void* data = nullptr;
  size_t size = 0;
  la_int64_t offset = 0;
  for (;;) {
    int rc = archive_read_data_block(a.get(), &data, &size, &offset);
    if (rc == ARCHIVE_EOF) break;
    if (rc != ARCHIVE_OK) return ArchiveError(a.get(), reader, what + ": cannot decompress");
    hash.Update(data, size);
  }
  return hash.Digest();
}

}  // namespace

Status ApplyLayer(Unpacker& unpacker, const LayerPlan& layer, size_t index, size_t count,
                  Progress& progress) {
  progress.Start("layer", index + 1, count);
  const std::string what = "layer " + std::to_string(index + 1) + " " + layer.label;
  RangeReader reader(layer.blob.fd, layer.blob.offset, layer.blob.size, layer.blob.name, &progress);
  NSBOX_ASSIGN_OR_RETURN(std::unique_ptr<TarStream> tar, TarStream::Open(&reader, what));
  NSBOX_TRY_CTX(unpacker.ApplyLayer(*tar, reader), what);
  const bool compressed = tar->compressed();
  NSBOX_TRY_CTX(reader.Drain(), what);
  const std::string got = reader.Digest();
  if (!layer.digest.empty() && got != layer.digest) {
    return BadInput(what + ": digest mismatch, got " + got);
  }
  if (!layer.diff_id.empty() && (!compressed || layer.digest.empty())) {
    std::string uncompressed = got;
    if (compressed) {
      NSBOX_ASSIGN_OR_RETURN(uncompressed, UncompressedDigest(layer, what));
    }
    if (uncompressed != layer.diff_id) {
      return BadInput(what + ": the config's diff_id is " + layer.diff_id +
                      ", but the uncompressed layer's digest is " + uncompressed);
    }
  }
  return Ok();
}

}  // namespace nsbox::images::internal

#pragma once

// Internal to images/: applying an image's layers to its root file system, entry by entry
// relative to directory fds (import_layers.cc), and their whiteouts (import_whiteouts.cc).

#include <sys/types.h>
#include <time.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "images/import_budget.h"
#include "images/import_plan.h"
#include "images/import_reader.h"
#include "images/tar_stream.h"
#include "isolate/idmap.h"

struct archive;
struct archive_entry;

namespace nsbox::images::internal {

// ---- applying layers ----

// The first of a kind of thing that could not be kept, and how many there were: one warning each.
struct Tally {
  uint64_t count = 0;
  std::string first;
  void Add(std::string what) {
    if (count++ == 0) first = std::move(what);
  }
};

std::string Child(const std::string& dir, std::string_view name);

// The components of a tar entry's path inside the image. A leading "/" or "./" is dropped (root
// file system tarballs are made with `tar -C root .`, some with absolute names), as are empty and
// "." components. ".." is refused wherever it is, even where it would stay inside: no image
// tool writes it, and refusing is simpler to trust than resolving.
Result<std::vector<std::string>> SplitEntryPath(std::string_view path, std::string_view what);

std::string JoinParts(const std::vector<std::string>& parts, size_t n);

// Writes layers into the root file system. Every entry is created relative to a directory fd
// (never a path from the process's cwd: the daemon is multithreaded, which is also why
// libarchive's archive_write_disk is not used), its parent found with
// openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS), and the entry itself
// created with O_EXCL/O_NOFOLLOW semantics. So a symlink an earlier entry placed ("evil ->
// /etc") can never redirect a write: an entry below it is refused, and one at its place replaces
// the link instead of following it.
class Unpacker {
 public:
  Unpacker(int root_fd, const isolate::IdMapping& ids, ImportBudget& budget);

  // Applies one layer's entries, read from `a`, in order. Errors name the entry; the caller
  // adds which layer.
  Status ApplyLayer(TarStream& tar, const RangeReader& reader);

  // Sets the directories' mtimes. Last, because making an entry inside a directory changes its
  // mtime; a directory removed or replaced by a later layer is skipped.
  Status Finish();

  uint64_t files() const { return files_; }
  uint64_t size_bytes() const { return size_bytes_; }

  std::vector<std::string> Warnings() const;

 private:
  struct Owner {
    uid_t uid;
    gid_t gid;
  };

  // The host id of image id `id` in `range`: its place in the sandbox's range.
  static Result<uint32_t> Shift(int64_t id, const isolate::IdRange& range, std::string_view kind,
                                const std::string& what);

  Owner RootOwner() const { return Owner{ids_.uid.outside, ids_.gid.outside}; }

  // A path kept in written_ (`written`) or dir_mtimes_: its bytes and its node's count against
  // kMaxHeldBytes.
  Status Hold(uint64_t bytes, bool written);

  // The directory `parts[0..n)` of the image, as an O_PATH fd. Each component must be a real
  // directory: an entry may not be written through a symlink, not even one that resolves inside
  // (the rule is simpler to trust than any resolution). Missing directories are made (0755,
  // owned by the image's root) when `create`; otherwise an invalid fd says one is missing.
  // `what` names the entry in errors ("entry 'a/b'").
  Result<UniqueFd> OpenDir(const std::string& what, const std::vector<std::string>& parts, size_t n,
                           bool create);

  // ---- whiteouts (import_whiteouts.cc) ----

  bool WrittenBelow(const std::string& rel) const;

  // Removes what lower layers left at `rel` (called `name` in `parent_fd`), keeping what this
  // layer wrote there or below: a whiteout hides only the layers under its own.
  Status RemoveLower(int parent_fd, const std::string& rel, const std::string& name);

  // RemoveLower for every entry of the directory `dir_fd` (at `rel`): an opaque directory.
  Status RemoveLowerIn(int dir_fd, const std::string& rel);

  // `.wh.NAME` (NAME removed) and `.wh..wh..opq` (the directory made opaque) in `dir`.
  Status ApplyWhiteout(const std::string& raw, const std::vector<std::string>& parts);

  // ---- entries ----

  // The entry's xattrs as images/xattrs.h plans them: user.* kept, security.capability bound to
  // the sandboxes' root, the rest dropped with a note. Also the notes for the entry's ACLs and
  // file flags, which are never applied.
  Status ApplyXattrs(int fd, struct archive_entry* e, const std::string& path);

  // Owner, then mode (a chown clears the setuid bit and file capabilities), then xattrs.
  Status SetMetadata(int fd, struct archive_entry* e, const Owner& owner, const std::string& path);

  static struct timespec MtimeOf(struct archive_entry* e);

  // Something is at `name` that the new entry replaces (a later layer's file over an earlier
  // one's, or over a directory): it goes, whatever it is, without following it.
  Status Clear(int parent_fd, const std::string& name, const std::string& path);

  Status MakeDirectory(struct archive_entry* e, int parent, const std::string& name,
                       const std::string& rel, const Owner& owner);

  Status WriteRegular(struct archive* a, const RangeReader& reader, struct archive_entry* e,
                      int parent, const std::string& name, const std::string& rel,
                      const Owner& owner);

  Status MakeSymlink(struct archive_entry* e, int parent, const std::string& name,
                     const std::string& raw, const std::string& rel, const Owner& owner);

  Status MakeHardlink(const char* hardlink, int parent, const std::string& name,
                      const std::string& raw, const std::string& rel);

  Status MakeFifo(struct archive_entry* e, int parent, const std::string& name,
                  const std::string& rel, const Owner& owner);

  Status ApplyEntry(struct archive* a, const RangeReader& reader, struct archive_entry* e);

  int root_fd_;
  isolate::IdMapping ids_;
  ImportBudget& budget_;
  bool use_openat2_;               // g_use_openat2 as the import started (import_layers.cc)
  std::set<std::string> written_;  // paths this layer made: whiteouts never remove them
  std::map<std::string, struct timespec> dir_mtimes_;
  uint64_t files_ = 0;
  uint64_t size_bytes_ = 0;
  Tally devices_;
  Tally sockets_;
  Tally unknown_;
  Tally dropped_xattrs_;
  Tally refused_xattrs_;
  Tally acls_;
  Tally fflags_;
  // What written_ and dir_mtimes_ hold (kMaxHeldBytes), and of it written_'s.
  uint64_t held_bytes_ = 0;
  uint64_t written_bytes_ = 0;
};

// One layer: streamed once through libarchive into the root file system, its digest computed
// on the way and checked at its end (a mismatch fails the import, and the caller removes all
// that was unpacked).
Status ApplyLayer(Unpacker& unpacker, const LayerPlan& layer, size_t index, size_t count,
                  Progress& progress);

}  // namespace nsbox::images::internal

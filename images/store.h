#pragma once

// Imported images: OCI layouts, `docker save` tarballs and plain root file system tarballs,
// unpacked once into the state dir and shared read-only by every sandbox of that image (the
// lower layer of its overlay root). design.md "State on disk":
//
//   <state>/images/<name>.json            the name's current image: id, config, sizes (atomic)
//   <state>/images/content/<id>/rootfs/   the unpacked root file system, owners shifted into
//                                         the sandboxes' uid range; never changed once published
//   <state>/images/content/<id>/image.json the same metadata, written before the name points here
//   <state>/images/.import-<random>/      an import in progress (removed at the next start)
//
// A name points at one content id. Replacing a name makes a new id; sandboxes made from the old
// one keep it (their upper layers were built on it) until the last of them is deleted, then it
// is collected. Thread-safe; every method may block (the daemon calls them on its worker pool).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "isolate/idmap.h"

namespace nsbox::images {

// Why `name` cannot name an image, or nullopt. Names are 1 to 64 characters of [a-z0-9._-],
// starting with a letter or a digit ("debian-12", "busybox.1"); "host" is the built-in image.
// No ':' or '/': a name is a file name and appears in overlay mount options.
std::optional<std::string> InvalidImageNameReason(std::string_view name);

// What is kept of the image's OCI/Docker config. Env and WorkingDir become the defaults of a
// sandbox made from the image; User, Entrypoint and Cmd are kept for the record and ignored.
struct ImageConfig {
  std::vector<std::string> env;  // "K=V", in the image's order
  std::string working_dir;       // "" when the image sets none
  std::string user;
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd;
  std::string architecture;  // "amd64"; "" for a plain root file system tarball
  std::string os;
};

struct ImageInfo {
  std::string name;
  std::string id;           // 32 hex digits: content/<id>/
  std::string format;       // "oci", "docker" or "rootfs"
  std::string digest;       // the manifest's "sha256:..." ("" for a rootfs tarball)
  uint64_t layers = 0;      // layers applied (1 for a rootfs tarball)
  uint64_t size_bytes = 0;  // bytes of regular files unpacked
  uint64_t files = 0;       // entries unpacked
  std::string imported_at;  // RFC 3339 UTC with milliseconds
  uint32_t uid_base = 0;    // host uid of root inside: owners were shifted by it
  uint32_t gid_base = 0;
  std::string shell;  // "/bin/bash" when the image has bash, else "/bin/sh"
  ImageConfig config;
  // What could not be kept, said once each: "skipped 3 device nodes (/dev/null, ...)",
  // "dropped 2 trusted.* xattrs". Shown by the CLI after an import.
  std::vector<std::string> warnings;
};

// Progress of an import, reported often enough for a progress line (at least every 4 MiB read
// and at every layer boundary).
struct ImportProgress {
  std::string phase;         // "reading", "layer", "publishing"
  uint64_t layer = 0;        // 1-based, while phase == "layer"
  uint64_t layers = 0;       // 0 until known
  uint64_t bytes_read = 0;   // of the source file, compressed
  uint64_t bytes_total = 0;  // the source's size (0 for a directory)
};
using ProgressFn = std::function<void(const ImportProgress&)>;

class ImportBudget;  // images/import_budget.h

class ImageStore {
 public:
  // Makes `images_dir` (0711) and content/, removes .import-* left by a dead daemon (into the
  // trash: see PurgeTrash), and loads every <name>.json. `ids` is the range sandboxes run with:
  // owners are shifted into it.
  static Result<std::unique_ptr<ImageStore>> Open(std::string images_dir, isolate::IdMapping ids);

  // Imports `source` as `name`: a file (a tar, optionally gzip/zstd/xz/bzip2-compressed, holding
  // an OCI layout, a `docker save` image or a root file system) or a directory holding an OCI
  // layout. Detects which, verifies every blob's digest, applies the layers in order (whiteouts,
  // opaque directories, hardlinks, symlinks, modes, owners + ids base, xattrs where the file
  // system allows, device nodes skipped and said so) into .import-<random>/, refusing any entry
  // whose path or link would leave the image root, then publishes it atomically. Nothing is
  // visible under `name` unless the whole import succeeded.
  // Errors: EEXIST when `name` exists and !replace; EINVAL (Error::code) for bad input, with a
  // message naming the problem ("layer sha256:ab12... : digest mismatch, got sha256:..."),
  // ENOSPC etc. from the file system.
  // `budget` bounds what it writes and ends it early (import_budget.h: EFBIG, ENOSPC, ECANCELED,
  // and budget->stop() says why); without one, only CancelImports ends it.
  Result<ImageInfo> Import(std::string_view name, const std::string& source, bool replace,
                           const ProgressFn& progress, ImportBudget* budget = nullptr);

  std::optional<ImageInfo> Find(std::string_view name) const;
  std::vector<ImageInfo> List() const;  // sorted by name

  // Removes `name`. ENOENT when there is none. Its content stays while `ids_in_use` holds its id.
  Status Remove(std::string_view name, const std::set<std::string>& ids_in_use);
  // Deletes every content/<id> that neither a name nor `ids_in_use` refers to.
  Status CollectGarbage(const std::set<std::string>& ids_in_use);
  // Remove, CollectGarbage and Open only take content and leftovers out of sight (a rename to
  // content/.trash-*, so they are quick enough to call under a lock or at start); this deletes
  // them, which takes seconds for a distribution's thousands of files: for a thread of its own.
  Status PurgeTrash();

  // content/<id>/rootfs, for an overlay's lower layer; ENOENT when it is gone.
  Result<std::string> RootfsOf(std::string_view id) const;
  // The metadata of content/<id> (also after its name was removed or replaced).
  Result<ImageInfo> InfoOf(std::string_view id) const;

  const std::string& dir() const { return dir_; }

  // Imports under way, and any started later, end with ECANCELED before they publish anything
  // (the daemon is stopping: an import of gigabytes would hold up its exit for minutes).
  void CancelImports() { cancel_.store(true); }

 private:
  ImageStore() = default;
  std::atomic<bool> cancel_{false};
  std::string dir_;
  isolate::IdMapping ids_;
  mutable std::mutex mu_;
  std::vector<ImageInfo> images_;  // by name
};

// The image metadata as JSON (image.json / <name>.json), both ways; Decode checks every field.
std::string EncodeImageInfo(const ImageInfo& info);
Result<ImageInfo> DecodeImageInfo(std::string_view json);

// Writes an uncompressed pax tar of the contents of `dir` to `out_fd` (a file, a pipe or a
// socket): relative names, symlinks stored as symlinks and never followed, hardlinks as
// hardlinks, owners, modes, mtimes and xattrs as they are; sockets left out. For the CLI, which
// sends a local OCI layout directory to the daemon as one stream. Progress: phase "reading",
// bytes_read the file data written so far (bytes_total 0), at least every 4 MiB.
Status WriteTarOfDirectory(const std::string& dir, int out_fd, const ProgressFn& progress);

}  // namespace nsbox::images

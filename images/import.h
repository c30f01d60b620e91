#pragma once

// Internal to images/: the import pipeline behind ImageStore::Import (import.cc) and the
// fd-relative file helpers store.cc shares with it. Nothing outside images/ includes this.
//
// The pipeline, one step per line (import.cc's UnpackImage runs them; the file that does each
// is named after it, and import_reader.h has what they all read with):
//   1. look at the source: a directory holding an OCI layout, or a tar file (scanned once with
//      libarchive: its member names, sizes and data offsets) holding an OCI layout, a
//      `docker save` image, or else a root file system (import_source.cc);
//   2. read the manifest chain (OCI: index.json -> [nested index ->] manifest -> config; docker:
//      manifest.json -> config), verifying the sha256 of every blob read (import_plan.cc);
//   3. apply the layers in order into rootfs/, each streamed once through libarchive while its
//      digest is computed, every entry written relative to the rootfs's directory fd
//      (import_layers.cc; their whiteouts, import_whiteouts.cc);
//   4. set the directories' mtimes last (creating entries inside a directory changes its mtime).

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "images/import_budget.h"
#include "images/store.h"
#include "isolate/idmap.h"

namespace nsbox::images::internal {

// What UnpackImage found and did; the store adds the name, id, time, ids and shell.
struct UnpackedImage {
  std::string format;  // "oci", "docker", "rootfs"
  std::string digest;  // the manifest's digest (OCI), the config's (docker), "" (rootfs)
  uint64_t layers = 0;
  uint64_t size_bytes = 0;
  uint64_t files = 0;
  ImageConfig config;
  std::vector<std::string> warnings;
};

// Reads `source`, verifies it and unpacks its root file system into `rootfs_fd` (an open
// directory, empty, owned by the image's root), owners shifted into `ids`. `work_fd` is the
// .import- directory: a compressed outer tar is decompressed into an unlinked scratch file there.
// Bad input is EINVAL with a message naming the problem; what is half-written into rootfs_fd on
// an error is for the caller to remove (it removes the whole .import- directory).
//
// Progress: "reading" while the source is scanned (bytes_read climbs to bytes_total, the
// source's size; 0 for a directory; from 0 once more while a compressed OCI or docker tarball is
// decompressed), then "layer" at the start of each layer and every 4 MiB of
// layer blobs read (bytes_read counts the layer bytes read so far, from 0 again, and bytes_total
// is then the layers' total size).
//
// `budget` bounds what it writes and the layers it applies, and ends it (ECANCELED) at its next
// read or write once it is to stop (import_budget.h); it says what was exceeded.
Result<UnpackedImage> UnpackImage(const std::string& source, int work_fd, int rootfs_fd,
                                  const isolate::IdMapping& ids, const ProgressFn& progress,
                                  ImportBudget& budget);

// Removes `name` in the directory `dir_fd` and, when it is a directory, everything below it,
// never following a symlink (each level is opened with O_NOFOLLOW relative to its parent's fd).
// A missing `name` is success. `display` names the tree in errors.
Status RemoveTreeAt(int dir_fd, const std::string& name, const std::string& display);

// Tests only: false makes the unpacking resolve every parent directory with the O_NOFOLLOW walk
// it uses where the kernel has no openat2 (before 5.6), true (the default) puts openat2 back.
// Read when an import starts.
void SetUseOpenat2ForTesting(bool enabled);

// "sha256:" and 64 lower-case hex digits: the only digests nsbox verifies (every OCI and Docker
// tool writes sha256).
bool IsSha256Digest(std::string_view digest);

// Lower-case hex of `bytes`.
std::string HexOf(const unsigned char* bytes, size_t size);

}  // namespace nsbox::images::internal

#pragma once

// What one image import may cost, checked while it runs (docs/images.md "Limits"): the bytes it
// writes, the layers it applies, the free space it leaves on the state's file system, and
// whether it is to stop (its client went away, or the daemon is stopping).
//
// An image is hostile input: a 4 MB gzip tarball may declare a 4 GiB member, a 580 KB manifest
// may list one layer 3,000 times. The budget is handed to every step that writes (the spooled
// upload, the decompressed copy of a compressed tarball, the unpacked files) and each asks it
// before it writes; the first step over a limit fails with an error that says which, and the
// budget remembers what was exceeded, so that the daemon answers 413 or 507 (not a 500).
//
// One import at a time: each budget is used by one thread at a time (the import's, or the worker
// that writes the upload's next piece), handed over with a happens-before (a queued job). Only
// ClientGone may be called from another thread at any moment.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/error.h"
#include "base/unique_fd.h"

namespace nsbox::images {

// The defaults of `nsbox serve` (docs/daemon.md, docs/images.md "Limits").
// 8 GiB: the largest images in common use (CUDA and PyTorch development images) unpack to 6-8
// GiB; a distribution's root is 80-200 MiB.
inline constexpr uint64_t kDefaultImportMaxBytes = uint64_t{8} << 30;
// 128: Docker refuses to pull, load or build an image of more than 125 layers (moby's
// layer/layer_store.go maxLayerDepth, "max depth exceeded": aufs's 127 branches less the two a
// container adds), so no image made by or for Docker has more. Each layer costs a pass over its
// own archive, and a manifest may list one small layer thousands of times.
inline constexpr uint64_t kDefaultImportMaxLayers = 128;
// Free space kept on the state directory's file system: 5% of its size, on top of what the file
// system itself reserves for root (ext4: 5%), which nsboxd, running as root, could otherwise use.
inline constexpr uint32_t kDefaultImportKeepFreePercent = 5;

struct ImportLimits {
  // The most one import may write at each of its steps: the upload as spooled, the decompressed
  // copy of a compressed OCI or docker tarball, and the unpacked image (file data, plus
  // kBytesPerEntry for each entry: its inode and name).
  uint64_t max_bytes = kDefaultImportMaxBytes;
  // How messages name where max_bytes comes from ("nsbox serve --image-max-bytes").
  std::string max_bytes_source = "nsbox serve --image-max-bytes";
  uint64_t max_layers = kDefaultImportMaxLayers;
  // The free space an import leaves on the file system it writes to: keep_free_bytes when it is
  // not 0, else keep_free_percent of the file system's size; and keep_free_percent of its inodes.
  uint64_t keep_free_bytes = 0;
  uint32_t keep_free_percent = kDefaultImportKeepFreePercent;

  // No bound at all (the store's own tests, and a store used without a daemon).
  static ImportLimits Unlimited();
};

// What ended an import early.
enum class ImportStop {
  kNone,
  kTooLarge,        // max_bytes or max_layers: 413
  kKeepFree,        // the free space to keep: 507
  kClientGone,      // its client hung up: nobody to answer
  kDaemonStopping,  // SIGTERM: 500, "cancelled: the daemon is stopping"
};

class ImportBudget {
 public:
  // What each entry of a layer is counted as, besides its data: its inode and its directory
  // entry take about this much, and an archive of empty files must not be free.
  static constexpr uint64_t kBytesPerEntry = 512;
  // How often the free space is looked at: every this many bytes counted, or entries made.
  static constexpr uint64_t kCheckEveryBytes = uint64_t{8} << 20;
  static constexpr uint64_t kCheckEveryEntries = 1024;

  // `dir`: a directory on the file system the import writes to (the images directory), opened
  // at the first look at its free space.
  ImportBudget(ImportLimits limits, std::string dir);
  ImportBudget(const ImportBudget&) = delete;
  ImportBudget& operator=(const ImportBudget&) = delete;

  // The steps of an import that write, each bounded by max_bytes on its own.
  enum class Step { kUpload, kScratch, kUnpacked };

  // Before writing `bytes` more at `step`: an error when that goes past max_bytes (EFBIG), when
  // the file system would keep less free space than it must (ENOSPC), or when the import is to
  // stop (ECANCELED). `what` names what is written, for the message.
  Status Charge(Step step, uint64_t bytes, std::string_view what);
  // Before a file of `bytes` is written at `step` (its size as its archive declares it): an
  // error at once when it cannot fit, rather than after max_bytes were written. Counts nothing.
  Status Expect(Step step, uint64_t bytes, std::string_view what);
  // The data the members of a tarball declare, `total` bytes so far (read from its headers
  // before anything is unpacked): more than max_bytes cannot be unpacked nor decompressed.
  Status Declared(uint64_t total, std::string_view what);
  // One more entry of a layer made: kBytesPerEntry of kUnpacked, and every kCheckEveryEntries
  // the free space (inodes too).
  Status Entry();
  // The image has `layers` layers.
  Status Layers(uint64_t layers);
  // The free space now: an error when the file system has less than it must keep.
  Status CheckFreeSpace();
  // ECANCELED when the import is to stop.
  Status CheckCancel();

  // The import's client went away: it stops at its next read or write. Any thread.
  void ClientGone() { client_gone_.store(true); }
  // The daemon is stopping once `*stopping` is true (ImageStore::CancelImports).
  void WatchStopping(const std::atomic<bool>* stopping) { stopping_ = stopping; }
  // Called before each read and write of the import (in CheckCancel): where it may wait for
  // the daemon's other requests (runtime/image_imports.h, ImportLane).
  void SetPace(std::function<void()> pace) { pace_ = std::move(pace); }

  // What ended the import early, once one of the calls above failed for it.
  ImportStop stop() const { return stop_; }
  // Its message, as the first refusal said it.
  const std::string& stop_message() const { return stop_message_; }
  const ImportLimits& limits() const { return limits_; }
  uint64_t used(Step step) const { return used_[static_cast<int>(step)]; }

 private:
  Error Refuse(ImportStop why, int code, std::string message);
  Status MaybeCheckFreeSpace();

  const ImportLimits limits_;
  const std::string dir_;
  UniqueFd dir_fd_;
  std::atomic<bool> client_gone_{false};
  const std::atomic<bool>* stopping_ = nullptr;
  std::function<void()> pace_;
  ImportStop stop_ = ImportStop::kNone;
  std::string stop_message_;
  uint64_t used_[3] = {0, 0, 0};
  uint64_t since_check_bytes_ = 0;
  uint64_t since_check_entries_ = 0;
};

// "64.0 MiB", "1.5 GiB", "512 bytes": a size for messages.
std::string DescribeBytes(uint64_t bytes);

}  // namespace nsbox::images

#include "images/import_budget.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/statvfs.h>

#include <cinttypes>
#include <cstdio>
#include <limits>
#include <utility>

namespace nsbox::images {

namespace {

const char* StepName(ImportBudget::Step step) {
  switch (step) {
    case ImportBudget::Step::kUpload:
      return "the upload";
    case ImportBudget::Step::kScratch:
      return "the decompressed copy of the tarball";
    case ImportBudget::Step::kUnpacked:
      return "the unpacked image";
  }
  return "the import";
}

}  // namespace

std::string DescribeBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, kUnits[unit]);
  return text;
}

ImportLimits ImportLimits::Unlimited() {
  ImportLimits l;
  l.max_bytes = std::numeric_limits<uint64_t>::max();
  l.max_layers = std::numeric_limits<uint64_t>::max();
  l.keep_free_bytes = 0;
  l.keep_free_percent = 0;
  return l;
}

ImportBudget::ImportBudget(ImportLimits limits, std::string dir)
    : limits_(std::move(limits)), dir_(std::move(dir)) {}

Error ImportBudget::Refuse(ImportStop why, int code, std::string message) {
  if (stop_ == ImportStop::kNone) {
    stop_ = why;
    stop_message_ = message;
  }
  return Error(code, std::move(message));
}

Status ImportBudget::CheckCancel() {
  if (pace_) pace_();
  if (stopping_ != nullptr && stopping_->load()) {
    return Refuse(ImportStop::kDaemonStopping, ECANCELED,
                  "the import was cancelled: the daemon is stopping");
  }
  if (client_gone_.load()) {
    return Refuse(ImportStop::kClientGone, ECANCELED,
                  "the import was cancelled: its client went away");
  }
  return Ok();
}

Status ImportBudget::Expect(Step step, uint64_t bytes, std::string_view what) {
  NSBOX_TRY(CheckCancel());
  const uint64_t used = used_[static_cast<int>(step)];
  if (bytes > limits_.max_bytes || used > limits_.max_bytes - bytes) {
    return Refuse(ImportStop::kTooLarge, EFBIG,
                  std::string(what) + ": " + StepName(step) + " would be more than the " +
                      DescribeBytes(limits_.max_bytes) + " an import may write (" +
                      limits_.max_bytes_source + "); " + DescribeBytes(used) +
                      " were written, and this is " + DescribeBytes(bytes) + " more");
  }
  return Ok();
}

Status ImportBudget::Charge(Step step, uint64_t bytes, std::string_view what) {
  NSBOX_TRY(Expect(step, bytes, what));
  used_[static_cast<int>(step)] += bytes;
  since_check_bytes_ += bytes;
  return MaybeCheckFreeSpace();
}

Status ImportBudget::Declared(uint64_t total, std::string_view what) {
  if (total > limits_.max_bytes) {
    return Refuse(ImportStop::kTooLarge, EFBIG,
                  std::string(what) + ": the tarball's members hold " + DescribeBytes(total) +
                      " or more, more than the " + DescribeBytes(limits_.max_bytes) +
                      " an import may write (" + limits_.max_bytes_source + ")");
  }
  return Ok();
}

Status ImportBudget::Entry() {
  NSBOX_TRY(Charge(Step::kUnpacked, kBytesPerEntry, "an entry"));
  if (++since_check_entries_ >= kCheckEveryEntries) NSBOX_TRY(CheckFreeSpace());
  return Ok();
}

Status ImportBudget::Layers(uint64_t layers) {
  if (layers > limits_.max_layers) {
    return Refuse(ImportStop::kTooLarge, EFBIG,
                  "the image has " + std::to_string(layers) + " layers, more than the " +
                      std::to_string(limits_.max_layers) +
                      " nsboxd imports (nsbox serve --image-max-layers)");
  }
  return Ok();
}

Status ImportBudget::MaybeCheckFreeSpace() {
  if (since_check_bytes_ < kCheckEveryBytes) return Ok();
  return CheckFreeSpace();
}

Status ImportBudget::CheckFreeSpace() {
  since_check_bytes_ = 0;
  since_check_entries_ = 0;
  if (limits_.keep_free_bytes == 0 && limits_.keep_free_percent == 0) return Ok();
  if (!dir_fd_.valid()) {
    dir_fd_.reset(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir_fd_.valid()) return Error::Sys("open", dir_, errno);
  }
  struct statvfs fs {};
  if (::fstatvfs(dir_fd_.get(), &fs) != 0) return Error::Sys("fstatvfs", dir_, errno);
  // f_bavail and f_favail: what a process without CAP_SYS_RESOURCE may still use. nsboxd is root
  // and could eat into the file system's own reserve for root too; the reserve kept here is on
  // top of that one.
  const unsigned __int128 unit = fs.f_frsize;
  const unsigned __int128 size = unit * fs.f_blocks;
  const unsigned __int128 avail = unit * fs.f_bavail;
  const unsigned __int128 keep = limits_.keep_free_bytes != 0
                                     ? limits_.keep_free_bytes
                                     : size * limits_.keep_free_percent / 100;
  const std::string how = limits_.keep_free_bytes != 0
                              ? DescribeBytes(limits_.keep_free_bytes)
                              : std::to_string(limits_.keep_free_percent) + "% (" +
                                    DescribeBytes(static_cast<uint64_t>(keep)) + ")";
  if (avail < keep) {
    return Refuse(ImportStop::kKeepFree, ENOSPC,
                  "the file system of " + dir_ + " has " +
                      DescribeBytes(static_cast<uint64_t>(avail)) + " free, less than the " + how +
                      " nsboxd keeps free for everything else on it (nsbox serve "
                      "--image-keep-free): the import stopped there");
  }
  // Inodes: a tarball of millions of empty files takes few bytes and every inode. A file system
  // that has no fixed count (btrfs says 0) is left to its bytes.
  if (fs.f_files > 0 && limits_.keep_free_percent > 0) {
    const unsigned __int128 keep_inodes =
        static_cast<unsigned __int128>(fs.f_files) * limits_.keep_free_percent / 100;
    if (fs.f_favail < keep_inodes) {
      return Refuse(ImportStop::kKeepFree, ENOSPC,
                    "the file system of " + dir_ + " has " + std::to_string(fs.f_favail) +
                        " free inodes, less than the " + std::to_string(limits_.keep_free_percent) +
                        "% (" + std::to_string(static_cast<uint64_t>(keep_inodes)) +
                        ") nsboxd keeps free for everything else on it (nsbox serve "
                        "--image-keep-free): the import stopped there");
    }
  }
  return Ok();
}

}  // namespace nsbox::images

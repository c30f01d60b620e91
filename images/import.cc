#include "images/import.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "base/files.h"
#include "base/unique_fd.h"
#include "images/import_layers.h"
#include "images/import_plan.h"
#include "images/import_reader.h"
#include "images/import_source.h"

namespace nsbox::images::internal {

bool IsSha256Digest(std::string_view d) {
  return d.size() == 71 && d.substr(0, 7) == "sha256:" && IsHex(d.substr(7));
}

std::string HexOf(const unsigned char* bytes, size_t size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 15];
  }
  return out;
}

Result<UnpackedImage> UnpackImage(const std::string& source, int work_fd, int rootfs_fd,
                                  const isolate::IdMapping& ids, const ProgressFn& progress_fn,
                                  ImportBudget& budget) {
  NSBOX_ASSIGN_OR_RETURN(UniqueFd fd, OpenAt(AT_FDCWD, source, O_RDONLY | O_NOCTTY));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Error::Sys("fstat", source, errno);
  Progress progress(progress_fn, budget);

  // 1. What the source is.
  std::unique_ptr<Source> src;
  UniqueFd scratch;
  ImagePlan plan;
  if (S_ISDIR(st.st_mode)) {
    progress.Start("reading", 0, 0);
    if (::faccessat(fd.get(), "oci-layout", F_OK, AT_SYMLINK_NOFOLLOW) != 0 ||
        ::faccessat(fd.get(), "index.json", F_OK, AT_SYMLINK_NOFOLLOW) != 0) {
      return BadInput(source +
                      " is a directory but not an OCI image layout (it needs oci-layout and "
                      "index.json)");
    }
    src = std::make_unique<DirSource>(std::move(fd), source);
    NSBOX_ASSIGN_OR_RETURN(plan, PlanOci(*src));
  } else if (S_ISREG(st.st_mode)) {
    const auto size = static_cast<uint64_t>(st.st_size);
    progress.SetTotal(size);
    progress.Start("reading", 0, 0);
    NSBOX_ASSIGN_OR_RETURN(ScannedTar scan, ScanTar(fd.get(), size, source, progress));
    const bool oci = scan.has_oci_layout || (scan.has_index_json && !scan.has_manifest_json);
    const bool docker = !oci && scan.has_manifest_json;
    if ((oci || docker) && scan.index_full) {
      return BadInput(source + ": an " + (oci ? "OCI" : "docker save") +
                      " tarball whose member names take more than " +
                      std::to_string(kMaxIndexBytes / kMiB) +
                      " MiB (a real one has a few members per layer)");
    }
    if (!oci && !docker) {
      // A root file system tarball: the whole file is its one layer, nothing names a digest.
      plan.format = "rootfs";
      plan.layers.push_back(
          LayerPlan{"(root file system tarball)", BlobRef{fd.get(), 0, size, source}, "", ""});
    } else {
      int tar_fd = fd.get();
      uint64_t tar_size = size;
      if (scan.compressed) {
        NSBOX_ASSIGN_OR_RETURN(scratch,
                               DecompressToScratch(fd.get(), size, work_fd, source, progress));
        struct stat sst {};
        if (::fstat(scratch.get(), &sst) != 0) {
          return Error::Sys("fstat", "the decompressed copy of " + source, errno);
        }
        tar_fd = scratch.get();
        tar_size = static_cast<uint64_t>(sst.st_size);
      }
      src = std::make_unique<TarSource>(tar_fd, tar_size, std::move(scan.members), source);
      if (oci) {
        NSBOX_ASSIGN_OR_RETURN(plan, PlanOci(*src));
      } else {
        NSBOX_ASSIGN_OR_RETURN(plan, PlanDocker(*src));
      }
    }
  } else {
    return BadInput(source + " is neither a regular file nor a directory");
  }

  // 2. The layers, in order. Their progress counts against their own bytes: a compressed outer
  // tar's layers are read from its decompressed copy, larger than the source.
  NSBOX_TRY(budget.Layers(plan.layers.size()));
  uint64_t layer_bytes = 0;
  for (const LayerPlan& layer : plan.layers) layer_bytes += layer.blob.size;
  progress.SetTotal(layer_bytes);
  Unpacker unpacker(rootfs_fd, ids, budget);
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    NSBOX_TRY(ApplyLayer(unpacker, plan.layers[i], i, plan.layers.size(), progress));
  }
  // 3. Directory mtimes, after everything inside them was made.
  NSBOX_TRY(unpacker.Finish());

  UnpackedImage out;
  out.format = plan.format;
  out.digest = plan.digest;
  out.layers = plan.layers.size();
  out.size_bytes = unpacker.size_bytes();
  out.files = unpacker.files();
  out.config = std::move(plan.config);
  out.warnings = std::move(plan.warnings);
  for (std::string& w : unpacker.Warnings()) out.warnings.push_back(std::move(w));
  return out;
}

Status RemoveTreeAt(int dir_fd, const std::string& name, const std::string& display) {
  return ::nsbox::RemoveTreeAt(dir_fd, name, display);
}

}  // namespace nsbox::images::internal

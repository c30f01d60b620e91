// The registry's images: the overlay a sandbox of an imported image runs on, imports and
// removals, and the content no name and no sandbox uses any more.

#include <errno.h>

#include <mutex>

#include "base/files.h"
#include "base/log.h"
#include "images/image.h"
#include "runtime/image_imports.h"
#include "runtime/registry.h"

namespace nsbox::runtime {

Result<isolate::RootSpec::Overlay> Registry::OverlayOf(const SandboxEntry& entry) const {
  const SandboxConfig& c = entry.config_;
  auto info = images_->InfoOf(c.image_id);
  if (!info.ok()) {
    return std::move(info).error().Context("the content of image '" + c.image + "' (" + c.image_id +
                                           ") that this sandbox was made from");
  }
  // Owners were shifted at import; a sandbox must run with the same ids to own its files.
  if (info->uid_base != ids_.uid.outside || info->gid_base != ids_.gid.outside) {
    return Error(EINVAL, "image '" + c.image + "' was imported for host uid " +
                             std::to_string(info->uid_base) + " but sandboxes now run as " +
                             std::to_string(ids_.uid.outside) +
                             " (/etc/subuid changed): import it again under a new name");
  }
  isolate::RootSpec::Overlay overlay;
  NSBOX_ASSIGN_OR_RETURN(overlay.lower, images_->RootfsOf(c.image_id));
  if (entry.disk_ != nullptr) {
    overlay.upper = entry.disk_->PathOf("upper");
    overlay.work = entry.disk_->PathOf("work");
  } else {
    overlay.upper = entry.dir_ + "/upper";
    overlay.work = entry.dir_ + "/work";
  }
  return overlay;
}

std::set<std::string> Registry::ImageIdsInUseLocked() const {
  std::set<std::string> ids;
  for (const auto& [id, e] : by_id_) {
    if (!e->config_.image_id.empty()) ids.insert(e->config_.image_id);
  }
  for (const auto& [id, config] : creating_) {
    if (!config.image_id.empty()) ids.insert(config.image_id);
  }
  return ids;
}

void Registry::CollectImagesLocked() {
  if (auto st = images_->CollectGarbage(ImageIdsInUseLocked()); !st.ok()) {
    log::error("collect unused images: {}", st.error().message());
  }
  WakeJanitor();
}

namespace {

ApiError ImageError(const Error& e) {
  switch (e.code()) {
    case EEXIST:
      return ApiError::Of(409, "image_exists", e.message());
    case ENOENT:
      return ApiError::Of(404, "image_not_found", e.message());
    case EINVAL:
    // What an archive's names and links make the unpacking meet: a name or path too long, a
    // path through a file, too many links to one file, a file larger than the file system takes.
    case ENAMETOOLONG:
    case ELOOP:
    case ENOTDIR:
    case EISDIR:
    case EMLINK:
    case EFBIG:
      return ApiError::Of(400, "invalid_image", e.message());
    case ENOSPC:
    case EDQUOT:
      return ApiError::Of(507, ErrnoName(e.code()), e.message());
    default:
      return ApiError::Internal(e.message());
  }
}

}  // namespace

ApiOutcome<images::ImageInfo> Registry::ImportImage(const std::string& name,
                                                    const std::string& source, bool replace,
                                                    const images::ProgressFn& progress,
                                                    images::ImportBudget* budget) {
  auto imported = images_->Import(name, source, replace, progress, budget);
  if (!imported.ok()) {
    log::warn("image={} import failed: {}", name, imported.error().message());
    // A limit of the import's: 413 or 507, saying which (runtime/image_imports.h).
    if (budget != nullptr) {
      if (auto refused = BudgetError(*budget, imported.error())) return *refused;
    }
    return ImageError(imported.error());
  }
  log::info("image={} imported as {} ({} layers, {} files, {} bytes)", name, imported->id,
            imported->layers, imported->files, imported->size_bytes);
  if (replace) {
    std::lock_guard<std::mutex> lock(mu_);
    CollectImagesLocked();
  }
  return std::move(imported).value();
}

std::vector<std::string> Registry::SandboxesOfImage(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [id, e] : by_id_) {
    if (e->config_.image == name) out.push_back(id);
  }
  return out;
}

ApiOutcome<bool> Registry::RemoveImage(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> users;
  for (const auto& [id, e] : by_id_) {
    if (e->config_.image == name) users.push_back(id);
  }
  for (const auto& [id, config] : creating_) {
    if (config.image == name) users.push_back(id);
  }
  if (!users.empty()) {
    std::string list;
    for (size_t i = 0; i < users.size() && i < 10; ++i) list += (i ? ", " : "") + users[i];
    if (users.size() > 10) list += " and " + std::to_string(users.size() - 10) + " more";
    return ApiError::Of(409, "image_in_use",
                        "image '" + name + "' is used by " + std::to_string(users.size()) +
                            " sandbox" + (users.size() == 1 ? "" : "es") + " (" + list +
                            "): delete them first");
  }
  if (auto st = images_->Remove(name, ImageIdsInUseLocked()); !st.ok()) {
    return ImageError(st.error());
  }
  WakeJanitor();
  log::info("image={} removed", name);
  return true;
}

std::string Registry::NewUploadPath() const {
  return images_->dir() + "/.import-upload-" + RandomHex(16);
}

}  // namespace nsbox::runtime

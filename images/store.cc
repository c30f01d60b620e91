#include "images/store.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <map>
#include <utility>

#include "base/cleanup.h"
#include "base/files.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/syscalls.h"
#include "base/utf8.h"
#include "images/image.h"
#include "images/import.h"
#include "images/import_budget.h"

// libarchive 3.6's tar writers (pax, ustar, gnutar) report an unsupported file type through
// __archive_write_entry_filetype_unsupported, which lives in archive_write_set_format.o, the
// file of the by-code table of every write format. In a static link that object drags in all of
// them, the xar writer and its libxml2 with it (not linked: the link of nsbox fails). Defining
// the helper here, in the object that uses the pax writer, keeps the table out. The shared
// library does not export the symbol, so a dynamic build is unaffected; should anything link
// the table after all, the duplicate definition fails the link loudly. The text is libarchive's
// own. WriteTarOfDirectory never hands the writer a socket, the one type pax refuses.
extern "C" void __archive_write_entry_filetype_unsupported(struct archive* a,
                                                           struct archive_entry* entry,
                                                           const char* format);
extern "C" void __archive_write_entry_filetype_unsupported(struct archive* a,
                                                           struct archive_entry* entry,
                                                           const char* format) {
  const char* path = archive_entry_pathname(entry);
  // EILSEQ: libarchive's ARCHIVE_ERRNO_FILE_FORMAT on Linux.
  archive_set_error(a, EILSEQ, "%s: %s format cannot archive files with mode 0%lo",
                    path != nullptr ? path : "?", format,
                    static_cast<unsigned long>(archive_entry_mode(entry)));
}

namespace nsbox::images {

namespace json = boost::json;

namespace {

constexpr uint64_t kProgressStep = uint64_t{4} << 20;
constexpr std::string_view kImportPrefix = ".import-";
constexpr std::string_view kTrashPrefix = ".trash-";
constexpr size_t kIdDigits = 32;

bool IsRfc3339Millis(std::string_view t) {
  // YYYY-MM-DDTHH:MM:SS.mmmZ
  static constexpr std::string_view kShape = "dddd-dd-ddTdd:dd:dd.dddZ";
  if (t.size() != kShape.size()) return false;
  for (size_t i = 0; i < t.size(); ++i) {
    if (kShape[i] == 'd' ? (t[i] < '0' || t[i] > '9') : t[i] != kShape[i]) return false;
  }
  return true;
}

bool IsContentId(std::string_view id) {
  return id.size() == kIdDigits && std::all_of(id.begin(), id.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

Result<std::vector<std::string>> ListNames(int dir_fd, const std::string& display) {
  UniqueFd fd(::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Error::Sys("open", display, errno);
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::fdopendir(fd.get()), ::closedir);
  if (!dir) return Error::Sys("fdopendir", display, errno);
  fd.release();  // the DIR owns it now
  std::vector<std::string> out;
  for (;;) {
    errno = 0;
    struct dirent* d = ::readdir(dir.get());
    if (d == nullptr) {
      if (errno != 0) return Error::Sys("readdir", display, errno);
      break;
    }
    std::string_view n = d->d_name;
    if (n != "." && n != "..") out.emplace_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Takes content/<id> out of sight at once: a rename to .trash-<id>-<random>, which PurgeTrash
// (or, after a crash, Open) deletes.
Status MoveToTrash(int content_fd, const std::string& content_dir, const std::string& id) {
  const std::string trash = std::string(kTrashPrefix) + id + "-" + RandomHex(8);
  if (::renameat(content_fd, id.c_str(), content_fd, trash.c_str()) != 0) {
    if (errno == ENOENT) return Ok();  // already gone (a concurrent Remove or CollectGarbage)
    return Error::Sys("rename", content_dir + "/" + id, errno);
  }
  return FsyncPath(content_dir);
}

// ---- JSON of ImageInfo ----

json::array StringArray(const std::vector<std::string>& v) {
  json::array a;
  for (const std::string& s : v) a.emplace_back(s);
  return a;
}

Error BadInfo(std::string_view what) {
  return Error(EINVAL, "image metadata: " + std::string(what));
}

Result<std::string> RequiredString(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  if (v == nullptr || !v->is_string()) {
    return BadInfo("\"" + std::string(key) + "\" is missing or not a string");
  }
  return std::string(v->get_string());
}

Result<uint64_t> RequiredCount(const json::object& o, std::string_view key, uint64_t max) {
  const json::value* v = o.if_contains(key);
  uint64_t n = 0;
  if (v != nullptr && v->is_uint64()) {
    n = v->get_uint64();
  } else if (v != nullptr && v->is_int64() && v->get_int64() >= 0) {
    n = static_cast<uint64_t>(v->get_int64());
  } else {
    return BadInfo("\"" + std::string(key) + "\" is missing or not a non-negative integer");
  }
  if (n > max) return BadInfo("\"" + std::string(key) + "\" is out of range");
  return n;
}

Result<std::vector<std::string>> RequiredStrings(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  if (v == nullptr || !v->is_array()) {
    return BadInfo("\"" + std::string(key) + "\" is missing or not an array");
  }
  std::vector<std::string> out;
  for (const json::value& item : v->get_array()) {
    if (!item.is_string()) return BadInfo("\"" + std::string(key) + "\" holds a non-string");
    out.emplace_back(item.get_string());
  }
  return out;
}

// ---- the tar writer of WriteTarOfDirectory ----

struct ArchiveWriteFree {
  void operator()(struct archive* a) const { archive_write_free(a); }
};
struct EntryFree {
  void operator()(struct archive_entry* e) const { archive_entry_free(e); }
};

// Walks a directory tree with fds (every level opened O_NOFOLLOW relative to its parent, so a
// symlink is stored as one and never followed) and writes each entry with libarchive's writer.
// A manual walk rather than archive_read_disk: that one resolves paths from the process's cwd
// and drags more of libarchive into the static binaries.
class TarWriter {
 public:
  TarWriter(struct archive* a, const std::string& root, const ProgressFn& progress)
      : a_(a), root_(root), progress_(progress) {
    state_.phase = "reading";
  }

  Status WriteTree(int dir_fd, const std::string& prefix) {
    const std::string display = prefix.empty() ? root_ : root_ + "/" + prefix;
    NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> names, ListNames(dir_fd, display));
    for (const std::string& name : names) {
      const std::string rel = prefix.empty() ? name : prefix + "/" + name;
      NSBOX_TRY(WriteOne(dir_fd, name, rel));
    }
    return Ok();
  }

  Status Close() {
    if (archive_write_close(a_) != ARCHIVE_OK) return WriteError("close");
    Report();
    return Ok();
  }

 private:
  Error WriteError(const std::string& what) {
    const char* msg = archive_error_string(a_);
    int err = archive_errno(a_);
    return Error(err > 0 ? err : EIO, "write the tar of " + root_ + ": " + what + ": " +
                                          (msg != nullptr ? msg : "failed"));
  }

  void Report() {
    if (progress_) progress_(state_);
  }

  // user.* and the like, read through the entry's own fd.
  Status AddXattrs(int fd, struct archive_entry* e, const std::string& display) {
    ssize_t len = ::flistxattr(fd, nullptr, 0);
    if (len < 0) {
      if (errno == ENOTSUP || errno == EOPNOTSUPP) return Ok();
      return Error::Sys("flistxattr", display, errno);
    }
    std::string names(static_cast<size_t>(len), '\0');
    len = ::flistxattr(fd, names.data(), names.size());
    if (len < 0) return Error::Sys("flistxattr", display, errno);
    names.resize(static_cast<size_t>(len));
    for (size_t start = 0; start < names.size();) {
      size_t end = names.find('\0', start);
      if (end == std::string::npos) end = names.size();
      const std::string name = names.substr(start, end - start);
      start = end + 1;
      if (name.empty()) continue;
      ssize_t vlen = ::fgetxattr(fd, name.c_str(), nullptr, 0);
      if (vlen < 0) {
        if (errno == ENODATA) continue;  // removed in between
        return Error::Sys("fgetxattr", display + " " + name, errno);
      }
      std::string value(static_cast<size_t>(vlen), '\0');
      vlen = ::fgetxattr(fd, name.c_str(), value.data(), value.size());
      if (vlen < 0) return Error::Sys("fgetxattr", display + " " + name, errno);
      archive_entry_xattr_add_entry(e, name.c_str(), value.data(), static_cast<size_t>(vlen));
    }
    return Ok();
  }

  Status WriteOne(int dir_fd, const std::string& name, const std::string& rel) {
    const std::string display = root_ + "/" + rel;
    struct stat st {};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return Ok();  // removed while we walk
      return Error::Sys("fstatat", display, errno);
    }
    if (S_ISSOCK(st.st_mode)) return Ok();  // tar has no sockets
    std::unique_ptr<struct archive_entry, EntryFree> e(archive_entry_new());
    if (!e) return Error(ENOMEM, "archive_entry_new: out of memory");
    archive_entry_copy_stat(e.get(), &st);
    archive_entry_set_pathname(e.get(), rel.c_str());
    UniqueFd fd;
    if (S_ISREG(st.st_mode) && st.st_nlink > 1) {
      auto [it, first] = links_.try_emplace({st.st_dev, st.st_ino}, rel);
      if (!first) {  // a later name of a file already written: a hardlink entry, no data
        archive_entry_set_hardlink(e.get(), it->second.c_str());
        archive_entry_set_size(e.get(), 0);
        return WriteHeader(e.get(), display);
      }
    }
    if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) {
      const int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (S_ISDIR(st.st_mode) ? O_DIRECTORY : 0);
      fd.reset(::openat(dir_fd, name.c_str(), flags));
      if (!fd.valid()) return Error::Sys("open", display, errno);
      NSBOX_TRY(AddXattrs(fd.get(), e.get(), display));
    } else if (S_ISLNK(st.st_mode)) {
      std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
      ssize_t n = ::readlinkat(dir_fd, name.c_str(), target.data(), target.size());
      if (n < 0) return Error::Sys("readlinkat", display, errno);
      target.resize(static_cast<size_t>(n));
      archive_entry_set_symlink(e.get(), target.c_str());
      archive_entry_set_size(e.get(), 0);
    } else {
      archive_entry_set_size(e.get(), 0);  // FIFOs and device nodes carry no data
    }
    if (S_ISDIR(st.st_mode)) archive_entry_set_size(e.get(), 0);
    NSBOX_TRY(WriteHeader(e.get(), display));
    if (S_ISREG(st.st_mode)) {
      NSBOX_TRY(WriteData(fd.get(), static_cast<uint64_t>(st.st_size), display));
    }
    if (S_ISDIR(st.st_mode)) NSBOX_TRY(WriteTree(fd.get(), rel));
    return Ok();
  }

  Status WriteHeader(struct archive_entry* e, const std::string& display) {
    // ARCHIVE_WARN: a name that is not valid in the locale's charset, written as bytes.
    if (archive_write_header(a_, e) < ARCHIVE_WARN) return WriteError(display);
    return Ok();
  }

  // At most `size` bytes (the size in the header): a file that grows meanwhile is cut there, one
  // that shrinks is padded by libarchive.
  Status WriteData(int fd, uint64_t size, const std::string& display) {
    std::vector<char> buf(256 * 1024);
    uint64_t done = 0;
    while (done < size) {
      ssize_t n = ::read(fd, buf.data(), std::min<uint64_t>(buf.size(), size - done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return Error::Sys("read", display, errno);
      }
      if (n == 0) break;
      if (archive_write_data(a_, buf.data(), static_cast<size_t>(n)) < 0) {
        return WriteError(display);
      }
      done += static_cast<uint64_t>(n);
      state_.bytes_read += static_cast<uint64_t>(n);
      if (state_.bytes_read - reported_ >= kProgressStep) {
        reported_ = state_.bytes_read;
        Report();
      }
    }
    return Ok();
  }

  struct archive* a_;
  const std::string& root_;
  const ProgressFn& progress_;
  ImportProgress state_;
  uint64_t reported_ = 0;
  std::map<std::pair<dev_t, ino_t>, std::string> links_;
};

}  // namespace

std::optional<std::string> InvalidImageNameReason(std::string_view name) {
  if (name.empty() || name.size() > 64) {
    return "an image name has 1 to 64 characters; this one has " + std::to_string(name.size());
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return "an image name has only the characters a-z, 0-9, '.', '_' and '-'";
  }
  const char first = name.front();
  if (!((first >= 'a' && first <= 'z') || (first >= '0' && first <= '9'))) {
    return "an image name starts with a letter or a digit";
  }
  if (name == "host") return "\"host\" is the built-in image";
  return std::nullopt;
}

std::string EncodeImageInfo(const ImageInfo& info) {
  json::object config;
  config["env"] = StringArray(info.config.env);
  config["workingDir"] = info.config.working_dir;
  config["user"] = info.config.user;
  config["entrypoint"] = StringArray(info.config.entrypoint);
  config["cmd"] = StringArray(info.config.cmd);
  config["architecture"] = info.config.architecture;
  config["os"] = info.config.os;
  json::object o;
  o["name"] = info.name;
  o["id"] = info.id;
  o["format"] = info.format;
  o["digest"] = info.digest;
  o["layers"] = info.layers;
  o["sizeBytes"] = info.size_bytes;
  o["files"] = info.files;
  o["importedAt"] = info.imported_at;
  o["uidBase"] = info.uid_base;
  o["gidBase"] = info.gid_base;
  o["shell"] = info.shell;
  o["config"] = std::move(config);
  o["warnings"] = StringArray(info.warnings);
  return json::serialize(o) + "\n";
}

Result<ImageInfo> DecodeImageInfo(std::string_view text) {
  boost::system::error_code ec;
  json::value v = json::parse(json::string_view(text.data(), text.size()), ec);
  if (ec) return BadInfo("not valid JSON: " + ec.message());
  if (!v.is_object()) return BadInfo("not a JSON object");
  const json::object& o = v.get_object();
  ImageInfo info;
  NSBOX_ASSIGN_OR_RETURN(info.name, RequiredString(o, "name"));
  if (auto why = InvalidImageNameReason(info.name)) return BadInfo("\"name\": " + *why);
  NSBOX_ASSIGN_OR_RETURN(info.id, RequiredString(o, "id"));
  if (!IsContentId(info.id)) return BadInfo("\"id\" is not 32 lower-case hex digits");
  NSBOX_ASSIGN_OR_RETURN(info.format, RequiredString(o, "format"));
  if (info.format != "oci" && info.format != "docker" && info.format != "rootfs") {
    return BadInfo("\"format\" is not oci, docker or rootfs");
  }
  NSBOX_ASSIGN_OR_RETURN(info.digest, RequiredString(o, "digest"));
  if (!info.digest.empty() && !internal::IsSha256Digest(info.digest)) {
    return BadInfo("\"digest\" is not a sha256 digest");
  }
  NSBOX_ASSIGN_OR_RETURN(info.layers, RequiredCount(o, "layers", UINT64_MAX));
  NSBOX_ASSIGN_OR_RETURN(info.size_bytes, RequiredCount(o, "sizeBytes", UINT64_MAX));
  NSBOX_ASSIGN_OR_RETURN(info.files, RequiredCount(o, "files", UINT64_MAX));
  NSBOX_ASSIGN_OR_RETURN(info.imported_at, RequiredString(o, "importedAt"));
  if (!IsRfc3339Millis(info.imported_at)) {
    return BadInfo("\"importedAt\" is not an RFC 3339 UTC time with milliseconds");
  }
  NSBOX_ASSIGN_OR_RETURN(uint64_t uid_base, RequiredCount(o, "uidBase", UINT32_MAX));
  NSBOX_ASSIGN_OR_RETURN(uint64_t gid_base, RequiredCount(o, "gidBase", UINT32_MAX));
  info.uid_base = static_cast<uint32_t>(uid_base);
  info.gid_base = static_cast<uint32_t>(gid_base);
  NSBOX_ASSIGN_OR_RETURN(info.shell, RequiredString(o, "shell"));
  if (info.shell.empty() || info.shell[0] != '/') return BadInfo("\"shell\" is not absolute");
  const json::value* c = o.if_contains("config");
  if (c == nullptr || !c->is_object()) return BadInfo("\"config\" is missing or not an object");
  const json::object& co = c->get_object();
  NSBOX_ASSIGN_OR_RETURN(info.config.env, RequiredStrings(co, "env"));
  NSBOX_ASSIGN_OR_RETURN(info.config.working_dir, RequiredString(co, "workingDir"));
  NSBOX_ASSIGN_OR_RETURN(info.config.user, RequiredString(co, "user"));
  NSBOX_ASSIGN_OR_RETURN(info.config.entrypoint, RequiredStrings(co, "entrypoint"));
  NSBOX_ASSIGN_OR_RETURN(info.config.cmd, RequiredStrings(co, "cmd"));
  NSBOX_ASSIGN_OR_RETURN(info.config.architecture, RequiredString(co, "architecture"));
  NSBOX_ASSIGN_OR_RETURN(info.config.os, RequiredString(co, "os"));
  NSBOX_ASSIGN_OR_RETURN(info.warnings, RequiredStrings(o, "warnings"));
  return info;
}

Result<std::unique_ptr<ImageStore>> ImageStore::Open(std::string images_dir,
                                                     isolate::IdMapping ids) {
  NSBOX_TRY(isolate::ValidateIdRange(ids.uid, "uid"));
  NSBOX_TRY(isolate::ValidateIdRange(ids.gid, "gid"));
  while (images_dir.size() > 1 && images_dir.back() == '/') images_dir.pop_back();
  if (images_dir.empty()) return Error(EINVAL, "the images directory must not be empty");
  std::unique_ptr<ImageStore> store(new ImageStore());
  store->dir_ = images_dir;
  store->ids_ = ids;
  const std::string& dir = store->dir_;
  const std::string content = dir + "/content";

  // 0711: a sandbox's root (an unprivileged host uid) must pass through to its image's rootfs;
  // nobody may list the images.
  for (const std::string& path : {dir, content}) {
    NSBOX_TRY(MakeDir(path, 0711));
    if (::chmod(path.c_str(), 0711) != 0) return Error::Sys("chmod", path, errno);
  }
  NSBOX_ASSIGN_OR_RETURN(UniqueFd dir_fd, OpenAt(AT_FDCWD, dir, O_RDONLY | O_DIRECTORY));
  NSBOX_ASSIGN_OR_RETURN(UniqueFd content_fd,
                         OpenAt(dir_fd.get(), "content", O_RDONLY | O_DIRECTORY | O_NOFOLLOW));

  // What a dead daemon left: imports in progress (and spooled uploads), half-written <name>.json
  // temp files; in content/, a directory without image.json (written before the rename into
  // content/, so nsbox did not make it). Each is taken out of sight at once, into the trash that
  // PurgeTrash empties (with what a crash left in it): a half-unpacked distribution takes
  // seconds to delete, which a start must not wait for. A leftover that cannot be moved is
  // logged, not fatal.
  auto to_trash = [&](int from_fd, const std::string& name, const std::string& path) {
    const std::string trash = std::string(kTrashPrefix) + name + "-" + RandomHex(8);
    log::info("removing {}, left unfinished by an earlier nsboxd", path);
    if (::renameat(from_fd, name.c_str(), content_fd.get(), trash.c_str()) != 0) {
      log::warn("{}", Error::Sys("rename", path, errno).message());
    }
  };
  NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> names, ListNames(dir_fd.get(), dir));
  for (const std::string& name : names) {
    if (StartsWith(name, kImportPrefix)) {
      to_trash(dir_fd.get(), name, dir + "/" + name);
    } else if (StartsWith(name, ".") && name.size() > 4 &&
               name.compare(name.size() - 4, 4, ".tmp") == 0) {
      if (::unlinkat(dir_fd.get(), name.c_str(), 0) != 0) {
        log::warn("{}", Error::Sys("unlink", dir + "/" + name, errno).message());
      }
    }
  }
  NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> ids_on_disk,
                         ListNames(content_fd.get(), content));
  for (const std::string& id : ids_on_disk) {
    if (IsContentId(id) &&
        ::faccessat(content_fd.get(), (id + "/image.json").c_str(), F_OK, AT_SYMLINK_NOFOLLOW) !=
            0 &&
        errno == ENOENT) {
      to_trash(content_fd.get(), id, content + "/" + id);
    }
  }
  if (auto st = FsyncPath(content); !st.ok()) log::warn("{}", st.error().message());

  // The names. One that cannot be read is skipped and kept on disk, never deleted.
  for (const std::string& file : names) {
    if (StartsWith(file, ".") || file.size() <= 5 ||
        file.compare(file.size() - 5, 5, ".json") != 0) {
      continue;
    }
    const std::string path = dir + "/" + file;
    const std::string name = file.substr(0, file.size() - 5);
    if (auto why = InvalidImageNameReason(name)) {
      log::warn("skipping {}: {}", path, *why);
      continue;
    }
    auto text = ReadFileAt(dir_fd.get(), file);
    if (!text.ok()) {
      log::warn("skipping the image {}: {}", path, text.error().message());
      continue;
    }
    auto info = DecodeImageInfo(*text);
    if (!info.ok()) {
      log::warn("skipping the image {}: {}", path, info.error().message());
      continue;
    }
    if (info->name != name) {
      log::warn("skipping the image {}: it names the image '{}'", path, info->name);
      continue;
    }
    struct stat st {};
    const std::string rootfs = "content/" + info->id + "/rootfs";
    if (::fstatat(dir_fd.get(), rootfs.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISDIR(st.st_mode)) {
      log::warn("skipping the image {}: its content {}/{} is missing", path, dir, rootfs);
      continue;
    }
    store->images_.push_back(std::move(info).value());
  }
  log::info("images directory {}: {} images", dir, store->images_.size());
  return store;
}

Result<ImageInfo> ImageStore::Import(std::string_view name_view, const std::string& source,
                                     bool replace, const ProgressFn& progress,
                                     ImportBudget* given_budget) {
  const std::string name(name_view);
  ImportBudget unlimited(ImportLimits::Unlimited(), dir_);
  ImportBudget& budget = given_budget != nullptr ? *given_budget : unlimited;
  budget.WatchStopping(&cancel_);
  if (auto why = InvalidImageNameReason(name)) return Error(EINVAL, *why);
  const Error taken(EEXIST,
                    "an image named '" + name + "' exists already (replace it with ?replace=1)");
  if (!replace && Find(name).has_value()) return taken;  // before the work; checked again below

  NSBOX_ASSIGN_OR_RETURN(UniqueFd dir_fd, OpenAt(AT_FDCWD, dir_, O_RDONLY | O_DIRECTORY));
  const std::string content = dir_ + "/content";
  NSBOX_ASSIGN_OR_RETURN(UniqueFd content_fd,
                         OpenAt(dir_fd.get(), "content", O_RDONLY | O_DIRECTORY | O_NOFOLLOW));

  // 1. A private work directory; whatever fails from here on removes it.
  const std::string work = std::string(kImportPrefix) + RandomHex(16);
  const std::string work_path = dir_ + "/" + work;
  if (::mkdirat(dir_fd.get(), work.c_str(), 0700) != 0) {
    return Error::Sys("mkdir", work_path, errno);
  }
  CleanupStack cleanup;
  cleanup.Push([&] {
    if (auto st = internal::RemoveTreeAt(dir_fd.get(), work, work_path); !st.ok()) {
      log::warn("{}", st.error().message());
    }
  });
  NSBOX_ASSIGN_OR_RETURN(UniqueFd work_fd,
                         OpenAt(dir_fd.get(), work, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
  if (::mkdirat(work_fd.get(), "rootfs", 0755) != 0) {
    return Error::Sys("mkdir", work_path + "/rootfs", errno);
  }
  NSBOX_ASSIGN_OR_RETURN(UniqueFd rootfs_fd,
                         OpenAt(work_fd.get(), "rootfs", O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
  // The root directory belongs to the image's root; chmod after chown, and not left to umask.
  if (::fchown(rootfs_fd.get(), ids_.uid.outside, ids_.gid.outside) != 0) {
    return Error::Sys("fchown", work_path + "/rootfs", errno);
  }
  if (::fchmod(rootfs_fd.get(), 0755) != 0) {
    return Error::Sys("fchmod", work_path + "/rootfs", errno);
  }

  // 2. Unpack and verify, without the lock: imports run side by side.
  Result<internal::UnpackedImage> unpacked_or =
      internal::UnpackImage(source, work_fd.get(), rootfs_fd.get(), ids_, progress, budget);
  // What the unpacking allocated (libarchive's buffers, the paths it kept) is free now, but glibc
  // keeps a worker thread's freed memory in its arena: given back to the kernel here, so that an
  // import, a failed one of a hostile image included, leaves nsboxd no larger than it found it.
  ::malloc_trim(0);
  NSBOX_ASSIGN_OR_RETURN(internal::UnpackedImage unpacked, std::move(unpacked_or));
  NSBOX_TRY(budget.CheckCancel());
  // Where a sandbox mounts its own /dev, /proc and /tmp, the image must have directories (or
  // nothing): a symlink or a file there would make every start of its sandboxes fail (mkdir
  // /dev: ENOTDIR), found only at their first command.
  for (const char* mount_point : {"dev", "proc", "tmp"}) {
    struct stat mp {};
    if (::fstatat(rootfs_fd.get(), mount_point, &mp, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISDIR(mp.st_mode)) {
      return Error(EINVAL, std::string("the image's /") + mount_point + " is " +
                               (S_ISLNK(mp.st_mode) ? "a symlink" : "not a directory") +
                               ": a sandbox mounts its own /" + mount_point +
                               " there, so the image must have a directory there, or nothing");
    }
  }
  ImageInfo info;
  info.name = name;
  // A fresh id: never one that is on disk (content that a sandbox still uses keeps its id).
  do {
    info.id = RandomHex(kIdDigits);
  } while (::faccessat(content_fd.get(), info.id.c_str(), F_OK, AT_SYMLINK_NOFOLLOW) == 0);
  info.format = std::move(unpacked.format);
  info.digest = std::move(unpacked.digest);
  info.layers = unpacked.layers;
  info.size_bytes = unpacked.size_bytes;
  info.files = unpacked.files;
  info.imported_at = NowRfc3339();
  info.uid_base = ids_.uid.outside;
  info.gid_base = ids_.gid.outside;
  info.shell = ShellIn(rootfs_fd.get());
  info.config = std::move(unpacked.config);
  // What of the config a sandbox will not use, or that will fail its commands, said now rather
  // than found at a command: nsboxd takes an absolute WorkingDir as the sandboxes' cwd and
  // NAME=VALUE entries of Env (runtime/serve.cc, PutSandbox).
  const std::string& workdir = info.config.working_dir;
  if (!workdir.empty() && workdir[0] != '/') {
    unpacked.warnings.push_back("the config's WorkingDir " + Quote(workdir) +
                                " is not absolute: ignored, sandboxes start in /workspace");
  } else if (!workdir.empty()) {
    struct open_how how {};
    how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;  // the image's symlinks, inside it
    // SAFETY: `how` is a fully initialised open_how of the size passed; the path is a
    // NUL-terminated string that outlives the call.
    const int fd = sys::Openat2(rootfs_fd.get(), workdir.c_str(), &how, sizeof how);
    if (fd >= 0) {
      ::close(fd);
    } else if (errno == ENOENT || errno == ENOTDIR) {
      unpacked.warnings.push_back("the config's WorkingDir " + Quote(workdir) +
                                  " is not a directory of the image: a command of its sandboxes "
                                  "fails unless it is given another cwd");
    }
  }
  for (const std::string& kv : info.config.env) {
    if (kv.empty() || kv[0] == '=' || kv.find('=') == std::string::npos) {
      unpacked.warnings.push_back("the config's Env entry " + Quote(kv) +
                                  " is not NAME=VALUE: ignored");
    }
  }
  // They quote names of the archive, which need not be UTF-8; image.json and the API's JSON
  // must be (api.md "Paths": invalid bytes replaced by U+FFFD).
  for (const std::string& w : unpacked.warnings) info.warnings.push_back(utf8::DecodeLossy(w));

  // 3. Durable before visible: image.json, then every byte of the tree (syncfs: one call for
  // the thousands of files an image has), then the renames that publish it.
  if (progress) {
    ImportProgress p;
    p.phase = "publishing";
    p.layers = info.layers;
    progress(p);
  }
  NSBOX_TRY(WriteFileAtomic(work_path, "image.json", EncodeImageInfo(info)));
  if (::syncfs(work_fd.get()) != 0) return Error::Sys("syncfs", work_path, errno);
  NSBOX_TRY(budget.CheckCancel());
  // 0700: the root holds setuid files owned by the sandboxes' uids; no host user may reach them
  // (case SetuidFilesOfSandboxesAreOutOfHostUsersReach). The overlay reads it as root.
  if (::fchmod(work_fd.get(), 0700) != 0) return Error::Sys("fchmod", work_path, errno);

  // 4. Publish, under the lock: the check of the name, the rename into content/ (so that
  // CollectGarbage never sees a content id before its name) and <name>.json.
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(images_.begin(), images_.end(),
                         [&](const ImageInfo& i) { return i.name == name; });
  if (it != images_.end() && !replace) return taken;
  // RENAME_NOREPLACE: should two imports ever draw the same id, the second fails instead of
  // replacing the first's content.
  if (::renameat2(dir_fd.get(), work.c_str(), content_fd.get(), info.id.c_str(),
                  RENAME_NOREPLACE) != 0) {
    return Error::Sys("rename", content + "/" + info.id, errno);
  }
  cleanup.Release();
  Status published = FsyncPath(content);
  if (published.ok()) published = WriteFileAtomic(dir_, name + ".json", EncodeImageInfo(info));
  if (!published.ok()) {
    // Not published: the content goes to the trash (nothing can refer to its new id yet).
    if (auto st = MoveToTrash(content_fd.get(), content, info.id); !st.ok()) {
      log::warn("{}", st.error().message());
    }
    return std::move(published).error();
  }
  if (it != images_.end()) {
    *it = info;
  } else {
    images_.insert(
        std::upper_bound(images_.begin(), images_.end(), info,
                         [](const ImageInfo& a, const ImageInfo& b) { return a.name < b.name; }),
        info);
  }
  return info;
}

std::optional<ImageInfo> ImageStore::Find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const ImageInfo& info : images_) {
    if (info.name == name) return info;
  }
  return std::nullopt;
}

std::vector<ImageInfo> ImageStore::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ImageInfo> out = images_;
  std::sort(out.begin(), out.end(),
            [](const ImageInfo& a, const ImageInfo& b) { return a.name < b.name; });
  return out;
}

Status ImageStore::Remove(std::string_view name, const std::set<std::string>& ids_in_use) {
  NSBOX_ASSIGN_OR_RETURN(UniqueFd dir_fd, OpenAt(AT_FDCWD, dir_, O_RDONLY | O_DIRECTORY));
  const std::string content = dir_ + "/content";
  NSBOX_ASSIGN_OR_RETURN(UniqueFd content_fd,
                         OpenAt(dir_fd.get(), "content", O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(images_.begin(), images_.end(),
                           [&](const ImageInfo& i) { return i.name == name; });
    if (it == images_.end()) return Error(ENOENT, "no image named '" + std::string(name) + "'");
    const std::string file = std::string(name) + ".json";
    if (::unlinkat(dir_fd.get(), file.c_str(), 0) != 0 && errno != ENOENT) {
      return Error::Sys("unlink", dir_ + "/" + file, errno);
    }
    NSBOX_TRY(FsyncPath(dir_));
    id = it->id;
    images_.erase(it);
  }
  // Names never share a content id (each import makes a new one), so only sandboxes can
  // still use it.
  if (ids_in_use.count(id) != 0) return Ok();
  return MoveToTrash(content_fd.get(), content, id);
}

Status ImageStore::CollectGarbage(const std::set<std::string>& ids_in_use) {
  const std::string content = dir_ + "/content";
  NSBOX_ASSIGN_OR_RETURN(UniqueFd content_fd, OpenAt(AT_FDCWD, content, O_RDONLY | O_DIRECTORY));
  // Under the lock, as Import's publish step is: a content id is never seen without its name.
  std::lock_guard<std::mutex> lock(mu_);
  std::set<std::string> named;
  for (const ImageInfo& info : images_) named.insert(info.id);
  NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> on_disk, ListNames(content_fd.get(), content));
  Status result = Ok();
  for (const std::string& id : on_disk) {
    if (!IsContentId(id) || named.count(id) != 0 || ids_in_use.count(id) != 0) continue;
    if (auto st = MoveToTrash(content_fd.get(), content, id); !st.ok() && result.ok()) {
      result = std::move(st);
    }
  }
  return result;
}

Status ImageStore::PurgeTrash() {
  const std::string content = dir_ + "/content";
  NSBOX_ASSIGN_OR_RETURN(UniqueFd content_fd, OpenAt(AT_FDCWD, content, O_RDONLY | O_DIRECTORY));
  // No lock: nothing else looks at a .trash- directory.
  NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> names, ListNames(content_fd.get(), content));
  Status result = Ok();
  for (const std::string& name : names) {
    if (!StartsWith(name, kTrashPrefix)) continue;
    if (auto st = internal::RemoveTreeAt(content_fd.get(), name, content + "/" + name);
        !st.ok() && result.ok()) {
      result = std::move(st);
    }
  }
  return result;
}

Result<std::string> ImageStore::RootfsOf(std::string_view id) const {
  if (!IsContentId(id)) return Error(EINVAL, "'" + std::string(id) + "' is not an image id");
  const std::string path = dir_ + "/content/" + std::string(id) + "/rootfs";
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Error(ENOENT, "image content " + std::string(id) + " is gone");
    return Error::Sys("stat", path, errno);
  }
  if (!S_ISDIR(st.st_mode)) return Error(ENOENT, path + " is not a directory");
  return path;
}

Result<ImageInfo> ImageStore::InfoOf(std::string_view id) const {
  if (!IsContentId(id)) return Error(EINVAL, "'" + std::string(id) + "' is not an image id");
  const std::string path = dir_ + "/content/" + std::string(id) + "/image.json";
  auto text = ReadFile(path);
  if (!text.ok()) {
    if (text.error().code() == ENOENT) {
      return Error(ENOENT, "image content " + std::string(id) + " is gone");
    }
    return std::move(text).error();
  }
  NSBOX_ASSIGN_OR_RETURN(ImageInfo info, DecodeImageInfo(*text));
  if (info.id != id) return Error(EINVAL, path + " describes the content id " + info.id);
  return info;
}

Status WriteTarOfDirectory(const std::string& dir, int out_fd, const ProgressFn& progress) {
  NSBOX_ASSIGN_OR_RETURN(UniqueFd root, OpenAt(AT_FDCWD, dir, O_RDONLY | O_DIRECTORY));
  std::unique_ptr<struct archive, ArchiveWriteFree> a(archive_write_new());
  if (!a) return Error(ENOMEM, "archive_write_new: out of memory");
  // pax (restricted): ustar headers where they suffice, pax extensions for long names, large
  // sizes and xattrs.
  if (archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK ||
      archive_write_add_filter_none(a.get()) != ARCHIVE_OK ||
      archive_write_open_fd(a.get(), out_fd) != ARCHIVE_OK) {
    const char* msg = archive_error_string(a.get());
    return Error(EIO, "write the tar of " + dir + ": " + (msg != nullptr ? msg : "failed"));
  }
  TarWriter writer(a.get(), dir, progress);
  NSBOX_TRY(writer.WriteTree(root.get(), ""));
  return writer.Close();
}

}  // namespace nsbox::images

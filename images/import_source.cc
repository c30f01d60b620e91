#include "images/import_source.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <utility>

#include "base/files.h"
#include "base/strings.h"
#include "base/syscalls.h"
#include "images/tar_stream.h"

namespace nsbox::images::internal {

namespace {

// An index, a manifest or a config is a few KiB; this bounds what a hostile one costs in memory.
constexpr uint64_t kMaxJsonBytes = 16 * kMiB;

// docker save writes a repeated layer as a symlink to the first copy; links of links are rare.
constexpr int kMaxMemberLinks = 8;

}  // namespace

std::string MemberKey(std::string_view name) {
  std::vector<std::string_view> parts;
  for (std::string_view part : Split(name, '/')) {
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
  }
  std::string out;
  for (std::string_view p : parts) {
    if (!out.empty()) out += '/';
    out += p;
  }
  return out;
}

Result<ScannedTar> ScanTar(int fd, uint64_t size, const std::string& source, Progress& progress) {
  RangeReader reader(fd, 0, size, source, &progress);
  reader.AllowSkip();
  // A root file system tarball has no digest: a gzip one is checked by its own CRC-32.
  reader.CheckGzip();
  NSBOX_ASSIGN_OR_RETURN(std::unique_ptr<TarStream> tar, TarStream::Open(&reader, source));
  struct archive* a = tar->archive();
  ScannedTar scan;
  uint64_t entries = 0;
  uint64_t index_bytes = 0;
  uint64_t declared = 0;  // the data of the regular members, by their headers
  for (;;) {
    struct archive_entry* e = nullptr;
    auto more = tar->Next(&e);
    if (!more.ok()) return std::move(more).error().Context(source);
    if (!*more) break;
    ++entries;
    const char* name = archive_entry_pathname(e);
    if (name == nullptr) name = archive_entry_pathname_utf8(e);
    Member m;
    if (const char* hardlink = archive_entry_hardlink(e); hardlink != nullptr) {
      m.kind = Member::Kind::kHardlink;
      m.link = MemberKey(hardlink);
    } else if (archive_entry_filetype(e) == AE_IFREG) {
      m.kind = Member::Kind::kFile;
      // After the header (pax and GNU long-name headers included), the decompressed stream's
      // position is the first byte of this member's data.
      m.offset = tar->position();
      m.size = static_cast<uint64_t>(archive_entry_size(e));
      m.sparse = archive_entry_sparse_count(e) > 0;
      // More than the import may write is refused at the headers, before the data is
      // decompressed (4 MB of gzip may declare 4 GiB). A sparse member may hold less than it says.
      if (!m.sparse) {
        declared += std::min(m.size, UINT64_MAX - declared);
        NSBOX_TRY(progress.budget().Declared(declared, source));
      }
    } else if (archive_entry_filetype(e) == AE_IFLNK) {
      m.kind = Member::Kind::kSymlink;
      const char* target = archive_entry_symlink(e);
      m.link = target != nullptr ? target : "";
    }
    if (name != nullptr) {
      std::string key = MemberKey(name);
      scan.has_oci_layout |= key == "oci-layout";
      scan.has_index_json |= key == "index.json";
      scan.has_manifest_json |= key == "manifest.json";
      if (!scan.index_full) {
        const uint64_t cost = kIndexNodeBytes + key.size() + m.link.size();
        auto [it, added] = scan.members.try_emplace(std::move(key));
        if (added) index_bytes += cost;
        it->second = std::move(m);
        if (index_bytes > kMaxIndexBytes) {
          scan.index_full = true;
          scan.members.clear();
        }
      }
    }
    if (archive_read_data_skip(a) != ARCHIVE_OK) {
      return ArchiveError(a, reader, source + ": truncated or corrupt tar archive");
    }
  }
  if (entries == 0) {
    return BadInput(source +
                    ": not a tar archive (or an unsupported compression): it holds no entries");
  }
  scan.compressed = tar->compressed();
  // The gzip trailer comes after the tar's end, which libarchive stops at.
  NSBOX_TRY_CTX(reader.Drain(), source + ": corrupt tar archive");
  NSBOX_TRY_CTX(reader.FinishCheck(), source + ": corrupt tar archive");
  return scan;
}

Result<UniqueFd> DecompressToScratch(int fd, uint64_t size, int work_fd, const std::string& source,
                                     Progress& progress) {
  const std::string scratch = "source.tar";
  NSBOX_ASSIGN_OR_RETURN(UniqueFd out,
                         OpenAt(work_fd, scratch, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0600));
  // Unlinked at once: the fd keeps the data, and nothing is left to clean up on any path.
  if (::unlinkat(work_fd, scratch.c_str(), 0) != 0) return Error::Sys("unlinkat", scratch, errno);
  progress.Rewind();
  RangeReader reader(fd, 0, size, source, &progress);
  NSBOX_ASSIGN_OR_RETURN(ArchiveReader a, OpenRaw(&reader, source));
  struct archive_entry* e = nullptr;
  if (archive_read_next_header(a.get(), &e) != ARCHIVE_OK) {
    return ArchiveError(a.get(), reader, source + ": cannot decompress");
  }
  std::vector<char> buf(kReadChunk);
  for (;;) {
    la_ssize_t n = archive_read_data(a.get(), buf.data(), buf.size());
    if (n < 0) return ArchiveError(a.get(), reader, source + ": cannot decompress");
    if (n == 0) break;
    NSBOX_TRY(
        progress.budget().Charge(ImportBudget::Step::kScratch, static_cast<uint64_t>(n), source));
    NSBOX_TRY(WriteAll(out.get(), std::string_view(buf.data(), static_cast<size_t>(n)),
                       "the decompressed copy of " + source));
  }
  return out;
}

Result<std::optional<BlobRef>> DirSource::Find(const std::string& rel) {
  const std::string full = path_ + "/" + rel;
  struct open_how how {};
  how.flags = O_RDONLY | O_NOCTTY | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  int fd;
  do {
    // SAFETY: `how` is a fully initialised open_how of the size passed; `rel` is a
    // NUL-terminated string that outlives the call.
    fd = sys::Openat2(dir_.get(), rel.c_str(), &how, sizeof how);
  } while (fd < 0 && errno == EAGAIN);
  if (fd < 0 && errno == ENOSYS) {
    // Before Linux 5.6: the names nsbox asks for are fixed or made of a digest's hex digits,
    // so they cannot climb out; only the last component is kept from being a symlink.
    fd = ::openat(dir_.get(), rel.c_str(), O_RDONLY | O_NOCTTY | O_CLOEXEC | O_NOFOLLOW);
  }
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<BlobRef>();
    return Error::Sys("open", full, errno);
  }
  UniqueFd owned(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Error::Sys("fstat", full, errno);
  if (!S_ISREG(st.st_mode)) return BadInput(full + " is not a regular file");
  fds_.push_back(std::move(owned));
  return std::optional<BlobRef>(BlobRef{fd, 0, static_cast<uint64_t>(st.st_size), full});
}

Result<std::optional<BlobRef>> TarSource::Find(const std::string& path) {
  std::string key = MemberKey(path);
  for (int hops = 0; hops <= kMaxMemberLinks; ++hops) {
    auto it = members_.find(key);
    if (it == members_.end()) return std::optional<BlobRef>();
    const Member& m = it->second;
    const std::string what = source_ + ": member " + Quote(key);
    switch (m.kind) {
      case Member::Kind::kFile:
        if (m.sparse) return BadInput(what + " is a sparse file, which nsbox cannot read");
        if (m.offset > size_ || m.size > size_ - m.offset) {
          return BadInput(what + " runs past the end of the archive (truncated?)");
        }
        return std::optional<BlobRef>(BlobRef{fd_, m.offset, m.size, source_ + ":" + key});
      case Member::Kind::kHardlink:
        key = m.link;  // tar hardlink targets are relative to the archive's root
        break;
      case Member::Kind::kSymlink: {
        // docker save's repeated layers: "<id>/layer.tar -> ../<other id>/layer.tar".
        size_t slash = key.rfind('/');
        std::string dir = slash == std::string::npos ? "" : key.substr(0, slash);
        key = MemberKey(!m.link.empty() && m.link[0] == '/' ? m.link : dir + "/" + m.link);
        break;
      }
      case Member::Kind::kOther:
        return BadInput(what + " is not a regular file");
    }
  }
  return BadInput(source_ + ": member " + Quote(path) + ": too many links");
}

Result<BlobBytes> ReadSmallBlob(const BlobRef& blob, std::string_view what) {
  if (blob.size > kMaxJsonBytes) {
    return BadInput(std::string(what) + " is " + std::to_string(blob.size) +
                    " bytes, more than the 16 MiB nsbox reads");
  }
  RangeReader reader(blob.fd, blob.offset, blob.size, blob.name, nullptr);
  BlobBytes out;
  const void* data;
  for (;;) {
    NSBOX_ASSIGN_OR_RETURN(size_t n, reader.Read(&data));
    if (n == 0) break;
    out.data.append(static_cast<const char*>(data), n);
  }
  out.digest = reader.Digest();
  return out;
}

}  // namespace nsbox::images::internal

#pragma once

// Internal to images/: where an import's bytes come from: the members of an outer tar (scanned
// once, read in place at their offsets; decompressed to a scratch file first when compressed),
// or the files of an OCI layout directory. import_source.cc defines them.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "images/import_reader.h"

namespace nsbox::images::internal {

// ---- the members of an outer tar ----

// A member's name as a lookup key: "./index.json", "/index.json" and "index.json" are the same
// member; "a/../b" is "b" (a name resolved lexically inside the archive, never on disk).
std::string MemberKey(std::string_view name);

struct Member {
  enum class Kind { kFile, kHardlink, kSymlink, kOther } kind = Kind::kOther;
  uint64_t offset = 0;  // of the data, in the (decompressed) tar stream
  uint64_t size = 0;
  bool sparse = false;
  std::string link;  // hardlink target (a member key) or symlink text
};

// What the index of an outer tar's members may hold: 64 bytes for each member's map node and its
// strings' bytes. An OCI or docker save tarball has a few members per layer (a 500-layer image's
// index is under 100 KiB); a root file system tarball of any size needs none (only the three
// names below tell its format), so past this the index stops growing and is not used.
constexpr uint64_t kMaxIndexBytes = 16 * kMiB;
constexpr uint64_t kIndexNodeBytes = 64;

struct ScannedTar {
  std::map<std::string, Member> members;  // by MemberKey; a later member of a name wins
  // The index outgrew kMaxIndexBytes and is incomplete: only a root file system can be read.
  bool index_full = false;
  bool has_oci_layout = false;
  bool has_index_json = false;
  bool has_manifest_json = false;
  bool compressed = false;
};

// Reads every header of the tar in `fd` once, recording where each member's data starts, so
// that blobs can later be read in place with pread (ranges of the file), in any order, without
// unpacking the outer tar to disk. It must see every name before the format is known (docker
// save and OCI archives often put manifest.json or index.json last), and it reads the whole
// file (skipping data where the tar is uncompressed), so a truncated or corrupt tar fails here,
// before anything is written. A compressed root file system tarball is thus decompressed twice:
// once here, once as its layer; CPU spent for never unpacking a broken one.
Result<ScannedTar> ScanTar(int fd, uint64_t size, const std::string& source, Progress& progress);

// Decompresses the whole outer tar into an unlinked scratch file under `work_fd`. A compressed
// outer tar (`docker save | gzip`) cannot be read in place at offsets, and the manifest chain
// decides which members are needed only as it is read, so one decompressed copy lets everything
// after this work exactly as for an uncompressed tar. It costs the disk space of the image once
// more, for the length of the import only.
Result<UniqueFd> DecompressToScratch(int fd, uint64_t size, int work_fd, const std::string& source,
                                     Progress& progress);

// ---- where blobs come from ----

// A blob: a byte range of an open file (a whole file of an OCI layout directory, or a member of
// an outer tar).
struct BlobRef {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t size = 0;
  std::string name;  // for messages: the member's or the file's path in the source
};

class Source {
 public:
  virtual ~Source() = default;
  // The file called `path` in the layout or tarball, nullopt when there is none.
  virtual Result<std::optional<BlobRef>> Find(const std::string& path) = 0;
};

// An OCI layout directory. Blobs are opened beneath it (RESOLVE_BENEATH: a layout's own
// symlinks may not lead out of it) and stay open for the length of the import.
class DirSource : public Source {
 public:
  DirSource(UniqueFd dir, std::string path) : dir_(std::move(dir)), path_(std::move(path)) {}

  Result<std::optional<BlobRef>> Find(const std::string& rel) override;

 private:
  UniqueFd dir_;
  std::string path_;
  std::vector<UniqueFd> fds_;
};

// The members of a tar, read in place at the offsets ScanTar recorded.
class TarSource : public Source {
 public:
  TarSource(int fd, uint64_t size, std::map<std::string, Member> members, std::string source)
      : fd_(fd), size_(size), members_(std::move(members)), source_(std::move(source)) {}

  Result<std::optional<BlobRef>> Find(const std::string& path) override;

 private:
  int fd_;
  uint64_t size_;
  std::map<std::string, Member> members_;
  std::string source_;
};

struct BlobBytes {
  std::string data;
  std::string digest;
};

// A small blob (JSON) read whole, with its digest.
Result<BlobBytes> ReadSmallBlob(const BlobRef& blob, std::string_view what);

}  // namespace nsbox::images::internal

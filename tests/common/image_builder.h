#pragma once

// Test images, made in memory: layer tarballs from a list of entries, packed as an OCI image
// layout (a directory or a tar), a `docker save` tarball or a plain root file system tarball,
// with real sha256 digests (nettle), so that nsbox's importer sees what skopeo, buildah and
// docker write. Used by the image store's integration tests and the daemon's e2e tests.
//
// Everything here is for tests: a failure (a libarchive error, a file that cannot be written)
// prints what went wrong and aborts the test binary, loudly.
//
//   using namespace nsbox::testutil;
//   ImageSpec spec;
//   spec.layers = {BusyboxRootfs(), {File("etc/motd", "hi\n"), Whiteout("etc/os-release")}};
//   ImageFiles oci = BuildOciLayout(spec);
//   WriteFileOrDie(dir + "/image.tar", PackTar(oci));   // what `skopeo copy ... oci-archive:`
//   writes WriteLayoutDir(oci, dir + "/layout");               // what `skopeo copy ... oci:`
//   writes

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nsbox::testutil {

// One entry of a tarball. `path` is written verbatim ("./etc/passwd", "/abs", "../evil" alike):
// tests of hostile input need names no honest tool writes.
struct TarEntry {
  enum class Type { kDir, kFile, kSymlink, kHardlink, kFifo, kCharDevice, kBlockDevice };
  Type type = Type::kFile;
  std::string path;
  std::string content;   // kFile
  std::string target;    // kSymlink: the link's text; kHardlink: the path of an earlier entry
  uint32_t mode = 0644;  // permission bits, setuid/setgid/sticky included
  int64_t uid = 0;
  int64_t gid = 0;
  unsigned dev_major = 0;  // kCharDevice, kBlockDevice
  unsigned dev_minor = 0;
  int64_t mtime = 1700000000;                               // 2023-11-14T22:13:20Z
  std::vector<std::pair<std::string, std::string>> xattrs;  // "user.x" -> value

  // Chainable changes: File("a", "x").Owner(1000, 1000).Mode(04755).
  TarEntry& Owner(int64_t new_uid, int64_t new_gid) {
    uid = new_uid;
    gid = new_gid;
    return *this;
  }
  TarEntry& Mode(uint32_t new_mode) {
    mode = new_mode;
    return *this;
  }
  TarEntry& Mtime(int64_t seconds) {
    mtime = seconds;
    return *this;
  }
  TarEntry& Xattr(std::string name, std::string value) {
    xattrs.emplace_back(std::move(name), std::move(value));
    return *this;
  }
};

TarEntry Dir(std::string path, uint32_t mode = 0755);
TarEntry File(std::string path, std::string content, uint32_t mode = 0644);
TarEntry Symlink(std::string path, std::string target);
TarEntry Hardlink(std::string path, std::string target);
TarEntry Fifo(std::string path, uint32_t mode = 0644);
TarEntry CharDevice(std::string path, unsigned major, unsigned minor);
// The OCI whiteout of "dir/name": an empty file "dir/.wh.name".
TarEntry Whiteout(std::string_view path);
// The OCI opaque marker of `dir`: an empty file "dir/.wh..wh..opq".
TarEntry OpaqueWhiteout(std::string_view dir);

enum class Compression { kNone, kGzip, kZstd };

// A pax tarball of `entries`, in order.
std::string MakeTar(const std::vector<TarEntry>& entries,
                    Compression compression = Compression::kNone);
// Compresses `data` whole (a tar made elsewhere, or bytes that are no tar at all).
std::string Compress(std::string_view data, Compression compression);
// "sha256:<64 hex>" of `data`.
std::string Sha256Digest(std::string_view data);

// What an image is made of. The config fields become the image config's Env, WorkingDir, User,
// Entrypoint and Cmd.
struct ImageSpec {
  std::vector<std::vector<TarEntry>> layers;
  Compression layer_compression = Compression::kGzip;
  std::vector<std::string> env = {
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
  std::string working_dir;
  std::string user;
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd = {"/bin/sh"};
  std::string architecture = "amd64";
  std::string os = "linux";
};

// The files of a built image, by their path inside the layout or tarball, in the order a tar of
// them has them. Tests may change or drop a file to make a broken image (Find, Erase).
struct ImageFiles {
  std::vector<std::pair<std::string, std::string>> files;
  // OCI: the manifest's digest (ImageInfo::digest); docker save: the config's (the image id).
  std::string digest;
  std::string config_digest;
  // Per layer: its path in `files`, the digest of its bytes as stored, and the digest of the
  // uncompressed tar (the config's diff_id).
  std::vector<std::string> layer_paths;
  std::vector<std::string> layer_digests;
  std::vector<std::string> diff_ids;

  // The content of `path`; aborts when there is none.
  std::string& Find(const std::string& path);
  void Erase(const std::string& path);
};

struct OciOptions {
  // index.json points at an image index blob that lists a linux/arm64 manifest (whose blob is
  // absent: it must never be read) before the linux/amd64 one, as multi-platform images do.
  bool nested_index = false;
};

// An OCI image layout (oci-layout, index.json, blobs/sha256/...) of `spec`.
ImageFiles BuildOciLayout(const ImageSpec& spec, const OciOptions& options = {});
// A `docker save` tarball's files in the layout before Docker 25: "<id>/layer.tar" (each
// compressed as spec.layer_compression says; docker itself writes them uncompressed), with
// "<id>/VERSION" and "<id>/json", the config as "<hex>.json", manifest.json and repositories.
ImageFiles BuildDockerSave(const ImageSpec& spec);

// Writes every file under `dir` (made, with parents, as needed).
void WriteLayoutDir(const ImageFiles& image, const std::string& dir);
// The files as one tarball (their directories included), optionally compressed as a whole.
std::string PackTar(const ImageFiles& image, Compression compression = Compression::kNone);

// Writes `data` to `path` (created or truncated, mode 0644).
void WriteFileOrDie(const std::string& path, std::string_view data);
// The whole content of `path`.
std::string ReadFileOrDie(const std::string& path);

// Where Debian's busybox-static is; BusyboxRootfs needs it.
inline constexpr const char* kBusybox = "/bin/busybox";
bool HaveBusybox();
// The entries of a minimal root file system: /bin/busybox (read from kBusybox) and symlinks to
// it for the usual commands (sh, ls, cat, echo, env, id, ...; /usr/bin/env too), /etc/passwd and
// /etc/group with root and nobody, and the directories /tmp (1777), /root (0700), /usr/bin,
// /usr/sbin, /sbin, /home, /dev, /proc, /sys, /var/tmp. Names have no "./" prefix.
std::vector<TarEntry> BusyboxRootfs();
// The commands BusyboxRootfs links to busybox, under /bin.
const std::vector<std::string>& BusyboxCommands();

}  // namespace nsbox::testutil

#include "tests/common/image_builder.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>

// The static link of libarchive's pax writer needs this helper without the by-code table of
// every write format beside it (which drags in the xar writer and libxml2): see the comment at
// its definition in images/store.cc. Weak here, since a test that also links the store's object
// gets that definition.
extern "C" void __archive_write_entry_filetype_unsupported(struct archive* a,
                                                           struct archive_entry* entry,
                                                           const char* format);
extern "C" __attribute__((weak)) void __archive_write_entry_filetype_unsupported(
    struct archive* a, struct archive_entry* entry, const char* format) {
  const char* path = archive_entry_pathname(entry);
  archive_set_error(a, EILSEQ, "%s: %s format cannot archive files with mode 0%lo",
                    path != nullptr ? path : "?", format,
                    static_cast<unsigned long>(archive_entry_mode(entry)));
}

namespace nsbox::testutil {

namespace json = boost::json;

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "image_builder: %s\n", what.c_str());
  std::abort();
}

std::string Hex(const uint8_t* bytes, size_t size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 15];
  }
  return out;
}

// The hex part of a "sha256:..." digest.
std::string HexOf(const std::string& digest) { return digest.substr(7); }

la_ssize_t AppendToString(struct archive*, void* client, const void* buffer, size_t length) {
  static_cast<std::string*>(client)->append(static_cast<const char*>(buffer), length);
  return static_cast<la_ssize_t>(length);
}

struct WriterFree {
  void operator()(struct archive* a) const { archive_write_free(a); }
};
using Writer = std::unique_ptr<struct archive, WriterFree>;

// A libarchive writer into `out`: pax, or raw (no format: the bytes as given, only compressed).
Writer NewWriter(std::string* out, Compression compression, bool raw) {
  Writer a(archive_write_new());
  if (raw) {
    archive_write_set_format_raw(a.get());
  } else {
    archive_write_set_format_pax_restricted(a.get());
  }
  int rc = ARCHIVE_OK;
  switch (compression) {
    case Compression::kNone:
      rc = archive_write_add_filter_none(a.get());
      break;
    case Compression::kGzip:
      rc = archive_write_add_filter_gzip(a.get());
      break;
    case Compression::kZstd:
      rc = archive_write_add_filter_zstd(a.get());
      break;
  }
  if (rc != ARCHIVE_OK) Die(std::string("add filter: ") + archive_error_string(a.get()));
  // No padding of the last block to 10240 bytes: after a compressor it would be trailing
  // garbage (zstd refuses it), and OCI tools (Go's archive/tar) do not pad either.
  archive_write_set_bytes_in_last_block(a.get(), 1);
  if (archive_write_open(a.get(), out, nullptr, &AppendToString, nullptr) != ARCHIVE_OK) {
    Die(std::string("archive_write_open: ") + archive_error_string(a.get()));
  }
  return a;
}

void Close(struct archive* a) {
  if (archive_write_close(a) != ARCHIVE_OK) {
    Die(std::string("archive_write_close: ") + archive_error_string(a));
  }
}

std::string LayerMediaType(Compression c) {
  switch (c) {
    case Compression::kNone:
      return "application/vnd.oci.image.layer.v1.tar";
    case Compression::kGzip:
      return "application/vnd.oci.image.layer.v1.tar+gzip";
    case Compression::kZstd:
      return "application/vnd.oci.image.layer.v1.tar+zstd";
  }
  return "";
}

json::array Strings(const std::vector<std::string>& v) {
  json::array a;
  for (const std::string& s : v) a.emplace_back(s);
  return a;
}

// The image config (OCI and docker share it) with the layers' diff_ids.
std::string ConfigJson(const ImageSpec& spec, const std::vector<std::string>& diff_ids) {
  json::object config;
  config["Env"] = Strings(spec.env);
  if (!spec.working_dir.empty()) config["WorkingDir"] = spec.working_dir;
  if (!spec.user.empty()) config["User"] = spec.user;
  config["Entrypoint"] =
      spec.entrypoint.empty() ? json::value(nullptr) : json::value(Strings(spec.entrypoint));
  config["Cmd"] = Strings(spec.cmd);
  json::object rootfs;
  rootfs["type"] = "layers";
  rootfs["diff_ids"] = Strings(diff_ids);
  json::object o;
  o["architecture"] = spec.architecture;
  o["os"] = spec.os;
  o["created"] = "2023-11-14T22:13:20Z";
  o["config"] = std::move(config);
  o["rootfs"] = std::move(rootfs);
  return json::serialize(o);
}

json::object Descriptor(std::string_view media_type, const std::string& data) {
  json::object d;
  d["mediaType"] = media_type;
  d["digest"] = Sha256Digest(data);
  d["size"] = data.size();
  return d;
}

void MakeDirs(const std::string& path) {
  for (size_t pos = 1; pos != std::string::npos;) {
    pos = path.find('/', pos + 1);
    std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      Die("mkdir " + prefix + ": " + std::strerror(errno));
    }
  }
}

}  // namespace

TarEntry Dir(std::string path, uint32_t mode) {
  TarEntry e;
  e.type = TarEntry::Type::kDir;
  e.path = std::move(path);
  e.mode = mode;
  return e;
}

TarEntry File(std::string path, std::string content, uint32_t mode) {
  TarEntry e;
  e.type = TarEntry::Type::kFile;
  e.path = std::move(path);
  e.content = std::move(content);
  e.mode = mode;
  return e;
}

TarEntry Symlink(std::string path, std::string target) {
  TarEntry e;
  e.type = TarEntry::Type::kSymlink;
  e.path = std::move(path);
  e.target = std::move(target);
  e.mode = 0777;
  return e;
}

TarEntry Hardlink(std::string path, std::string target) {
  TarEntry e;
  e.type = TarEntry::Type::kHardlink;
  e.path = std::move(path);
  e.target = std::move(target);
  return e;
}

TarEntry Fifo(std::string path, uint32_t mode) {
  TarEntry e;
  e.type = TarEntry::Type::kFifo;
  e.path = std::move(path);
  e.mode = mode;
  return e;
}

TarEntry CharDevice(std::string path, unsigned major, unsigned minor) {
  TarEntry e;
  e.type = TarEntry::Type::kCharDevice;
  e.path = std::move(path);
  e.mode = 0666;
  e.dev_major = major;
  e.dev_minor = minor;
  return e;
}

TarEntry Whiteout(std::string_view path) {
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string_view::npos ? "" : std::string(path.substr(0, slash + 1));
  std::string name(slash == std::string_view::npos ? path : path.substr(slash + 1));
  return File(dir + ".wh." + name, "");
}

TarEntry OpaqueWhiteout(std::string_view dir) {
  std::string d(dir);
  if (!d.empty() && d.back() != '/') d += '/';
  return File(d + ".wh..wh..opq", "");
}

std::string MakeTar(const std::vector<TarEntry>& entries, Compression compression) {
  std::string out;
  Writer a = NewWriter(&out, compression, /*raw=*/false);
  for (const TarEntry& t : entries) {
    std::unique_ptr<struct archive_entry, void (*)(struct archive_entry*)> e(archive_entry_new(),
                                                                             archive_entry_free);
    archive_entry_set_pathname(e.get(), t.path.c_str());
    archive_entry_set_perm(e.get(), t.mode);
    archive_entry_set_uid(e.get(), t.uid);
    archive_entry_set_gid(e.get(), t.gid);
    archive_entry_set_mtime(e.get(), t.mtime, 0);
    archive_entry_set_size(e.get(), 0);
    switch (t.type) {
      case TarEntry::Type::kDir:
        archive_entry_set_filetype(e.get(), AE_IFDIR);
        break;
      case TarEntry::Type::kFile:
        archive_entry_set_filetype(e.get(), AE_IFREG);
        archive_entry_set_size(e.get(), static_cast<la_int64_t>(t.content.size()));
        break;
      case TarEntry::Type::kSymlink:
        archive_entry_set_filetype(e.get(), AE_IFLNK);
        archive_entry_set_symlink(e.get(), t.target.c_str());
        break;
      case TarEntry::Type::kHardlink:
        archive_entry_set_filetype(e.get(), AE_IFREG);
        archive_entry_set_hardlink(e.get(), t.target.c_str());
        break;
      case TarEntry::Type::kFifo:
        archive_entry_set_filetype(e.get(), AE_IFIFO);
        break;
      case TarEntry::Type::kCharDevice:
      case TarEntry::Type::kBlockDevice:
        archive_entry_set_filetype(e.get(),
                                   t.type == TarEntry::Type::kCharDevice ? AE_IFCHR : AE_IFBLK);
        archive_entry_set_rdevmajor(e.get(), t.dev_major);
        archive_entry_set_rdevminor(e.get(), t.dev_minor);
        break;
    }
    for (const auto& [name, value] : t.xattrs) {
      archive_entry_xattr_add_entry(e.get(), name.c_str(), value.data(), value.size());
    }
    // ARCHIVE_WARN: a name the C locale cannot convert, written as bytes; fine for tests.
    if (archive_write_header(a.get(), e.get()) < ARCHIVE_WARN) {
      Die("write header " + t.path + ": " + archive_error_string(a.get()));
    }
    if (t.type == TarEntry::Type::kFile && !t.content.empty() &&
        archive_write_data(a.get(), t.content.data(), t.content.size()) < 0) {
      Die("write data " + t.path + ": " + archive_error_string(a.get()));
    }
  }
  Close(a.get());
  return out;
}

std::string Compress(std::string_view data, Compression compression) {
  if (compression == Compression::kNone) return std::string(data);
  std::string out;
  Writer a = NewWriter(&out, compression, /*raw=*/true);
  std::unique_ptr<struct archive_entry, void (*)(struct archive_entry*)> e(archive_entry_new(),
                                                                           archive_entry_free);
  archive_entry_set_pathname(e.get(), "data");
  archive_entry_set_filetype(e.get(), AE_IFREG);
  archive_entry_set_size(e.get(), static_cast<la_int64_t>(data.size()));
  if (archive_write_header(a.get(), e.get()) < ARCHIVE_WARN ||
      (!data.empty() && archive_write_data(a.get(), data.data(), data.size()) < 0)) {
    Die(std::string("compress: ") + archive_error_string(a.get()));
  }
  Close(a.get());
  return out;
}

std::string Sha256Digest(std::string_view data) {
  struct sha256_ctx ctx;
  sha256_init(&ctx);
  sha256_update(&ctx, data.size(), reinterpret_cast<const uint8_t*>(data.data()));
  uint8_t out[SHA256_DIGEST_SIZE];
  sha256_digest(&ctx, sizeof out, out);
  return "sha256:" + Hex(out, sizeof out);
}

std::string& ImageFiles::Find(const std::string& path) {
  for (auto& [p, data] : files) {
    if (p == path) return data;
  }
  Die("the image has no file " + path);
}

void ImageFiles::Erase(const std::string& path) {
  for (auto it = files.begin(); it != files.end(); ++it) {
    if (it->first == path) {
      files.erase(it);
      return;
    }
  }
  Die("the image has no file " + path);
}

ImageFiles BuildOciLayout(const ImageSpec& spec, const OciOptions& options) {
  ImageFiles image;
  auto add_blob = [&](const std::string& data) {
    std::string path = "blobs/sha256/" + HexOf(Sha256Digest(data));
    for (const auto& [p, d] : image.files) {
      if (p == path) return path;  // the same content once, as in a real layout
    }
    image.files.emplace_back(path, data);
    return path;
  };
  image.files.emplace_back("oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
  json::array layers;
  for (const std::vector<TarEntry>& entries : spec.layers) {
    std::string tar = MakeTar(entries);
    image.diff_ids.push_back(Sha256Digest(tar));
    std::string blob = Compress(tar, spec.layer_compression);
    image.layer_digests.push_back(Sha256Digest(blob));
    image.layer_paths.push_back(add_blob(blob));
    layers.push_back(Descriptor(LayerMediaType(spec.layer_compression), blob));
  }
  std::string config = ConfigJson(spec, image.diff_ids);
  image.config_digest = Sha256Digest(config);
  add_blob(config);
  json::object manifest;
  manifest["schemaVersion"] = 2;
  manifest["mediaType"] = "application/vnd.oci.image.manifest.v1+json";
  manifest["config"] = Descriptor("application/vnd.oci.image.config.v1+json", config);
  manifest["layers"] = std::move(layers);
  std::string manifest_text = json::serialize(manifest);
  image.digest = Sha256Digest(manifest_text);
  add_blob(manifest_text);

  json::object top = Descriptor("application/vnd.oci.image.manifest.v1+json", manifest_text);
  top["annotations"] = json::object{{"org.opencontainers.image.ref.name", "latest"}};
  if (options.nested_index) {
    json::object arm = Descriptor("application/vnd.oci.image.manifest.v1+json", "not here");
    arm["platform"] = json::object{{"architecture", "arm64"}, {"os", "linux"}};
    json::object amd = Descriptor("application/vnd.oci.image.manifest.v1+json", manifest_text);
    amd["platform"] = json::object{{"architecture", "amd64"}, {"os", "linux"}};
    json::object nested;
    nested["schemaVersion"] = 2;
    nested["mediaType"] = "application/vnd.oci.image.index.v1+json";
    nested["manifests"] = json::array{arm, amd};
    std::string nested_text = json::serialize(nested);
    add_blob(nested_text);
    top = Descriptor("application/vnd.oci.image.index.v1+json", nested_text);
  }
  json::object index;
  index["schemaVersion"] = 2;
  index["mediaType"] = "application/vnd.oci.image.index.v1+json";
  index["manifests"] = json::array{top};
  image.files.emplace_back("index.json", json::serialize(index));
  return image;
}

ImageFiles BuildDockerSave(const ImageSpec& spec) {
  ImageFiles image;
  json::array layer_names;
  std::string parent;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    std::string tar = MakeTar(spec.layers[i]);
    image.diff_ids.push_back(Sha256Digest(tar));
    std::string blob = Compress(tar, spec.layer_compression);
    image.layer_digests.push_back(Sha256Digest(blob));
    // The legacy "v1 id" of a layer: any hex string; docker derives it from the chain.
    std::string id = HexOf(Sha256Digest(parent + image.diff_ids.back()));
    image.files.emplace_back(id + "/VERSION", "1.0");
    json::object v1;
    v1["id"] = id;
    if (!parent.empty()) v1["parent"] = parent;
    image.files.emplace_back(id + "/json", json::serialize(v1));
    image.files.emplace_back(id + "/layer.tar", blob);
    image.layer_paths.push_back(id + "/layer.tar");
    layer_names.emplace_back(id + "/layer.tar");
    parent = id;
  }
  std::string config = ConfigJson(spec, image.diff_ids);
  image.config_digest = Sha256Digest(config);
  image.digest = image.config_digest;
  const std::string config_name = HexOf(image.config_digest) + ".json";
  image.files.emplace_back(config_name, config);
  json::object entry;
  entry["Config"] = config_name;
  entry["RepoTags"] = json::array{"nsbox-test:latest"};
  entry["Layers"] = std::move(layer_names);
  image.files.emplace_back("manifest.json", json::serialize(json::array{entry}));
  json::object tags{{"latest", parent}};
  image.files.emplace_back("repositories", json::serialize(json::object{{"nsbox-test", tags}}));
  return image;
}

void WriteLayoutDir(const ImageFiles& image, const std::string& dir) {
  MakeDirs(dir);
  for (const auto& [path, data] : image.files) {
    std::string full = dir + "/" + path;
    MakeDirs(full.substr(0, full.rfind('/')));
    WriteFileOrDie(full, data);
  }
}

std::string PackTar(const ImageFiles& image, Compression compression) {
  std::vector<TarEntry> entries;
  std::set<std::string> dirs;
  for (const auto& [path, data] : image.files) {
    for (size_t slash = path.find('/'); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      std::string dir = path.substr(0, slash);
      if (dirs.insert(dir).second) entries.push_back(Dir(dir));
    }
    entries.push_back(File(path, data));
  }
  return MakeTar(entries, compression);
}

void WriteFileOrDie(const std::string& path, std::string_view data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Die("open " + path + ": " + std::strerror(errno));
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) Die("write " + path + ": " + std::strerror(errno));
    data.remove_prefix(static_cast<size_t>(n));
  }
  ::close(fd);  // a test helper's own fd: nothing to report on close of a regular file
}

std::string ReadFileOrDie(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("open " + path + ": " + std::strerror(errno));
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Die("read " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);  // see WriteFileOrDie
  return out;
}

bool HaveBusybox() { return ::access(kBusybox, X_OK) == 0; }

const std::vector<std::string>& BusyboxCommands() {
  static const std::vector<std::string> kCommands = {
      "sh",      "ash",      "ls",    "cat",  "echo",   "mkdir", "rm",       "rmdir", "touch",
      "test",    "[",        "env",   "id",   "printf", "sleep", "pwd",      "true",  "false",
      "head",    "tail",     "wc",    "grep", "sed",    "sort",  "uname",    "ps",    "kill",
      "chmod",   "chown",    "ln",    "cp",   "mv",     "stat",  "readlink", "dd",    "date",
      "whoami",  "hostname", "mount", "cut",  "tr",     "find",  "xargs",    "seq",   "basename",
      "dirname", "tee",      "yes",   "du",   "df",     "nproc", "timeout",  "nice",  "sync"};
  return kCommands;
}

std::vector<TarEntry> BusyboxRootfs() {
  if (!HaveBusybox()) Die(std::string(kBusybox) + " is missing (Debian's busybox-static)");
  std::vector<TarEntry> entries = {
      Dir("bin"),  Dir("sbin"),           Dir("etc"),
      Dir("usr"),  Dir("usr/bin"),        Dir("usr/sbin"),
      Dir("home"), Dir("root", 0700),     Dir("tmp", 01777),
      Dir("dev"),  Dir("proc"),           Dir("sys"),
      Dir("var"),  Dir("var/tmp", 01777),
  };
  entries.push_back(File("bin/busybox", ReadFileOrDie(kBusybox), 0755));
  // Absolute targets, as `busybox --install -s` makes them; they resolve inside the sandbox.
  for (const std::string& cmd : BusyboxCommands()) {
    entries.push_back(Symlink("bin/" + cmd, "/bin/busybox"));
  }
  entries.push_back(Symlink("usr/bin/env", "/bin/busybox"));
  entries.push_back(File("etc/passwd",
                         "root:x:0:0:root:/root:/bin/sh\n"
                         "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"));
  entries.push_back(File("etc/group", "root:x:0:\nnogroup:x:65534:\n"));
  entries.push_back(File("etc/os-release", "NAME=\"nsbox test busybox\"\nID=busybox\n"));
  return entries;
}

}  // namespace nsbox::testutil

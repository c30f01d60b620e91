#include "images/import_plan.h"

#include <algorithm>
#include <boost/json.hpp>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "base/strings.h"
#include "images/import.h"

namespace nsbox::images::internal {

namespace json = boost::json;

namespace {

// An index may point at an index (a platform list inside a layout's index.json); never deeper
// than this in practice.
constexpr int kMaxIndexNesting = 4;

#if defined(__x86_64__)
constexpr std::string_view kHostArch = "amd64";
#elif defined(__aarch64__)
constexpr std::string_view kHostArch = "arm64";
#else
#error "nsbox images: add the OCI architecture name of this target"
#endif

constexpr std::string_view kOciIndexType = "application/vnd.oci.image.index.v1+json";
constexpr std::string_view kDockerListType =
    "application/vnd.docker.distribution.manifest.list.v2+json";
constexpr std::string_view kOciManifestType = "application/vnd.oci.image.manifest.v1+json";
constexpr std::string_view kDockerManifestType =
    "application/vnd.docker.distribution.manifest.v2+json";
// Layer media types; which compression a layer has is detected from its bytes either way.
constexpr std::string_view kLayerTypes[] = {
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
};

// ---- JSON ----

Result<json::value> ParseJson(std::string_view text, std::string_view what) {
  boost::system::error_code ec;
  json::value v = json::parse(json::string_view(text.data(), text.size()), ec);
  if (ec) return BadInput(std::string(what) + " is not valid JSON: " + ec.message());
  return v;
}

Result<const json::object*> ObjectOf(const json::value& v, std::string_view what) {
  if (!v.is_object()) return BadInput(std::string(what) + " is not a JSON object");
  return &v.get_object();
}

// An optional string member: "" when absent or null.
Result<std::string> OptString(const json::object& o, std::string_view key, std::string_view what) {
  const json::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::string();
  if (!v->is_string()) {
    return BadInput(std::string(what) + ": \"" + std::string(key) + "\" is not a string");
  }
  return std::string(v->get_string());
}

// An optional array of strings: empty when absent or null.
Result<std::vector<std::string>> OptStrings(const json::object& o, std::string_view key,
                                            std::string_view what) {
  std::vector<std::string> out;
  const json::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return out;
  if (!v->is_array()) {
    return BadInput(std::string(what) + ": \"" + std::string(key) + "\" is not an array");
  }
  for (const json::value& item : v->get_array()) {
    if (!item.is_string()) {
      return BadInput(std::string(what) + ": \"" + std::string(key) +
                      "\" holds something that is not a string");
    }
    out.emplace_back(item.get_string());
  }
  return out;
}

// An OCI content descriptor (also Docker's, which has the same shape).
struct Descriptor {
  std::string media_type;
  std::string digest;
  std::optional<uint64_t> size;
  std::string os;
  std::string architecture;
  bool attestation = false;  // buildx's provenance/SBOM entries of an index: not images
};

Result<Descriptor> ParseDescriptor(const json::value& v, std::string_view what) {
  NSBOX_ASSIGN_OR_RETURN(const json::object* o, ObjectOf(v, what));
  Descriptor d;
  NSBOX_ASSIGN_OR_RETURN(d.media_type, OptString(*o, "mediaType", what));
  NSBOX_ASSIGN_OR_RETURN(d.digest, OptString(*o, "digest", what));
  if (d.digest.empty()) return BadInput(std::string(what) + " has no digest");
  if (!IsSha256Digest(d.digest)) {
    return BadInput(std::string(what) + ": " + Quote(d.digest) +
                    " is not a sha256 digest (nsbox verifies sha256 digests only)");
  }
  if (const json::value* size = o->if_contains("size"); size != nullptr && !size->is_null()) {
    if (size->is_uint64()) {
      d.size = size->get_uint64();
    } else if (size->is_int64() && size->get_int64() >= 0) {
      d.size = static_cast<uint64_t>(size->get_int64());
    } else {
      return BadInput(std::string(what) + ": \"size\" is not a non-negative integer");
    }
  }
  if (const json::value* p = o->if_contains("platform"); p != nullptr && p->is_object()) {
    NSBOX_ASSIGN_OR_RETURN(d.os, OptString(p->get_object(), "os", what));
    NSBOX_ASSIGN_OR_RETURN(d.architecture, OptString(p->get_object(), "architecture", what));
  }
  if (const json::value* a = o->if_contains("annotations"); a != nullptr && a->is_object()) {
    const json::value* type = a->get_object().if_contains("vnd.docker.reference.type");
    d.attestation =
        type != nullptr && type->is_string() && type->get_string() == "attestation-manifest";
  }
  return d;
}

// The manifest of an index (index.json or a nested index) that nsbox unpacks: the only image,
// or the one for linux on this machine's architecture.
Result<Descriptor> ChooseManifest(const json::object& index, std::string_view what) {
  const json::value* list = index.if_contains("manifests");
  if (list == nullptr || !list->is_array()) {
    return BadInput(std::string(what) + " has no \"manifests\" array");
  }
  std::vector<Descriptor> images;
  for (const json::value& item : list->get_array()) {
    NSBOX_ASSIGN_OR_RETURN(Descriptor d, ParseDescriptor(item, std::string(what) + ": a manifest"));
    if (d.attestation || (d.os == "unknown" && d.architecture == "unknown")) continue;
    images.push_back(std::move(d));
  }
  if (images.empty()) return BadInput(std::string(what) + " lists no image manifest");
  if (images.size() == 1) return images.front();
  std::string found;
  for (const Descriptor& d : images) {
    if (d.os == "linux" && d.architecture == kHostArch) return d;
    found += (found.empty() ? "" : ", ") + (d.os.empty() ? "?" : d.os) + "/" +
             (d.architecture.empty() ? "?" : d.architecture);
  }
  return BadInput(std::string(what) + " lists " + std::to_string(images.size()) +
                  " manifests and none is for linux/" + std::string(kHostArch) + " (" + found +
                  ")");
}

// The blob of `d` in an OCI layout, checked to exist and to have the size `d` says.
Result<BlobRef> FindBlob(Source& src, const Descriptor& d, std::string_view what) {
  const std::string path = "blobs/sha256/" + d.digest.substr(7);
  NSBOX_ASSIGN_OR_RETURN(std::optional<BlobRef> blob, src.Find(path));
  if (!blob.has_value()) {
    return BadInput(std::string(what) + " " + d.digest + ": its blob " + path +
                    " is missing from the image");
  }
  if (d.size.has_value() && *d.size != blob->size) {
    return BadInput(std::string(what) + " " + d.digest + ": the blob has " +
                    std::to_string(blob->size) + " bytes, its descriptor says " +
                    std::to_string(*d.size));
  }
  return *blob;
}

// A JSON blob of an OCI layout, read and checked against its digest.
Result<std::string> ReadVerifiedBlob(Source& src, const Descriptor& d, std::string_view what) {
  NSBOX_ASSIGN_OR_RETURN(BlobRef blob, FindBlob(src, d, what));
  NSBOX_ASSIGN_OR_RETURN(BlobBytes bytes, ReadSmallBlob(blob, std::string(what) + " " + d.digest));
  if (bytes.digest != d.digest) {
    return BadInput(std::string(what) + " " + d.digest + ": digest mismatch, got " + bytes.digest);
  }
  return std::move(bytes.data);
}

// A file of the source that is not named by a digest (index.json, manifest.json), read whole.
Result<std::optional<std::string>> ReadNamedFile(Source& src, const std::string& path) {
  NSBOX_ASSIGN_OR_RETURN(std::optional<BlobRef> blob, src.Find(path));
  if (!blob.has_value()) return std::optional<std::string>();
  NSBOX_ASSIGN_OR_RETURN(BlobBytes bytes, ReadSmallBlob(*blob, path));
  return std::optional<std::string>(std::move(bytes.data));
}

struct ParsedConfig {
  ImageConfig config;
  std::vector<std::string> diff_ids;
};

// The image config (OCI and Docker share it): what ImageConfig keeps, and the layers' diff_ids.
Result<ParsedConfig> ParseImageConfig(std::string_view text, std::string_view what) {
  NSBOX_ASSIGN_OR_RETURN(json::value v, ParseJson(text, what));
  NSBOX_ASSIGN_OR_RETURN(const json::object* o, ObjectOf(v, what));
  ParsedConfig out;
  NSBOX_ASSIGN_OR_RETURN(out.config.architecture, OptString(*o, "architecture", what));
  NSBOX_ASSIGN_OR_RETURN(out.config.os, OptString(*o, "os", what));
  if (const json::value* c = o->if_contains("config"); c != nullptr && !c->is_null()) {
    const std::string cwhat = std::string(what) + ": config";
    NSBOX_ASSIGN_OR_RETURN(const json::object* co, ObjectOf(*c, cwhat));
    NSBOX_ASSIGN_OR_RETURN(out.config.env, OptStrings(*co, "Env", cwhat));
    NSBOX_ASSIGN_OR_RETURN(out.config.working_dir, OptString(*co, "WorkingDir", cwhat));
    NSBOX_ASSIGN_OR_RETURN(out.config.user, OptString(*co, "User", cwhat));
    NSBOX_ASSIGN_OR_RETURN(out.config.entrypoint, OptStrings(*co, "Entrypoint", cwhat));
    NSBOX_ASSIGN_OR_RETURN(out.config.cmd, OptStrings(*co, "Cmd", cwhat));
  }
  if (const json::value* r = o->if_contains("rootfs"); r != nullptr && !r->is_null()) {
    const std::string rwhat = std::string(what) + ": rootfs";
    NSBOX_ASSIGN_OR_RETURN(const json::object* ro, ObjectOf(*r, rwhat));
    NSBOX_ASSIGN_OR_RETURN(out.diff_ids, OptStrings(*ro, "diff_ids", rwhat));
    for (const std::string& id : out.diff_ids) {
      if (!IsSha256Digest(id)) {
        return BadInput(rwhat + ": unsupported diff_id " + Quote(id) + " (sha256 only)");
      }
    }
  }
  return out;
}

bool IsIndexType(std::string_view media_type) {
  return media_type == kOciIndexType || media_type == kDockerListType;
}

}  // namespace

Result<ImagePlan> PlanOci(Source& src) {
  ImagePlan plan;
  plan.format = "oci";
  NSBOX_ASSIGN_OR_RETURN(std::optional<std::string> layout, ReadNamedFile(src, "oci-layout"));
  if (layout.has_value()) {
    NSBOX_ASSIGN_OR_RETURN(json::value v, ParseJson(*layout, "oci-layout"));
    NSBOX_ASSIGN_OR_RETURN(const json::object* o, ObjectOf(v, "oci-layout"));
    NSBOX_ASSIGN_OR_RETURN(std::string version, OptString(*o, "imageLayoutVersion", "oci-layout"));
    if (version.rfind("1.", 0) != 0) {
      return BadInput("oci-layout: unsupported imageLayoutVersion " + Quote(version));
    }
  }
  NSBOX_ASSIGN_OR_RETURN(std::optional<std::string> index_text, ReadNamedFile(src, "index.json"));
  if (!index_text.has_value()) return BadInput("the OCI layout has no index.json");
  NSBOX_ASSIGN_OR_RETURN(json::value index, ParseJson(*index_text, "index.json"));
  NSBOX_ASSIGN_OR_RETURN(const json::object* index_obj, ObjectOf(index, "index.json"));
  NSBOX_ASSIGN_OR_RETURN(Descriptor d, ChooseManifest(*index_obj, "index.json"));

  json::value manifest;
  for (int depth = 0;; ++depth) {
    const std::string what = IsIndexType(d.media_type) ? "image index" : "manifest";
    NSBOX_ASSIGN_OR_RETURN(std::string text, ReadVerifiedBlob(src, d, what));
    NSBOX_ASSIGN_OR_RETURN(manifest, ParseJson(text, what + " " + d.digest));
    NSBOX_ASSIGN_OR_RETURN(const json::object* o, ObjectOf(manifest, what + " " + d.digest));
    // An index is told by its content too: media types are optional in an index's descriptors.
    if (!o->contains("manifests")) break;
    if (depth == kMaxIndexNesting) {
      return BadInput("image index " + d.digest + ": indexes nested more than " +
                      std::to_string(kMaxIndexNesting) + " deep");
    }
    NSBOX_ASSIGN_OR_RETURN(d, ChooseManifest(*o, "image index " + d.digest));
  }
  const std::string mwhat = "manifest " + d.digest;
  const json::object& m = manifest.get_object();
  NSBOX_ASSIGN_OR_RETURN(std::string media_type, OptString(m, "mediaType", mwhat));
  if (media_type.empty()) media_type = d.media_type;
  if (!media_type.empty() && media_type != kOciManifestType && media_type != kDockerManifestType) {
    return BadInput(mwhat + ": unsupported media type " + Quote(media_type));
  }
  if (const json::value* sv = m.if_contains("schemaVersion");
      sv != nullptr && !(sv->is_int64() && sv->get_int64() == 2)) {
    return BadInput(mwhat + ": only schemaVersion 2 manifests are supported");
  }
  const json::value* config_v = m.if_contains("config");
  if (config_v == nullptr) return BadInput(mwhat + " has no config");
  NSBOX_ASSIGN_OR_RETURN(Descriptor config_d, ParseDescriptor(*config_v, mwhat + ": config"));
  const json::value* layers_v = m.if_contains("layers");
  if (layers_v == nullptr || !layers_v->is_array()) {
    return BadInput(mwhat + " has no \"layers\" array");
  }
  plan.digest = d.digest;

  NSBOX_ASSIGN_OR_RETURN(std::string config_text, ReadVerifiedBlob(src, config_d, "config"));
  NSBOX_ASSIGN_OR_RETURN(ParsedConfig config,
                         ParseImageConfig(config_text, "config " + config_d.digest));
  plan.config = std::move(config.config);

  const json::array& layers = layers_v->get_array();
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string what = "layer " + std::to_string(i + 1);
    NSBOX_ASSIGN_OR_RETURN(Descriptor ld, ParseDescriptor(layers[i], mwhat + ": " + what));
    if (!ld.media_type.empty() && std::find(std::begin(kLayerTypes), std::end(kLayerTypes),
                                            ld.media_type) == std::end(kLayerTypes)) {
      return BadInput(what + " " + ld.digest + ": unsupported media type " + Quote(ld.media_type));
    }
    LayerPlan layer;
    layer.label = ld.digest;
    NSBOX_ASSIGN_OR_RETURN(layer.blob, FindBlob(src, ld, what));
    layer.digest = ld.digest;
    // The config's diff_ids are checked where they cost nothing (uncompressed layers, whose
    // digest is their diff_id); a compressed layer is already bound to the manifest by its
    // digest.
    if (config.diff_ids.size() == layers.size()) layer.diff_id = config.diff_ids[i];
    plan.layers.push_back(std::move(layer));
  }
  return plan;
}

namespace {

// "<64 hex>" from a docker save member name that carries its digest: "blobs/sha256/<hex>"
// (Docker 25 and later) or "<hex>.json" (the config of older versions); "" otherwise.
std::string DigestFromMemberName(std::string_view name) {
  std::string key = MemberKey(name);
  std::string_view k = key;
  if (k.size() == 13 + 64 && k.substr(0, 13) == "blobs/sha256/" && IsHex(k.substr(13))) {
    return "sha256:" + std::string(k.substr(13));
  }
  if (k.size() == 64 + 5 && k.substr(64) == ".json" && IsHex(k.substr(0, 64))) {
    return "sha256:" + std::string(k.substr(0, 64));
  }
  return "";
}

}  // namespace

Result<ImagePlan> PlanDocker(Source& src) {
  ImagePlan plan;
  plan.format = "docker";
  NSBOX_ASSIGN_OR_RETURN(std::optional<std::string> text, ReadNamedFile(src, "manifest.json"));
  if (!text.has_value()) return BadInput("the docker save tarball has no manifest.json");
  NSBOX_ASSIGN_OR_RETURN(json::value v, ParseJson(*text, "manifest.json"));
  if (!v.is_array()) return BadInput("manifest.json is not a JSON array");
  const json::array& images = v.get_array();
  if (images.size() != 1) {
    return BadInput("manifest.json lists " + std::to_string(images.size()) +
                    " images; nsbox imports a tarball of exactly one (docker save one image)");
  }
  NSBOX_ASSIGN_OR_RETURN(const json::object* entry, ObjectOf(images[0], "manifest.json[0]"));
  NSBOX_ASSIGN_OR_RETURN(std::string config_name, OptString(*entry, "Config", "manifest.json"));
  if (config_name.empty()) return BadInput("manifest.json names no Config");
  NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> layer_names,
                         OptStrings(*entry, "Layers", "manifest.json"));

  NSBOX_ASSIGN_OR_RETURN(std::optional<BlobRef> config_blob, src.Find(config_name));
  if (!config_blob.has_value()) {
    return BadInput("config " + Quote(config_name) + ": named by manifest.json but missing");
  }
  NSBOX_ASSIGN_OR_RETURN(BlobBytes config_bytes,
                         ReadSmallBlob(*config_blob, "config " + Quote(config_name)));
  if (std::string want = DigestFromMemberName(config_name);
      !want.empty() && want != config_bytes.digest) {
    return BadInput("config " + Quote(config_name) + ": digest mismatch, got " +
                    config_bytes.digest);
  }
  plan.digest = config_bytes.digest;
  NSBOX_ASSIGN_OR_RETURN(ParsedConfig config,
                         ParseImageConfig(config_bytes.data, "config " + Quote(config_name)));
  plan.config = std::move(config.config);
  if (!config.diff_ids.empty() && config.diff_ids.size() != layer_names.size()) {
    return BadInput("config " + Quote(config_name) + " lists " +
                    std::to_string(config.diff_ids.size()) + " diff_ids for " +
                    std::to_string(layer_names.size()) + " layers");
  }
  uint64_t unverified = 0;
  for (size_t i = 0; i < layer_names.size(); ++i) {
    LayerPlan layer;
    layer.label = layer_names[i];
    NSBOX_ASSIGN_OR_RETURN(std::optional<BlobRef> blob, src.Find(layer_names[i]));
    if (!blob.has_value()) {
      return BadInput("layer " + std::to_string(i + 1) + " " + Quote(layer_names[i]) +
                      ": named by manifest.json but missing from the tarball");
    }
    layer.blob = *blob;
    layer.digest = DigestFromMemberName(layer_names[i]);
    if (!config.diff_ids.empty()) layer.diff_id = config.diff_ids[i];
    if (layer.digest.empty() && layer.diff_id.empty()) ++unverified;
    plan.layers.push_back(std::move(layer));
  }
  if (unverified > 0) {
    plan.warnings.push_back(Plural(unverified, "layer", "layers") +
                            " not verified: no digest in the member name, no diff_ids in the "
                            "config");
  }
  return plan;
}

}  // namespace nsbox::images::internal

#pragma once

// Internal to images/: the plan of an import, read from an OCI layout or a docker save tarball
// (import_plan.cc): which blobs are its layers, what they must hash to, and its config.

#include <string>
#include <vector>

#include "base/error.h"
#include "images/import_source.h"
#include "images/store.h"

namespace nsbox::images::internal {

// ---- the plan: which blobs are the layers, and what they must hash to ----

struct LayerPlan {
  std::string label;  // how messages name it: its digest, or its member path (docker save)
  BlobRef blob;
  std::string digest;   // the blob's expected "sha256:...", "" when nothing names it
  std::string diff_id;  // the uncompressed tar's expected digest, "" when unknown
};

struct ImagePlan {
  std::string format;
  std::string digest;
  ImageConfig config;
  std::vector<LayerPlan> layers;
  std::vector<std::string> warnings;
};

// index.json -> [nested index ->] manifest -> config and layers. Every blob found and sized
// before the first layer is applied, so a layout with a missing blob fails before any work.
Result<ImagePlan> PlanOci(Source& src);

// manifest.json -> config and layers. docker save's older layout names layers "<id>/layer.tar",
// which is no digest: those are checked against the config's diff_ids (the sha256 of the
// uncompressed layer), and the config against its file name (the image id is its digest).
Result<ImagePlan> PlanDocker(Source& src);

}  // namespace nsbox::images::internal

#pragma once

#include <string>
#include <string_view>

#include "base/error.h"
#include "isolate/mount_plan.h"

namespace nsbox::images {

// A root file system a jail can run on.
struct Image {
  std::string name;
  isolate::RootSpec root;
  std::string shell;  // "/bin/bash" when the image has bash, else "/bin/sh"
};

// The default image, "host": the host's /usr bound read-only, with /bin, /sbin and /lib* laid
// out as the host lays them out (merged-/usr symlinks reproduced as symlinks, real directories
// bound read-only). It starts instantly and cannot be changed from inside.
inline constexpr std::string_view kHostImage = "host";

// The image called `name`; an error naming it when there is no such image.
Result<Image> ResolveImage(std::string_view name);

// The host image read from the layout under `host_root` ("/" in production; a temp dir in tests).
Result<Image> HostImage(const std::string& host_root);

}  // namespace nsbox::images

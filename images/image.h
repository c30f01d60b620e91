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

// The image called `name`; an error naming it when there is no such image. Only "host": the
// imported images are the daemon's (images/store.h), which runs them with OverlayImage.
Result<Image> ResolveImage(std::string_view name);

// The shell of the root file system at `root_fd` (an unpacked image): "/bin/bash" when
// usr/bin/bash or bin/bash, looked up inside it (its absolute symlinks resolve inside, never on
// the host), is an executable file, else "/bin/sh".
std::string ShellIn(int root_fd);

// An imported image as the root of one sandbox: an overlay of its unpacked root file system
// (`overlay.lower`) and the sandbox's own upper layer. The shell is bash when the sandbox's
// root has one now (the upper layer first: it may have installed or removed it), else sh.
Result<Image> OverlayImage(std::string_view name, const isolate::RootSpec::Overlay& overlay);

// The host image read from the layout under `host_root` ("/" in production; a temp dir in tests).
Result<Image> HostImage(const std::string& host_root);

}  // namespace nsbox::images

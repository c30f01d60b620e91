#pragma once

// What `nsbox serve` checks before it touches anything: the layers without which no sandbox can
// start here (the required rows of `nsbox doctor` that the kernel decides), so that a host with
// user namespaces disabled, or a kernel too old, gets one message naming the cause and the fix
// and an exit status systemd does not restart (kExitHostUnfit), rather than a daemon whose every
// creation fails.

#include <string>
#include <vector>

#include "base/features.h"
#include "runtime/doctor.h"

namespace nsbox::runtime {

// The required kernel layers of DoctorLayers that are not "ok", from `features` alone (no
// probe here: tests give made-up hosts).
std::vector<DoctorLayer> MissingPrerequisites(const Features& features);

// One line per layer: "user namespaces: <what is missing>; fix: <how>".
std::string DescribeMissing(const std::vector<DoctorLayer>& missing);

}  // namespace nsbox::runtime

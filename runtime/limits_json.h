// A sandbox's limits as JSON: the same object in config.json (registry_config.cc's EncodeConfig)
// and in the API's answers (runtime/api/json_shapes.cc's SandboxJson), a key a limit that is set.
#pragma once

#include <boost/json.hpp>

#include "runtime/registry.h"

namespace nsbox::runtime {

boost::json::object LimitsJson(const SandboxLimits& limits);

}  // namespace nsbox::runtime

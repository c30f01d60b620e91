#pragma once

// The log facade: nsbox code logs through these, never through spdlog directly, so the sink and
// format are chosen in one place. Logs go to stderr.

#include <spdlog/spdlog.h>

#include <string_view>

#include "base/error.h"

namespace nsbox::log {

// "trace", "debug", "info", "warn", "error", "off"; an unknown name is an error.
Status SetLevel(std::string_view level);

using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::log;  // at a level chosen at run time
using spdlog::trace;
using spdlog::warn;

}  // namespace nsbox::log

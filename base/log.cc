#include "base/log.h"

// spdlog is compiled here, once (SPDLOG_COMPILED_LIB, cmake/Dependencies.cmake): its
// implementation headers, which header-only use makes every file that logs compile again (6 of
// the 10 s a small file takes), and the sinks nsbox uses. Debian's libspdlog.so cannot serve: the
// nsbox binaries are static.
#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/sinks/stdout_color_sinks-inl.h>
#include <spdlog/sinks/stdout_sinks-inl.h>
#include <spdlog/spdlog-inl.h>

#include <string>

namespace nsbox::log {

Status SetLevel(std::string_view level) {
  auto lvl = spdlog::level::from_str(std::string(level));
  // from_str answers "off" for any unknown name; only the word "off" itself may mean that.
  if (lvl == spdlog::level::off && level != "off") {
    return Error::Msg("unknown log level '" + std::string(level) +
                      "' (expected trace, debug, info, warn, error or off)");
  }
  static bool configured = [] {
    auto logger = spdlog::stderr_logger_st("nsbox");
    logger->set_pattern("nsbox: %^%l%$: %v");
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)configured;
  spdlog::set_level(lvl);
  return Ok();
}

}  // namespace nsbox::log

#include "base/log.h"

#include <spdlog/sinks/stdout_sinks.h>

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

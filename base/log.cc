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

#include <memory>
#include <string>

#include "base/strings.h"

namespace nsbox::log {

namespace {

// Formats as `inner` does, with the message's control bytes escaped (EscapeControl): a message
// quotes names from images, from inside sandboxes and from API clients, and one with a newline
// and "nsbox: info: ..." after it would otherwise forge a line of the daemon's log, one with
// escape sequences act on the terminal that shows it. Here, once, so that no caller can forget.
class EscapingFormatter final : public spdlog::formatter {
 public:
  explicit EscapingFormatter(std::unique_ptr<spdlog::formatter> inner) : inner_(std::move(inner)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    if (!NeedsEscape(payload)) return inner_->format(msg, dest);
    const std::string escaped = EscapeControl(payload);
    spdlog::details::log_msg copy = msg;
    copy.payload = spdlog::string_view_t(escaped.data(), escaped.size());
    inner_->format(copy, dest);
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<EscapingFormatter>(inner_->clone());
  }

 private:
  std::unique_ptr<spdlog::formatter> inner_;
};

}  // namespace

Status SetLevel(std::string_view level) {
  auto lvl = spdlog::level::from_str(std::string(level));
  // from_str answers "off" for any unknown name; only the word "off" itself may mean that.
  if (lvl == spdlog::level::off && level != "off") {
    return Error::Msg("unknown log level '" + std::string(level) +
                      "' (expected trace, debug, info, warn, error or off)");
  }
  static bool configured = [] {
    auto logger = spdlog::stderr_logger_st("nsbox");
    logger->set_formatter(std::make_unique<EscapingFormatter>(
        std::make_unique<spdlog::pattern_formatter>("nsbox: %^%l%$: %v")));
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)configured;
  spdlog::set_level(lvl);
  return Ok();
}

}  // namespace nsbox::log

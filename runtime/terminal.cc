#include "runtime/terminal.h"

#include <sys/ioctl.h>
#include <unistd.h>

namespace nsbox::runtime {

RawTerminal::RawTerminal(int fd) : fd_(fd) {
  if (::isatty(fd_) && ::tcgetattr(fd_, &saved_) == 0) {
    struct termios raw = saved_;
    ::cfmakeraw(&raw);
    active_ = ::tcsetattr(fd_, TCSANOW, &raw) == 0;
  }
}

RawTerminal::~RawTerminal() {
  // TCSADRAIN: what was written before (the command's last output) is shown in raw mode as it
  // was meant, then the line discipline comes back.
  if (active_) ::tcsetattr(fd_, TCSADRAIN, &saved_);
}

std::optional<WindowSize> TerminalSize(int fd) {
  struct winsize ws {};
  if (::ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_row == 0 || ws.ws_col == 0) return std::nullopt;
  return WindowSize{ws.ws_row, ws.ws_col};
}

}  // namespace nsbox::runtime

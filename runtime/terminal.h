#pragma once

// The caller's terminal, for the commands that relay one: `nsbox run --tty`, `nsbox shell` and
// `nsbox exec -t`.

#include <termios.h>

#include <cstdint>
#include <optional>

namespace nsbox::runtime {

// Puts the terminal on `fd` in raw mode (no echo, no line editing, no signals from keys: Ctrl-C
// and Ctrl-D travel as bytes) and restores the saved mode on every way out. Does nothing when
// `fd` is not a terminal.
class RawTerminal {
 public:
  explicit RawTerminal(int fd);
  ~RawTerminal();
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;

  bool active() const { return active_; }

 private:
  int fd_;
  struct termios saved_ {};
  bool active_ = false;
};

struct WindowSize {
  uint16_t rows = 0;
  uint16_t cols = 0;
};
// The window size of the terminal on `fd` (TIOCGWINSZ); nullopt when it is not a terminal or
// reports no size (0x0, as some do before they are drawn).
std::optional<WindowSize> TerminalSize(int fd);

}  // namespace nsbox::runtime

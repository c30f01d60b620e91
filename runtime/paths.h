#pragma once

// Where nsboxd listens and keeps its state by default (api.md "Transport", design.md "State on
// disk"). Shared by the daemon and every client command, so both sides agree.

#include <string>

namespace nsbox::runtime {

// The system daemon's socket, /run/nsbox/nsboxd.sock: the default as root.
std::string SystemSocketPath();
// SystemSocketPath() as root, else $XDG_RUNTIME_DIR/nsbox/nsboxd.sock (or
// /tmp/nsbox-<uid>/nsboxd.sock when XDG_RUNTIME_DIR is unset).
std::string DefaultSocketPath();
// /var/lib/nsbox as root, else $XDG_STATE_HOME/nsbox (or ~/.local/state/nsbox).
std::string DefaultStateDir();

}  // namespace nsbox::runtime

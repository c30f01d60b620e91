#pragma once

// Where nsboxd listens and keeps its state by default (api.md "Transport", design.md "State on
// disk"). Shared by the daemon and every client command, so both sides agree.

#include <string>

namespace nsbox::runtime {

// /run/nsbox/nsboxd.sock as root, else $XDG_RUNTIME_DIR/nsbox/nsboxd.sock (or
// /tmp/nsbox-<uid>/nsboxd.sock when XDG_RUNTIME_DIR is unset).
std::string DefaultSocketPath();
// /var/lib/nsbox as root, else $XDG_STATE_HOME/nsbox (or ~/.local/state/nsbox).
std::string DefaultStateDir();
// The client's socket: NSBOX_SOCKET when set, else DefaultSocketPath().
std::string ClientSocketPath();

}  // namespace nsbox::runtime

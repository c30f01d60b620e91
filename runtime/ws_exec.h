#pragma once

// The client side of the exec WebSocket (docs/exec.md): `nsbox shell` and `nsbox exec -i/-t`.
// It starts an exec over `GET /v1/sandboxes/{id}/exec` upgraded to a WebSocket, relays this
// process's stdin to the command (channel 0), the command's stdout and stderr to ours (channels
// 1 and 2) and, with a terminal, the window size (a resize message on every SIGWINCH), until the
// exit message.

#include <boost/json/object.hpp>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "runtime/api_client.h"

namespace nsbox::runtime {

struct WsExecResult {
  bool exited = false;       // the exit message arrived
  int64_t exit_code = 1;     // from it
  std::string reason;        // "exited", "timeout", "oom", ...
  bool interrupted = false;  // SIGINT/SIGTERM/SIGHUP here ended it (the command was killed)
  int signal = 0;            // which of them
};

struct WsExecOptions {
  boost::json::object body;  // the exec body of api.md, sent as the first message
  bool tty = false;          // the body asks for a terminal: raw mode here, resizes relayed
  int in_fd = 0;             // read until EOF, then stdin is closed (or VEOF on a terminal)
  int out_fd = 1;
  int err_fd = 2;
};

// Runs the exec to its end. Errors: the daemon could not be reached, refused the upgrade (the
// API's error message), or broke the protocol.
Result<WsExecResult> RunWsExec(const ApiEndpoint& endpoint, const std::string& sandbox_id,
                               const WsExecOptions& options);

}  // namespace nsbox::runtime

#pragma once

// What holds an address a new nsboxd wants to listen on (runtime/serve.cc's listeners): nothing,
// something that takes connections but does not answer (a SIGKILLed daemon's listening socket,
// still held for a moment by a jail it was cloning), or a live server that answers HTTP (another
// daemon). Every step is bounded by the wait: a connect to a backlog that is full, or to a TCP
// port whose SYNs are dropped, never blocks (nothing of it is blocking).

#include <sys/socket.h>

#include <chrono>
#include <string>

#include "base/error.h"

namespace nsbox::runtime {

enum class ListenerFound {
  kNothing,  // no listener: the connection is refused, or the socket file is gone
  kSilent,   // a connection is taken (or the backlog is full) but no HTTP answer begins in time
  kAnswers,  // an HTTP answer begins ("HTTP/"): a live server
};

// Connects to the Unix socket `path`, sends GET /v1/health and waits up to `wait` for the first
// bytes of an answer. Errors other than the listener's absence (EACCES, EMFILE...) are errors.
Result<ListenerFound> ProbeUnixListener(const std::string& path, std::chrono::milliseconds wait);

// The same for a TCP address (an unspecified one, 0.0.0.0 or ::, asked on the loopback).
Result<ListenerFound> ProbeTcpListener(const sockaddr* addr, socklen_t len,
                                       std::chrono::milliseconds wait);

}  // namespace nsbox::runtime

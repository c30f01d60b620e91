#pragma once

// Sockets inside a sandbox's network namespace, made by the daemon itself (ports and the HTTP
// path through the API need nothing else: they work for every sandbox, also network "none").

#include "base/error.h"
#include "base/unique_fd.h"

namespace nsbox::runtime {

// A socket(domain, type | SOCK_CLOEXEC) in the network namespace `netns_fd`: the calling thread
// enters it, makes the socket and goes back to the daemon's own namespace; a thread that cannot
// go back aborts the process (it would make every later socket in the wrong place). Blocks
// briefly: call it on the worker pool, never on the event loop.
Result<UniqueFd> SocketInNetns(int netns_fd, int domain, int type);

}  // namespace nsbox::runtime

#pragma once

// nsbox-net: the host side of sandbox networking (docs/network.md), a co-process of nsboxd.
// nsboxd starts it with one end of a SOCK_SEQPACKET socketpair; each message is one JSON object
// (an attach also carries the sandbox's network namespace fd, SCM_RIGHTS), answered in order:
//
//   {"op":"attach","key":K,"id":ID,"policy":P} + fd  ->  {"address":"10.213.0.2","interface":I}
//   {"op":"policy","key":K,"policy":P}              ->  {}
//   {"op":"detach","key":K}                         ->  {}
//   {"op":"counters"}                               ->  {"counters":{K:{"allowed":N,"refused":N}}}
//   any failure                                     ->  {"error":"..."}
//
// Its first message is {"ready":true,"gateway":G} once the table, the gateway and the resolver
// are up, or {"error":"..."} before it exits. When the channel closes it removes its table,
// interfaces and gateway and exits.

#include <cstdint>
#include <string>
#include <vector>

namespace nsbox::net {

struct NetdOptions {
  int channel_fd = -1;
  std::string range = "10.213.0.0/16";
  std::string tag;  // hex; names the table (nsbox_<tag>) and the interfaces (nsb<tag>...)
  std::vector<std::string> dns_upstreams;  // "ADDR[:PORT]"; empty: /etc/resolv.conf's
};

// Runs until the channel closes; the exit code.
int RunNetd(const NetdOptions& options);
// `nsbox-net --probe`: "name: ok (...)" / "name: missing (...)" lines on stdout; 0 when a
// policy with a network can be enforced here.
int RunProbe();

}  // namespace nsbox::net

// nsbox-net: the host side of sandbox networking, started by nsboxd (net/netd.h).

#include <CLI/CLI.hpp>
#include <cstdio>

#include "base/log.h"
#include "net/netd.h"

int main(int argc, char** argv) {
  CLI::App app{
      "nsbox-net: nsboxd's network co-process (veth, nftables, the sandboxes' resolver: "
      "docs/network.md). It is started by nsbox serve, not by hand; `nsbox-net --probe` says what "
      "this host allows (nsbox doctor runs it)"};
  nsbox::net::NetdOptions o;
  bool probe = false;
  std::string log_level = "info";
  app.add_flag("--probe", probe, "print what this host allows, then exit");
  app.add_option("--channel-fd", o.channel_fd, "the daemon's end of the channel");
  app.add_option("--range", o.range, "the daemon's IPv4 range");
  app.add_option("--tag", o.tag, "the daemon's tag (hex)");
  app.add_option("--dns-upstream", o.dns_upstreams, "ADDR[:PORT] (repeatable)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  CLI11_PARSE(app, argc, argv);
  if (auto st = nsbox::log::SetLevel(log_level); !st.ok()) {
    std::fprintf(stderr, "nsbox-net: --log-level: %s\n", st.error().message().c_str());
    return 2;
  }
  if (probe) return nsbox::net::RunProbe();
  if (o.channel_fd < 0) {
    std::fprintf(stderr, "nsbox-net is started by nsboxd (--channel-fd); try --probe\n");
    return 2;
  }
  return nsbox::net::RunNetd(o);
}

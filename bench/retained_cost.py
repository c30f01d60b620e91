#!/usr/bin/env python3
"""What an ended exec kept for re-attach costs nsboxd's memory, two builds side by side.

    sudo bench/retained_cost.py OLD_NSBOX NEW_NSBOX [--execs N] [--output BYTES] [--runs R]

Starts each `nsbox` binary as a daemon (`nsbox serve`, its own socket and state directory under
/var/tmp, the default retention of 10 minutes), creates one sandbox in each, runs 100 execs to
warm it up, then N execs that each print BYTES bytes (default 12, `echo hello world`), over one
keep-alive connection. Every exec stays in the daemon for re-attach until its retention ends; the
daemon's growth in resident memory (VmRSS) over the N execs, divided by N, is what each costs.
With R runs the builds alternate, each run on fresh daemons; prints each run and the medians.
An agent that runs 10 commands a second keeps 6,000 of them.
"""

import argparse
import json
import os
import statistics
import sys

from nsboxd_http import call, start_daemon, stop_daemons


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    sys.exit(f"retained_cost.py: no VmRSS for {pid}")


def one_run(binary, tag, execs, output):
    root = f"/var/tmp/nsbox-retained-{os.getpid()}-{tag}"
    os.makedirs(root)
    daemon, conn = start_daemon(binary, f"{root}/d.sock", f"{root}/state", f"{root}/daemon.log")
    try:
        call(conn, "PUT", "/v1/sandboxes/r", b"{}")
        command = "echo hello world" if output == 12 else f"head -c {output} /dev/zero"
        body = json.dumps({"command": command}).encode()
        for _ in range(100):
            call(conn, "POST", "/v1/sandboxes/r/exec", body)
        before = rss_kib(daemon.pid)
        for _ in range(execs):
            call(conn, "POST", "/v1/sandboxes/r/exec", body)
        return (rss_kib(daemon.pid) - before) / execs
    finally:
        conn.close()
        stop_daemons([daemon], [root])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--execs", type=int, default=3000)
    ap.add_argument("--output", type=int, default=12)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("retained_cost.py: run as root (nsboxd makes cgroups and namespaces)")
    costs = {"old": [], "new": []}
    for r in range(a.runs):
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            binary = a.old if name == "old" else a.new
            costs[name].append(one_run(binary, f"{name}{r}", a.execs, a.output))
            print(f"run {r} {name}: {costs[name][-1]:.2f} KiB per retained exec", flush=True)
    for name in ("old", "new"):
        print(f"{name}: median {statistics.median(costs[name]):.2f} KiB per retained exec "
              f"({a.execs} execs of {a.output} bytes of output)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What huge directory listings cost nsboxd's memory (issue 44), one or more builds in turn.

    sudo bench/listing_rss.py NSBOX [NSBOX...] [--names N] [--name-bytes B] [--clients C]

For each `nsbox` binary: starts it as a daemon (`nsbox serve`, its own socket and state directory
under /var/tmp), creates a sandbox, makes N files (default 300,000) with names of B bytes
(default 200) in its /tmp, then C clients (default 6) each ask for `fs/readdir` of that
directory at once, over connections of their own, and read the whole answer. The daemon's
resident memory (VmRSS) is sampled every 20 ms: printed before, at its peak, and 5 s after the
last answer; with the wall time of the slowest answer and each answer's size and entry count
checked.
"""

import argparse
import json
import os
import sys
import threading
import time

from nsboxd_http import UnixConnection, call, start_daemon, stop_daemons


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    sys.exit(f"listing_rss.py: no VmRSS for {pid}")


def one_binary(binary, tag, names, name_bytes, clients):
    root = f"/var/tmp/nsbox-listing-{os.getpid()}-{tag}"
    os.makedirs(root)
    sock = f"{root}/d.sock"
    daemon, conn = start_daemon(binary, sock, f"{root}/state", f"{root}/daemon.log")
    try:
        call(conn, "PUT", "/v1/sandboxes/l", b"{}")
        make = (f"mkdir /tmp/d && cd /tmp/d && python3 -c 'for i in range({names}): "
                f"open(\"%08d%s\" % (i, \"x\" * {name_bytes - 8}), \"w\").close()'")
        out = json.loads(call(conn, "POST", "/v1/sandboxes/l/exec",
                              json.dumps({"command": make, "timeoutMs": 600000}).encode()))
        if out.get("exitCode") != 0:
            sys.exit(f"listing_rss.py: making the names failed: {out}")
        time.sleep(1)
        before = rss_kib(daemon.pid)
        peak = [before]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], rss_kib(daemon.pid))
                time.sleep(0.02)

        sizes = [None] * clients

        def client(i):
            c = UnixConnection(sock)
            c.timeout = 600
            body = call(c, "POST", "/v1/sandboxes/l/fs/readdir", b'{"path": "/tmp/d"}')
            entries = json.loads(body)["entries"]
            if len(entries) != names:
                sys.exit(f"listing_rss.py: {len(entries)} entries, not {names}")
            sizes[i] = len(body)
            c.close()

        sampler = threading.Thread(target=sample)
        sampler.start()
        t0 = time.monotonic()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        done.set()
        sampler.join()
        peak[0] = max(peak[0], rss_kib(daemon.pid))
        time.sleep(5)
        after = rss_kib(daemon.pid)
        print(f"{binary}: {clients} listings of {names} names of {name_bytes} bytes "
              f"({sizes[0] / 1e6:.1f} MB of JSON each) in {wall:.1f} s; daemon RSS "
              f"{before / 1024:.1f} MiB before, {peak[0] / 1024:.1f} MiB at its peak, "
              f"{after / 1024:.1f} MiB 5 s after", flush=True)
    finally:
        conn.close()
        stop_daemons([daemon], [root])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--names", type=int, default=300000)
    ap.add_argument("--name-bytes", type=int, default=200)
    ap.add_argument("--clients", type=int, default=6)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("listing_rss.py: run as root (nsboxd makes cgroups and namespaces)")
    for i, binary in enumerate(a.binaries):
        one_binary(binary, str(i), a.names, a.name_bytes, a.clients)


if __name__ == "__main__":
    main()

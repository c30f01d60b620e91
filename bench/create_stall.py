#!/usr/bin/env python3
"""Whether sandbox creations hold up other requests.

One client creates sandboxes back to back (PUT of new ids) while another asks nsboxd for an
existing sandbox (GET /v1/sandboxes/warm) as fast as it can, for DURATION seconds. Prints the
GETs' latency (median, p90, p99, max) and how many of each were served.

    sudo bench/create_stall.py build/runtime/nsbox [--duration 4]

Every PUT makes a sandbox's directory durable (fsyncs); a daemon that held its registry's lock
across them made every other request wait (docs/perf-notes.md, "A new sandbox adopts its jail
during its PUT"). The daemon runs on its own socket and state directory under /var/tmp, removed
at the end.
"""

import argparse
import os
import shutil
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nsboxd_http import UnixConnection, call, start_daemon  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nsbox", help="the nsbox binary to run as the daemon")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds of measurement")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("create_stall.py: run as root (the daemon makes sandboxes)")

    d = f"/var/tmp/nsbox-create-stall-{os.getpid()}"
    os.makedirs(d)
    daemon, conn = start_daemon(args.nsbox, d + "/s.sock", d + "/state", d + "/daemon.log")
    try:
        call(conn, "PUT", "/v1/sandboxes/warm")
        stop = threading.Event()
        made = [0]

        def creator():
            c = UnixConnection(d + "/s.sock")
            while not stop.is_set():
                call(c, "PUT", f"/v1/sandboxes/new-{made[0]}")
                made[0] += 1

        thread = threading.Thread(target=creator)
        thread.start()
        lat = []
        end = time.perf_counter() + args.duration
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            call(conn, "GET", "/v1/sandboxes/warm")
            lat.append(time.perf_counter() - t0)
        stop.set()
        thread.join()
        lat.sort()
        us = lambda s: s * 1e6  # noqa: E731
        print(f"{args.nsbox}: GET of a sandbox while PUTs run: median {us(statistics.median(lat)):.0f} us, "
              f"p90 {us(lat[int(len(lat) * 0.9)]):.0f}, p99 {us(lat[int(len(lat) * 0.99)]):.0f}, "
              f"max {us(lat[-1]):.0f}; {made[0]} PUTs and {len(lat)} GETs in {args.duration:.0f} s")
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()

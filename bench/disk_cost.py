#!/usr/bin/env python3
"""What a disk of its own (limits.diskBytes, docs/daemon.md "Disk limits") costs a sandbox.

    sudo bench/disk_cost.py [--nsbox build/runtime/nsbox] [--runs 30] [--sizes 64M,1G]

Starts `nsbox serve` on its own socket and state directory under /var/tmp, then, interleaved
sandbox by sandbox, for no disk and for each size: PUT a new id (with {"limits": {"diskBytes":
N}} for a size), POST an exec of /bin/true (the first use: the disk's loop device and mount, and
the jail's start), and a second exec (warm). 100 ms between sandboxes, so that the daemon's pool
and its directories made ahead are ready again. Prints the medians and p90 of each, in ms, then
deletes every sandbox and checks that no loop device is left on the state directory.
"""

import argparse
import os
import statistics
import tempfile
import time

from nsboxd_http import call, start_daemon, stop_daemons


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if text[-1].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


def loops_under(directory):
    out = []
    for name in os.listdir("/sys/block"):
        try:
            with open(f"/sys/block/{name}/loop/backing_file") as f:
                if f.read().startswith(directory + "/"):
                    out.append(name)
        except OSError:
            pass
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nsbox", default="build/runtime/nsbox")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--sizes", default="64M,1G")
    a = p.parse_args()
    kinds = [("no disk", None)] + [(s, parse_size(s)) for s in a.sizes.split(",")]
    work = tempfile.mkdtemp(prefix="nsbox-disk-cost-", dir="/var/tmp")
    state = os.path.join(work, "state")
    daemon, conn = start_daemon(os.path.abspath(a.nsbox), os.path.join(work, "sock"), state,
                                os.path.join(work, "daemon.log"))
    times = {k: {"put": [], "first": [], "warm": []} for k, _ in kinds}
    ids = []
    try:
        for i in range(a.runs):
            order = kinds if i % 2 == 0 else list(reversed(kinds))
            for kind, size in order:
                sid = f"disk-cost-{len(ids)}"
                ids.append(sid)
                body = None if size is None else f'{{"limits":{{"diskBytes":{size}}}}}'
                t0 = time.perf_counter()
                call(conn, "PUT", f"/v1/sandboxes/{sid}", body)
                t1 = time.perf_counter()
                call(conn, "POST", f"/v1/sandboxes/{sid}/exec", '{"command":"true"}')
                t2 = time.perf_counter()
                call(conn, "POST", f"/v1/sandboxes/{sid}/exec", '{"command":"true"}')
                t3 = time.perf_counter()
                times[kind]["put"].append((t1 - t0) * 1e3)
                times[kind]["first"].append((t2 - t1) * 1e3)
                times[kind]["warm"].append((t3 - t2) * 1e3)
                time.sleep(0.1)
        for kind, _ in kinds:
            parts = []
            for what in ("put", "first", "warm"):
                v = sorted(times[kind][what])
                parts.append(f"{what} {statistics.median(v):6.2f} (p90 {v[int(len(v) * 0.9)]:6.2f})")
            print(f"{kind:>8}: " + ", ".join(parts) + " ms")
        for sid in ids:
            call(conn, "DELETE", f"/v1/sandboxes/{sid}")
        time.sleep(0.5)
        left = loops_under(state)
        print("loop devices left on the state directory:", left or "none")
    finally:
        stop_daemons([daemon], [work])


if __name__ == "__main__":
    main()

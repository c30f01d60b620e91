#!/usr/bin/env python3
"""Two nsboxd builds side by side: first use, and a start after a stop, interleaved.

    sudo bench/ab_first_use.py OLD_NSBOX NEW_NSBOX [--sandboxes N]
        [--old-args "ARGS"] [--new-args "ARGS"] [--pace MS] [--bwrap]

Starts each `nsbox` binary as a daemon (`nsbox serve`, its own socket and state directory
under /var/tmp; the script, its daemons and peers at nice -10), then for i in 0..N-1,
alternating which build goes first: PUT a new id and POST an exec of /bin/true (first use:
the PUT, the jail's start and the first exec), keeping every sandbox. Then for each sandbox: POST .../stop, and time the
next exec (a start of an existing sandbox and an exec). Prints the medians per build. On this
machine the PUT's fsyncs vary by milliseconds from run to run, and a machine's speed drifts
over minutes; interleaving the two builds request by request is what makes their figures
comparable (docs/perf-notes.md).

--old-args and --new-args add arguments to each daemon's `nsbox serve` (e.g. "--pool 0": one
build, with and without its pool). --pace waits that long between sandboxes, and before each
first use until the daemon's pool (docs/daemon.md "The pool") is full again: sandboxes made at a
human pace rather than in a burst. --bwrap also times `bwrap --unshare-all ... /bin/true`
(the command of docs/benchmarks.md's "Baselines measured before nsbox") in the same interleaving, the peer of issue 4's first-use target.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from nsboxd_http import call, start_daemon, stop_daemons


BWRAP = ["/usr/bin/bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
         "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib", "--symlink",
         "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "/bin/true"]


def wait_pool_full(conn, timeout=10.0):
    """Until nsbox_pool_ready equals nsbox_pool_size, and with a pool a jail is adopted ahead;
    a build without a pool has none of them, one without adoption ahead not the last."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = {}
        for line in call(conn, "GET", "/metrics").decode().splitlines():
            if line.startswith(("nsbox_pool_ready ", "nsbox_pool_size ",
                                "nsbox_pool_adopted_ahead ")):
                name, value = line.split()
                metrics[name] = int(value)
        size = metrics.get("nsbox_pool_size")
        ahead = metrics.get("nsbox_pool_adopted_ahead")
        if metrics.get("nsbox_pool_ready") == size and (
                ahead is None or ahead == (1 if size else 0)):
            return
        if time.monotonic() > deadline:
            sys.exit("the daemon's pool did not fill within 10 s")
        time.sleep(0.005)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--sandboxes", type=int, default=200)
    ap.add_argument("--old-args", default="")
    ap.add_argument("--new-args", default="")
    ap.add_argument("--pace", type=float, default=0, help="milliseconds between sandboxes")
    ap.add_argument("--bwrap", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("ab_first_use.py: run as root (nsboxd makes cgroups and namespaces)")
    os.nice(-10)  # this script, both daemons and bwrap alike
    builds = {"old": args.old, "new": args.new}
    daemons, conns = {}, {}
    base = f"/var/tmp/nsbox-ab-{os.getpid()}"
    try:
        for name, binary in builds.items():
            daemons[name], conns[name] = start_daemon(
                binary, f"{base}-{name}.sock", f"{base}-{name}", f"{base}-{name}.log",
                getattr(args, f"{name}_args").split())
        body = json.dumps({"command": "/bin/true"})
        put = {n: [] for n in builds}
        first = {n: [] for n in builds}
        restart = {n: [] for n in builds}
        order = lambda i: ("old", "new") if i % 2 == 0 else ("new", "old")
        bwrap = []
        for i in range(args.sandboxes):
            if args.bwrap:
                t0 = time.perf_counter()
                subprocess.run(BWRAP, check=True)
                bwrap.append((time.perf_counter() - t0) * 1e6)
            for n in order(i):
                if args.pace > 0:
                    time.sleep(args.pace / 1000)
                    wait_pool_full(conns[n])
                t0 = time.perf_counter()
                call(conns[n], "PUT", f"/v1/sandboxes/ab{i}", "{}")
                t1 = time.perf_counter()
                call(conns[n], "POST", f"/v1/sandboxes/ab{i}/exec", body)
                t2 = time.perf_counter()
                put[n].append((t1 - t0) * 1e6)
                first[n].append((t2 - t0) * 1e6)
        for i in range(args.sandboxes):
            for n in order(i):
                call(conns[n], "POST", f"/v1/sandboxes/ab{i}/stop")
                if args.pace > 0:
                    time.sleep(args.pace / 1000)
                    wait_pool_full(conns[n])
                t0 = time.perf_counter()
                call(conns[n], "POST", f"/v1/sandboxes/ab{i}/exec", body)
                restart[n].append((time.perf_counter() - t0) * 1e6)
        med = statistics.median
        if bwrap:
            # Started by Python's subprocess (fork or vfork, then exec): a little more than
            # nsbox-api-bench's posix_spawn would measure.
            print(f"bwrap --unshare-all ... /bin/true: {med(bwrap):.0f} us")
        for n in builds:
            start = med([f - p for f, p in zip(first[n], put[n])])
            print(f"{n}: first use {med(first[n]):.0f} us (PUT {med(put[n]):.0f}, start and first "
                  f"exec {start:.0f}); after a stop, start and exec {med(restart[n]):.0f} us")
        for n in builds:
            for i in range(args.sandboxes):
                call(conns[n], "DELETE", f"/v1/sandboxes/ab{i}")
        for n in builds:
            os.unlink(f"{base}-{n}.log")  # kept when something failed
    finally:
        stop_daemons(daemons.values(), [f"{base}-{n}" for n in builds])


if __name__ == "__main__":
    main()

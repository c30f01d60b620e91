#!/usr/bin/env python3
"""Two nsbox builds side by side: what a download of a file not in memory does to other requests.

    sudo bench/cold_download.py OLD_NSBOX NEW_NSBOX [--mib N] [--rate MB] [--runs R]

Starts each build's daemon (its own socket, its state directory under /var/tmp) inside a cgroup
whose reads of the state directory's disk are throttled to --rate MB/s (cgroup v1 `blkio`, or v2
`io.max`): a slow disk, on any host. Each daemon gets a sandbox holding an N MiB file. Then, for
each run, the builds alternating: the page cache is dropped, `nsbox cp ID:f /dev/null` downloads
the file, and a second client sends `GET /v1/health` every 5 ms meanwhile. Prints, per build,
the medians over the runs of the download's time and of the health requests' median, p99 and
worst latency. A daemon that reads the file on its event loop holds every other request for as
long as the disk takes.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

from nsboxd_http import call, health_during, start_daemon, stop_daemons

CGROUP = f"nsbox-cold-download-{os.getpid()}"


def disk_of(path):
    """'MAJ:MIN' of the whole disk that holds `path` (a partition's parent)."""
    dev = os.stat(path).st_dev
    node = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    if not os.path.exists(node):
        sys.exit(f"cold_download.py: {path} is not on a block device")
    if os.path.exists(node + "/partition"):
        node = os.path.realpath(node + "/..")
    with open(node + "/dev") as f:
        return f.read().strip()


def throttled_cgroup(disk, rate):
    """A cgroup directory whose reads of `disk` are limited to `rate` bytes per second."""
    v1 = "/sys/fs/cgroup/blkio"
    if os.path.exists(v1 + "/blkio.throttle.read_bps_device"):
        path = f"{v1}/{CGROUP}"
        os.mkdir(path)
        with open(path + "/blkio.throttle.read_bps_device", "w") as f:
            f.write(f"{disk} {rate}")
        return path
    v2 = "/sys/fs/cgroup"
    with open(v2 + "/cgroup.controllers") as f:
        if "io" not in f.read().split():
            sys.exit("cold_download.py: neither cgroup v1 blkio nor the v2 io controller is here")
    with open(v2 + "/cgroup.subtree_control", "w") as f:
        f.write("+io")
    path = f"{v2}/{CGROUP}"
    os.mkdir(path)
    with open(path + "/io.max", "w") as f:
        f.write(f"{disk} rbps={rate}")
    return path


def start_in(cgroup, binary, sock, state, log):
    """The daemon started in `cgroup`; on a throttled disk its start may take a while."""
    def enter():
        with open(cgroup + "/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    return start_daemon(binary, sock, state, log, preexec_fn=enter, timeout=15.0)


def one_run(binary, sock):
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
    def download():
        t0 = time.perf_counter()
        subprocess.run([binary, "--socket", sock, "cp", "s:f", "/dev/null"], check=True)
        return time.perf_counter() - t0

    return health_during(sock, download, pause=0.005)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rate", type=float, default=10, help="the disk's read rate, MB/s")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("cold_download.py: run as root (cgroups, drop_caches, nsboxd)")
    builds = {"old": args.old, "new": args.new}
    base = f"/var/tmp/nsbox-cold-{os.getpid()}"
    data = f"{base}.data"
    cgroup = throttled_cgroup(disk_of("/var/tmp"), int(args.rate * 1e6))
    daemons = {}
    try:
        with open(data, "wb") as f:
            f.write(os.urandom(args.mib << 20))
        for n, binary in builds.items():
            daemons[n], conn = start_in(cgroup, binary, f"{base}-{n}.sock", f"{base}-{n}",
                                        f"{base}-{n}.log")
            call(conn, "PUT", "/v1/sandboxes/s", "{}")
            subprocess.run([binary, "--socket", f"{base}-{n}.sock", "cp", data, "s:f"], check=True)
        runs = {n: [] for n in builds}
        for i in range(args.runs):
            for n in (("old", "new") if i % 2 == 0 else ("new", "old")):
                runs[n].append(one_run(builds[n], f"{base}-{n}.sock"))
        print(f"{args.runs} cold downloads of {args.mib} MiB per build, the disk read at "
              f"{args.rate:g} MB/s; medians over the runs")
        print("| build | download s | GET /v1/health meanwhile: median ms | p99 ms | worst ms |")
        print("|---|---|---|---|---|")
        for n in builds:
            cols = [statistics.median(r[k] for r in runs[n]) for k in range(4)]
            print(f"| {n} | {cols[0]:.1f} | {cols[1]:.2f} | {cols[2]:.2f} | {cols[3]:.2f} |")
        for n in builds:
            os.unlink(f"{base}-{n}.log")  # kept when something failed
    finally:
        stop_daemons(daemons.values(), [data] + [f"{base}-{n}" for n in builds])
        try:
            os.rmdir(cgroup)
        except OSError as e:
            print(f"cold_download.py: {cgroup} left: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()

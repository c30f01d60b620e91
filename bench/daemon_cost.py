#!/usr/bin/env python3
"""What one request costs nsboxd itself: its CPU time and its malloc calls, two builds side by side.

    sudo bench/daemon_cost.py OLD_NSBOX NEW_NSBOX [--mode exec|stream|read] [--requests N]
        [--blocks B] [--pace MS] [--mallocs]

Starts each `nsbox` binary as a daemon (`nsbox serve`, its own socket and state directory under
/var/tmp; the script and both daemons at nice -10), creates one sandbox in each and warms it up,
then sends B blocks of N requests to each daemon in turn over one keep-alive connection, MS
milliseconds apart: warm execs of /bin/true (`--mode exec`), warm execs of `echo hi` streamed as
NDJSON (`--mode stream`: start, stdout and exit events) or reads of a 4 KiB file (`--mode read`). For each block it prints the daemon's CPU time per request (the sum of its threads'
/proc/PID/task/TID/schedstat; the sandbox's processes are not the daemon's) and the median latency
of its requests as this Python client sees it, and the medians at the end. A daemon's CPU time is a
steadier figure than a latency on this machine, whose speed drifts from minute to minute
(docs/perf-notes.md).

--mallocs also counts the daemon's calls to malloc with a uprobe (tracefs, `nm` and `readelf`
needed; the binary must have its symbols): one `p:` line in /sys/kernel/tracing/uprobe_events at
malloc's file offset, enabled for the block, its hits read from uprobe_profile. The hits are every
process's that runs that binary: give the two builds as two files, and run nothing else of them.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from nsboxd_http import call, start_daemon, stop_daemons

TRACING = "/sys/kernel/tracing"


def cpu_ns(pid):
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass  # a worker thread that ended meanwhile
    return total


def uprobe_events(line):
    # O_APPEND without the seek to the end that Python's "a" mode adds: tracefs refuses it.
    fd = os.open(f"{TRACING}/uprobe_events", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class MallocProbe:
    """A uprobe on malloc in one binary, counted for one process."""

    def __init__(self, binary, name):
        out = subprocess.run(["nm", binary], capture_output=True, text=True, check=True).stdout
        addr = next(int(l.split()[0], 16) for l in out.splitlines()
                    if l.endswith(" malloc") and l.split()[1] in "Tt")
        # The file offset of a non-PIE binary's text: its address less the first segment's.
        seg = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True).stdout
        base = min(int(l.split()[2], 16) for l in seg.splitlines() if l.strip().startswith("LOAD"))
        self.event = f"nsbox_cost/{name}"
        uprobe_events(f"p:{self.event} {binary}:{addr - base:#x}")
        self.dir = f"{TRACING}/events/{self.event}"

    def hits(self):
        name = self.event.split("/")[1]
        with open(f"{TRACING}/uprobe_profile") as f:
            for l in f:
                parts = l.split()
                if len(parts) == 3 and parts[1] == name:
                    return int(parts[2])
        sys.exit(f"daemon_cost.py: no {self.event} in uprobe_profile")

    def count(self, fn):
        with open(f"{self.dir}/enable", "w") as f:
            f.write("1")
        before = self.hits()
        fn()
        after = self.hits()
        with open(f"{self.dir}/enable", "w") as f:
            f.write("0")
        return after - before

    def remove(self):
        uprobe_events(f"-:{self.event}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--mode", choices=["exec", "stream", "read"], default="exec")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--pace", type=float, default=1.0, help="milliseconds between requests")
    ap.add_argument("--mallocs", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("daemon_cost.py: run as root (nsboxd makes cgroups and namespaces)")
    os.nice(-10)
    builds = {"old": args.old, "new": args.new}
    daemons, conns, probes = {}, {}, {}
    base = f"/var/tmp/nsbox-cost-{os.getpid()}"
    exec_body = json.dumps({"command": "/bin/true"})
    stream_body = json.dumps({"command": "echo hi"})
    try:
        for name, binary in builds.items():
            daemons[name], conns[name] = start_daemon(
                binary, f"{base}-{name}.sock", f"{base}-{name}", f"{base}-{name}.log")
            call(conns[name], "PUT", "/v1/sandboxes/cost", "{}")
            call(conns[name], "PUT", "/v1/sandboxes/cost/files?path=f4k", b"x" * 4096)
            if args.mallocs:
                probes[name] = MallocProbe(binary, name)

        latency = {n: [] for n in builds}  # medians of the blocks, µs

        def block(name, timed=True):
            conn = conns[name]
            took = []
            for _ in range(args.requests):
                t0 = time.perf_counter()
                if args.mode == "exec":
                    call(conn, "POST", "/v1/sandboxes/cost/exec", exec_body)
                elif args.mode == "stream":
                    events = call(conn, "POST", "/v1/sandboxes/cost/exec", stream_body,
                                  accept="application/x-ndjson").splitlines()
                    if len(events) != 3 or json.loads(events[-1])["exitCode"] != 0:
                        sys.exit(f"daemon_cost.py: unexpected stream {events!r}")
                else:
                    call(conn, "GET", "/v1/sandboxes/cost/files?path=f4k")
                took.append((time.perf_counter() - t0) * 1e6)
                time.sleep(args.pace / 1000)
            if timed:
                latency[name].append(statistics.median(took))

        for name in builds:
            block(name, timed=False)  # warm-up: the sandbox's start, its first commands
        cpu = {n: [] for n in builds}
        mallocs = {n: [] for n in builds}
        for b in range(args.blocks):
            for name in (("old", "new") if b % 2 == 0 else ("new", "old")):
                pid = daemons[name].pid
                before = cpu_ns(pid)
                if args.mallocs:
                    mallocs[name].append(probes[name].count(lambda: block(name)) /
                                         args.requests)
                else:
                    block(name)
                cpu[name].append((cpu_ns(pid) - before) / args.requests / 1000)
                line = (f"block {b} {name}: daemon CPU {cpu[name][-1]:.1f} us per {args.mode}, "
                        f"median latency {latency[name][-1]:.0f} us")
                if args.mallocs:
                    line += f", {mallocs[name][-1]:.1f} mallocs"
                print(line, flush=True)
        for name in builds:
            line = (f"{name}: median daemon CPU {statistics.median(cpu[name]):.1f} us per request, "
                    f"latency {statistics.median(latency[name]):.0f} us (the blocks' medians)")
            if args.mallocs:
                line += f", {statistics.median(mallocs[name]):.1f} mallocs per request"
            print(line)
    finally:
        for p in probes.values():
            p.remove()
        stop_daemons(list(daemons.values()),
                     [f"{base}-{n}{suffix}" for n in builds for suffix in ("", ".sock", ".log")])


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Two nsboxd builds side by side: first use, and a start after a stop, interleaved.

    sudo bench/ab_first_use.py OLD_NSBOX NEW_NSBOX [--sandboxes N]

Starts each `nsbox` binary as a daemon (`nsbox serve`, its own socket and state directory
under /var/tmp, both at nice -10), then for i in 0..N-1, alternating which build goes
first: PUT a new id and POST an exec of /bin/true (first use: the PUT, the jail's start and
the first exec), keeping every sandbox. Then for each sandbox: POST .../stop, and time the
next exec (a start of an existing sandbox and an exec). Prints the medians per build. On this
machine the PUT's fsyncs vary by milliseconds from run to run, and a machine's speed drifts
over minutes; interleaving the two builds request by request is what makes their figures
comparable (docs/benchmarks.md).
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(60)
        self.sock.connect(self.path)


def call(conn, method, url, body=None):
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn.request(method, url, body, headers)
    r = conn.getresponse()
    data = r.read()
    if r.status >= 300:
        sys.exit(f"{method} {url}: {r.status} {data[:200]!r}")
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--sandboxes", type=int, default=200)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("ab_first_use.py: run as root (nsboxd makes cgroups and namespaces)")
    builds = {"old": args.old, "new": args.new}
    daemons, conns = {}, {}
    base = f"/var/tmp/nsbox-ab-{os.getpid()}"
    try:
        for name, binary in builds.items():
            sock, state = f"{base}-{name}.sock", f"{base}-{name}"
            daemons[name] = subprocess.Popen(
                ["nice", "-n", "-10", binary, "serve", "--socket", sock, "--state-dir", state],
                stderr=open(f"{base}-{name}.log", "w"))
            for _ in range(100):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            conns[name] = UnixConnection(sock)
            call(conns[name], "GET", "/v1/health")
        body = json.dumps({"command": "/bin/true"})
        put = {n: [] for n in builds}
        first = {n: [] for n in builds}
        restart = {n: [] for n in builds}
        order = lambda i: ("old", "new") if i % 2 == 0 else ("new", "old")
        for i in range(args.sandboxes):
            for n in order(i):
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
                t0 = time.perf_counter()
                call(conns[n], "POST", f"/v1/sandboxes/ab{i}/exec", body)
                restart[n].append((time.perf_counter() - t0) * 1e6)
        med = statistics.median
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
        for d in daemons.values():
            d.terminate()
            d.wait()
        subprocess.run(["rm", "-rf"] + [f"{base}-{n}" for n in builds])


if __name__ == "__main__":
    main()

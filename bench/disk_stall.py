#!/usr/bin/env python3
"""Does what the daemon writes to disk hold up its other clients? Two nsbox builds side by side.

    sudo bench/disk_stall.py OLD_NSBOX NEW_NSBOX [--what upload|output|drop|reread] [--mib N]
                             [--runs R] [--dirty-mib D]

Starts each `nsbox` binary as a daemon (`nsbox serve`, its own socket and state directory under
/var/tmp) with one sandbox. In each run, the builds alternating, one connection makes the daemon
write N MiB while a second one asks `GET /v1/health` every 2 ms until the first is done:

- upload: `PUT /v1/sandboxes/ID/files?path=...`, the body sent 1 MiB at a time (the daemon
  writes it into the temp file nsbox-init opened);
- output: a detached exec of `head -c N MiB /dev/zero` that nobody reads (its starter hangs up;
  the exec list is asked every 10 ms whether it has ended): the daemon spills the output beyond
  its 2 MiB ring to `<sandbox dir>/execs/` as fast as the command writes it;
- drop: the output's run first, unmeasured, and a sync(2) (as a spill file retained for the
  default 10 minutes is on the disk), then the end of its retention (the daemons run with
  `--exec-retention 3`), when the daemon removes the spill file of N - 2 MiB: the health answers
  are timed from after the sync until the exec is no longer listed;
- reread: the output's run first (letters, not zeros, which JSON would escape six times over),
  unmeasured, a sync and the page cache dropped (`vm.drop_caches`), then a re-attach reads the
  whole log (`GET .../execs/{execId}/output`): N - 2 MiB of it from the spill file on the disk.

Prints, per build, the medians over the runs of the throughput (for drop: of the seconds from the
exec's end to its removal) and of the health answers' p50, p99 and worst latencies.

`--dirty-mib D` sets vm.dirty_bytes to D MiB (and vm.dirty_background_bytes to half of it) for
the runs and puts the old values back after: the kernel then throttles a writer of dirty pages
to the disk's pace early, as it does on any host once a large upload outruns the disk. A
`write(2)` that the kernel throttles sleeps in the thread that made it; if that thread is the
daemon's loop, every other client waits with it.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from nsboxd_http import UnixConnection, call, health_during, start_daemon, stop_daemons


def upload(sock_path, box, mib):
    """Seconds to PUT `mib` MiB of file body to `box`, answer included."""
    piece = os.urandom(1 << 20)
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)
    head = (f"PUT /v1/sandboxes/{box}/files?path=/workspace/big HTTP/1.1\r\n"
            f"Host: localhost\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {mib << 20}\r\n\r\n").encode()
    t0 = time.perf_counter()
    s.sendall(head)
    for _ in range(mib):
        s.sendall(piece)
    answer = b""
    while b"\r\n\r\n" not in answer:
        got = s.recv(4096)
        if not got:
            break
        answer += got
    elapsed = time.perf_counter() - t0
    s.close()
    if not answer.startswith(b"HTTP/1.1 204"):
        sys.exit(f"upload: {answer[:200]!r}")
    return elapsed


def output(sock_path, box, mib, letters=False):
    """Seconds from the start of a detached exec that writes `mib` MiB to its stdout to its end
    (zeros, or with `letters` the letter a); with the exec's id.

    The client that starts it hangs up after the start event, and a re-attach from the output's
    end waits for the exit: the daemon takes the output in as fast as the command writes it."""
    conn = UnixConnection(sock_path)
    command = (f"tr '\\0' a < /dev/zero | head -c {mib << 20}" if letters
               else f"head -c {mib << 20} /dev/zero")
    body = json.dumps({"command": command, "detach": True}).encode()
    t0 = time.perf_counter()
    conn.request("POST", f"/v1/sandboxes/{box}/exec", body,
                 {"Content-Type": "application/json", "Accept": "application/x-ndjson"})
    r = conn.getresponse()
    start = json.loads(r.readline())
    conn.close()
    if start.get("type") != "start":
        sys.exit(f"output: {start}")
    conn = UnixConnection(sock_path)
    while True:
        execs = json.loads(call(conn, "GET", f"/v1/sandboxes/{box}/execs?all=1"))["execs"]
        mine = [e for e in execs if e["execId"] == start["execId"]]
        if not mine:
            sys.exit(f"output: exec {start['execId']} is not listed")
        if mine[0]["state"] != "running":
            break
        time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    conn.close()
    if mine[0]["exit"]["exitCode"] != 0 or mine[0]["outputEnd"] != mib << 20:
        sys.exit(f"output: {mine[0]}")
    if mine[0]["oldestOffset"] != 0:
        # The spill fell more than its backlog's bound behind the output (or failed).
        print(f"output: the log kept only from offset {mine[0]['oldestOffset']}", file=sys.stderr)
    return elapsed, start["execId"]


def reread(sock_path, box, exec_id, mib):
    """Seconds to read an exec's whole log through a re-attach, checked to be `mib` MiB."""
    conn = UnixConnection(sock_path)
    t0 = time.perf_counter()
    conn.request("GET", f"/v1/sandboxes/{box}/execs/{exec_id}/output?offset=0")
    r = conn.getresponse()
    got = 0
    for line in r:
        event = json.loads(line)
        if event.get("type") == "stdout":
            got += len(event["data"])
    elapsed = time.perf_counter() - t0
    conn.close()
    if got != mib << 20:
        sys.exit(f"reread: {got} bytes of {mib << 20}")
    return elapsed


def dropped(sock_path, box):
    """Seconds until no exec of `box` is listed any more (retention ended, the log removed)."""
    conn = UnixConnection(sock_path)
    t0 = time.perf_counter()
    while json.loads(call(conn, "GET", f"/v1/sandboxes/{box}/execs?all=1"))["execs"]:
        time.sleep(0.01)
    conn.close()
    return time.perf_counter() - t0


def one_run(sock_path, box, mib, what):
    if what == "reread":
        _, exec_id = output(sock_path, box, mib, letters=True)
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        seconds, median, p99, worst = health_during(
            sock_path, lambda: reread(sock_path, box, exec_id, mib), pause=0.002, lead=0.05)
        return (mib << 20) / seconds / 1e6, median, p99, worst
    if what == "drop":
        output(sock_path, box, mib)
        os.sync()
        seconds, median, p99, worst = health_during(sock_path, lambda: dropped(sock_path, box),
                                                    pause=0.002)
        return seconds, median, p99, worst

    def work():
        return upload(sock_path, box, mib) if what == "upload" else output(sock_path, box, mib)[0]

    seconds, median, p99, worst = health_during(sock_path, work, pause=0.002, lead=0.05)
    return (mib << 20) / seconds / 1e6, median, p99, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("builds", nargs=2, metavar="NSBOX")
    ap.add_argument("--what", choices=("upload", "output", "drop", "reread"), default="upload")
    ap.add_argument("--mib", type=int, default=0, help="default: 1024 (upload), 60 (output)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dirty-mib", type=int, default=0)
    a = ap.parse_args()
    a.mib = a.mib or (1024 if a.what == "upload" else 60)
    if os.geteuid() != 0:
        sys.exit("run as root (the daemon makes namespaces)")

    # The four knobs come in pairs: writing a ratio zeroes its bytes twin and the reverse, so
    # the one of each pair that was in force (non-zero) is what gets written back.
    knobs = ("vm.dirty_bytes", "vm.dirty_ratio", "vm.dirty_background_bytes",
             "vm.dirty_background_ratio")
    saved = {k: subprocess.run(["sysctl", "-n", k], capture_output=True, text=True,
                               check=True).stdout.strip() for k in knobs}
    if a.dirty_mib:
        subprocess.run(["sysctl", "-q", f"vm.dirty_bytes={a.dirty_mib << 20}",
                        f"vm.dirty_background_bytes={a.dirty_mib << 19}"], check=True)
    daemons, paths, socks = [], [], []
    try:
        for i, binary in enumerate(a.builds):
            root = f"/var/tmp/disk-stall-{os.getpid()}-{i}"
            os.makedirs(root)
            sock = f"{root}/d.sock"
            extra = ["--exec-retention", "3"] if a.what == "drop" else []
            daemon, conn = start_daemon(binary, sock, f"{root}/state", f"{root}/daemon.log",
                                        extra)
            call(conn, "PUT", "/v1/sandboxes/u", b"{}")
            daemons.append(daemon)
            paths.append(root)
            socks.append(sock)
        rows = [[] for _ in a.builds]
        for _ in range(a.runs):
            for i in range(len(a.builds)):
                rows[i].append(one_run(socks[i], "u", a.mib, a.what))
        print(f"{a.mib} MiB {a.what}s, {a.runs} runs per build"
              + (f", vm.dirty_bytes {a.dirty_mib} MiB" if a.dirty_mib else "")
              + "; medians over the runs")
        first = "s" if a.what == "drop" else "MB/s"
        print(f"{'build':<40} {first:>7} {'health p50 ms':>14} {'p99 ms':>8} {'worst ms':>9}")
        for binary, runs in zip(a.builds, rows):
            cols = [statistics.median(r[k] for r in runs) for k in range(4)]
            print(f"{binary:<40} {cols[0]:>7.{2 if a.what == 'drop' else 0}f} {cols[1]:>14.2f} "
                  f"{cols[2]:>8.2f} {cols[3]:>9.1f}")
    finally:
        stop_daemons(daemons, paths)
        if a.dirty_mib:
            subprocess.run(["sysctl", "-q"] + [f"{k}={v}" for k, v in saved.items() if v != "0"],
                           check=True)


if __name__ == "__main__":
    main()

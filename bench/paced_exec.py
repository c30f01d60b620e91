#!/usr/bin/env python3
"""Commands at a person's or an agent's pace: execs with pauses between them, through the API.

    sudo bench/paced_exec.py NSBOX [--pause S] [--runs N] [--args "ARGS"]

Starts `NSBOX serve` (its own socket and state directory under /var/tmp; the script and its
daemon at nice -10), and first moves a sleeping process into a v1 memory cgroup N times, each
after the pause and then once right after (what a jail's or a command's move into its v1 cgroups
costs on a hybrid host, docs/cgroups.md "Moves into v1"). Then N times: wait the pause, PUT a new
id and POST an exec of /bin/true (first use); then, on one sandbox, N execs each after the pause
(an exec whose sandbox has been idle), and N execs back to back. Prints medians and whether the
host's cgroup2 has favordynmods. Benchmarks that send requests back to back never wait for an
RCU grace period; these do, unless the kernel favours dynamic cgroup changes.

--args adds arguments to `nsbox serve` (e.g. "--leave-cgroup-mount").
"""

import argparse
import json
import os
import statistics
import time

from nsboxd_http import call, start_daemon, stop_daemons


def favordynmods():
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if " - cgroup2 " in line:
                return "favordynmods" in line.split(" - ", 1)[1].split()[2].split(",")
    return None


def v1_moves(pause, runs):
    """Medians (us) of a move into a v1 memory cgroup after `pause` s, and right after one."""
    base = "/sys/fs/cgroup/memory"
    if not os.path.isdir(base):
        return None
    mine = open("/proc/self/cgroup").read().split("\n")
    path = next((l.split(":", 2)[2] for l in mine if ":memory:" in l), "/")
    parent = base + path
    child = f"{parent}/nsbox-paced-{os.getpid()}"
    os.mkdir(child)
    pid = os.fork()
    if pid == 0:
        while True:
            time.sleep(60)
    after_pause, in_a_row = [], []
    try:
        for _ in range(runs):
            time.sleep(pause)
            for target, out in ((child, after_pause), (parent, in_a_row)):
                t0 = time.perf_counter()
                with open(target + "/cgroup.procs", "w") as f:
                    f.write(str(pid))
                out.append((time.perf_counter() - t0) * 1e6)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.rmdir(child)
    return statistics.median(after_pause), statistics.median(in_a_row)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nsbox")
    ap.add_argument("--pause", type=float, default=3.0, help="seconds between commands")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--args", default="")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("paced_exec.py: run as root (nsboxd makes cgroups and namespaces)")
    os.nice(-10)
    moves = v1_moves(min(args.pause, 1.0), args.runs)
    base = f"/var/tmp/nsbox-paced-{os.getpid()}"
    daemon, conn = start_daemon(args.nsbox, base + ".sock", base, base + ".log",
                                args.args.split())
    try:
        body = json.dumps({"command": "/bin/true"})
        first, idle, in_a_row = [], [], []
        for i in range(args.runs):
            time.sleep(args.pause)
            t0 = time.perf_counter()
            call(conn, "PUT", f"/v1/sandboxes/p{i}", "{}")
            call(conn, "POST", f"/v1/sandboxes/p{i}/exec", body)
            first.append((time.perf_counter() - t0) * 1e6)
        for _ in range(args.runs):
            time.sleep(args.pause)
            t0 = time.perf_counter()
            call(conn, "POST", "/v1/sandboxes/p0/exec", body)
            idle.append((time.perf_counter() - t0) * 1e6)
        for _ in range(args.runs):
            t0 = time.perf_counter()
            call(conn, "POST", "/v1/sandboxes/p0/exec", body)
            in_a_row.append((time.perf_counter() - t0) * 1e6)
        med = statistics.median
        print(f"cgroup2 favordynmods: {favordynmods()} (after the daemon's start)")
        if moves is not None:
            print(f"move into a v1 memory cgroup: {moves[0]:.0f} us after a pause, "
                  f"{moves[1]:.0f} us right after another (before the daemon's start)")
        print(f"first use (PUT + exec) after {args.pause} s: {med(first):.0f} us")
        print(f"exec after {args.pause} s idle: {med(idle):.0f} us")
        print(f"exec back to back: {med(in_a_row):.0f} us")
        for i in range(args.runs):
            call(conn, "DELETE", f"/v1/sandboxes/p{i}")
        os.unlink(base + ".log")  # kept when something failed
    finally:
        stop_daemons([daemon], [base])


if __name__ == "__main__":
    main()

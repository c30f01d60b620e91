#!/usr/bin/env python3
"""nsbox builds side by side: the daemon's peak memory for a buffered exec answer cut at the cap.

    sudo bench/flood_peak.py NSBOX [NSBOX...] [--runs R] [--load N [--load-cmd CMD]]

For each run and each build in turn: a fresh daemon (`nsbox serve`, its own socket and state
directory under /var/tmp), `PUT` of a sandbox, a buffered `POST .../exec` of
`head -c 100M /dev/zero | tr '\\0' a; echo never` sent with curl (the output is cut at the
64 MiB cap), then the daemon's peak RSS (`VmHWM` in /proc/PID/status) and the answer's time.
api.md: the daemon never holds more than the cap for one command.

`--load N` runs N copies of a shell command over and over at idle priority (`chrt --idle 0`)
throughout, as scripts/test's background build runs beside its tests: they take only idle CPU
time, but change how the daemon's loop and the sandbox's nsbox-init take turns. The command is
`--load-cmd` (default: fill 256 MiB of fresh memory); a compiler is what showed the difference
(docs/perf-notes.md, 2026-12-03 seventh), where busy loops and the default did not. Prints each run, then the median and the highest peak per build.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time

from nsboxd_http import call, start_daemon, stop_daemons

COMMAND = "head -c 100M /dev/zero | tr '\\0' a; echo never"


def peak_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def one_run(binary, base):
    sock = os.path.join(base, "s.sock")
    daemon, conn = start_daemon(binary, sock, os.path.join(base, "state"),
                                os.path.join(base, "daemon.log"))
    try:
        call(conn, "PUT", "/v1/sandboxes/flood")
        start = time.monotonic()
        out = subprocess.run(
            ["curl", "-sS", "--unix-socket", sock, "-o", "/dev/null", "-w", "%{http_code}",
             "-H", "Content-Type: application/json", "-d", json.dumps({"command": COMMAND}),
             "http://nsboxd/v1/sandboxes/flood/exec"],
            capture_output=True, text=True, check=True).stdout
        seconds = time.monotonic() - start
        if out != "200":
            raise RuntimeError(f"POST .../exec answered {out}")
        return peak_kib(daemon.pid), seconds
    finally:
        stop_daemons([daemon], [base])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nsbox", nargs="+", help="nsbox binaries (each with its nsbox-init beside it)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--load", type=int, default=0,
                    help="copies of --load-cmd run over and over at idle priority meanwhile")
    ap.add_argument("--load-cmd", default="python3 -c \"b'x' * (256 << 20)\"",
                    help="the shell command of --load")
    args = ap.parse_args()
    loads = [subprocess.Popen(["chrt", "--idle", "0", "sh", "-c",
                               f"while :; do {args.load_cmd}; done"], start_new_session=True)
             for _ in range(args.load)]
    peaks = {b: [] for b in args.nsbox}
    try:
        for run in range(args.runs):
            for binary in args.nsbox:
                base = tempfile.mkdtemp(prefix="nsbox-flood-", dir="/var/tmp")
                kib, seconds = one_run(binary, base)
                peaks[binary].append(kib)
                print(f"run {run}: {binary}: peak {kib / 1024:.1f} MiB, answer {seconds:.2f} s",
                      flush=True)
    finally:
        for p in loads:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    for binary, kibs in peaks.items():
        print(f"{binary}: median peak {statistics.median(kibs) / 1024:.1f} MiB, "
              f"highest {max(kibs) / 1024:.1f} MiB over {len(kibs)} runs")


if __name__ == "__main__":
    main()

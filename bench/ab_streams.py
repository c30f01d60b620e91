#!/usr/bin/env python3
"""Two nsbox builds side by side: a command's stdin and output streamed through the CLI.

    sudo bench/ab_streams.py OLD_NSBOX NEW_NSBOX [--mib N] [--runs R]

Starts each `nsbox` binary as a daemon (`nsbox serve`, its own socket and state directory under
/var/tmp; the script, its daemons and CLIs at nice -10) with one sandbox, then times, with each
build's own CLI against its own daemon, the builds alternating run by run:

- stdin: `nsbox exec -i ID -- wc -c < FILE`, FILE being N MiB of random bytes (the CLI's stdin
  streamed over the exec WebSocket, as `tar c . | nsbox exec -i ID -- tar x` does);
- output: `nsbox exec -i ID -- head -c N MiB /dev/zero` (the command's stdout over that
  WebSocket; N stays under the 64 MiB output cap);
- NDJSON: `nsbox exec ID -- head -c N MiB /dev/zero`, the same output through the NDJSON stream
  of POST .../exec (base64 in JSON lines, as the CLI asks for it without -i or -t);
- for reference, `nsbox cp FILE ID:f` and `nsbox cp ID:f -` (the files endpoints, plain HTTP).

Prints the median throughput of each, in MB/s (10^6 bytes per second), per build. The two
builds may be the same binary (a noise check). A run that fails stops the script.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

from nsboxd_http import call, start_daemon, stop_daemons


def timed(argv, stdin_path=None, expect_out=None):
    """Seconds that `argv` took; its stdout is counted, and must be `expect_out` bytes if given."""
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    total = 0
    while True:
        chunk = p.stdout.read1(1 << 20)
        if not chunk:
            break
        total += len(chunk)
        last = chunk
    err = p.stderr.read()
    rc = p.wait()
    elapsed = time.perf_counter() - t0
    if stdin_path:
        stdin.close()
    if rc != 0:
        sys.exit(f"{' '.join(argv)}: exit {rc}: {err.decode(errors='replace').strip()}")
    if expect_out is not None and total != expect_out:
        sys.exit(f"{' '.join(argv)}: {total} bytes out, {expect_out} expected")
    return elapsed, (last if total else b"")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--mib", type=int, default=48, help="MiB per transfer (at most 60)")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("ab_streams.py: run as root (nsboxd makes cgroups and namespaces)")
    if not 1 <= args.mib <= 60:
        sys.exit("ab_streams.py: --mib must be 1 to 60 (the output cap is 64 MiB)")
    os.nice(-10)
    size = args.mib << 20
    builds = {"old": args.old, "new": args.new}
    base = f"/var/tmp/nsbox-streams-{os.getpid()}"
    data = f"{base}.data"
    daemons = {}
    try:
        with open(data, "wb") as f:
            f.write(os.urandom(size))
        for name, binary in builds.items():
            daemons[name], conn = start_daemon(binary, f"{base}-{name}.sock", f"{base}-{name}",
                                               f"{base}-{name}.log")
            call(conn, "PUT", "/v1/sandboxes/s", "{}")
            conn.close()
        kinds = ("stdin", "output", "NDJSON", "cp upload", "cp download")
        mbps = {n: {k: [] for k in kinds} for n in builds}
        for i in range(args.runs):
            for n in (("old", "new") if i % 2 == 0 else ("new", "old")):
                cli = [builds[n], "--socket", f"{base}-{n}.sock"]
                t, last = timed(cli + ["exec", "-i", "s", "--", "wc", "-c"], stdin_path=data)
                if last.strip() != str(size).encode():
                    sys.exit(f"{n}: wc -c counted {last.strip()!r}, {size} sent")
                mbps[n]["stdin"].append(size / t / 1e6)
                t, _ = timed(cli + ["exec", "-i", "s", "--", "head", "-c", str(size), "/dev/zero"],
                             expect_out=size)
                mbps[n]["output"].append(size / t / 1e6)
                t, _ = timed(cli + ["exec", "s", "--", "head", "-c", str(size), "/dev/zero"],
                             expect_out=size)
                mbps[n]["NDJSON"].append(size / t / 1e6)
                t, _ = timed(cli + ["cp", data, "s:f"])
                mbps[n]["cp upload"].append(size / t / 1e6)
                t, _ = timed(cli + ["cp", "s:f", "-"], expect_out=size)
                mbps[n]["cp download"].append(size / t / 1e6)
        print(f"{args.runs} runs of {args.mib} MiB each, builds alternating; medians, MB/s")
        print("| build | " + " | ".join(kinds) + " |")
        print("|---|" + "---|" * len(kinds))
        for n in builds:
            row = " | ".join(f"{statistics.median(mbps[n][k]):.0f}" for k in kinds)
            print(f"| {n} | {row} |")
        for n in builds:
            os.unlink(f"{base}-{n}.log")  # kept when something failed
    finally:
        stop_daemons(daemons.values(), [data] + [f"{base}-{n}" for n in builds])


if __name__ == "__main__":
    main()

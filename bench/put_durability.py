#!/usr/bin/env python3
"""What making a new sandbox's config.json durable costs on a disk, three ways side by side.

    sudo bench/put_durability.py [--dir /var/tmp] [--runs 150]

In a scratch directory under --dir (give one on the file system of the daemon's state
directory; /var/tmp by default, on the same disk as /var/lib/nsbox here), each run makes a
directory ahead as nsboxd's janitor does (made and fsynced with its parent, outside the timing), then times one way of what a `PUT`
does with it: write the config, make it durable, rename the directory into place and fsync the
parent. The ways, interleaved run by run:

- new file: a new config.json written and fsynced, renameat2, fsync of the parent (nsboxd
  before 2026-12-02, fifth);
- slot: 4,096 bytes written over a file of spaces made and fsynced ahead, fdatasync, the same
  rename and fsync (nsboxd from 2026-12-02, fifth, to 2026-12-04);
- rename first: a new file written, renamed first, then the file's and the parent's fsync;
- slot, rename unsynced: the slot written and fdatasynced, the rename left to the journal's own
  commit (no fsync of the parent; nsboxd now, docs/daemon.md "State on disk": a start puts a
  directory whose rename was lost in place).

Prints the median, p10 and p90 of each, in µs. Python's own cost per call (a microsecond or two)
is nothing beside an fsync. Run nothing else on the disk meanwhile.
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

CONFIG = b'{"version":1,"id":"x","image":"host","cwd":"/workspace"}\n'
SLOT = 4096


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_ahead(base, name, slot):
    """The directory made ahead, durable; with config.json's slot when `slot`."""
    path = os.path.join(base, name)
    os.mkdir(path, 0o700)
    if slot:
        fd = os.open(os.path.join(path, "config.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b" " * SLOT)
        os.fsync(fd)
        os.close(fd)
    fsync_path(path)
    fsync_path(base)
    return path


def put(way, base, spare, target):
    """One way of a PUT's durable steps, timed: the config written, the rename, the fsyncs."""
    config = os.path.join(spare, "config.json")
    start = time.perf_counter()
    if way.startswith("slot"):
        fd = os.open(config, os.O_WRONLY)
        os.write(fd, CONFIG.ljust(SLOT, b" "))
        os.fdatasync(fd)
    else:
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, CONFIG)
        if way == "new file":
            os.fsync(fd)
    os.rename(spare, target)
    if way == "rename first":
        os.fsync(fd)
    if way != "slot, rename unsynced":
        fsync_path(base)
    elapsed = time.perf_counter() - start
    os.close(fd)
    return elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--runs", type=int, default=150)
    args = ap.parse_args()
    ways = ["new file", "slot", "rename first", "slot, rename unsynced"]
    times = {way: [] for way in ways}
    base = tempfile.mkdtemp(prefix="nsbox-put-durability-", dir=args.dir)
    try:
        for i in range(args.runs):
            for k, way in enumerate(ways):
                spare = make_ahead(base, f".spare-{i}-{k}", way.startswith("slot"))
                time.sleep(0.02)  # the janitor's commits are done before the PUT
                times[way].append(put(way, base, spare, os.path.join(base, f"sb-{i}-{k}")))
                time.sleep(0.02)
    finally:
        shutil.rmtree(base)
    print(f"{args.runs} runs in {args.dir}; µs")
    print("| way | median | p10 | p90 |")
    print("|---|---|---|---|")
    for way in ways:
        t = sorted(x * 1e6 for x in times[way])
        p10, p90 = t[len(t) // 10], t[len(t) * 9 // 10]
        print(f"| {way} | {statistics.median(t):,.0f} | {p10:,.0f} | {p90:,.0f} |")


if __name__ == "__main__":
    main()

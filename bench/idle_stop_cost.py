#!/usr/bin/env python3
"""What an idle sandbox costs running and once its idle stop (idleStopMs, docs/daemon.md "Idle
stop") has stopped it, and what the stop costs its next command.

    sudo bench/idle_stop_cost.py [--nsbox build/runtime/nsbox] [--sandboxes 200] [--runs 20]

Starts `nsbox serve` on its own socket and state directory under /var/tmp.

Memory: PUTs --sandboxes new ids with {"idleStopMs": --idle-ms} and runs /bin/true in each; after
6 s (nsbox-init's idle release) drops the reclaimable caches and reads the kernel's memory
(/proc/meminfo: SUnreclaim, SReclaimable, KernelStack, PageTables, Percpu, Shmem), the daemon's
RSS and the nsbox-inits' PSS: per sandbox, against the same before the first PUT. Then waits
until the idle stop has stopped every one and reads them again.

Latency, --runs times on one sandbox with {"idleStopMs": 1000}: an exec of /bin/true right after
another, 300 ms after the one that started it (warm), then, once the idle stop has stopped it, the next exec of /bin/true (which starts
it again, adopting a jail of the daemon's pool); and how long after the last answer the stop was
seen (GET every 20 ms). Medians and p90, in ms.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

from nsboxd_http import call, start_daemon, stop_daemons

KERNEL = ("SUnreclaim", "SReclaimable", "KernelStack", "PageTables", "Percpu", "Shmem")


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            out[name] = int(value.split()[0])
    return out


def kib(path, field):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def inits_pss(daemon_pid):
    """The PSS (KiB) of the daemon's children that are nsbox-init, and how many there are."""
    total, count = 0, 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) != daemon_pid:
            continue
        try:
            exe = os.readlink(f"/proc/{name}/exe")
        except OSError:
            continue
        if os.path.basename(exe).startswith("nsbox-init"):
            total += kib(f"/proc/{name}/smaps_rollup", "Pss")
            count += 1
    return total, count


def snapshot(daemon_pid):
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")
    m = meminfo()
    pss, inits = inits_pss(daemon_pid)
    return {"kernel": sum(m.get(k, 0) for k in KERNEL),
            "daemon": kib(f"/proc/{daemon_pid}/status", "VmRSS"), "inits": pss, "count": inits}


def state(conn, sid):
    return json.loads(call(conn, "GET", f"/v1/sandboxes/{sid}"))["state"]


def wait_stopped(conn, ids, limit, pause=0.2):
    deadline = time.monotonic() + limit
    left = list(ids)
    while left and time.monotonic() < deadline:
        left = [sid for sid in left if state(conn, sid) != "stopped"]
        if left:
            time.sleep(pause)
    return left


def quantiles(values):
    v = sorted(values)
    return f"median {statistics.median(v):7.2f}, p90 {v[int(len(v) * 0.9)]:7.2f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nsbox", default="build/runtime/nsbox")
    p.add_argument("--sandboxes", type=int, default=200)
    p.add_argument("--idle-ms", type=int, default=30000,
                   help="the memory part's idleStopMs: longer than making them all takes, + 7 s")
    p.add_argument("--runs", type=int, default=20)
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="nsbox-idle-cost-", dir="/var/tmp")
    daemon, conn = start_daemon(os.path.abspath(a.nsbox), os.path.join(work, "sock"),
                                os.path.join(work, "state"), os.path.join(work, "daemon.log"))
    try:
        time.sleep(1)
        before = snapshot(daemon.pid)
        t0 = time.monotonic()
        ids = [f"idle-cost-{i}" for i in range(a.sandboxes)]
        body = json.dumps({"idleStopMs": a.idle_ms})
        for sid in ids:
            call(conn, "PUT", f"/v1/sandboxes/{sid}", body)
            call(conn, "POST", f"/v1/sandboxes/{sid}/exec", '{"command":"/bin/true"}')
        made = time.monotonic() - t0
        time.sleep(6)
        running = snapshot(daemon.pid)
        if time.monotonic() - t0 > a.idle_ms / 1000:
            raise SystemExit(f"making and reading took longer than --idle-ms {a.idle_ms}: raise it")
        left = wait_stopped(conn, ids, a.idle_ms / 1000 + 30)
        if left:
            raise SystemExit(f"{len(left)} sandboxes still running after their idle stop")
        time.sleep(1)
        stopped = snapshot(daemon.pid)
        n = a.sandboxes
        print(f"{n} sandboxes made and used in {made:.1f} s; per sandbox, KiB "
              "(kernel + daemon RSS growth + nsbox-inits' PSS = total):")
        for label, s in (("running, idle", running), ("stopped by the idle stop", stopped)):
            kernel = (s["kernel"] - before["kernel"]) / n
            daemon_kib = (s["daemon"] - before["daemon"]) / n
            inits = (s["inits"] - before["inits"]) / n
            print(f"  {label:>25}: {kernel:7.1f} + {daemon_kib:5.1f} + {inits:5.1f} = "
                  f"{kernel + daemon_kib + inits:7.1f}  ({s['count']} nsbox-init processes, "
                  f"the pool's included)")
        for sid in ids:
            call(conn, "DELETE", f"/v1/sandboxes/{sid}")

        sid = "idle-cost-latency"
        call(conn, "PUT", f"/v1/sandboxes/{sid}", '{"idleStopMs": 1000}')
        warm, after_stop, seen = [], [], []
        exec_true = '{"command":"/bin/true"}'
        for _ in range(a.runs):
            call(conn, "POST", f"/v1/sandboxes/{sid}/exec", exec_true)
            time.sleep(0.3)  # the pool makes its next jail, which a command would compete with
            call(conn, "POST", f"/v1/sandboxes/{sid}/exec", exec_true)
            t1 = time.perf_counter()
            call(conn, "POST", f"/v1/sandboxes/{sid}/exec", exec_true)
            t2 = time.perf_counter()
            warm.append((t2 - t1) * 1e3)
            if wait_stopped(conn, [sid], 30, pause=0.02):
                raise SystemExit("the latency sandbox was not stopped")
            seen.append((time.perf_counter() - t2) * 1e3)
            time.sleep(0.3)  # as before the warm one
            t3 = time.perf_counter()
            call(conn, "POST", f"/v1/sandboxes/{sid}/exec", exec_true)
            after_stop.append((time.perf_counter() - t3) * 1e3)
        print(f"exec /bin/true, warm:                   {quantiles(warm)} ms")
        print(f"exec /bin/true after the idle stop:     {quantiles(after_stop)} ms")
        print(f"stop seen after the last answer (1000): {quantiles(seen)} ms")
        call(conn, "DELETE", f"/v1/sandboxes/{sid}")
    finally:
        stop_daemons([daemon], [work])


if __name__ == "__main__":
    main()

"""What the bench scripts share: an nsboxd started on its own socket, and HTTP over that socket."""

import http.client
import os
import socket
import statistics
import subprocess
import sys
import threading
import time


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(60)
        self.sock.connect(self.path)


def call(conn, method, url, body=None, accept=None):
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if accept is not None:
        headers["Accept"] = accept
    conn.request(method, url, body, headers)
    r = conn.getresponse()
    data = r.read()
    if r.status >= 300:
        sys.exit(f"{method} {url}: {r.status} {data[:200]!r}")
    return data


def start_daemon(binary, sock, state, log, extra_args=(), preexec_fn=None, timeout=5.0):
    """`binary serve` on `sock` and `state`, its stderr to `log`; the process and a connection.

    `preexec_fn` runs in the child before the exec (e.g. to enter a cgroup); the socket is
    waited for up to `timeout` seconds."""
    daemon = subprocess.Popen([binary, "serve", "--socket", sock, "--state-dir", state] +
                              list(extra_args), stderr=open(log, "w"), preexec_fn=preexec_fn)
    deadline = time.monotonic() + timeout
    while not os.path.exists(sock) and time.monotonic() < deadline:
        time.sleep(0.05)
    conn = UnixConnection(sock)
    call(conn, "GET", "/v1/health")
    return daemon, conn


def stop_daemons(daemons, paths):
    """SIGTERM to each of `daemons` (Popen objects), a wait for each, then `rm -rf` of `paths`."""
    for d in daemons:
        d.terminate()
        d.wait()
    subprocess.run(["rm", "-rf"] + list(paths))


def health_during(sock, work, pause, lead=0.0):
    """Runs `work()` while a second connection asks GET /v1/health every `pause` seconds (from
    `lead` seconds before `work` starts until it returns): `work`'s result, and the health
    answers' median, p99 and worst latencies in ms."""
    lat, stop = [], threading.Event()

    def probe():
        conn = UnixConnection(sock)
        while not stop.is_set():
            t0 = time.perf_counter()
            call(conn, "GET", "/v1/health")
            lat.append((time.perf_counter() - t0) * 1e3)
            time.sleep(pause)
        conn.close()

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        time.sleep(lead)
        result = work()
    finally:
        stop.set()
        prober.join()
    q = sorted(lat)
    return result, statistics.median(q), q[min(len(q) - 1, int(len(q) * 0.99))], q[-1]

"""The orphan storm and the scrape abuse that bench_metrics.py measures and
tests/test_metrics_abuse.py checks: one copy for both (stdlib only)."""
from __future__ import annotations

import http.client
import socket
import threading
import time

# The main child. Every round: wait for the file go-K, make N orphans (the middle
# processes exit at once, the orphans block on a pipe), release them all at once by
# closing the pipe, and time until PID 1 has no child left but us (result-K).
STORM_CHILD = r'''
import os, signal, sys, time
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
d, n = sys.argv[1], int(sys.argv[2])

def reaper_children():
    with open("/proc/1/task/1/children") as f:
        return len(f.read().split())

open(f"{d}/ready", "w").write("1")
k = 0
while True:
    k += 1
    while not os.path.exists(f"{d}/go-{k}"):
        if os.path.exists(f"{d}/exit"):
            sys.exit(0)
        time.sleep(0.002)
    r, w = os.pipe()
    for _ in range(n):
        mid = os.fork()
        if mid == 0:
            if os.fork() == 0:
                os.close(w)
                os.read(r, 1)          # returns at EOF: when the main child closes w
                os._exit(0)
            os._exit(0)
        os.waitpid(mid, 0)
    os.close(r)
    while reaper_children() != n + 1:   # every orphan adopted by PID 1
        time.sleep(0.001)
    start = time.monotonic()
    os.close(w)
    while reaper_children() > 1:
        time.sleep(0.0002)
    elapsed = time.monotonic() - start
    with open(f"{d}/result-{k}.tmp", "w") as f:
        f.write(repr(elapsed))
    os.rename(f"{d}/result-{k}.tmp", f"{d}/result-{k}")
'''

JUNK = [b"\x00\xff" * 500 + b"\r\n\r\n", b"GET\r\n\r\n", b"BREW /pot HTCPCP/1.0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"a" * 40000 + b"\r\n\r\n",
        b"GET /" + b"%" * 70000 + b" HTTP/1.1\r\n\r\n", b"", b"POST /metrics HTTP/1.1\r\n\r\n"]


def status_of(port: int, timeout: float = 10.0) -> int:
    """GET /metrics; the HTTP status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


class Abuse:
    """Slow-loris connections, rapid scrapes and garbage, until the with-block ends.
    .rapid counts the rapid scrapes, .latencies their durations, .statuses their
    answers."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.latencies: list = []
        self.statuses: dict = {}
        self.threads = [threading.Thread(target=self._slow_loris, daemon=True) for _ in range(4)]
        self.threads += [threading.Thread(target=self._rapid, daemon=True) for _ in range(4)]
        self.threads += [threading.Thread(target=self._garbage, daemon=True)]

    @property
    def rapid(self) -> int:
        return len(self.latencies)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(15)

    def _slow_loris(self) -> None:
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
                    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    while not self.stop.wait(0.3):
                        s.sendall(b"X-Slow: 1\r\n")     # never ends the head
            except OSError:
                pass     # cut off by reaper's request deadline: connect again

    def _rapid(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                status = status_of(self.port)
            except OSError:
                status = "error"
            with self.lock:
                self.latencies.append(time.monotonic() - t)
                self.statuses[status] = self.statuses.get(status, 0) + 1

    def _garbage(self) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
                    s.sendall(JUNK[i % len(JUNK)])
                    s.shutdown(socket.SHUT_WR)
                    s.recv(4096)
            except OSError:
                pass
            i += 1

"""Abuse of the metrics endpoint does not delay reaping.

The main child runs orphan storms on request and times each one from the
release of N orphans until reaper (PID 1) has reaped them all. Quiet rounds and
rounds under abuse (a slow-loris client, 1,000 rapid requests, garbage
requests) run in the same reaper; the abused rounds must stay close to the
quiet ones. A loop that waited on the exporter (say, a slow-loris holding it)
would take seconds. Absolute numbers: bench/bench_metrics.py.
"""
import socket
import threading

import pytest

from conftest import free_port, wait_for, wait_for_file
from metrics_helpers import get, scrape, wait_healthy, write_script

N = 300
# Every round: wait for the file go-K, make N orphans (the middle processes
# exit at once, the orphans block on a pipe), release them all at once by
# closing the pipe, and time until PID 1 has no child left but us.
STORM_CHILD = r'''
import os, signal, sys, time
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
d, n = sys.argv[1], int(sys.argv[2])

def reaper_children():
    with open("/proc/1/task/1/children") as f:
        return len(f.read().split())

k = 0
while True:
    k += 1
    while not os.path.exists(f"{d}/go-{k}"):
        if os.path.exists(f"{d}/exit"):
            sys.exit(0)
        time.sleep(0.005)
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
        time.sleep(0.0005)
    elapsed = time.monotonic() - start
    with open(f"{d}/result-{k}.tmp", "w") as f:
        f.write(repr(elapsed))
    os.rename(f"{d}/result-{k}.tmp", f"{d}/result-{k}")
'''


def _round(tmp_path, k: int) -> float:
    (tmp_path / f"go-{k}").touch()
    return float(wait_for_file(tmp_path / f"result-{k}", 60))


class Abuse:
    """Slow-loris connections, rapid scrapes and garbage, until stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.rapid = 0
        self.statuses: dict = {}
        self.threads = [threading.Thread(target=self._slow_loris, daemon=True) for _ in range(4)]
        self.threads += [threading.Thread(target=self._rapid, daemon=True) for _ in range(4)]
        self.threads += [threading.Thread(target=self._garbage, daemon=True)]
        self.lock = threading.Lock()

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
            try:
                status = get(self.port, timeout=10)[0]
            except OSError:
                status = "error"
            with self.lock:
                self.rapid += 1
                self.statuses[status] = self.statuses.get(status, 0) + 1

    def _garbage(self) -> None:
        junk = [b"\x00\xff" * 500 + b"\r\n\r\n", b"GET\r\n\r\n", b"BREW /pot HTCPCP/1.0\r\n\r\n",
                b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"a" * 40000 + b"\r\n\r\n",
                b"GET /" + b"%" * 70000 + b" HTTP/1.1\r\n\r\n", b"", b"POST /metrics HTTP/1.1\r\n\r\n"]
        i = 0
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
                    s.sendall(junk[i % len(junk)])
                    s.shutdown(socket.SHUT_WR)
                    s.recv(4096)
            except OSError:
                pass
            i += 1


@pytest.mark.xdist_group("cpu-heavy")     # compares latencies: not beside other heavy tests
def test_abuse_does_not_delay_reaping(reaper, tmp_path):
    port = free_port()
    r = reaper(["--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--",
                *write_script(tmp_path, "storm.py", STORM_CHILD), str(tmp_path), str(N)])
    wait_healthy(port)
    k, quiet, abused = 0, [], []
    for _ in range(3):
        k += 1
        quiet.append(_round(tmp_path, k))
        with Abuse(port) as abuse:
            wait_for(lambda: abuse.rapid >= 100, 60, 0.01, what="abuse to be in full swing")
            k += 1
            abused.append(_round(tmp_path, k))
            # Hold the abuse until 1,000 rapid requests have gone through.
            wait_for(lambda: abuse.rapid >= 1000, 120, 0.05, what="1,000 rapid requests")
        assert abuse.statuses.get(200, 0) > 0, abuse.statuses
    s = scrape(port)                  # still answering, and it counted every reap
    assert s.value("reaper_reaped_total", kind="orphan", outcome="exited_0") == 6 * N
    assert r.proc.poll() is None
    (tmp_path / "exit").touch()
    assert r.wait(30) == 0
    q, a = min(quiet), min(abused)
    print(f"orphan storm of {N}: quiet {sorted(quiet)}, under abuse {sorted(abused)}")
    # Generous: the machine is shared and 2 cores serve reaper, the storm and the
    # abuse at once. A loop stuck behind the exporter would take seconds.
    assert a <= 4 * q + 0.5, (quiet, abused)

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


# --- a connection flood: idle and slow-loris connections held open ----------------------

SLOW_EVERY = 0.5     # seconds between the header lines a slow-loris connection trickles


class Flood:
    """Holds `idle` connections that never send a byte and `slow` ones that trickle
    a request head that never ends; every connection cut is opened again at once.
    One thread, one selectors loop (a thousand threads would measure themselves)."""

    def __init__(self, port: int, idle: int, slow: int, host: str = "127.0.0.1") -> None:
        import selectors

        self.addr = (host, port)
        self.selector = selectors.DefaultSelector()
        self.kinds = ["idle"] * idle + ["slow"] * slow
        self.established = 0       # connections open now
        self.connects = 0          # connections ever established
        self.cuts = 0              # connections the server cut (EOF or reset)
        self.retry: list = []      # kinds to open again once connect() can succeed
        self.slow_due: dict = {}   # slow socket -> when it sends its next line
        self.control_ready = False  # a file registered with data None became readable

    def open_all(self) -> None:
        for kind in self.kinds:
            self._open(kind)

    def _open(self, kind: str) -> None:
        import errno
        import selectors

        s = socket.socket()
        s.setblocking(False)
        err = s.connect_ex(self.addr)
        if err not in (0, errno.EINPROGRESS):
            s.close()
            self.retry.append(kind)          # refused, or out of ports: later
            return
        self.selector.register(s, selectors.EVENT_WRITE, [kind, False])

    def _drop(self, s: socket.socket, state: list) -> None:
        self.selector.unregister(s)
        s.close()
        self.slow_due.pop(s, None)
        if state[1]:
            self.established -= 1
            self.cuts += 1
        self._open(state[0])

    def step(self, timeout: float) -> None:
        import selectors

        for key, _ in self.selector.select(timeout):
            s, state = key.fileobj, key.data
            if state is None:                                  # a control file of the caller's
                self.control_ready = True
                continue
            if not state[1]:                                   # connect() finished
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    self.selector.unregister(s)
                    s.close()
                    self.retry.append(state[0])
                    continue
                state[1] = True
                self.established += 1
                self.connects += 1
                self.selector.modify(s, selectors.EVENT_READ, state)
                if state[0] == "slow":
                    self._send(s, state, b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                continue
            try:
                gone = not s.recv(4096)
            except OSError:
                gone = True
            if gone:
                self._drop(s, state)
        now = time.monotonic()
        for s, due in list(self.slow_due.items()):
            if due <= now and s in self.slow_due:          # not dropped earlier in this loop
                self._send(s, self.selector.get_key(s).data, b"X-Slow: 1\r\n")
        retry, self.retry = self.retry, []
        for kind in retry:
            self._open(kind)

    def _send(self, s: socket.socket, state: list, data: bytes) -> None:
        try:
            s.send(data)
        except OSError:
            self._drop(s, state)
            return
        self.slow_due[s] = time.monotonic() + SLOW_EVERY

    def stats(self) -> dict:
        return {"established": self.established, "connects": self.connects, "cuts": self.cuts,
                "wanted": len(self.kinds)}


def _flood_main(argv: list) -> int:
    """python3 abuse.py flood PORT IDLE SLOW: prints "ready" once every connection is
    open; each line on stdin gets the counters back as JSON; stdin's EOF ends it."""
    import json
    import resource
    import selectors
    import sys

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port, idle, slow = (int(a) for a in argv)
    flood = Flood(port, idle, slow)
    flood.open_all()
    stdin = sys.stdin.buffer.raw
    flood.selector.register(stdin, selectors.EVENT_READ, None)
    said_ready = False
    while True:
        if not said_ready and flood.established >= len(flood.kinds):
            sys.stdout.write("ready\n")
            sys.stdout.flush()
            said_ready = True
        if flood.control_ready:
            flood.control_ready = False
            line = stdin.read(4096)
            if not line:
                return 0
            sys.stdout.write(json.dumps(flood.stats()) + "\n")
            sys.stdout.flush()
        flood.step(0.05 if flood.slow_due or flood.retry else 0.2)


class Flooding:
    """The flood in a process of its own (its loop must not share the GIL with the
    probing client). with Flooding(port, idle, slow) as f: ... f.stats() ..."""

    def __init__(self, port: int, idle: int, slow: int, timeout: float = 60.0) -> None:
        self.args = [str(port), str(idle), str(slow)]
        self.timeout = timeout
        self.proc = None

    def __enter__(self):
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, __file__, "flood", *self.args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        if self._line() != "ready":
            self.__exit__()
            raise RuntimeError("the flood did not get its connections open")
        return self

    def _line(self) -> str:
        import select

        if not select.select([self.proc.stdout], [], [], self.timeout)[0]:
            raise TimeoutError(f"no answer from the flood within {self.timeout}s")
        return self.proc.stdout.readline().strip()

    def stats(self) -> dict:
        import json

        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def __exit__(self, *exc):
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["flood"]:
        sys.exit(_flood_main(sys.argv[2:]))
    sys.exit("usage: abuse.py flood PORT IDLE SLOW")

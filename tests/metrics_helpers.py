"""Helpers for the metrics tests: real HTTP scrapes parsed by prometheus_client's parser."""
from __future__ import annotations

import http.client
import os
import signal
import textwrap
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from conftest import PYTHON, SLOW, wait_for

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def request(port: int, method: str, path: str, headers=None, body=None, timeout: float = 10.0,
            host: str = "127.0.0.1"):
    """(status, headers dict with lower-case names, body bytes) of one real HTTP request:
    the suite's one HTTP client."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def get(port: int, path: str = "/metrics", accept: str = "", timeout: float = 10.0, host: str = "127.0.0.1"):
    """(status, content type, body text) of one GET on host:port."""
    status, headers, body = request(port, "GET", path, {"Accept": accept} if accept else {}, timeout=timeout,
                                    host=host)
    return status, headers.get("content-type", ""), body.decode()


def start_with_metrics(reaper, command: list, flags=(), **kw) -> tuple:
    """(reaper, port): the reaper fixture's reaper serving metrics on a port of this
    test's own (loopback only), started with flags before COMMAND, once it answers.
    An empty command gives no `--` (pause mode, -P, takes none)."""
    from conftest import free_port

    port = free_port()
    r = reaper(["--metrics-port", str(port), "--metrics-address", "127.0.0.1", *flags,
                *(["--", *command] if command else [])], **kw)
    wait_healthy(port)
    return r, port


def wait_healthy(port: int, timeout: float = 20.0) -> None:
    """Until /healthz answers (reaper binds before the spawn, but starts under unshare first)."""
    def ok():
        try:
            return get(port, "/healthz", timeout=2)[0] == 200
        except OSError:
            return False
    wait_for(ok, timeout, 0.02, what=f"metrics endpoint on port {port}")


class Scrape:
    """One scrape: families by name, samples looked up by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(self, sample: str, **labels):
        found = [s.value for f in self.families.values() for s in f.samples
                 if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) <= 1, f"{sample}{labels} is ambiguous: {found}"
        return found[0] if found else None

    def total(self, sample: str, **labels):
        """Sum over every sample named sample whose labels include labels (None if none)."""
        found = [s.value for s in self.samples(sample) if all(s.labels.get(k) == v for k, v in labels.items())]
        return sum(found) if found else None

    def samples(self, sample: str):
        return [s for f in self.families.values() for s in f.samples if s.name == sample]

    def type(self, family: str) -> str:
        return self.families[family].type


def sample_map(url: str) -> dict:
    """GET url (a /metrics through any route, e.g. a container's published port):
    {(sample name, sorted label pairs): value}."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    status, _, text = get(parts.port, parts.path or "/", timeout=5, host=parts.hostname)
    assert status == 200, (url, status)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in Scrape(text).families.values() for s in f.samples}


def scrape(port: int) -> Scrape:
    status, _, body = get(port)
    assert status == 200, status
    return Scrape(body)


def wait_scrape(port: int, predicate, what: str, timeout: float = 15.0) -> Scrape:
    """Scrapes until predicate(scrape) is true (/proc scans are reused for up to 0.5 s)."""
    def check():
        try:
            s = scrape(port)
        except ConnectionResetError:
            if SLOW == 1:
                raise
            return None        # cut by the exporter's 5 s deadlines on a host SLOW times slower
        return s if predicate(s) else None
    return wait_for(check, timeout, interval=0.05, what=what)


def wait_value(port: int, sample: str, expected, timeout: float = 15.0, **labels) -> Scrape:
    """Scrapes until the sum of sample{labels...} == expected; returns that scrape."""
    last = {}

    def check():
        s = scrape(port)
        last["v"] = s.total(sample, **labels)
        return s if last["v"] == expected else None
    try:
        return wait_for(check, timeout, interval=0.05, what=f"{sample}{labels} == {expected}")
    except AssertionError:
        raise AssertionError(f"{sample}{labels} stayed {last.get('v')!r}, expected {expected!r}") from None


# A main child for the exact-count test. It makes orphans with known outcomes,
# a zombie of its own, counts the signals reaper forwards, and exits with a
# known code only when the test creates the file "go".
EVENTS_CHILD = textwrap.dedent(r'''
    import os, signal, sys, time
    d = sys.argv[1]
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)   # an inherited SIG_IGN would auto-reap the zombie
    outcomes = [("exit", 0)] * 3 + [("exit", 5)] * 2 + [("kill", signal.SIGTERM)]

    def note(signo, frame):
        with open(os.path.join(d, "signals"), "a") as f:
            f.write(signal.Signals(signo).name + "\n")
    signal.signal(signal.SIGUSR1, note)
    signal.signal(signal.SIGHUP, note)

    for how, arg in outcomes:          # orphans: the middle process exits at once
        mid = os.fork()
        if mid == 0:
            if os.fork() == 0:
                while os.getppid() != 1:
                    time.sleep(0.001)
                if how == "kill":
                    signal.signal(arg, signal.SIG_DFL)
                    os.kill(os.getpid(), arg)
                os._exit(arg)
            os._exit(0)
        os.waitpid(mid, 0)
    if os.fork() == 0:                 # a zombie: its parent (this process) never waits
        os._exit(0)
    open(os.path.join(d, "ready"), "w").write("ready")
    while not os.path.exists(os.path.join(d, "go")):
        time.sleep(0.01)
    sys.exit(7)
''')


def write_script(tmp_path: Path, name: str, code: str) -> list:
    path = tmp_path / name
    path.write_text(code)
    return [PYTHON, str(path)]


def send_and_confirm(r, sig: int, log: Path, expect_lines: int) -> None:
    """Sends sig to reaper and waits until the main child has logged it (signals coalesce)."""
    r.send(sig)
    wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= expect_lines, 10,
             what=f"main child to receive {signal.Signals(sig).name}")


def in_pids_cgroup(limit: int):
    """A fresh pids cgroup with pids.max=limit, or None when this host has none: cgroup v1's,
    or on a pure cgroup v2 host (.ci/check-cgroup2's guest) one below the root, which hands
    the pids controller down. Returns (directory, preexec_fn that moves the started process into it)."""
    base = Path("/sys/fs/cgroup/pids")
    v2 = not (base / "cgroup.procs").exists() and "pids" in _v2_root_controllers()
    if os.geteuid() != 0 or not ((base / "cgroup.procs").exists() or v2):
        return None
    base = Path("/sys/fs/cgroup") if v2 else base
    d = base / f"reaper-test-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        if v2:
            (base / "cgroup.subtree_control").write_text("+pids")
        d.mkdir()
        (d / "pids.max").write_text(str(limit))
    except OSError:
        return None

    def enter():
        with open(d / "cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
    return d, enter


def _v2_root_controllers() -> list:
    try:
        return open("/sys/fs/cgroup/cgroup.controllers").read().split()
    except OSError:
        return []


def refuse_http_thread(monkeypatch) -> None:
    """threading.Thread.start refuses reaper's HTTP thread (no room for a thread), and
    starts every other thread as usual."""
    import threading

    real_start = threading.Thread.start

    def start(t):
        if t.name == "reaper-metrics-http":
            raise RuntimeError("can't start new thread")
        real_start(t)
    monkeypatch.setattr(threading.Thread, "start", start)


# --- an exporter in the test's own process: real options.Config and stats.Stats --------------

def exporter_config(**fields):
    """A real options.Config (reaper's defaults) with the fields given set; a field the
    Config lacks is the test's mistake."""
    from reaper import options

    cfg = options.Config()
    for name, value in fields.items():
        assert hasattr(cfg, name), f"options.Config has no {name}"
        setattr(cfg, name, value)
    return cfg


def own_scope():
    """A real scope (reaper watch's type) for an exporter made in the test's process:
    not PID 1, no main child, no services."""
    from reaper.commands.watch import WatchScope

    return WatchScope(os.getpid())

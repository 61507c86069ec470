"""The exporter cannot hurt PID 1: a connection flood, an empty /proc, no room for a
thread. Real reapers, real HTTP; bench/abuse.py's Flooding holds the connections."""
import gzip
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PYTHON, REAPER, UNSHARE, free_port, line_with, proc_status, read_until, remove_cgroup, wait_for
from metrics_helpers import Scrape, get, in_pids_cgroup, refuse_http_thread, request, start_with_metrics, wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from abuse import Flooding  # noqa: E402  (one copy for the test and the benchmark)

IDLE, SLOW = 1000, 300          # SLOW alone is above the server's 256 connections: it must evict


def raw(port: int, data: bytes) -> bytes:
    """What the server answers to data sent as is (up to its close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def threads(pid: int) -> int:
    return int(proc_status(pid)["Threads"])


@pytest.mark.xdist_group("cpu-heavy")     # the flood takes a core: not beside other heavy tests
def test_endpoint_answers_within_a_second_under_a_connection_flood(reaper):
    r, port = start_with_metrics(reaper, ["sleep", "600"])
    before = threads(r.pid)
    with Flooding(port, IDLE, SLOW) as flood:
        # Under way: the server has cut connections and they came back.
        wait_for(lambda: flood.stats()["cuts"] >= 2 * SLOW, 30, 0.05, what="the server to cut connections")
        for _ in range(5):
            for path in ("/healthz", "/metrics"):
                t = time.monotonic()
                status, _, body = get(port, path, timeout=1.0)
                took = time.monotonic() - t
                assert status == 200 and took < 1.0, (path, status, took)
            assert threads(r.pid) == before        # no thread per connection
        held = flood.stats()
    assert held["established"] >= IDLE + SLOW - 50, held     # the flood was really held open
    assert "reaper_build_info" in body
    assert r.proc.poll() is None
    r.kill()
    assert "Traceback" not in r.stderr
    assert not [ln for ln in r.stderr.splitlines() if "metrics" in ln], r.stderr   # nothing per request


@pytest.mark.xdist_group("cpu-heavy")
def test_a_flood_never_takes_the_descriptors_a_scrape_needs(reaper):
    """RLIMIT_NOFILE 64 and a flood of 300 connections: the server holds at most half
    the descriptors, so the scrape can still read /proc while it is flooded."""
    import resource

    def few_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    r, port = start_with_metrics(reaper, ["sleep", "600"], preexec_fn=few_fds)
    with Flooding(port, 200, 100) as flood:
        wait_for(lambda: flood.stats()["cuts"] >= 200, 30, 0.05, what="the server to cut connections")
        for _ in range(3):
            t = time.monotonic()
            status, _, text = get(port, timeout=1.0)
            assert status == 200 and time.monotonic() - t < 1.0
            s = Scrape(text)
            assert s.value("reaper_source_available", source="proc") == 1
            assert s.value("reaper_zombies") == 0
            assert s.value("process_open_fds") <= 64 // 2 + 16
    assert r.proc.poll() is None


def test_methods_paths_and_encodings(reaper):
    r, port = start_with_metrics(reaper, ["sleep", "600"])
    status, got, body = request(port, "GET", "/metrics")
    h_status, head, h_body = request(port, "HEAD", "/metrics")
    assert (status, h_status, h_body) == (200, 200, b"")
    assert head["content-type"] == got["content-type"]
    # Two scrapes, two sets of values (CPU seconds, ratios): the lengths agree closely.
    assert abs(int(head["content-length"]) - len(body)) < 0.05 * len(body), (head, len(body))
    assert int(got["content-length"]) == len(body)
    h_status, head, h_body = request(port, "HEAD", "/healthz")
    assert (h_status, head["content-length"], h_body) == (200, "3", b"")
    status, got, body = request(port, "POST", "/metrics", body=b"x=1")
    assert status == 405 and got["allow"] == "GET, HEAD"
    assert request(port, "GET", "/nope")[0] == 404
    status, _, body = request(port, "GET", "/")
    assert status == 200 and b"/metrics" in body
    assert raw(port, b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n").startswith(b"HTTP/1.1 431 ")
    status, got, body = request(port, "GET", "/metrics", headers={"Accept-Encoding": "gzip"})
    assert status == 200 and got["content-encoding"] == "gzip"
    assert "reaper_build_info" in Scrape(gzip.decompress(body).decode()).families
    assert r.proc.poll() is None


def test_a_collection_that_fails_is_a_500_and_the_server_goes_on():
    """docs/metrics.md: a scrape whose collection fails answers 500 (logged at debug
    level only); the next scrape, and /healthz, are answered as usual."""
    from prometheus_client import CollectorRegistry

    from reaper import httpserver
    from reaper.metrics import routes

    class Failing:
        fail = True

        def collect(self):
            if Failing.fail:
                raise RuntimeError("a collector that fails")
            return []

    registry = CollectorRegistry()
    registry.register(Failing())
    port = free_port()
    sock = socket.create_server(("127.0.0.1", port))
    with StderrPipe() as err:
        server = httpserver.Server(sock, routes.app(registry, err.log), err.log)
        server.start()
        try:
            status, _, body = request(port, "GET", "/metrics")
            assert (status, body) == (500, b"collection failed\n")
            assert request(port, "GET", "/healthz")[0] == 200
            Failing.fail = False
            assert request(port, "GET", "/metrics")[0] == 200
        finally:
            server.stop()
        assert err.lines() == []                    # debug level only: nothing at -v


def test_head_matches_get_exactly_on_a_fixed_registry():
    """The same routes and server in this process, over real HTTP, on metrics that do
    not change between two scrapes: HEAD's headers are GET's, byte for byte."""
    from prometheus_client import CollectorRegistry, Gauge

    from reaper import httpserver
    from reaper.metrics import routes

    registry = CollectorRegistry()
    Gauge("fixed_value", "A value that does not move", registry=registry).set(42)
    port = free_port()
    sock = socket.create_server(("127.0.0.1", port))
    from reaper.log import Log

    server = httpserver.Server(sock, routes.app(registry, Log()), Log())
    server.start()
    try:
        for accept in ("", "application/openmetrics-text; version=1.0.0"):
            status, got, body = request(port, "GET", "/metrics", headers={"Accept": accept})
            h_status, head, h_body = request(port, "HEAD", "/metrics", headers={"Accept": accept})
            assert (status, h_status, h_body) == (200, 200, b"")
            assert head == got and int(head["content-length"]) == len(body) > 0
    finally:
        server.stop()
        server.thread.join(5)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_scrape_succeeds_without_proc():
    """An empty tmpfs over /proc before reaper starts: the scrape still answers, and
    says which sources it could not read instead of reporting zeros."""
    port = free_port()
    inner = f"mount -t tmpfs none /proc && exec {REAPER} --metrics-port {port} --metrics-address 127.0.0.1 " \
            "-- sleep 600"
    proc = subprocess.Popen([*UNSHARE, "sh", "-c", inner], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_healthy(port)
        status, _, text = get(port)
        assert status == 200
        s = Scrape(text)
        for source in ("proc", "proc_stat", "proc_cgroups", "cgroup_pids", "self_memory"):
            assert s.value("reaper_source_available", source=source) == 0, source
        for left_out in ("reaper_zombies", "reaper_processes", "reaper_resident_memory_bytes",
                         "reaper_node_cpu_busiest_ratio", "reaper_node_cpus", "reaper_cgroup_pids"):
            assert not s.samples(left_out), left_out
        assert s.value("reaper_cgroup_pids_available") == 0
        assert s.value("reaper_node_memory_cgroups_available") == 0
        assert s.value("reaper_main_child_up") == 1            # what needs no /proc is there
        assert s.value("reaper_policy_errors_total") == 0
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    assert "Traceback" not in err.decode(), err


def test_sources_are_available_with_proc(reaper):
    _, port = start_with_metrics(reaper, ["sleep", "600"])
    s = Scrape(get(port)[2])
    for source in ("proc", "proc_stat", "proc_cgroups", "self_memory"):
        assert s.value("reaper_source_available", source=source) == 1, source
    assert s.value("reaper_zombies") == 0
    assert s.value("reaper_log_lines_dropped_total") == 0


def test_exporter_start_failure_leaves_metrics_off_and_the_child_supervised(tmp_path):
    """No room for a thread (pids.max: unshare, reaper, the child and nothing more):
    the exporter cannot start, reaper says so once and goes on to the child's status."""
    cg = in_pids_cgroup(3)
    if cg is None:
        pytest.skip("needs root and a cgroup-v1 pids hierarchy")
    port, go = free_port(), tmp_path / "go"
    child = ("import os, sys, time\n"           # no fork, no thread: the child takes one pid
             "while not os.path.exists(sys.argv[1]):\n"
             "    time.sleep(0.01)\n"
             "sys.exit(5)\n")
    proc = subprocess.Popen([*UNSHARE, REAPER, "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
                             "--", PYTHON, "-c", child, str(go)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=cg[1])
    try:
        err = read_until(proc.stderr.fileno(), line_with(re.compile(rb"metrics.*\boff\b")), 30)
        with pytest.raises(ConnectionRefusedError):       # the socket is closed, not left hanging
            socket.create_connection(("127.0.0.1", port), timeout=5)
        go.touch()
        assert proc.wait(30) == 5, err
        err += proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        remove_cgroup(cg[0])
    text = err.decode(errors="replace")
    assert "Traceback" not in text, text
    assert len(re.findall(r"metrics.*\boff\b", text)) == 1, text


# --- in this process: the exporter's own failure handling ---------------------------------

class StderrPipe:
    """fd 2 is a pipe of the test's own while it is open, for a real reaper Log made
    inside: the first `full` lines it writes find the pipe full and are dropped (and
    counted, as reaper counts them); .lines() are (level, message) of the rest."""

    def __init__(self, full: int = 0) -> None:
        self.full, self.buf = full, b""

    def __enter__(self):
        from reaper.log import Log

        self.r, w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(w, False)
        filler = 0
        for size in (4096, 1):                  # to the last byte: a line never fits
            try:
                while True:
                    filler += os.write(w, b"x" * size)
            except BlockingIOError:
                pass
        self.saved = os.dup(2)
        os.dup2(w, 2)
        os.close(w)
        self.log = Log(verbosity=2)
        for n in range(self.full):
            self.log.warn(f"line {n} that finds stderr full")
        while filler:                            # room again: the lines after reach the pipe
            filler -= len(os.read(self.r, min(filler, 65536)))
        return self

    def lines(self) -> list:
        try:
            while True:
                chunk = os.read(self.r, 65536)
                if not chunk:
                    break
                self.buf += chunk
        except BlockingIOError:
            pass
        out = []
        for line in self.buf.decode().splitlines():
            level, _, msg = line.partition(": ")[2].partition(" ")
            out.append((level.lower(), msg))
        return out

    def __exit__(self, *exc) -> None:
        os.dup2(self.saved, 2)
        os.close(self.saved)
        os.close(self.r)


def _exporter(port: int, log):
    from metrics_helpers import exporter_config

    from reaper import metrics
    from reaper.stats import Stats

    return metrics.prepare(exporter_config(metrics_address="127.0.0.1", metrics_port=port), Stats(), log)


def test_abort_after_a_failed_start_releases_everything(monkeypatch):
    """The HTTP thread cannot start after the sampler did: start() raises with the
    sampler stopped and the port closed; abort() never raises, even twice."""
    port, err = free_port(), StderrPipe()
    with err:
        _abort_after_a_failed_start(port, err.log, monkeypatch)
        assert not [ln for ln in err.lines() if ln[0] in ("error", "warn")], err.lines()


def _abort_after_a_failed_start(port, log, monkeypatch):
    x = _exporter(port, log)
    refuse_http_thread(monkeypatch)
    from metrics_helpers import own_scope

    scope = own_scope()
    with pytest.raises(RuntimeError):
        x.start(scope)
    x._sampler.join(5)
    assert not x._sampler.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    x.abort()
    x.abort()


def test_a_failing_sampler_piece_is_switched_off_and_starts_again(tmp_path, monkeypatch):
    """Per-core CPU whose /proc/stat vanishes after the start: one line, the piece
    off, its metrics left out and its source unavailable; the rest goes on. Once the
    file is back the piece starts again after its backoff (a failure is no off switch)."""
    from reaper import nodestats

    stat = tmp_path / "stat"
    stat.write_text("cpu  1 0 1 10 0 0 0 0\ncpu0 1 0 1 10 0 0 0 0\n")
    real = nodestats.CpuSampler
    monkeypatch.setattr(nodestats, "CpuSampler", lambda: real(str(tmp_path)))
    with StderrPipe(full=3) as err:
        assert err.log.dropped == 3 and err.lines() == []     # the real Log counted what it lost
        _switched_off_and_on_again(free_port(), err, stat)


def _switched_off_and_on_again(port, err, stat):
    x = _exporter(port, err.log)
    from metrics_helpers import own_scope

    scope = own_scope()
    x.start(scope)
    try:
        assert x.cpu is not None
        stat.unlink()                                      # the sampler's next read fails
        wait_for(lambda: x.cpu is None, 10, 0.02, what="the sampler to switch per-core CPU off")
        s = Scrape(get(port)[2])
        assert s.value("reaper_source_available", source="proc_stat") == 0
        assert s.value("reaper_source_available", source="proc") == 1
        assert not s.samples("reaper_node_cpu_busiest_ratio") and not s.samples("reaper_node_cpus")
        assert s.value("reaper_log_lines_dropped_total") == 3
        warned = [msg for level, msg in err.lines() if level in ("warn", "error")]
        assert len(warned) == 1 and "per-core CPU" in warned[0] and "switched off" in warned[0], warned
        assert "starting it again in 1 s" in warned[0], warned
        assert x._sampler.is_alive()                       # the other pieces go on
        stat.write_text("cpu  2 0 2 20 0 0 0 0\ncpu0 2 0 2 20 0 0 0 0\n")
        wait_for(lambda: x.cpu is not None, 10, 0.02, what="per-core CPU to start again")
        # A scrape within routes.SCRAPE_CACHE of the last one is served that one's page.
        wait_for(lambda: Scrape(get(port)[2]).value("reaper_source_available", source="proc_stat") == 1, 10, 0.1,
                 what="a scrape to see per-core CPU again")
        assert any("per-core CPU started again" in msg for level, msg in err.lines() if level == "info"), err.lines()
    finally:
        x.abort()

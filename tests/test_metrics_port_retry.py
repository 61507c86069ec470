"""A metrics port that cannot be bound for now (issue 18, point 3): on a hostNetwork
node the second pod finds the port taken, and an address may come up after reaper
starts. The child starts anyway, one WARN line says why, the bind is retried in the
background with backoff, and /healthz and /metrics answer once it succeeds; the
metrics file is written meanwhile. What can never work is still a usage error."""
import errno
import os
import shutil
import signal
import socket
from contextlib import contextmanager

import pytest

from conftest import (PYTHON, REAPER, _refusal, free_port, refused, refused_sub, require, wait_for,
                      wait_for_file)
from metrics_helpers import Scrape, exporter_config, get, own_scope, scrape, wait_healthy, write_script


@contextmanager
def held(port: int):
    """127.0.0.1:port bound and listening by this process (another one than reaper),
    as another pod on a hostNetwork node holds it; released on leaving."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        yield holder
    finally:
        holder.close()


def file_says(path, listening: int, mode: str = "init", timeout: float = 15.0) -> Scrape:
    """Waits until the metrics file (atomically replaced) says reaper_metrics_listening == listening."""
    def check():
        try:
            s = Scrape(path.read_text())
        except FileNotFoundError:
            return None
        return s if s.value("reaper_metrics_listening") == listening and \
            s.value("reaper_build_info", mode=mode) == 1 else None
    return wait_for(check, timeout, 0.02, what=f"{path} to say reaper_metrics_listening {listening}")


def lines(path, word: str) -> list:
    return [ln for ln in path.read_text().splitlines() if f" {word} " in ln]


def test_a_taken_port_starts_the_child_and_serves_once_freed(reaper, tmp_path):
    port, mfile, err, go = free_port(), tmp_path / "m.prom", tmp_path / "reaper.err", tmp_path / "go"
    with held(port):
        with open(err, "wb") as f:
            r = reaper(["--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--metrics-file", str(mfile),
                        "--metrics-interval", "0.2", "--",
                        "sh", "-c", f"echo up; while [ ! -e {go} ]; do sleep 0.05; done"], stderr=f)
        assert r.readline() == "up"                      # the child runs though the port is taken
        warned = wait_for_file(err, contains=" WARN ")
        assert f"--metrics-port: 127.0.0.1:{port} is already in use" in warned, warned
        s = file_says(mfile, 0)                          # the file is written while the port is taken
        assert s.value("reaper_main_child_up") == 1
    wait_healthy(port)                                   # bounded: the retries are 1, 2, 4 s ... apart
    s = scrape(port)
    assert s.value("reaper_metrics_listening") == 1
    assert s.value("reaper_main_child_up") == 1 and s.value("reaper_pid") == 1
    assert s.samples("process_cpu_seconds_total")        # the endpoint's own registry, as from the start
    file_says(mfile, 1)
    go.touch()
    assert r.wait(30) == 0
    text = err.read_text()
    # Silence is the default: the one WARN line is all an ordinary run says.
    assert text.splitlines() == lines(err, "WARN") and len(text.splitlines()) == 1, text


def test_watch_with_a_taken_port_serves_once_freed(reaper, tmp_path):
    """reaper watch, with -v: the same WARN line once, and one INFO line when the bind succeeds."""
    port, mfile, err = free_port(), tmp_path / "m.prom", tmp_path / "watch.err"
    with held(port):
        with open(err, "wb") as f:
            r = reaper(["watch", "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
                        "--metrics-file", str(mfile), "--metrics-interval", "0.2", "-v"], pid1=False, stderr=f)
        file_says(mfile, 0, mode="watch")
        assert r.proc.poll() is None
    wait_healthy(port)
    assert scrape(port).value("reaper_build_info", mode="watch") == 1
    wait_for_file(err, contains="serving on")
    r.send(signal.SIGTERM)
    assert r.wait(30) == 0
    warns, served = lines(err, "WARN"), [ln for ln in lines(err, "INFO") if "serving on" in ln]
    assert len(warns) == 1 and f"127.0.0.1:{port} is already in use" in warns[0], err.read_text()
    assert len(served) == 1 and f"metrics: serving on 127.0.0.1:{port}" in served[0], err.read_text()
    assert not lines(err, "ERROR"), err.read_text()


CHILD_BRINGS_THE_ADDRESS_UP = r'''
import subprocess, sys, time, urllib.request
from pathlib import Path
go, address, port = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
print("up", flush=True)
while not go.exists():
    time.sleep(0.02)
subprocess.run(["ip", "addr", "add", address + "/32", "dev", "lo"], check=True)
deadline = time.monotonic() + 40
while True:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=2) as r:
            body = r.read().decode()
        listening = [ln for ln in body.splitlines() if ln.startswith("reaper_metrics_listening ")]
        print(r.status, *listening, flush=True)
        break
    except OSError as e:
        if time.monotonic() > deadline:
            print("never served:", e, flush=True)
            break
        time.sleep(0.05)
'''


def test_an_address_that_comes_up_later_is_retried(reaper, tmp_path):
    """EADDRNOTAVAIL: the address is not on the host when reaper starts. In a network
    namespace of the test's own (nothing leaves it), the main child adds it to lo
    while reaper runs; reaper binds it at its next try. (A namespace whose lo is down binds
    any address: lo goes up before reaper starts.)"""
    require("ip", shutil.which("ip") is not None, "Debian package iproute2")
    address, port, go, err = "192.0.2.1", free_port(), tmp_path / "go", tmp_path / "reaper.err"
    child = write_script(tmp_path, "child.py", CHILD_BRINGS_THE_ADDRESS_UP)
    # lo up first (with no interface up, any address binds); `unshare --net` and sh exec: reaper
    # stays PID 1 of the new PID namespace.
    up_then_reaper = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', REAPER]
    with open(err, "wb") as f:
        r = reaper(["--metrics-port", str(port), "--metrics-address", address, "--", *child, str(go), address,
                    str(port)], exe=up_then_reaper, stderr=f)
    assert r.readline() == "up"
    assert f"--metrics-address: {address} is not an address of this host" in wait_for_file(err, contains=" WARN ")
    go.touch()
    assert r.readline(timeout=45) == "200 reaper_metrics_listening 1.0"
    assert r.wait(30) == 0
    assert len(lines(err, "WARN")) == 1 and len(err.read_text().splitlines()) == 1, err.read_text()


# --- in-process: the backoff, the wake-ups once bound, a retry that fails --------------------

class Log:
    """reaper.log.Log's interface, keeping the lines."""

    def __init__(self):
        self.lines = []
        self.dropped = 0

    def enabled(self, level: int) -> bool:
        return False

    def __getattr__(self, level):
        if level in ("error", "warn", "info", "debug"):
            return lambda msg: self.lines.append((level, msg))
        raise AttributeError(level)

    def said(self, *levels) -> list:
        return [msg for level, msg in self.lines if level in levels]




def exporter(port: int, log, mfile, interval: float = 0.05):
    from reaper import metrics
    from reaper.stats import Stats

    cfg = exporter_config(metrics_address="127.0.0.1", metrics_port=port, metrics_file=str(mfile),
                          metrics_interval=interval)
    return metrics.prepare(cfg, Stats(), log)


def test_retries_back_off_to_the_ceiling_and_end_once_bound(monkeypatch, tmp_path):
    """Intervals double from the first to the ceiling (scaled down here: the first try
    0.05 s after the start, then 0.1, 0.2 and 0.2 s apart; uncapped the sixth gap would
    be 3.2 s); once bound, no try is made again while the sampler goes on waking up for
    its other pieces (the metrics file, every 0.05 s)."""
    import time

    from reaper import metrics
    from reaper.metrics import exporter as lifecycle

    monkeypatch.setattr(lifecycle, "BIND_RETRY_FIRST", 0.05)
    monkeypatch.setattr(lifecycle, "BIND_RETRY_MAX", 0.2)
    tries, real_listen = [], metrics.Port.listen

    def listen(*a):
        tries.append(time.monotonic())
        return real_listen(*a)
    monkeypatch.setattr(metrics.Port, "listen", listen)
    port, log = free_port(), Log()
    with held(port) as holder:
        x = exporter(port, log, tmp_path / "m.prom")
        assert len(log.said("warn")) == 1 and "is already in use" in log.said("warn")[0]
        writes = []
        real_write = x.write_file

        def write_file():
            writes.append(1)
            real_write()
        x.write_file = write_file                                   # the sampler takes it at its start
        try:
            x.start(own_scope())
            wait_for(lambda: len(tries) >= 8, 15, 0.01, what="7 retries")
            gaps = [b - a for a, b in zip(tries[1:], tries[2:8])]   # tries[0]: prepare's bind
            for gap, want in zip(gaps, (0.1, 0.2, 0.2, 0.2, 0.2, 0.2)):
                assert gap >= want * 0.95, gaps                      # backoff: no busy loop
            assert gaps[5] < 1.0, gaps                               # the ceiling holds (uncapped: 3.2 s)
            holder.close()
            wait_for(lambda: x.listening, 5, 0.01, what="the bind to succeed")
            assert get(port, "/healthz")[0] == 200
            done, seen = len(tries), len(writes)
            wait_for(lambda: len(writes) >= seen + 20, 15, 0.01, what="20 more sampler wake-ups")
            assert len(tries) == done, "a try after the bind succeeded"
            assert len(log.said("info")) == 1 and f"serving on 127.0.0.1:{port}" in log.said("info")[0]
            assert len(log.said("warn", "error")) == 1, log.lines
        finally:
            x.abort()


@pytest.mark.parametrize("failure", ["eacces", "no-thread"])
def test_a_retry_that_fails_is_switched_off_with_one_line(monkeypatch, tmp_path, failure):
    """A retry never raises into reaper: a bind error no retry can mend, or no room for
    the server thread, switches the piece off with one line; the port is left closed,
    and the sampler goes on (the metrics file keeps being written)."""
    from reaper import metrics
    from reaper.metrics import exporter as lifecycle

    monkeypatch.setattr(lifecycle, "BIND_RETRY_FIRST", 0.05)
    port, log, mfile = free_port(), Log(), tmp_path / "m.prom"
    if failure == "no-thread":
        from metrics_helpers import refuse_http_thread

        refuse_http_thread(monkeypatch)
    with held(port):
        x = exporter(port, log, mfile)
    if failure == "eacces":                               # after prepare's bind, before the first retry
        def listen(*a):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        monkeypatch.setattr(metrics.Port, "listen", listen)
    try:
        x.start(own_scope())
        wait_for(lambda: len(log.said("warn", "error")) == 2, 10, 0.01, what="the retry to fail")
        off = log.said("warn", "error")[1]
        assert "metrics port failed" in off and "switched off" in off, off
        mfile.unlink()
        wait_for(mfile.exists, 10, 0.01, what="the next metrics-file write")
        assert Scrape(mfile.read_text()).value("reaper_metrics_listening") == 0
        assert x._sampler.is_alive() and not x.listening
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
        assert len(log.said("warn", "error")) == 2, log.lines
    finally:
        x.abort()


# --- what can never work is still a usage error, before the child --------------------------

@pytest.mark.parametrize("args,needles", [
    (["--metrics-port", "0"], ["--metrics-port", "1-65535"]),
    (["--metrics-port", "65536"], ["--metrics-port", "1-65535"]),
    (["--metrics-port", "PORT", "--metrics-address", "256.1.1.1"], ["--metrics-address", "bad address"]),
    (["--metrics-port", "PORT", "--metrics-address", "[::1"], ["--metrics-address", "bad address"]),
])
def test_an_address_that_can_never_work_is_refused_before_the_child(tmp_path, args, needles):
    args = [str(free_port()) if a == "PORT" else a for a in args]
    refused(tmp_path, args, *needles, pid1=True)
    refused_sub("watch", args, *needles)


def test_a_privileged_port_without_the_capability_is_refused(tmp_path):
    """EACCES is no reason of the moment: the kernel checks it before whether the port
    is free, and reaper never gains CAP_NET_BIND_SERVICE later. As root, reaper runs
    without that capability (dropped from the bounding set)."""
    with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as f:
        if int(f.read()) <= 1:
            pytest.skip("every port is unprivileged on this host (net.ipv4.ip_unprivileged_port_start)")
    args = ["--metrics-port", "1", "--metrics-address", "127.0.0.1"]
    needles = ("no permission to bind", "127.0.0.1:1")
    if os.geteuid() != 0:                      # this user lacks the capability already
        refused(tmp_path, args, *needles, pid1=True)
        return
    marker = tmp_path / "child-ran"
    _refusal(["setpriv", "--bounding-set=-net_bind_service", REAPER, *args, "--", "touch", str(marker)],
             "reaper", needles, None, None, True)
    assert not marker.exists(), "the child started on bad input"


def test_a_port_free_at_start_is_bound_before_the_child_and_listening_at_once(reaper, tmp_path):
    """The control: a free port is bound before the spawn as before, and the gauge is 1
    from the first write of the metrics file."""
    port, mfile = free_port(), tmp_path / "m.prom"
    with open(tmp_path / "reaper.err", "wb") as f:
        r = reaper(["--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--metrics-file", str(mfile),
                    "--", PYTHON, "-c", f"import socket; s = socket.socket(); "
                                        f"print(s.connect_ex(('127.0.0.1', {port})) == 0, flush=True); "
                                        f"import time; time.sleep(300)"], stderr=f)
    assert r.readline() == "True"          # the child can connect at once: bound before its exec
    file_says(mfile, 1)
    assert scrape(port).value("reaper_metrics_listening") == 1
    assert (tmp_path / "reaper.err").read_text() == ""

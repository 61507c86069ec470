"""Documented behaviour that no other test reaches: the default metrics port, -c over -g,
-g without a group, IPv6 addresses, reaper watch's SIGQUIT and last write, reaper stats'
--timeout, write failures of the summary and metrics files, and list variables that hold
regular expressions with commas."""
import http.client
import os
import signal
import socket
import subprocess
import time

import pytest

from conftest import REAPER, run_reaper, wait_for, wait_for_file
from metrics_helpers import wait_healthy

DEFAULT_PORT = 9259


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as reaper binds: TIME_WAIT is no owner
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def _get(host: str, port: int, path: str = "/healthz") -> int:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def test_list_variables_keep_the_commas_of_a_regular_expression():
    from reaper import options

    cfg = options.parse(["true"], {"REAPER_STRAY_MATCH": r"worker{1,3},[,;]x,a\,b",
                                   "REAPER_PROTECT": "(keep,me),other"})
    assert cfg.stray_match == ["worker{1,3}", "[,;]x", "a,b"]
    assert cfg.protect == ["(keep,me)", "other"]
    assert options.parse(["true"], {"REAPER_REMAP_EXIT": "143,137"}).remap_exit == {143, 137}


# --- the default port: one test owns it ---------------------------------------------

@pytest.mark.xdist_group("default-metrics-port")
def test_the_default_port_serves_init_and_watch_and_reaper_stats_finds_it(reaper, tmp_path):
    if not _port_free(DEFAULT_PORT):
        pytest.skip(f"port {DEFAULT_PORT} is taken on this machine by something else")
    r = reaper(["--metrics", "--", "sh", "-c", "echo ready; exec sleep 300"])
    assert r.readline() == "ready"
    wait_healthy(DEFAULT_PORT)
    out = subprocess.run([REAPER, "stats"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "(init)" in out.stdout.splitlines()[0], out
    r.send(signal.SIGTERM)
    assert r.wait() == 143
    w = reaper(["watch"], pid1=False)
    wait_healthy(DEFAULT_PORT)
    out = subprocess.run([REAPER, "stats"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "(watch)" in out.stdout.splitlines()[0], out
    w.send(signal.SIGTERM)
    assert w.wait() == 0


# --- signals: -c over -g, -g without its group -----------------------------------------

# The main child and a member of its process group both record SIGUSR1; the main child
# exits on it, once the member has said it is ready.
GROUP = ("d=$0; (trap 'echo usr1 > $d/member; exit 0' USR1; echo > $d/member-ready; "
         "while :; do sleep 1 & wait; done) & "
         "while [ ! -e $d/member-ready ]; do sleep 0.01; done; trap 'exit 6' USR1; echo ready; "
         "while :; do sleep 1 & wait; done")


@pytest.mark.parametrize("flags, member_gets_it", [(["-g"], True), (["-g", "-c"], False)], ids=["g", "g-c"])
def test_single_child_overrides_process_group(reaper, tmp_path, flags, member_gets_it):
    r = reaper([*flags, "--grace", "5", "--", "sh", "-c", GROUP, str(tmp_path)])
    assert r.readline() == "ready"
    r.send(signal.SIGUSR1)
    assert r.wait() == 6
    # With -g the member got it before the drain's SIGTERM could; with -c only the child did.
    assert ((tmp_path / "member").exists() and (tmp_path / "member").read_text() == "usr1\n") == member_gets_it


def test_process_group_falls_back_to_the_child_when_its_group_is_gone(reaper):
    # The main child moves itself into its own child's new group: its old group (the one
    # reaper made, numbered after it) is empty, so -g sends to the child itself.
    child = r'''
import os, signal, sys, time
helper = os.fork()
if helper == 0:
    os.setpgid(0, 0)
    time.sleep(60)
    os._exit(0)
while os.getpgid(helper) != helper:
    time.sleep(0.005)
os.setpgid(0, helper)
signal.signal(signal.SIGUSR1, lambda *_: (os.kill(helper, signal.SIGKILL), sys.exit(7)))
print("moved", flush=True)
signal.pause()
'''
    r = reaper(["-g", "--", "python3", "-c", child])
    assert r.readline() == "moved"
    r.send(signal.SIGUSR1)
    assert r.wait() == 7


# --- the metrics endpoint on IPv6 ------------------------------------------------------

def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
@pytest.mark.parametrize("address", ["::", "[::1]"])
def test_metrics_on_ipv6(reaper, address):
    from conftest import free_port

    port = free_port()
    r = reaper(["--metrics-port", str(port), "--metrics-address", address, "--", "sleep", "300"])
    wait_for(lambda: _status_or_none("::1", port) == 200, 20, 0.05, what=f"/healthz on [::1]:{port}")
    if address == "::":          # dual stack: IPv4 clients are served too
        assert _get("127.0.0.1", port) == 200
    r.send(signal.SIGTERM)
    assert r.wait() == 143


def _status_or_none(host: str, port: int):
    try:
        return _get(host, port)
    except OSError:
        return None


# --- reaper watch: SIGQUIT, the last metrics-file write ------------------------------------

def test_watch_stops_on_sigquit_and_writes_the_metrics_file_last(reaper, tmp_path):
    f = tmp_path / "watch.prom"
    w = reaper(["watch", "--metrics-file", str(f), "--metrics-interval", "600"], pid1=False)
    wait_for_file(f, contains="reaper_build_info")
    assert "SIGQUIT" not in f.read_text()
    w.send(signal.SIGQUIT)
    assert w.wait() == 0
    # Written once more at the stop: the SIGQUIT that ended it is counted there.
    assert 'reaper_signals_received_total{signal="SIGQUIT"} 1.0' in f.read_text()


# --- reaper stats --timeout ------------------------------------------------------------

def test_stats_gives_up_after_its_timeout():
    with socket.socket() as server:                 # accepts, never answers
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]
        start = time.monotonic()
        out = subprocess.run([REAPER, "stats", "--url", f"127.0.0.1:{port}", "--timeout", "0.5"],
                             capture_output=True, text=True, timeout=30)
        took = time.monotonic() - start
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1, out
    assert "timed out" in out.stderr, out.stderr
    assert took < 20, took            # the 0.5 s timeout, not the 30 s bound, ended it


# --- write failures of the summary and metrics files ----------------------------------

def test_a_summary_file_that_cannot_be_written_is_one_error_line(tmp_path):
    d = tmp_path / "gone"
    d.mkdir()
    r = run_reaper(["--summary-file", str(d / "s.json"), "--", "sh", "-c", f"rm -r {d}; exit 4"])
    assert r.proc.returncode == 4
    errors = [l for l in r.stderr.splitlines() if ": ERROR " in l]
    assert len(errors) == 1 and "cannot write summary file" in errors[0], r.stderr


def test_metrics_file_write_errors_are_said_once(tmp_path):
    d = tmp_path / "gone"
    d.mkdir()
    # Twenty intervals pass with the directory gone, and the final write fails too.
    child = f"rm -r {d}; sleep 2; exit 0"
    r = run_reaper(["--metrics-file", str(d / "m.prom"), "--metrics-interval", "0.1", "--",
                    "sh", "-c", child])
    assert r.proc.returncode == 0
    errors = [l for l in r.stderr.splitlines() if ": ERROR " in l]
    assert len(errors) == 1 and "cannot write metrics file" in errors[0], r.stderr
    assert not os.path.exists(d)

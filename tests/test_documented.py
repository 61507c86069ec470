"""Documented behaviour that no other test reaches: the default metrics port, -c over -g,
-g without a group, IPv6 addresses, reaper watch's SIGQUIT and last write, reaper stats'
--timeout, write failures of the summary and metrics files, and list variables that hold
regular expressions with commas."""
import json
import os
import signal
import socket
import subprocess
import time

import pytest

from conftest import PYTHON, REAPER, run_reaper, wait_for, wait_for_file
from metrics_helpers import get

HERE = os.path.dirname(os.path.abspath(__file__))


def _get(host: str, port: int) -> int:
    return get(port, "/healthz", host=host)[0]


def test_list_variables_keep_the_commas_of_a_regular_expression():
    from reaper import options

    cfg = options.parse(["true"], {"REAPER_STRAY_MATCH": r"worker{1,3},[,;]x,a\,b",
                                   "REAPER_PROTECT": "(keep,me),other"})
    assert cfg.stray_match == ["worker{1,3}", "[,;]x", "a,b"]
    assert cfg.protect == ["(keep,me)", "other"]
    assert options.parse(["true"], {"REAPER_REMAP_EXIT": "143,137"}).remap_exit == {143, 137}


# --- the default port: one test owns it ---------------------------------------------

# Run in a network namespace of its own (its loopback brought up), so that the default
# port is this test's whatever the host or the other workers hold: prints what it saw.
DEFAULT_PORT_RUN = f"""
import fcntl, json, os, signal, socket, struct, subprocess, sys
sys.path.insert(0, {HERE!r})
from conftest import REAPER, Reaper
from metrics_helpers import wait_healthy

with socket.socket() as s:                           # ip link set lo up
    flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH22x", b"lo", 0))[:18])[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))
seen = {{}}
for mode, args, pid1 in (("init", ["--metrics", "--", "sh", "-c", "echo ready; exec sleep 300"], True),
                         ("watch", ["watch"], False)):
    r = Reaper(args, pid1=pid1)
    try:
        if pid1:
            assert r.readline() == "ready"
        wait_healthy(9259)
        out = subprocess.run([REAPER, "stats"], capture_output=True, text=True, timeout=30)
        r.send(signal.SIGTERM)
        seen[mode] = [out.returncode, out.stdout.splitlines()[:1], r.wait()]
    finally:
        r.kill()
print(json.dumps(seen))
"""


def test_the_default_port_serves_init_and_watch_and_reaper_stats_finds_it():
    p = subprocess.run(["unshare", "--net", PYTHON, "-c", DEFAULT_PORT_RUN], capture_output=True, text=True,
                       timeout=90)
    assert p.returncode == 0, p.stderr
    seen = json.loads(p.stdout)
    (rc, first, status) = seen["init"]
    assert rc == 0 and "(init)" in first[0] and status == 143, seen
    (rc, first, status) = seen["watch"]
    assert rc == 0 and "(watch)" in first[0] and status == 0, seen


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


# --- issue 22, point 5: documented, untested until now -------------------------------------

def _services(n: int, command: str) -> list:
    return [a for i in range(n) for a in ("--service", f"s{i}={command}")]


def test_at_most_64_services(tmp_path):
    """docs/services.md: at most 64 services (the C core watches that many pids)."""
    from conftest import refused

    refused(tmp_path, _services(65, "true"), "65 services: at most 64")
    r = run_reaper([*_services(64, "sleep 600"), "--", "true"], timeout=60)
    assert r.proc.returncode == 0, r.stderr


@pytest.mark.parametrize("name", ["stats", "watch"])
def test_a_command_named_like_a_subcommand_after_the_dashes_is_the_child(tmp_path, name):
    """`reaper -- stats` runs a program named stats: only a first word is a subcommand."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / name).write_text('#!/bin/sh\necho "child $*"\n')
    (bin_dir / name).chmod(0o755)
    r = run_reaper(["--", name, "x"], env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert r.proc.returncode == 0, r.stderr
    assert r.stdout == "child x\n"


@pytest.mark.parametrize("flags, exporter", [([], False), (["--metrics-file", "FILE"], True)],
                         ids=["without", "with-control"])
def test_without_metrics_flags_nothing_of_the_exporter_is_imported_and_no_thread_runs(reaper, tmp_path,
                                                                                     flags, exporter):
    """docs/metrics.md: with none of --metrics* nothing of the exporter is imported or
    run. Python's own import log (PYTHONPROFILEIMPORTTIME) names every module reaper
    loads; the control, with a metrics flag, shows the same check sees the exporter."""
    from conftest import in_poll

    flags = [str(tmp_path / "m.prom") if f == "FILE" else f for f in flags]
    r = reaper([*flags, "--", "sleep", "60"], env={"PYTHONPROFILEIMPORTTIME": "1"})
    wait_for(lambda: in_poll(r.pid), 20, what="reaper idle in poll")
    if exporter:
        wait_for_file(tmp_path / "m.prom", 20)
    threads = len(os.listdir(f"/proc/{r.pid}/task"))
    r.send(signal.SIGTERM)
    assert r.wait() == 143
    imported = [line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    assert imported, r.stderr                                         # the log is there to read
    loaded = {m for m in imported if m in ("reaper.metrics", "prometheus_client", "reaper.httpserver")}
    assert bool(loaded) == exporter, loaded
    assert (threads > 1) == exporter, threads


def test_watch_with_only_a_metrics_file_serves_no_port(tmp_path):
    """docs/reaper-watch.md: port 9259 unless --metrics-port or --metrics-file say otherwise."""
    from conftest import Reaper

    mfile = tmp_path / "m.prom"
    w = Reaper(["watch", "--metrics-file", str(mfile)], pid1=False)
    try:
        wait_for_file(mfile, 20, contains="reaper_build_info")
        sockets = [fd for fd in os.listdir(f"/proc/{w.pid}/fd")
                   if os.readlink(f"/proc/{w.pid}/fd/{fd}").startswith("socket:")]
        assert sockets == [], sockets
        w.send(signal.SIGTERM)
        assert w.wait() == 0, w.stderr
    finally:
        w.kill()


def test_start_time_reaped_cpu_and_service_ready_by_value(reaper, tmp_path):
    """docs/metrics.md, by value: reaper_start_time_seconds is when reaper started;
    reaper_reaped_cpu_seconds_total has the CPU of a child it reaped (an orphan that
    burnt 0.3 s of it); reaper_service_ready is 0 until the service says so, then 1."""
    from metrics_helpers import start_with_metrics, wait_scrape

    go = tmp_path / "go"
    service = f"sh -c 'while [ ! -e {go} ]; do sleep 0.02; done; echo >&$REAPER_READY_FD; exec sleep 600'"
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    before = time.time()
    r, port = start_with_metrics(reaper, ["sh", "-c", f"({PYTHON} -c \"$0\" &); exec sleep 600", burn],
                                 ["--service", f"db={service}", "--service-ready", "db"])
    after = time.time()
    s = wait_scrape(port, lambda s: s.value("reaper_reaped_total", kind="orphan", outcome="exited_0") == 1,
                    "the burning orphan reaped", 60)
    assert before - 1 <= s.value("reaper_start_time_seconds") <= after, (before, after)
    assert s.value("reaper_reaped_cpu_seconds_total") >= 0.3 * 0.9
    assert s.value("reaper_service_ready", service="db") == 0
    go.touch()
    wait_scrape(port, lambda s: s.value("reaper_service_ready", service="db") == 1, "db ready")
    r.send(signal.SIGTERM)
    assert r.wait() == 143


def test_stale_stray_cgroups_are_removed_at_start_and_counted(reaper, tmp_path):
    """docs/budgets.md, docs/metrics.md: a reaper-strays.* directory whose creator is gone
    (nobody holds its lock) is removed when budgets start, and counted in
    reaper_budget_stale_cgroups_removed_total. The reaper runs in a cpu cgroup of the
    test's own, so that no other reaper of the suite removes (or adds) any there."""
    import budget_helpers as bh
    from conftest import remove_cgroup
    from metrics_helpers import start_with_metrics, wait_scrape

    if not bh.v1_writable():
        pytest.skip("needs root and a writable cgroup v1 cpu hierarchy")
    own = os.path.join(bh.V1_CPU, f"rt-{bh.marker()}")
    os.mkdir(own)
    try:
        stale = os.path.join(own, "reaper-strays.0dead0ff")
        os.mkdir(stale)

        def enter():
            with open(os.path.join(own, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        r, port = start_with_metrics(reaper, ["sleep", "600"], ["--cpu-budget", "1", "--budget-action", "observe"],
                                     preexec_fn=enter)
        s = wait_scrape(port, lambda s: (s.value("reaper_budget_samples_total") or 0) >= 1, "a first budget sample")
        assert s.value("reaper_budget_stale_cgroups_removed_total") == 1
        assert not os.path.exists(stale)
        r.send(signal.SIGTERM)
        assert r.wait() == 143
    finally:
        remove_cgroup(own)


@pytest.mark.xdist_group("cpu-heavy")     # a stray's CPU is counted: not beside the other heavy tests
def test_stray_cpu_seconds_by_value(reaper, tmp_path):
    """docs/metrics.md: reaper_stray_cpu_seconds_total counts a stray's CPU, and what it
    used unseen before it was reaped from its rusage: an orphan that burns 0.6 s of CPU
    once it is a stray and exits counts that much (never more than it and its start-up
    used)."""
    from metrics_helpers import start_with_metrics, wait_scrape

    go = tmp_path / "go"
    # The orphan burns only once reaper reads it as a stray: what a process used before it
    # was one (here, a descendant of the main child until its parent exits; a loaded
    # machine can stretch that) is not a stray's, and is not counted.
    burn = ("import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
            "t = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n")
    r, port = start_with_metrics(reaper, ["sh", "-c", f"({PYTHON} -c \"$0\" {go} &); exec sleep 600", burn],
                                 ["--cpu-budget", "100", "--budget-action", "observe", "--budget-interval", "0.2"])
    s = wait_scrape(port, lambda s: s.value("reaper_processes", **{"class": "stray"}) == 1, "the orphan a stray", 30)
    n = s.value("reaper_budget_samples_total")
    wait_scrape(port, lambda s: s.value("reaper_budget_samples_total") >= n + 1, "a sample of the stray")
    go.write_text("")
    s = wait_scrape(port, lambda s: s.value("reaper_reaped_total", kind="orphan", outcome="exited_0") == 1,
                    "the burning orphan reaped", 60)
    n = s.value("reaper_budget_samples_total")
    s = wait_scrape(port, lambda s: s.value("reaper_budget_samples_total") >= n + 1, "a sample after the reap")
    counted = s.value("reaper_stray_cpu_seconds_total")
    # Its 0.6 s, from the samples and from the rusage of its reap; the floor still fails a
    # stray not counted, or counted from a late sample only.
    assert 0.6 * 0.9 <= counted <= 0.6 + 0.5, counted
    r.send(signal.SIGTERM)
    assert r.wait() == 143


# --- the README's sample run ----------------------------------------------------------------

def test_the_readme_sample_summary_is_the_real_one(tmp_path):
    """README.md's first command, run for real (not as PID 1, as there): the same keys
    and the same values, but for pids and times."""
    import re

    readme = open(os.path.join(HERE, os.pardir, "README.md")).read()
    shown = json.loads(re.search(r"^reaper\[\d+\]: INFO summary (\{.*\})$", readme, re.M).group(1))
    out = subprocess.run([REAPER, "--", "sh", "-c", 'sleep 1 & echo "hello from $$"; exit 3'],
                         capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert out.returncode == 3 and out.stdout.startswith("hello from ")
    real = json.loads(re.search(r"^reaper\[\d+\]: INFO summary (\{.*\})$", out.stderr, re.M).group(1))
    assert sorted(real) == sorted(shown), "README.md's sample summary has other keys than the real one"
    varying = {"main_pid", "drain_seconds", "uptime_seconds"}
    assert {k: v for k, v in real.items() if k not in varying} == {k: v for k, v in shown.items() if k not in varying}

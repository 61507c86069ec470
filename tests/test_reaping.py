"""Point 2 and 5: every orphan is reaped promptly, as PID 1 and as a subreaper."""
import os
import signal
import subprocess

import pytest

from conftest import REAPER, UNSHARE, children_of, proc_status, refused, run_reaper, summary, wait_for, zombies_of


# The main child: a storm of orphans, then it waits for SIGUSR1 before exiting 0.
def _storm_then_wait(storm_bin, n):
    return ["sh", "-c", f'trap "exit 0" USR1; {storm_bin} orphans {n}; while :; do sleep 1 & wait; done']


@pytest.mark.slow
@pytest.mark.xdist_group("cpu-heavy")
def test_storm_of_10000_orphans_leaves_none_behind(reaper, storm_bin):
    n = 10_000
    r = reaper(["--", *_storm_then_wait(storm_bin, n)])
    assert r.readline(120) == f"done {n}"
    # Every orphan is reaped while the main child still runs.
    wait_for(lambda: not zombies_of(r.pid), 30, 0.01, "all orphans to be reaped")
    r.send(signal.SIGUSR1)
    assert r.wait(30) == 0
    s = summary(r.stderr)
    # The storm's n grandchildren, plus the shell's own background sleeps.
    assert s["orphans"] >= n
    assert s["reaped"] >= n + 1


def test_main_child_dies_with_hundreds_of_orphans(storm_bin):
    for _ in range(5):
        r = run_reaper(["--", storm_bin, "burst", "500", "7"], timeout=60)
        assert r.proc.returncode == 7
        s = summary(r.stderr)
        assert s["main_exit_code"] == 7
        # Every burst child is reaped: as orphans, or killed by the drain.
        assert s["reaped"] == 501


def test_pre_existing_children_are_reaped_and_not_mistaken_for_main(tmp_path):
    # The shell that execs reaper already has children: one exits at once, one when the
    # main child lets it (through a FIFO), with another status. The main child exits 5
    # once reaper has reaped that one (a zombie still answers kill -0).
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    main = f'echo go > {fifo}; while kill -0 "$0" 2>/dev/null; do sleep 0.01; done; exit 5'
    script = f'(exit 9) & (read x < {fifo}; exit 7) & exec {REAPER} -w -- sh -c \'{main}\' $!'
    p = subprocess.run([*UNSHARE, "sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert p.returncode == 5, p.stderr
    s = summary(p.stderr)
    assert s["main_exit_code"] == 5
    assert s["orphans"] == 2
    assert "(exit status 9)" in p.stderr and "(exit status 7)" in p.stderr


def test_not_pid1_registers_as_subreaper_and_reaps_orphans(reaper, tmp_path):
    pidfile = tmp_path / "grandchild"
    # The main child double-forks: the grandchild is re-parented to reaper, not to PID 1.
    r = reaper(["-vv", "--", "sh", "-c", f"trap 'exit 0' USR1; (sleep 30 & echo $! > {pidfile}) ; "
                "echo started; while :; do sleep 1 & wait; done"], pid1=False)
    assert r.readline() == "started"
    gc = int(wait_for(lambda: pidfile.read_text().strip() if pidfile.exists() else "", 10))
    assert int(proc_status(gc)["PPid"]) == r.pid
    os.kill(gc, signal.SIGKILL)
    wait_for(lambda: gc not in children_of(r.pid), 10, what="orphan reaped by the subreaper")
    r.send(signal.SIGUSR1)
    assert r.wait() == 0
    assert "DEBUG not PID 1: registered as child subreaper" in r.stderr
    assert r.stderr.count("registered as child subreaper") == 1
    assert summary(r.stderr)["orphans"] >= 1


def test_subreaper_flag_and_env_are_accepted(tmp_path):
    # Subreaping is automatic when reaper is not PID 1, so -s and its variables change
    # nothing there: what can be checked is that they are parsed and accepted (tini's
    # spelling too), and that reaper then is the subreaper (the orphan is its own).
    for args, env in ((["-s"], {}), ([], {"TINI_SUBREAPER": ""}), ([], {"REAPER_SUBREAPER": "1"})):
        r = run_reaper([*args, "--", "sh", "-c", "(sleep 0.1 &) ; exit 3"], pid1=False, env=env)
        assert r.proc.returncode == 3
        assert summary(r.stderr)["orphans"] == 1
        assert "WARN" not in r.stderr
    refused(tmp_path, [], "REAPER_SUBREAPER='maybe'", env={"REAPER_SUBREAPER": "maybe"})


# The orphan exits 4 when the main child lets it (FIFO); the main child exits once
# reaper has reaped it (a zombie still answers kill -0), so no drain is involved.
ORPHAN_EXITS_4 = ('mkfifo "$0/go"; (sh -c "read x < $0/go; exit 4" & echo $! > "$0/pid"); '
                  'p=$(cat "$0/pid"); echo go > "$0/go"; while kill -0 $p 2>/dev/null; do sleep 0.01; done')


def test_warn_on_reap_logs_each_orphan(tmp_path):
    def child(run: str) -> list:
        (tmp_path / run).mkdir()
        return ["sh", "-c", ORPHAN_EXITS_4, str(tmp_path / run)]
    r = run_reaper(["-w", "--", *child("flag")])
    assert r.proc.returncode == 0
    assert "WARN reaped orphan" in r.stderr and "exit status 4" in r.stderr
    r = run_reaper(["--", *child("env")], env={"REAPER_WARN_ON_REAP": "1"})
    assert "WARN reaped orphan" in r.stderr
    r = run_reaper(["--", *child("none")])
    assert "reaped orphan" not in r.stderr

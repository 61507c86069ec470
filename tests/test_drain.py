"""Point 6: at the end, SIGTERM to what is left, a grace period, SIGKILL, reap, exit."""
import random
import signal
import subprocess

import pytest

from conftest import pids_with_arg, py, run_reaper, summary, wait_for


def _leaver(log, handler_body="", ignore_term=False, main_code=3, detach=False):
    """A main child that leaves a background process (with a SIGTERM handler) behind."""
    return py(f"""
import os, signal, sys, time
log = {str(log)!r}
def note(what):
    with open(log, "a") as f: f.write(what + "\\n")
if os.fork() == 0:
    if {detach!r}:
        os.setsid()
        if os.fork(): os._exit(0)        # daemonise: re-parented to reaper
    def on_term(*_):
        note("term")
        {handler_body or 'pass'}
        if not {ignore_term!r}:
            note("done"); os._exit(0)
    signal.signal(signal.SIGTERM, on_term)
    note("ready")
    while True: time.sleep(1)
while not (os.path.exists(log) and "ready" in open(log).read()): time.sleep(0.005)
sys.exit({main_code})
""")


def test_drain_lets_a_sigterm_handler_finish_before_any_sigkill(tmp_path):
    log = tmp_path / "log"
    # The handler takes 1 s; the grace (30 s) is far longer, so the drain ends when it exits.
    r = run_reaper(["--grace", "30", "--", *_leaver(log, "time.sleep(1)")], timeout=20)
    assert r.proc.returncode == 3
    assert log.read_text().split() == ["ready", "term", "done"]
    s = summary(r.stderr)
    assert s["drain"] == {"terminated": 1, "killed": 0, "survived": 0, "not_permitted": 0}


def test_what_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    log = tmp_path / "log"
    r = run_reaper(["--grace", "1", "--", *_leaver(log, ignore_term=True)], timeout=20)
    assert r.proc.returncode == 3
    assert log.read_text().split() == ["ready", "term"]
    assert summary(r.stderr)["drain"] == {"terminated": 0, "killed": 1, "survived": 0, "not_permitted": 0}


def test_grace_zero_kills_at_once(tmp_path):
    log = tmp_path / "log"
    r = run_reaper(["--grace", "0", "--", *_leaver(log)], env={"REAPER_GRACE": "30"}, timeout=20)
    assert r.proc.returncode == 3
    assert log.read_text().split() == ["ready"]          # no SIGTERM at all
    assert summary(r.stderr)["drain"]["killed"] == 1


def test_stopped_process_gets_to_handle_sigterm(tmp_path):
    log = tmp_path / "log"
    child = py(f"""
import os, signal, sys, time
log = {str(log)!r}
pid = os.fork()
if pid == 0:
    def on_term(*_):
        open(log, "a").write("term\\n"); os._exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open(log + ".ready", "w").close()
    time.sleep(30); os._exit(1)
while not os.path.exists(log + ".ready"): time.sleep(0.005)
os.kill(pid, signal.SIGSTOP)
sys.exit(0)
""")
    r = run_reaper(["--grace", "30", "--", *child], timeout=20)
    assert r.proc.returncode == 0
    assert log.read_text().split() == ["term"]


def test_subreaper_drains_only_its_own_descendants(reaper, tmp_path):
    log = tmp_path / "log"
    outsider = subprocess.Popen(["sleep", "60"])   # not a descendant of the reaper under test
    try:
        r = reaper(["--grace", "30", "--", *_leaver(log, detach=True)], pid1=False)
        assert r.wait(20) == 3
        assert log.read_text().split() == ["ready", "term", "done"]
        assert outsider.poll() is None, "a process outside reaper's tree was touched"
    finally:
        outsider.kill()
        outsider.wait()


def test_repeated_sigterm_does_not_cut_the_drain_short(reaper, tmp_path):
    log = tmp_path / "log"
    child = _leaver(log, "time.sleep(2)", main_code=0)
    main = py(f"""
import os, signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
subprocess.Popen({child!r})
print("ready", flush=True)
signal.pause()
""")
    r = reaper(["-v", "--grace", "30", "--", *main])      # -v: the event lines
    assert r.readline() == "ready"
    wait_for(lambda: log.exists() and "ready" in log.read_text(), what="helper ready")
    r.send(signal.SIGTERM)                       # 1: to the main child, which exits
    wait_for(lambda: "term" in log.read_text(), what="drain started")
    r.send(signal.SIGTERM)                       # 2: must not cut the drain short
    assert r.wait(20) == 0
    assert log.read_text().split() == ["ready", "term", "done"]
    assert "not cutting the grace period short" in r.stderr


def test_third_sigterm_kills_everything_at_once(reaper, tmp_path):
    log = tmp_path / "log"
    main = py(f"""
import os, signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
subprocess.Popen({_leaver(log, ignore_term=True, main_code=0)!r})
print("ready", flush=True)
signal.pause()
""")
    r = reaper(["--grace", "600", "--", *main])
    assert r.readline() == "ready"
    wait_for(lambda: log.exists() and "ready" in log.read_text(), what="helper ready")
    r.send(signal.SIGTERM)
    wait_for(lambda: "term" in log.read_text(), what="drain started")
    r.send(signal.SIGINT)
    r.send(signal.SIGTERM)
    assert r.wait(20) == 0                       # far sooner than the 600 s grace
    assert "killing everything now" in r.stderr
    assert summary(r.stderr)["drain"]["killed"] >= 1


@pytest.mark.parametrize("pid1", [True, False], ids=["pid1", "subreaper"])
def test_nothing_survives_reaper(pid1):
    # Many processes, some ignoring SIGTERM, some daemonised: all gone when reaper exits.
    # Looked for on the host by a tag in their argv (a sleep time no other test uses);
    # as a subreaper no kernel cleans up after reaper, so this is reaper's drain alone.
    tag = f"{600 + random.randrange(10**6) / 10**6:.6f}"
    child = ["sh", "-c", f"for i in 1 2 3 4 5; do (trap '' TERM; sleep {tag}) & setsid sleep {tag} & done; exit 0"]
    r = run_reaper(["--grace", "1", "--", *child], pid1=pid1, timeout=20)
    assert r.proc.returncode == 0
    assert pids_with_arg(tag) == []
    s = summary(r.stderr)
    assert s["drain"]["survived"] == 0
    assert s["drain"]["terminated"] + s["drain"]["killed"] >= 10


def test_descendants_forked_while_the_drain_kills_are_killed_too():
    # A forker that ignores SIGTERM makes a new TERM-ignoring child every 20 ms, up to the
    # moment SIGKILL reaches it: children forked after the kill round's scan become
    # reaper's (its subreaper) and are found by the rescans. Nothing tagged survives.
    tag = f"{700 + random.randrange(10**6) / 10**6:.6f}"
    forker = (f"trap '' TERM; while :; do (trap '' TERM; exec sleep {tag}) & sleep 0.02; done")
    child = ["sh", "-c", f"sh -c \"{forker}\" & sleep 0.3; exit 0"]
    r = run_reaper(["--grace", "0.5", "--", *child], pid1=False, timeout=30)
    assert r.proc.returncode == 0, r.stderr
    assert pids_with_arg(tag) == []
    assert summary(r.stderr)["drain"]["survived"] == 0



def test_the_kill_phase_looks_for_late_children_sooner_then_doubling(monkeypatch):
    """In process: as a subreaper, after SIGKILL reaper looks again for children forked
    since (or orphans of the killed) RESCAN_FIRST after, then twice as long each time, up
    to RESCAN_MAX (drain.Drain.step; the black-box count is in
    test_the_kill_phase_does_not_rescan_all_of_proc)."""
    from types import SimpleNamespace

    from reaper import drain
    from reaper.stats import Stats

    looks = []
    monkeypatch.setattr(drain, "own_children", lambda: looks.append(1) or [])
    d = drain.Drain(SimpleNamespace(grace=1.0, no_drain=False), None, Stats(), None, None)
    d.phase, d.deadline = "killing", 1e9
    d.rescan_at = d.rescan.next()
    gaps = []
    for _ in range(7):
        now = d.rescan_at
        assert d.step(False, now) is False
        gaps.append(round(d.rescan_at - now, 6))
    assert len(looks) == 7                                 # one look at each
    assert (drain.RESCAN_FIRST, drain.RESCAN_MAX) == (0.05, 1.0)
    assert gaps == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]      # the first (0.05) set the rescan_at above

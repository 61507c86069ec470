"""The quiet end (issue 10): while nothing is asked of the end but the exit
status, the C core's wait exits the process itself when the main child's exit is
all there is, so that the interpreter's cold code stays off the way out.

Tested at both levels: the C core directly (a Python PID 1 that prints when the
wait returns, so the test sees which path ended it), and reaper as PID 1, whose
end must be exactly what the full path gives: the status, -e, and silence, and
the summary, the drain and --exit-zero-on-stop whenever there is something to say.
"""
import signal
import subprocess

import pytest

from conftest import PYTHON, UNSHARE, in_poll, run_reaper, summary, wait_for

# PID 1 of a fresh namespace: spawns CHILD, arms the quiet end as ARGS say, then
# waits; "returned" means the wait came back to Python (no quiet end).
CORE = r"""
import os, sys
from reaper import _native
mode, zero, child = sys.argv[1], [int(c) for c in sys.argv[2].split(",") if c], sys.argv[3:]
sfd = _native.setup()
pid, err = _native.spawn(child, True, False)
w = _native.Waiter(sfd)
w.watch(pid, False)
w.zero_codes(zero)
w.quiet_end(mode != "off", mode == "no-drain")
while not w.main_reaped:
    w.wait(-1)
os.write(1, b"returned %d\n" % w.main_status)
os._exit(42)
"""


def core(mode: str, child: str, zero: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([*UNSHARE, PYTHON, "-c", CORE, mode, zero, "sh", "-c", child],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("child, zero, code", [
    ("exit 5", "", 5),
    ("exit 5", "5", 0),                  # -e 5
    ("exit 0", "", 0),
    ("kill -9 $$", "", 137),
    ("kill -9 $$", "137", 0),
])
def test_the_c_core_ends_on_the_main_childs_exit_alone(child, zero, code):
    r = core("armed", child, zero)
    assert (r.returncode, r.stdout) == (code, ""), r


@pytest.mark.parametrize("mode, child, why", [
    ("off", "exit 5", "not armed"),
    ("armed", "(sleep 0.1 &); sleep 0.5; exit 5", "an orphan was reaped: news"),
    ("armed", "(sleep 30 &); exit 5", "a process is left to drain"),
])
def test_the_c_core_leaves_the_end_to_python_when_there_is_something_to_do(mode, child, why):
    r = core(mode, child)
    assert (r.returncode, r.stdout) == (42, "returned %d\n" % (5 << 8)), (why, r)


def test_no_drain_ends_whatever_is_left():
    r = core("no-drain", "(sleep 30 &); exit 5")
    assert (r.returncode, r.stdout) == (5, ""), r


# --- reaper as PID 1: after the policy is loaded, the end is the full path's ------

def _after_idle(reaper, args, child):
    """reaper [args] -- sh -c 'read x; CHILD', released once reaper sleeps in its
    idle loop (past the first wait, its policy loaded): (status, stderr)."""
    r = reaper([*args, "--", "sh", "-c", "echo up; read x; " + child], stdin=subprocess.PIPE)
    assert r.readline() == "up"
    wait_for(lambda: in_poll(r.pid), what="reaper idle in poll")
    return r.wait(input=b"\n"), r.stderr


@pytest.mark.parametrize("args, child, code", [
    ([], "exit 7", 7),
    (["-e", "7"], "exit 7", 0),
    ([], "kill -TERM $$", 143),
    (["--no-drain"], "exit 3", 3),
])
def test_a_quiet_end_is_the_status_and_nothing_else(reaper, args, child, code):
    status, stderr = _after_idle(reaper, args, child)
    assert (status, stderr) == (code, "")


def test_an_orphan_reaped_is_still_reported(reaper):
    status, stderr = _after_idle(reaper, [], "(sleep 0.1 &); sleep 0.5; exit 4")
    assert status == 4
    assert summary(stderr)["orphans"] == 1, stderr


def test_what_is_left_is_still_drained(reaper):
    status, stderr = _after_idle(reaper, [], "(exec sleep 30 &); exit 4")
    assert status == 4
    assert summary(stderr)["drain"]["terminated"] == 1, stderr


def test_a_requested_stop_still_exits_zero(reaper):
    r = reaper(["--exit-zero-on-stop", "--", "sh", "-c", "trap 'exit 1' TERM; echo up; while :; do sleep 1 & wait; done"])
    assert r.readline() == "up"
    wait_for(lambda: in_poll(r.pid), what="reaper idle in poll")
    r.send(signal.SIGTERM)
    assert r.wait() == 0


def test_the_summary_file_is_still_written(tmp_path):
    out = tmp_path / "summary.json"
    r = run_reaper(["--summary-file", str(out), "--", "sh", "-c", "sleep 0.3; exit 6"])
    assert r.proc.returncode == 6
    assert '"exit_status": 6' in out.read_text()

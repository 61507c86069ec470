"""Services that misbehave at reaper (issue 20): one that ignores SIGTERM must not cost
the others theirs, and nothing a service writes to its readiness fd may make PID 1
busy. Real services under reaper as PID 1 of a fresh PID namespace; what they were
sent is read from their own handlers, reaper's CPU from /proc/<reaper>/stat."""
from __future__ import annotations

import shlex
import signal
import time
from pathlib import Path

from conftest import proc_stat, py, run_reaper, summary, wait_for_file, lines_of
from metrics_helpers import start_with_metrics, wait_scrape


def recorder(log: Path, name: str, stubborn: bool = False) -> str:
    """A service that writes 'NAME term TIME' to log on SIGTERM and then exits, or, if
    stubborn, carries on (reaper must SIGKILL it). 'NAME up' once its handler is set."""
    return shlex.join(py(f"""
import signal, sys, time
def term(*_):
    open({str(log)!r}, "a").write(f"{name} term {{time.time()}}\\n")
    if not {stubborn!r}:
        sys.exit(0)
signal.signal(signal.SIGTERM, term)
open({str(log)!r}, "a").write("{name} up\\n")
while True: time.sleep(1)
"""))


def test_a_service_that_ignores_sigterm_leaves_the_others_theirs(tmp_path):
    """Stopped in reverse order: c, then b, which ignores SIGTERM, then a. b has its
    share of the grace, not all of it: a still gets SIGTERM before the grace ends, and
    only b is killed at its end."""
    log = tmp_path / "log"
    grace = 4.0
    main = py(f"""
import os, time
log = {str(log)!r}
def up():
    return sum(line.endswith(" up") for line in open(log).read().splitlines()) if os.path.exists(log) else 0
while up() < 3:
    time.sleep(0.02)
open(log, "a").write(f"main end {{time.time()}}\\n")
""")
    args = ["-v", "--grace", f"{grace:g}"]
    for name in ("a", "b", "c"):
        args += ["--service", f"{name}={recorder(log, name, stubborn=name == 'b')}"]
    r = run_reaper([*args, "--", *main], timeout=60)
    ended = time.time()
    assert r.proc.returncode == 0, r.stderr
    got = [line.split() for line in lines_of(log, partial=True) if not line.endswith(" up")]
    assert [g[:2] for g in got] == [["main", "end"], ["c", "term"], ["b", "term"], ["a", "term"]], (got, r.stderr)
    main_end = float(got[0][2])
    for name, _, at in got[1:]:
        assert float(at) - main_end < grace, (name, float(at) - main_end, r.stderr)
    assert ended - main_end < grace + 5.0, ended - main_end          # SIGKILL to b at the grace's end
    assert "service b (" in r.stderr and "still up after its share of the grace" in r.stderr, r.stderr
    s = summary(r.stderr)
    assert s["drain"]["killed"] == 1, s                              # b, and b alone


def _flooder(marks: Path, seconds: float) -> str:
    """A service that writes to its readiness fd, never a newline, for `seconds` from
    its start (or until reaper closes the fd; then it waits out the time), then writes
    'done' to marks. 'flooding' once it has written its first chunk."""
    return shlex.join(py(f"""
import os, time
fd, marks = int(os.environ["REAPER_READY_FD"]), {str(marks)!r}
end = time.monotonic() + {seconds!r}
chunk, said, closed = b"x" * 65536, False, False
while time.monotonic() < end:
    if closed:
        time.sleep(0.05)
        continue
    try:
        os.write(fd, chunk)
    except BrokenPipeError:
        closed = True
        open(marks, "a").write("closed\\n")
    if not said:
        said = True
        open(marks, "a").write("flooding\\n")
open(marks, "a").write("done\\n")
time.sleep(600)
"""))


def test_a_service_flooding_its_ready_fd_does_not_make_reaper_busy(reaper, tmp_path):
    marks, go = tmp_path / "marks", tmp_path / "go"
    main = py(f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)")
    r = reaper(["--service", f"flood={_flooder(marks, 3.0)}", "--service-ready", "flood", "--", *main])
    wait_for_file(marks, 30, contains="flooding")
    before = proc_stat(r.pid)["cpu"]
    wait_for_file(marks, 30, contains="done")
    used = proc_stat(r.pid)["cpu"] - before
    go.touch()
    assert r.wait(30) == 0, r.stderr
    # The flood lasts 3 s from the service's start: reaper's share of it must be small
    # (generous for a loaded 2-CPU host; the old reader spent most of a CPU).
    assert used < 0.5, (used, r.stderr)
    assert "closed" in lines_of(marks, partial=True), lines_of(marks, partial=True)        # reaper closed its end
    assert r.stderr.count("readiness fd without a newline") == 1, r.stderr


def test_a_ready_flood_is_counted_and_the_wait_ready_timeout_applies(reaper, tmp_path):
    """Given up on, the service is not ready this run: --wait-ready waits out its time."""
    svc = "sh -c 'head -c 5000 /dev/zero >&$REAPER_READY_FD; exec sleep 600'"
    marker = tmp_path / "main-ran"
    main = py(f"import time\nopen({str(marker)!r}, 'w').write('ran')\nwhile True: time.sleep(1)")
    r, port = start_with_metrics(reaper, main, ["--service", f"flood={svc}", "--service-ready", "flood",
                                                "--wait-ready", "1"])
    s = wait_scrape(port, lambda s: s.value("reaper_service_ready_floods_total", service="flood") == 1,
                    "the flood counted")
    assert s.value("reaper_service_ready", service="flood") == 0
    wait_for_file(marker, 30, contains="ran")
    r.send(signal.SIGTERM)
    assert r.wait(30) == 143, r.stderr
    assert "service flood: more than 4096 bytes on its readiness fd without a newline" in r.stderr, r.stderr
    assert "services not ready after 1s: flood; starting the main child" in r.stderr, r.stderr

"""Budgets at scale (issue 25): among many sleeping strays, which reaper leaves unread
until its cgroup's counters say something moved (reaper/budgets/pulse.py), a stray
that starts burning, a new busy one, one that starts allocating, and one past its max
age are all still dealt with in time.

Each test runs reaper as PID 1 of a fresh PID namespace inside a cpuacct cgroup of its
own where one can be made (as in a container: the machine's root cgroup is busy with
other work, which would make every sample read every stray), with SLEEPERS sleeping
orphans. The bounds are the issue's: the budget's grace plus 3 seconds; a fast grower
ended before twice its budget; an idle stray ended within 2 seconds of its max age.
"""
from __future__ import annotations

import os
import re
import signal
import time

import pytest

from conftest import PYTHON, alive, children_of, ns_pid, wait_for
import budget_helpers as bh

SLEEPERS = 1000
CPUACCT = "/sys/fs/cgroup/cpuacct"
ROOT = os.geteuid() == 0

pytestmark = [pytest.mark.skipif(not ROOT, reason="needs root (unshare)"),
              pytest.mark.xdist_group("cpu-heavy")]


@pytest.fixture
def own_cgroup():
    """A cpuacct cgroup for the test's reaper (None where none can be made); removed after."""
    d = os.path.join(CPUACCT, f"reaper-test-scale-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.mkdir(d)
    except OSError:
        yield None
        return
    yield d
    deadline = time.monotonic() + 20
    while True:
        try:
            os.rmdir(d)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def joiner(d):
    """preexec_fn: the process (unshare, then reaper and all below) joins cgroup d."""
    def join():
        if d is not None:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
    return join


def sleepers(n: int = SLEEPERS) -> str:
    """Shell lines: n sleeping orphans, then a line in the log's place (they are up)."""
    return f"i=0; while [ $i -lt {n} ]; do (sleep 600 &); i=$((i+1)); done"


def start(reaper, cg, args: list, script: str, tmp_path):
    """reaper -vv as PID 1 in cgroup cg; what it says goes to a file (log(r) reads it)."""
    path = tmp_path / "reaper.log"
    with open(path, "wb") as f:
        r = reaper(["-vv", *args, "--", "sh", "-c", script], preexec_fn=joiner(cg), stderr=f)
    r.log_path = path
    r.wait_ready()
    return r


def log(r) -> str:
    return r.log_path.read_text(errors="replace")


def fifo(tmp_path, name="go"):
    path = tmp_path / name
    os.mkfifo(path)
    return path


def waiting_busy(tag: str, go) -> str:
    """A python stray asleep on a FIFO's open until the test opens it; then a busy loop."""
    code = f"open(\"{go}\").close()\nwhile True: pass\n"
    return f"{PYTHON} -c '{code}' {tag}"


def count_strays_up(r, n: int, timeout: float = 120) -> None:
    """Waits until reaper as PID 1 has at least n children (its orphans)."""
    wait_for(lambda: len(children_of(r.pid)) >= n, timeout, interval=0.2, what=f"{n} orphans of reaper")


def asleep(r, timeout: float = 30) -> None:
    """Waits for reaper's word that sleeping strays are left unread (the backoff)."""
    wait_for(lambda: "strays asleep: read again when" in log(r), timeout, interval=0.1,
             what="reaper to leave the sleeping strays unread")


def open_fifo(path) -> float:
    """Opens the FIFO for writing (the stray blocked on it goes on); when."""
    fd = os.open(path, os.O_WRONLY)
    t = time.monotonic()
    os.close(fd)
    return t


FAST = ["--budget-grace", "1", "--budget-window", "1", "--budget-interval", "0.5"]
GRACE = 1.0


def test_sleeper_that_starts_burning_is_niced_within_grace_plus_3s(own_cgroup, reaper, tmp_path):
    tag = bh.marker()
    go = fifo(tmp_path)
    script = f"( {waiting_busy(tag, go)} & )\n{sleepers()}\nexec sleep 600"
    r = start(reaper, own_cgroup, ["--cpu-budget", "0.05", "--budget-action", "nice", *FAST], script, tmp_path)
    (pid,) = bh.wait_tagged(tag)
    count_strays_up(r, SLEEPERS + 2)
    asleep(r)
    time.sleep(2)                       # the stray has slept among the others for samples
    assert bh.stat(pid)["nice"] != 19
    t0 = open_fifo(go)
    wait_for(lambda: bh.stat(pid)["nice"] == 19, GRACE + 3, interval=0.05,
             what="the stray that started burning reniced")
    assert time.monotonic() - t0 <= (GRACE + 3) * float(os.environ.get("REAPER_TEST_SLOW", "1"))
    assert re.search(r"WARN stray \d+ \(python\S*, orphan\) uses [\d.]+ cores, over --cpu-budget 0.05", log(r))


def test_new_busy_stray_among_sleepers_is_niced_within_grace_plus_3s(own_cgroup, reaper, tmp_path):
    tag = bh.marker()
    go = fifo(tmp_path)
    busy = bh.busy_argv(tag)
    # A sleeping sh that, once the FIFO is opened, leaves a new busy orphan behind.
    script = f"( read x < {go}; ( {busy} & ) ) &\n{sleepers()}\nexec sleep 600"
    r = start(reaper, own_cgroup, ["--cpu-budget", "0.05", "--budget-action", "nice", *FAST], script, tmp_path)
    count_strays_up(r, SLEEPERS + 1)
    asleep(r)
    time.sleep(2)
    with open(go, "w") as f:
        f.write("go\n")
    (pid,) = bh.wait_tagged(tag)
    born = time.monotonic()
    wait_for(lambda: bh.stat(pid)["nice"] == 19, GRACE + 3, interval=0.05, what="the new busy stray reniced")
    assert time.monotonic() - born <= (GRACE + 3) * float(os.environ.get("REAPER_TEST_SLOW", "1")) + 0.5


def test_sleeper_that_starts_allocating_ends_before_twice_its_budget(own_cgroup, reaper, tmp_path):
    tag = bh.marker()
    go = fifo(tmp_path)
    sizes = tmp_path / "sizes"
    budget = 40 << 20
    # 2 MiB every 100 ms (20 MiB/s), touched; the size reached written after each step.
    code = (f"import time\nopen(\"{go}\").close()\nheld = []\n"
            f"while len(held) < 150:\n"
            f"    held.append(bytearray(2 << 20))\n"
            f"    open(\"{sizes}\", \"a\").write(str(len(held) * 2) + \"\\n\")\n"
            f"    time.sleep(0.1)\n"
            f"time.sleep(600)\n")
    script = f"( {PYTHON} -c '{code}' {tag} & )\n{sleepers()}\nexec sleep 600"
    r = start(reaper, own_cgroup, ["--memory-budget", "40M", "--budget-action", "terminate", *FAST], script, tmp_path)
    (pid,) = bh.wait_tagged(tag)
    count_strays_up(r, SLEEPERS + 2)
    asleep(r)
    time.sleep(2)
    open_fifo(go)
    wait_for(lambda: not alive(pid), 30, interval=0.05, what="the growing stray ended")
    reached = int(sizes.read_text().split()[-1]) << 20
    assert reached < 2 * budget, f"it reached {reached >> 20} MiB, budget {budget >> 20} MiB"
    assert re.search(r"WARN stray \d+ .*over --memory-budget", log(r))


def test_sleeping_stray_ends_within_2s_of_its_max_age(own_cgroup, reaper, tmp_path):
    tag = bh.marker()
    max_age = 8.0
    code = "import time\ntime.sleep(600)\n"
    script = f"{sleepers()}\n( {PYTHON} -c '{code}' {tag} & )\nexec sleep 600"
    r = start(reaper, own_cgroup, ["--stray-max-age", str(max_age), "--budget-action", "terminate",
                                   "--budget-interval", "0.5"], script, tmp_path)
    (pid,) = bh.wait_tagged(tag, timeout=120)
    born = time.monotonic()
    asleep(r)
    wait_for(lambda: not alive(pid), max_age + 2 + 5, interval=0.05, what="the old stray ended")
    ended = time.monotonic()
    # First seen after it was born: never ended before its age; within 2 s of it, plus
    # what lies between its birth and the first sample that saw it (one interval).
    assert ended - born >= max_age - 0.5, ended - born
    assert ended - born <= (max_age + 2 + 0.5) * float(os.environ.get("REAPER_TEST_SLOW", "1")), ended - born
    assert re.search(r"WARN stray \d+ .*--stray-max-age\): SIGTERM", log(r))
    os.kill(r.pid, signal.SIGTERM)


# --- dormant strays (reaper/budgets/dormant.py): kept small, yet whole --------------------

def test_a_dormant_strays_child_joins_its_lineage_and_its_age(own_cgroup, reaper, tmp_path):
    """A stray kept dormant is still a lineage: a child it forks is linked to it (the
    record is tracked again for that) and is as old as it is."""
    tag = bh.marker()
    go = fifo(tmp_path)
    max_age = 10.0
    code = f"import os, time\nopen(\"{go}\").close()\nos.fork()\ntime.sleep(600)\n"
    script = f"( {PYTHON} -c '{code}' {tag} & )\n{sleepers(20)}\nexec sleep 600"
    r = start(reaper, own_cgroup, ["--stray-max-age", str(max_age), "--budget-action", "terminate",
                                   "--budget-interval", "0.5"], script, tmp_path)
    (parent,) = bh.wait_tagged(tag)
    first = time.monotonic()
    asleep(r)
    wait_for(lambda: time.monotonic() - first >= 4, 10, what="the parent asleep for 4 s")
    open_fifo(go)
    child = next(p for p in bh.wait_tagged(tag, n=2) if p != parent)
    born = time.monotonic()
    parent_ns, child_ns = ns_pid(parent), ns_pid(child)
    wait_for(lambda: not alive(child), max_age + 5, interval=0.05, what="the child ended at its lineage's age")
    # Its own age would end it max_age after its birth; its lineage's, about 6 s after.
    assert time.monotonic() - born < max_age - 2, time.monotonic() - born
    text = log(r)
    # Tracked again for its child, or already because its fork moved its CPU.
    assert re.search(rf"stray {parent_ns} \(python\S*\) tracked again: (a new stray's parent|its CPU moved)", text), \
        "\n".join(line for line in text.splitlines() if "python" in line)
    assert re.search(rf"stray {child_ns} \(python\S*\): orphan, lineage of {parent_ns} \(parent\)", text)


def test_a_dormant_stray_that_execs_is_judged_again(own_cgroup, reaper, tmp_path):
    """Two dormant shells exec into busy programs: the one whose new command line
    --protect matches is no longer a stray and is left alone; the other is niced."""
    keep, hold = bh.marker(), bh.marker()
    go = fifo(tmp_path)
    # From a file: a shell's forks show its command line, which must not hold the tags.
    path = tmp_path / "strays.sh"
    path.write_text(f"( ( read x < {go}; exec {bh.busy_argv(keep)} ) & )\n"
                    f"( ( read x < {go}; exec {bh.busy_argv(hold)} ) & )\n{sleepers(20)}\nexec sleep 600\n")
    script = f"exec sh {path}"
    r = start(reaper, own_cgroup, ["--cpu-budget", "0.05", "--budget-action", "nice", "--protect", keep, *FAST],
              script, tmp_path)
    count_strays_up(r, 23)
    asleep(r)
    time.sleep(2)                       # both shells sleep among the others for samples
    with open(go, "w") as f:
        f.write("go\ngo\n")
    (kept,) = bh.wait_tagged(keep)
    (held,) = bh.wait_tagged(hold)
    wait_for(lambda: bh.stat(held)["nice"] == 19, GRACE + 3 + 2, interval=0.05, what="the unprotected one reniced")
    time.sleep(GRACE + 1)
    assert bh.stat(kept)["nice"] != 19
    assert re.search(r"stray \d+ \(sh\) tracked again: (it exec'd|its CPU moved)", log(r))


def test_a_dormant_strays_memory_is_shown(own_cgroup, reaper, tmp_path):
    """A stray kept dormant holding 64 MiB is among the strays holding most memory, and
    counted among the strays."""
    from metrics_helpers import start_with_metrics, wait_scrape

    tag = bh.marker()
    ready = tmp_path / "ready"
    # It holds its memory before it is an orphan (its parent shell waits for that): a
    # dormant stray's figures are those of its last read.
    code = (f"import time\nheld = bytearray(64 << 20)\nheld[::4096] = b\"x\" * (len(held) // 4096)\n"
            f"open(\"{ready}\", \"w\").close()\ntime.sleep(600)\n")
    script = (f"( {PYTHON} -c '{code}' {tag} & while [ ! -e {ready} ]; do sleep 0.05; done )\n"
              f"{sleepers(20)}\nexec sleep 600")
    path = tmp_path / "reaper.log"
    with open(path, "wb") as f:
        r, port = start_with_metrics(reaper, ["sh", "-c", script],
                                     ["-vv", "--cpu-budget", "0.5", "--budget-action", "observe", *FAST],
                                     preexec_fn=joiner(own_cgroup), stderr=f)
    r.log_path = path
    pid = str(ns_pid(bh.wait_tagged(tag)[0]))       # as reaper names it
    asleep(r)
    s = wait_scrape(port, lambda s: (s.value("reaper_stray_memory_bytes", pid=pid) or 0) >= 60 << 20
                    and s.value("reaper_processes", **{"class": "stray"}) == 21,
                    "the dormant stray's memory shown, and 21 strays counted", timeout=20)
    assert s.value("reaper_stray_cpu_cores", pid=pid) in (None, 0.0)

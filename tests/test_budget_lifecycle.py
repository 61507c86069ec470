"""A stray's life under budgets, as docs/budgets.md tells it: throttled into a cgroup of
its own, the cgroup removed when it dies; resumed when it is back under budget; let go
(moved back) when it stops being a stray; held by a per-stray and a total budget at once."""
import os
import re
import signal

import pytest

import budget_helpers as bh
from budget_helpers import FAST, V1_CPU, needs_v1
from conftest import PYTHON, remove_cgroup, wait_for

heavy = pytest.mark.xdist_group("cpu-heavy")   # CPU shares are measured: one at a time (not parsing tests)


@pytest.fixture
def started(reaper):
    """reaper(args, command), returned once its signals are set up."""
    def start(args, command, **kw):
        r = reaper([*args, "--", *command], **kw)
        r.wait_ready()
        return r
    return start


def _leaf_of(pid: int) -> str:
    return wait_for(lambda: (lambda c: c if "reaper-strays." in c and c.rsplit("/", 1)[1].startswith("s") else None)
                    (bh.cpu_cgroup(pid)), 30, what=f"stray {pid} in a cgroup of its own")


@heavy
@needs_v1
def test_a_dead_strays_cgroup_is_removed_while_reaper_runs(started):
    tag = bh.marker()
    r = started(["-v", "--cpu-budget", "0.1", "--budget-action", "throttle", *FAST],
                bh.orphans_then_sleep(bh.busy_argv(tag)))
    (pid,) = bh.wait_tagged(tag)
    leaf = V1_CPU + _leaf_of(pid)
    os.kill(pid, signal.SIGKILL)                      # ours: the test started it
    wait_for(lambda: not os.path.exists(leaf), 30, what=f"{leaf} to be removed")
    assert r.proc.poll() is None                      # at the next sample, not at exit


@heavy
@needs_v1
def test_a_per_stray_and_a_total_budget_hold_together(started):
    tag = bh.marker()
    r = started(["--cpu-budget", "0.3", "--cpu-budget-total", "0.2", "--budget-action", "throttle", *FAST],
                bh.orphans_then_sleep(*[bh.busy_argv(tag)] * 2))
    pids = bh.wait_tagged(tag, 2)
    for p in pids:                                    # in reaper's cgroup, under the total's quota
        wait_for(lambda: "reaper-strays." in bh.cpu_cgroup(p), 30, what=f"stray {p} throttled")
    base = V1_CPU + bh.cpu_cgroup(pids[0]).rsplit("/", 1)[0]
    assert open(f"{base}/cpu.cfs_quota_us").read().strip() == "20000"
    # Together they get the total (0.1 each: under the per-stray 0.3, so they share one leaf).
    bh.assert_rate_near(pids, 0.2, low=0.4)
    assert all(bh.cpu_cgroup(p).endswith("/shared") for p in pids)
    r.send(signal.SIGTERM)
    assert r.wait() == 143


# Busy until the file argv[1] exists, then idle but alive (argv ends with the tag).
BUSY_THEN_IDLE = ("import os, sys, time\n"
                  "while not os.path.exists(sys.argv[1]): pass\n"
                  "time.sleep(600)\n")


@heavy
def test_a_stray_back_under_budget_is_resumed(started, tmp_path):
    tag, calm = bh.marker(), tmp_path / "calm"
    code = BUSY_THEN_IDLE.replace("'", "'\\''")
    r = started(["-v", "--cpu-budget", "0.1", "--budget-action", "throttle", *FAST],
                bh.orphans_then_sleep(f"{PYTHON} -c '{code}' {calm} {tag}"), preexec_fn=bh.readonly_cgroups)
    (pid,) = bh.wait_tagged(tag)
    wait_for(lambda: bh.stat(pid)["state"] == "T", 30, 0.01, what="the stray stopped by duty-cycling")
    calm.touch()
    # Its demand falls under the budget: released, never stopped again.
    wait_for(lambda: "T" not in bh.states_for([pid], 1.0), 30, what="the stray to be released")
    assert "T" not in bh.states_for([pid], 2.0)
    r.send(signal.SIGTERM)
    assert r.wait() == 143
    assert re.search(r"stray \d+ \(python\S*\) back under budget: resumed", r.stderr), r.stderr   # its pid in reaper's namespace


@heavy
@needs_v1
def test_a_process_that_stops_being_a_stray_is_let_go(started, tmp_path):
    # Matched by --stray-match on its command line, then it execs into something else.
    tag, leave = bh.marker(), tmp_path / "leave"
    code = ("import os, sys\n"
            "while not os.path.exists(sys.argv[1]): pass\n"
            "os.execv('/bin/sleep', ['sleep', '600'])\n").replace("'", "'\\''")
    r = started(["-v", "--cpu-budget", "0.1", "--budget-action", "throttle", "--stray-match", tag, *FAST],
                ["sh", "-c", f"{PYTHON} -c '{code}' {leave} {tag} & exec sleep 600"])
    (pid,) = bh.wait_tagged(tag)
    leaf = V1_CPU + _leaf_of(pid)
    leave.touch()
    wait_for(lambda: "reaper-strays." not in bh.cpu_cgroup(pid), 30, what="the process moved back")
    wait_for(lambda: not os.path.exists(leaf), 30, what=f"{leaf} to be removed")
    assert open(f"/proc/{pid}/comm").read().strip() == "sleep"
    r.send(signal.SIGTERM)
    assert r.wait() == 143


@needs_v1
def test_the_cgroup_throttle_never_sleeps_at_exit(monkeypatch):
    """close() runs on the loop's path at exit: it removes what it can and reports the
    rest at once, without waiting (the old one slept and retried). A cgroup made below
    one of reaper's by someone else keeps that one busy."""
    from reaper.budgets.throttle import CgroupThrottle

    cg = CgroupThrottle.probe()
    if cg.kind != "cgroup_v1":
        pytest.skip(f"the probe chose {cg.kind}")
    leaf = cg.leaf((os.getpid(), 0), 0.5)
    foreign = os.path.join(leaf, "someone-elses")
    os.mkdir(foreign)
    try:
        from reaper.budgets import cgroupfs, throttle

        for module in (throttle, cgroupfs):     # where close() runs: fails if one no longer uses time
            monkeypatch.setattr(module.time, "sleep", lambda s: pytest.fail(f"close() slept {s}s"))
        left = cg.close()
        monkeypatch.undo()
        assert leaf in left and cg.base in left, left
    finally:
        monkeypatch.undo()
        os.rmdir(foreign)
        remove_cgroup(cg.base)
    assert not os.path.exists(cg.base)

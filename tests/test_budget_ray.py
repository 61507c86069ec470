"""Ray-aware stray detection with a real Ray: reaper is PID 1 and runs
`ray start --head --block`; a driver leaves a busy child behind a task that
returned (a stray once its worker shows ray::IDLE), and keeps busy children
under a running task and a live actor (not strays).

    pytest -m ray tests/test_budget_ray.py
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from conftest import PYTHON, descendants, importable, require, wait_for
import budget_helpers as bh
import ray_helpers as rh

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("cpu-heavy")]


@pytest.fixture(autouse=True)
def _needs_ray():
    require("ray", importable("ray"), "pip install -e '.[test]'")
RAY = str(Path(PYTHON).with_name("ray"))

DRIVER = textwrap.dedent("""
    import subprocess, sys, time
    import ray

    address, leak_tag, task_tag, actor_tag = sys.argv[1:5]
    BUSY = [sys.executable, "-c", "while True: pass"]
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)

    @ray.remote(num_cpus=1)
    def hold(tag):
        subprocess.Popen(BUSY + [tag])        # a child of a task that is still running
        time.sleep(300)

    @ray.remote(num_cpus=0)
    class Keeper:
        def spawn(self, tag):
            self.child = subprocess.Popen(BUSY + [tag])   # a child of a live actor
            return self.child.pid

    @ray.remote(num_cpus=1)
    def leak(tag):
        # Detached, and left behind when the task returns.
        return subprocess.Popen(BUSY + [tag], start_new_session=True).pid

    keeper = Keeper.remote()
    ray.get(keeper.spawn.remote(actor_tag))
    running = hold.remote(task_tag)
    time.sleep(1)
    ray.get(leak.remote(leak_tag))
    print("READY", flush=True)
    sys.stdin.read()                           # until the test is done
""")


class _Job:
    """A Ray head under reaper as PID 1 and the driver above, once its three children run."""

    def __init__(self, reaper, shared_dir, extra: list, block: bool = True) -> None:
        tmp = str(shared_dir)                           # Ray's socket paths must stay short
        self.leak_tag, self.task_tag, self.actor_tag = bh.marker(), bh.marker(), bh.marker()
        args = ["--cpu-budget", "0.02", "--budget-action", "nice", "--budget-grace", "1",
                "--budget-window", "2", "--budget-interval", "0.5", "--summary-file",
                os.path.join(tmp, "summary.json"), "-v", *extra]
        self.r, port = rh.start_head(reaper, args, RAY, tmp, num_cpus=2, env={"RAY_USAGE_STATS_ENABLED": "0"},
                                     block=block)
        self.driver = None
        drv_path = os.path.join(tmp, "driver.py")
        with open(drv_path, "w") as f:
            f.write(DRIVER)
        # Wait until the head answers, then run the driver from outside the namespace.
        self.driver = subprocess.Popen([PYTHON, drv_path, f"127.0.0.1:{port}", self.leak_tag, self.task_tag,
                                        self.actor_tag], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.driver.stdout], [], [], 60)
        line = self.driver.stdout.readline() if ready else ""
        if line.strip() != "READY":
            self.driver.kill()
            pytest.fail(f"the driver did not get ready: {line!r} {self.driver.stderr.read()[-2000:]}")
        (self.leaked,) = wait_for(lambda: bh.pids_tagged(self.leak_tag), 20, what="the leaked child")
        (self.in_task,) = wait_for(lambda: bh.pids_tagged(self.task_tag), 20, what="the running task's child")
        (self.in_actor,) = wait_for(lambda: bh.pids_tagged(self.actor_tag), 20, what="the actor's child")

    def more_samples(self) -> None:
        """Several more samples, the running task's child well over its budget meanwhile
        (0.5 s of CPU, 0.04 s per window). Ray runs its workers at nice 15, so on a busy
        machine that takes a while."""
        c0 = bh.stat(self.in_task)["cpu"]
        wait_for(lambda: bh.stat(self.in_task)["cpu"] - c0 > 0.5, 60, 0.1, what="more samples")

    def stop(self) -> None:
        if self.driver is not None:
            self.driver.kill()
            self.driver.wait()
        if self.r.proc.poll() is None:
            self.r.send(signal.SIGTERM)
        try:
            self.r.wait(60)
        finally:
            self.r.kill()


def _niced(pid: int) -> bool:
    return os.sched_getscheduler(pid) == os.SCHED_IDLE and bh.stat(pid)["nice"] == 19


@pytest.mark.parametrize("block", [True, False], ids=["block", "orphaned"])
def test_idle_worker_child_is_stray_running_task_and_actor_children_are_not(reaper, shared_dir, block):
    """With --block `ray start` is the main child; without it, Ray's daemons are orphans
    of reaper once it returns (docs/budgets.md: they stay Ray's own, and so does what
    runs below the raylet)."""
    from reaper.budgets.ray import RayProcesses

    job = _Job(reaper, shared_dir, [], block)
    try:
        main = job.r.main_child()
        raylet = wait_for(lambda: [p for p in descendants(job.r.pid)
                                   if Path(f"/proc/{p}/comm").read_text().strip() == "raylet"] or None,
                          30, what="the raylet")[0]
        if block:
            assert bh.stat(raylet)["ppid"] != job.r.pid
        else:                                            # once `ray start` has returned
            wait_for(lambda: bh.stat(raylet)["ppid"] == job.r.pid, 30, what="the raylet orphaned to reaper")
        def title(pid):
            return Path(f"/proc/{bh.stat(pid)['ppid']}/cmdline").read_bytes().rstrip(b"\0").decode()

        assert title(job.leaked) == "ray::IDLE"
        assert title(job.in_task).startswith("ray::hold")
        assert title(job.in_actor).startswith("ray::Keeper")
        wait_for(lambda: _niced(job.leaked), 30, 0.1, what="the idle worker's child to be niced")
        job.more_samples()
        for pid in (job.in_task, job.in_actor):
            assert not _niced(pid)
        # Ray's own processes are never strays, and the detector knows them by their files.
        detector, kinds = RayProcesses(), {}
        for pid in descendants(job.r.pid):
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            kinds[comm] = detector.kind(pid, bh.stat(pid)["start"])
            if comm in ("raylet", "gcs_server") or comm.startswith("ray::"):
                assert os.sched_getscheduler(pid) != os.SCHED_IDLE, comm
        assert kinds.get("raylet") == "raylet" and kinds.get("gcs_server") == "gcs_server", kinds
        if block:
            assert detector.kind(main, bh.stat(main)["start"]) == "ray_start"
        daemons = [p for p in descendants(job.r.pid) if b"ray/_private/log_monitor.py" in
                   Path(f"/proc/{p}/cmdline").read_bytes()]
        assert daemons and detector.kind(daemons[0], bh.stat(daemons[0])["start"]) == "daemon"
    finally:
        job.stop()
    assert "ray-idle" in job.r.stderr, job.r.stderr[-3000:]
    # (Not checked on the log: at teardown the raylet may exit before its workers,
    # which are then orphans of reaper, like any process whose parent died.)


def test_no_ray_aware_leaves_the_children_of_idle_workers_alone(reaper, shared_dir):
    """--no-ray-aware: a child of a ray::IDLE worker is not a stray (it is in the main
    tree), and Ray's own processes are still never strays."""
    job = _Job(reaper, shared_dir, ["--no-ray-aware"])
    try:
        job.more_samples()
        job.more_samples()
        for pid in (job.leaked, job.in_task, job.in_actor):
            assert not _niced(pid)
        for pid in descendants(job.r.pid):
            assert not _niced(pid), Path(f"/proc/{pid}/comm").read_text()
    finally:
        job.stop()
    assert "ray-idle" not in job.r.stderr, job.r.stderr[-3000:]

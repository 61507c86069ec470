"""Leftovers of Ray workers, with a real Ray (one start for the module): reaper is
PID 1 of a fresh namespace, its main child a driver (leftovers_helpers.ray_driver)
whose actor's agent starts ranks in new sessions, as torchrun does, one holding a
device node named like a GPU, one ignoring SIGTERM, one under GNU timeout; the
actor is killed with ray.kill. A task's worker is SIGKILLed with its rank below
it. A live actor's setsid'd rank and the driver's own daemon are left alone.

Runs on its own: pytest -m ray tests/test_leftovers_ray.py
"""
from __future__ import annotations

import signal
import time

import pytest

from conftest import PYTHON, SLOW, importable, require, wait_for, wait_for_file
import leftovers_helpers as lh

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("cpu-heavy")]
GRACE = 1.0


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
    """The one Ray run of this module: (stderr, out directory, facts read while it ran)."""
    from conftest import Reaper

    require("ray", importable("ray"), "pip install -e '.[test]'")
    out = tmp_path_factory.mktemp("leftovers-ray")
    dev = lh.make_device(out)
    r = Reaper(["--leftovers", "end", "--leftover-grace", str(GRACE), "--devices", str(out / "nvidia[0-9]*"),
                "--", PYTHON, str(lh.HERE), "ray-driver", str(out)], env={"RAY_DISABLE_DOCKER_CPU_WARNING": "1"})
    facts = {}
    try:
        killed = float(wait_for_file(out / "killed", timeout=180))
        for name in ("gpu-rank", "stubborn-rank", "timeout-rank"):
            facts[name] = wait_for(lambda n=name: lh.marked(out, n) == [] and n, 15, 0.05, what=f"{name} ended")
        facts["killed"] = killed
        facts["ended_at"] = time.monotonic()
        wait_for_file(out / "task-killed", timeout=60)
        wait_for(lambda: lh.marked(out, "task-rank") == [], 15, 0.05, what="task-rank ended")
        wait_for_file(out / "quick-killed", timeout=60)
        wait_for(lambda: lh.marked(out, "quick-dead") == [], 15, 0.05, what="quick-dead ended")
        time.sleep(2.5)                     # two samples more: the live ones must still be there
        facts["live"] = {n: bool(lh.marked(out, n)) for n in ("live-rank", "daemon", "quick-live")}
        facts["term"] = {n: (out / f"{n}.term").exists() for n in ("live-rank", "daemon", "quick-live")}
        (out / "exit").write_text("1")
        r.send(signal.SIGTERM)
        r.wait(60)
    finally:
        r.kill()
    yield r.stderr, out, facts, dev


def test_ranks_of_a_killed_actor_get_sigterm_within_2s_then_sigkill_after_the_grace(ray_run):
    err, out, facts, dev = ray_run
    gpu_term = float((out / "gpu-rank.term").read_text())
    assert gpu_term - facts["killed"] < 2.0 * SLOW + 0.5, (gpu_term - facts["killed"], err)
    stubborn_term = float((out / "stubborn-rank.term").read_text())
    assert stubborn_term - facts["killed"] < 2.0 * SLOW + 0.5
    assert (out / "timeout-rank.term").exists()          # GNU timeout's child: reached too


def test_the_line_names_the_actor_the_job_the_device_and_its_release(ray_run):
    err, out, facts, dev = ray_run
    job = (out / "job").read_text().strip()
    # The other actor (the live one) ends with the driver, at reaper's SIGTERM: a line of its own.
    lines = [x for x in err.splitlines() if "leftovers of ray::Holder.run" in x and "holding" in x]
    assert len(lines) == 1, err
    line = lines[0]
    assert f"job {job}" in line and "ffffffff" not in line, line
    assert f"holding {dev}" in line and "devices released" in line, line
    assert "SIGKILL to 1 after the grace" in line, line


def test_a_sigkilled_tasks_rank_is_ended(ray_run):
    err, out, facts, dev = ray_run
    assert (out / "task-rank.term").exists()
    assert any("leftovers of ray::doomed" in x for x in err.splitlines()), err


def test_no_false_positive_for_a_live_actors_rank_and_the_drivers_daemon(ray_run):
    err, out, facts, dev = ray_run
    assert facts["live"] == {"live-rank": True, "daemon": True, "quick-live": True}, facts
    assert facts["term"] == {"live-rank": False, "daemon": False, "quick-live": False}, facts


def test_one_orphaned_before_reaper_saw_it_is_its_workers_by_the_log_it_inherited(ray_run):
    """Born and orphaned at once (sh returns at once), then its worker SIGKILLed: never
    seen below the worker, it is known as the worker's by its stdout, the worker's own log
    file. The same for a live worker's: left alone (the no-false-positive test)."""
    err, out, facts, dev = ray_run
    assert (out / "quick-dead.term").exists()
    # Its job: where its environment (a prestarted worker's null id) or its log says it;
    # a worker SIGKILLed at once may not have flushed its log's job line: "unknown job".
    lines = [x for x in err.splitlines() if "leftovers of ray::quick (" in x]
    assert len(lines) == 1 and "ffffffff" not in lines[0], err

"""Golden traces of the budgets engine: what it does, sample by sample, in scripted
worlds (tests/budget_world.py: fake clock, fake /proc, a fake process handle that
records signals, renices and moves), held equal to tests/data/budgets/<scenario>.json.

A change that is meant to keep behaviour (a refactor of reaper/budgets/) must leave
every trace as it is. A change that means to alter behaviour regenerates them and the
diff of the JSON files is part of its review:

    REAPER_GOLDEN_WRITE=1 /work/venv-NAME/bin/python -m pytest -q tests/test_budget_golden.py

The scenarios follow the black-box tests (test_budget*.py): a CPU hog under nice, the
duty cycle and terminate (cpu_*), the total shared; a fork hop caught at once by the
duty cycle (hop_at_once), by the scan and a sample late (hop_late); sleeping strays
(dormant_*: strays that lead their own group, never dormant records; sleepers_*:
dormant records) woken by CPU, by an exec, by their age, by their memory and as a new
stray's parent; memory over a stray's own budget and over the total, and kept awake
while over (memory_*); strays reaper may not read or renice (eperm); the CPU of what
reaper reaps (reaped); the drain. A scenario added later is written on the code before
the change it guards (PYTHONPATH at an export of that commit, the same command).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from budget_world import MAIN, PID0, REAPER, World

DATA = Path(__file__).parent / "data" / "budgets"
CPU = ["--cpu-budget", "0.5", "--budget-grace", "2", "--budget-window", "3", "--budget-interval", "1",
       "--grace", "2"]
LEADER = PID0 - 1        # the group and session of a hopper: their leader is gone (a hop is linked as one)


def cpu_nice() -> World:
    w = World([*CPU, "--budget-action", "nice"], 12)
    w.add(comm="hog", cmdline="hog --spin", rate=1.0)
    w.add(comm="sleep", cmdline="sleep 600")
    w.at(6.0, lambda: w.add(comm="sleep", cmdline="sleep 700"))
    w.at(9.2, lambda: w.add(comm="half", cmdline="half", rate=0.3))
    return w


def cpu_throttle() -> World:
    w = World([*CPU, "--budget-action", "throttle"], 8)
    w.add(comm="hog", cmdline="hog --spin", rate=1.0)
    return w


def cpu_terminate() -> World:
    w = World([*CPU, "--budget-action", "terminate", "--budget-kill-after", "3"], 14)
    w.add(comm="hog", cmdline="hog --spin", rate=1.0, term_exits=False)
    w.add(comm="polite", cmdline="polite", rate=0.9)
    return w


def cpu_total() -> World:
    w = World(["--cpu-budget-total", "1", "--budget-grace", "2", "--budget-window", "3",
               "--budget-action", "throttle"], 8)
    w.add(comm="a", cmdline="a", rate=1.0)
    w.add(comm="b", cmdline="b", rate=1.0)
    return w


def hop_at_once() -> World:
    """A duty-cycled stray forks and exits between two samples: its stop meets ESRCH,
    and its fork is caught among reaper's children at once."""
    w = World([*CPU, "--budget-action", "throttle"], 9)
    a = w.add(comm="hopper", cmdline="hopper --loop", rate=1.0, pgid=LEADER, sid=LEADER)

    def hop():
        b = w.fork(a, rate=1.0)
        w.exit(a.pid)
        b.ppid = REAPER
    w.at(6.02, hop)
    return w


def hop_late() -> World:
    """A fork hop seen by the scan (its parent gone at the same sample), then one whose
    parent outlives its first sample (joined a sample late)."""
    w = World([*CPU, "--budget-action", "nice"], 13)
    a = w.add(comm="hopper", cmdline="hopper --loop", rate=1.0, pgid=LEADER, sid=LEADER)
    later = {}

    def hop():
        later["b"] = b = w.fork(a, rate=1.0)
        b.ppid = REAPER
        w.exit(a.pid)

    def late():
        c = w.fork(later["b"], rate=1.0)
        c.ppid = REAPER
    w.at(4.5, hop)
    w.at(6.5, lambda: w.add(ppid=MAIN, comm="worker", cmdline="main --worker"))    # a scan: A is long gone
    w.at(8.5, late)
    w.at(9.5, lambda: w.exit(later["b"].pid))
    return w


def dormant_cpu() -> World:
    w = World([*CPU, "--budget-action", "nice"], 20)
    s = [w.add(comm="sleep", cmdline=f"sleep {600 + i}") for i in range(3)]
    w.at(12.0, lambda: setattr(s[1], "rate", 0.8))
    return w


def dormant_exec() -> World:
    w = World([*CPU, "--budget-action", "nice"], 14)
    s = [w.add(comm="sleep", cmdline=f"sleep {600 + i}") for i in range(3)]

    def exec_():
        s[2].comm, s[2].cmdline, s[2].rate = "python", "python job.py", 0.7
    w.at(8.0, exec_)
    w.at(9.5, lambda: w.add(ppid=MAIN, comm="worker", cmdline="main --worker"))    # a fork: the scan
    return w


def dormant_age() -> World:
    w = World(["--stray-max-age", "10", "--budget-grace", "2", "--budget-action", "nice", "--grace", "2"], 16)
    w.add(comm="sleep", cmdline="sleep 600")
    w.add(comm="stubborn", cmdline="stubborn", term_exits=False)
    w.at(3.0, lambda: w.add(comm="late", cmdline="sleep 900"))
    return w


def memory_own() -> World:
    w = World(["--memory-budget", "100M", "--budget-grace", "2", "--budget-action", "terminate"], 8)
    w.add(comm="fat", cmdline="fat", mem=200 << 20, rss=210 << 20)
    w.add(comm="thin", cmdline="thin", mem=50 << 20, rss=60 << 20)
    grow = w.add(comm="grow", cmdline="grow", mem=20 << 20, rss=30 << 20)

    def grows():
        grow.mem, grow.rss = 150 << 20, 160 << 20
    w.at(5.5, grows)
    return w


def memory_total() -> World:
    w = World(["--memory-budget-total", "300M", "--budget-grace", "2", "--budget-action", "terminate"], 8)
    w.add(comm="a", cmdline="a", mem=150 << 20, rss=160 << 20)
    w.add(comm="b", cmdline="b", mem=120 << 20, rss=130 << 20)
    w.add(comm="c", cmdline="c", mem=60 << 20, rss=70 << 20)
    return w


def eperm() -> World:
    w = World([*CPU, "--budget-action", "nice"], 8)
    w.add(comm="theirs", cmdline="theirs", rate=1.0, deny={"read"})
    w.add(comm="unnice", cmdline="unnice", rate=1.0, deny={"nice"})
    w.add(comm="hog", cmdline="hog", rate=1.0)
    return w


def reaped() -> World:
    """Where reaper reaps the orphans (reaped.py): the CPU of a hop's last moments, of a
    stray gone between two samples and of one never read is counted from what it reaped,
    to the end (close)."""
    w = World([*CPU, "--budget-action", "nice"], 10, reaped=True)
    a = w.add(comm="hopper", cmdline="hopper --loop", rate=1.0, pgid=LEADER, sid=LEADER)
    w.add(ppid=MAIN, comm="worker", cmdline="main --worker", rate=0.2)      # the main tree's: kept
    later = {}

    def hop():
        later["b"] = b = w.fork(a, rate=1.0)
        w.exit(a.pid)
        b.ppid = REAPER

    def brief():
        later["c"] = w.add(comm="brief", cmdline="brief", rate=1.0)
    w.at(3.5, hop)
    w.at(5.3, lambda: w.exit(later["b"].pid))
    w.at(6.2, brief)
    w.at(6.8, lambda: w.exit(later["c"].pid))
    w.at(7.5, lambda: later.update(d=w.add(comm="last", cmdline="last", rate=1.0)))
    w.at(8.2, lambda: setattr(w.scope, "phase", "draining"))
    w.at(8.4, lambda: w.exit(later["d"].pid))
    return w


def memory_nice() -> World:
    """Over a memory budget under nice: niced, and kept awake while over (Kind.busy)."""
    w = World(["--memory-budget", "100M", "--budget-grace", "2", "--budget-window", "2", "--budget-action", "nice"],
              12)
    fat = w.add(comm="fat", cmdline="fat", mem=200 << 20, rss=210 << 20)
    w.add(comm="thin", cmdline="thin", mem=50 << 20, rss=60 << 20)

    def shrinks():
        fat.mem, fat.rss = 40 << 20, 50 << 20
    w.at(8.5, shrinks)
    return w


# Strays of the main tree's group and session (as a program's helpers are): they lead
# none of their own, so a plain one sleeps as a dormant record (dormant.py).
MAINS = {"pgid": MAIN, "sid": MAIN}


def sleepers_cpu() -> World:
    """Dormant records from the first sample; one whose CPU moves is tracked again at the
    sweep its unread CPU makes (pulse.py), and judged."""
    w = World([*CPU, "--budget-action", "nice"], 16)
    s = [w.add(comm="sleep", cmdline=f"sleep {600 + i}", **MAINS) for i in range(4)]
    w.at(9.0, lambda: setattr(s[1], "rate", 0.8))
    return w


def sleepers_exec() -> World:
    """A dormant stray that exec's is tracked again at the next scan; one that ends is
    dropped; the dormant ones holding most memory are listed."""
    w = World([*CPU, "--budget-action", "nice"], 12)
    s = [w.add(comm="sleep", cmdline=f"sleep {600 + i}", mem=(i + 1) << 20, **MAINS) for i in range(4)]

    def exec_():
        s[2].comm, s[2].cmdline, s[2].rate = "python", "python job.py", 0.7
    w.at(5.0, exec_)
    w.at(6.5, lambda: w.exit(s[3].pid))
    w.at(7.5, lambda: w.add(ppid=MAIN, comm="worker", cmdline="main --worker"))    # a fork: the scan
    return w


def sleepers_age() -> World:
    """Dormant strays past --stray-max-age are tracked again when due and terminated."""
    w = World(["--stray-max-age", "8", "--budget-grace", "2", "--budget-action", "nice", "--grace", "2"], 16)
    w.add(comm="sleep", cmdline="sleep 600", **MAINS)
    w.add(comm="stubborn", cmdline="stubborn", term_exits=False, **MAINS)
    w.at(3.0, lambda: w.add(comm="late", cmdline="sleep 900", **MAINS))
    return w


def sleepers_memory_and_parents() -> World:
    """A dormant stray whose memory grows past its budget is tracked again (its RSS
    moved: read again at a sweep); one that forks a new stray is tracked again as its
    parent."""
    w = World(["--memory-budget", "100M", "--budget-grace", "2", "--budget-window", "2", "--budget-action", "nice"],
              14)
    s = [w.add(comm="sleep", cmdline=f"sleep {600 + i}", **MAINS) for i in range(3)]

    def grows():
        s[0].mem, s[0].rss = 150 << 20, 160 << 20
        s[2].rss += 4096                 # its RSS alone moved: its memory read again, still under
        w.total_cpu += 0.2               # CPU nobody read (a process come and gone): a sweep
    w.at(5.0, grows)
    w.at(8.5, lambda: w.add(ppid=s[1].pid, comm="child", cmdline="child", pgid=MAIN, sid=MAIN))
    return w


def drain() -> World:
    w = World([*CPU, "--budget-action", "throttle"], 9)
    w.add(comm="hog", cmdline="hog --spin", rate=1.0)
    w.at(6.33, lambda: setattr(w.scope, "phase", "draining"))
    return w


SCENARIOS = [cpu_nice, cpu_throttle, cpu_terminate, cpu_total, hop_at_once, hop_late, dormant_cpu,
             dormant_exec, dormant_age, sleepers_cpu, sleepers_exec, sleepers_age, sleepers_memory_and_parents,
             memory_own, memory_total, memory_nice, eperm, reaped, drain]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_the_engine_does_what_it_did(scenario, monkeypatch):
    trace = scenario().run(monkeypatch)
    path = DATA / f"{scenario.__name__}.json"
    text = json.dumps(trace, indent=1, sort_keys=False) + "\n"
    if os.environ.get("REAPER_GOLDEN_WRITE") == "1":
        DATA.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    golden = json.loads(path.read_text())
    for i, (got, want) in enumerate(zip(trace, golden)):
        assert got == want, f"{path.name}: entry {i} (t={want.get('t')}) differs"
    assert len(trace) == len(golden), f"{path.name}: {len(trace)} entries, the golden trace has {len(golden)}"

"""reaper/policy.py in process: the boundary's guard (Policy), the one doubling Backoff and
the one "say once, go on" helper (SayOnce). The black-box faults are in test_faults*.py."""
from __future__ import annotations

import pytest

from reaper import policy
from reaper.policy import BUDGETS, HYGIENE, RESTART_FIRST, RESTART_MAX, Backoff, Policy, SayOnce
from reaper.stats import Stats


class Lines:
    """A Log as Policy uses it: the lines said, by level."""

    def __init__(self) -> None:
        self.lines: list = []

    def error(self, msg: str) -> None:
        self.lines.append(("error", msg))

    def info(self, msg: str) -> None:
        self.lines.append(("info", msg))

    def debug(self, msg: str) -> None:
        self.lines.append(("debug", msg))

    def enabled(self, level: int) -> bool:
        return False


class Plugin:
    def __init__(self, due=None, fail_tick: bool = False) -> None:
        self.due, self.fail_tick = due, fail_tick
        self.ticks: list = []
        self.closed = 0

    def next_deadline(self):
        return self.due

    def tick(self, now: float) -> None:
        if self.fail_tick:
            raise RuntimeError("tick")
        self.ticks.append(now)

    def close(self) -> None:
        self.closed += 1


class Clock:
    """policy's time.monotonic, moved by hand."""

    def __init__(self, monkeypatch, now: float = 1000.0) -> None:
        self.now = now
        monkeypatch.setattr(policy.time, "monotonic", lambda: self.now)


def test_backoff_doubles_up_to_its_ceiling_and_starts_over():
    b = Backoff(1.0, 5.0)
    assert [b.next() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    b.reset()
    assert b.next() == 1.0
    assert b.next(ran=4.9) == 2.0              # a short run keeps doubling
    assert b.next(ran=5.0) == 1.0              # a run as long as the ceiling: a fresh backoff
    assert b.next() == 2.0


def test_say_once_says_each_failing_name_once_and_goes_on():
    said = []
    once = SayOnce(lambda name, e: said.append((name, repr(e))), default=[])

    def boom():
        raise ValueError("x")

    assert once.run("a", lambda x: x + 1, 1) == 2
    assert once.run("a", boom) == [] and once.run("a", boom) == []
    assert once.run("b", boom) == []
    assert once.run("a", lambda: "back") == "back"     # it goes on: a success is returned as ever
    assert said == [("a", "ValueError('x')"), ("b", "ValueError('x')")]


def test_say_once_lets_what_is_not_an_exception_through():
    once = SayOnce(lambda name, e: None)

    def leave():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        once.run("a", leave)


def test_a_failing_piece_is_switched_off_with_one_line_and_counted():
    log, stats = Lines(), Stats()
    p = Policy(log, stats)
    assert p.call(HYGIENE, lambda: 7) == 7
    assert p.call(HYGIENE, lambda: 1 / 0) is None
    assert p.call(HYGIENE, lambda: 7) is None          # off: not called any more
    assert stats.policy_errors == 1
    assert log.lines == [("error", "hygiene failed (ZeroDivisionError('division by zero')): "
                                   "hygiene switched off, reaper goes on")]
    assert p.off == {HYGIENE: None}                    # not one of RESTARTED: off for good


def test_a_restarted_piece_backs_off_doubling_and_starts_again(monkeypatch):
    clock, log, stats = Clock(monkeypatch), Lines(), Stats()
    p = Policy(log, stats)
    made = []

    def factory():
        made.append(clock.now)
        return Plugin(due=clock.now + 1, fail_tick=True)

    p.start(BUDGETS, factory)
    waits = []
    for _ in range(4):
        due = p.next_deadline()
        clock.now = due
        p.tick(clock.now)                               # the tick fails: off, restart later
        waits.append(p.off[BUDGETS] - clock.now)
        clock.now = p.off[BUDGETS]
        p.tick(clock.now)                               # started again
    assert waits == [RESTART_FIRST, 2 * RESTART_FIRST, 4 * RESTART_FIRST, 8 * RESTART_FIRST]
    assert stats.policy_restarts == {BUDGETS: 4} and stats.policy_errors == 4
    assert len(made) == 5
    assert sum(1 for level, line in log.lines if level == "info" and "started again" in line) == 4


def test_a_piece_that_ran_long_starts_over_at_the_first_wait(monkeypatch):
    clock = Clock(monkeypatch)
    p = Policy(Lines(), Stats())
    p.start(BUDGETS, lambda: Plugin())
    p.switch_off(BUDGETS, RuntimeError())
    clock.now = p.off[BUDGETS]
    p.tick(clock.now)
    clock.now += 0.5
    p.switch_off(BUDGETS, RuntimeError())
    assert p.off[BUDGETS] - clock.now == 2 * RESTART_FIRST
    clock.now = p.off[BUDGETS]
    p.tick(clock.now)
    clock.now += RESTART_MAX                          # it ran as long as the ceiling
    p.switch_off(BUDGETS, RuntimeError())
    assert p.off[BUDGETS] - clock.now == RESTART_FIRST


def test_switched_off_plugins_are_closed_and_close_ends_restarts(monkeypatch):
    Clock(monkeypatch)
    p = Policy(Lines(), None)                          # stats may not exist yet
    plugin = Plugin()
    p.start(BUDGETS, lambda: plugin)
    p.switch_off(BUDGETS, RuntimeError())
    assert plugin.closed == 1 and p.plugins == []
    other = Plugin()
    p.start(HYGIENE, lambda: [other])
    p.close()
    assert other.closed == 1 and p.off == {BUDGETS: None}   # nothing starts again on the way out


def test_an_aborted_start_releases_what_it_took():
    released = []

    def factory():
        raise OSError("port")

    p = Policy(Lines(), Stats())
    p.start(HYGIENE, factory, abort=lambda: released.append(True))
    assert released == [True] and HYGIENE in p.off

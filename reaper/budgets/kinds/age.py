"""Lifetime: --stray-max-age. A stray first seen that many seconds ago gets SIGTERM
(SIGKILL --grace seconds later), whatever its CPU and memory and whatever
--budget-action says, except observe, which only reports it (one line). For strays
that hold a resource while idle, which no CPU budget catches.
"""
from __future__ import annotations

from reaper.budgets.kinds import Kind as _Kind


def past_max_age(since: float, now: float, max_age: float) -> bool:
    """A stray first seen at since (monotonic seconds) is past max_age at now."""
    return now - since >= max_age


class State:
    __slots__ = ("over",)

    def __init__(self, stray) -> None:
        # Past --stray-max-age and still there: SIGTERM'd, or reported only (observe).
        self.over = False


class Kind(_Kind):
    reason = "age"
    State = State

    def judge(self, now: float) -> None:
        enf, limit = self.enf, self.cfg.stray_max_age
        for t in enf.tracked.values():
            s = t.kinds["age"]
            if s.over or t.refused is not None or not past_max_age(t.since, now, limit):
                continue
            s.over = True
            if enf.level == 0:
                enf.violation("age", t)
                enf.log.warn(f"stray {t.key[0]} ({t.comm}, {t.reason}) first seen {now - t.since:.0f}s ago, "
                             f"past --stray-max-age {limit:g}: observe")
            else:
                enf.violation("age")
                enf.kill(t, now, "age", f"first seen {limit:g}s ago (--stray-max-age)")

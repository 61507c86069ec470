"""Lifetime: --stray-max-age. A stray whose lineage (lineage.py) was first seen that
many seconds ago gets SIGTERM (SIGKILL --grace seconds later), whatever its CPU and
memory and whatever --budget-action says, except observe, which only reports it (one
line). For strays that hold a resource while idle, which no CPU budget catches.
"""
from __future__ import annotations

TYPE_CHECKING = False    # typing's, without importing typing (mypy takes it as true)
if TYPE_CHECKING:
    from typing import Any

from reaper.budgets.kinds import Kind as _Kind
from reaper.budgets.lineage import who


def past_max_age(since: float, now: float, max_age: float) -> bool:
    """A stray first seen at since (monotonic seconds) is past max_age at now."""
    return now - since >= max_age


class State:
    __slots__ = ("over",)

    def __init__(self, stray: Any) -> None:
        # The lineage is past --stray-max-age and still there: SIGTERM'd, or reported only (observe).
        self.over = False


class Kind(_Kind):
    reason = "age"
    State = State
    timed = True
    due_why = "past --stray-max-age"

    def due(self, since: float) -> float:
        limit: float = self.cfg.stray_max_age
        return since + limit

    def past_due(self, since: float, now: float) -> bool:
        return past_max_age(since, now, self.cfg.stray_max_age)

    def judge(self, now: float) -> None:
        """A lineage's age is its oldest member's: a fork that lets its parent exit is
        as old as the parent, and a member seen after its lineage is past the age gets
        SIGTERM at once (and SIGKILL at once, --grace after the lineage's first)."""
        act, limit = self.act, self.cfg.stray_max_age
        for a in self.sample.lineages():
            s = a.kinds["age"]
            if not s.over:
                if not past_max_age(a.since, now, limit):
                    continue
                s.over = True
                t = a.first()
                if act.level == act.OBSERVE:
                    act.violation("age", t)
                    act.log.warn(f"{who(t)} first seen {now - a.since:.0f}s ago, "
                                 f"past --stray-max-age {limit:g}: observe")
                else:
                    act.violation("age")
            for t in list(a.members.values()):
                if act.level == act.OBSERVE:
                    if t.action == "none":
                        t.action = "observe"
                elif t.term_at is None and t.refused is None:
                    act.kill(t, now, "age", f"first seen {limit:g}s ago (--stray-max-age)")

    def joined(self, t: Any, now: float) -> None:
        if t.kinds["age"].over and self.act.level >= self.act.NICE:
            self.act.kill(t, now, "age", f"first seen {self.cfg.stray_max_age:g}s ago (--stray-max-age)")

"""The kinds' stand-in for the engine (tests/test_budget_kinds.py): a recorded sample
(kinds.Sample) and an actions door (kinds.Actions) that keeps the actions asked for in
`done` instead of acting. Checked against both protocols by mypy --strict
(tests/test_typing.py): the interface the kinds use is declared, not mirrored."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from reaper import options
from reaper.budgets import kinds
from reaper.budgets.actions import Actions as RealActions
from reaper.budgets.lineage import Tracked, lineages
from reaper.budgets.strays import Stray

if TYPE_CHECKING:
    from reaper.budgets.kinds import Actions, Sample


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def warn(self, msg: str) -> None:
        self.lines.append(("WARN", msg))

    def info(self, msg: str) -> None:
        self.lines.append(("INFO", msg))

    def debug(self, msg: str) -> None:
        self.lines.append(("DEBUG", msg))

    def enabled(self, level: int) -> bool:
        return True


class Handle:
    """A process that is never asked: only its exact private memory is read (the total)."""

    def __init__(self, exact: int | None = None) -> None:
        self.exact = exact

    def private_memory(self, exact_above: int | None = None) -> int | None:
        return self.exact

    def autogroup_nice(self, value: int) -> bool:
        return True                         # it leads its session: its autogroup reniced


class Recorder:
    """A recorded sample and the actions asked for, as a kind sees them."""

    OBSERVE, NICE, THROTTLE, TERMINATE = RealActions.OBSERVE, RealActions.NICE, RealActions.THROTTLE, \
        RealActions.TERMINATE

    def __init__(self, args: list[str], now: float = 100.0) -> None:
        self.cfg = options.parse([*args, "--", "true"], environ={})
        self.level = options.BUDGET_ACTIONS.index(self.cfg.budget_action)
        self.log = Log()
        self.watch = False
        self.tracked: dict[tuple[int, int], Tracked] = {}
        self.done: list[tuple[str, str, int | None]] = []
        self.now = now
        self.kinds: list[kinds.Kind] = [k(self, self) for k in kinds.load(self.cfg)]

    def stray(self, pid: int, *, age: float, rate: float | None = None, demand: float | None = None,
              mem: int | None = None, exact: int | None = None, reason: str = "orphan") -> Tracked:
        """A stray first seen age seconds ago, with the last sample's measures."""
        key = (pid, 1000 + pid)
        t = Tracked(key, Stray(pid, key[1], 1, f"s{pid}", f"s{pid}", reason), Handle(exact),
                    self.now - age, self.kinds)
        t.use.rate, t.use.demand, t.use.mem = rate, demand if demand is not None else rate, mem
        t.acct.use.rate, t.acct.use.demand = t.use.rate, t.use.demand     # a lineage of one
        self.tracked[key] = t
        return t

    def judge(self) -> list[tuple[str, str, int | None]]:
        for kind in self.kinds:
            kind.judge(self.now)
        return self.done

    def warnings(self) -> list[str]:
        return [msg for level, msg in self.log.lines if level == "WARN"]

    # --- the sample (kinds.Sample) ---------------------------------------------------

    def lineages(self) -> list[Any]:
        return lineages(self.tracked.values())

    def eligible_lineages(self, now: float) -> list[Any]:
        return [a for a in self.lineages() if now - a.since >= self.cfg.budget_grace and a.use.rate is not None]

    def members(self) -> Iterable[Tracked]:
        return self.tracked.values()

    def alive(self, key: tuple[int, int]) -> bool:
        return key in self.tracked

    def v2_taken(self) -> bool:
        return False

    # --- the actions (kinds.Actions) ---------------------------------------------------

    def violation(self, reason: str, t: Any = None) -> None:
        self.done.append(("violation", reason, t.key[0] if t else None))
        if t is not None and t.action == "none":
            t.action = "observe"

    def nice(self, t: Any, reason: str) -> None:
        if self.level >= self.NICE and not t.niced:
            t.niced = True
            self.done.append(("nice", reason, t.key[0]))

    def kill(self, t: Any, now: float, reason: str, why: str) -> None:
        self.done.append(("terminate", reason, t.key[0]))

    def count(self, action: str, reason: str) -> None:
        self.done.append((action, reason, None))

    def once(self, key: str, msg: str, level: str = "info") -> None:
        getattr(self.log, level)(msg)

    def cycle(self, t: Any, fraction: float, now: float, group: Any) -> None:
        self.done.append(("throttle_sigstop", "cycle", t.key[0]))

    def ran_stopped(self, t: Any) -> float | None:
        return None

    def release(self, t: Any, now: float) -> None:
        self.done.append(("release", "cycle", t.key[0]))

    def mechanism(self, reason: str, name: str) -> None:
        self.done.append(("mechanism", reason, None))

    def act(self, t: Any, action: str, fn: Callable[[Any], Any], reason: str) -> bool:
        fn(t.handle)
        self.count(action, reason)
        return True


if TYPE_CHECKING:
    def _declared(r: Recorder) -> tuple[Sample, Actions]:
        """The Recorder is a Sample and an Actions door (mypy --strict says so, or fails)."""
        return r, r

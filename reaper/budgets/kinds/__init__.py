"""The budget kinds: one module each, named after its reason, listed in KINDS.

    cpu.py     --cpu-budget, --cpu-budget-total: over budget on demand, the total's
               shares, nice/throttle/terminate (the duty cycle's control law)
    memory.py  --memory-budget, --memory-budget-total: private memory, the biggest
               first over the total, memory cgroups (memory_cgroup.py) under throttle
    age.py     --stray-max-age: SIGTERM that long after a stray was first seen

A kind's module defines `Kind` (see Kind below): each sample the enforcer
(enforcer.py) measures every stray and then asks each kind that is on, in KINDS'
order, to judge what it reads of the sample (a read-only Sample) and to respond
through the one door it acts by (Actions, actions.py: renice, SIGTERM, ...). Both are
declared below as protocols (for mypy --strict; under TYPE_CHECKING: the budgets
import no typing at run time), and what the engine asks of a kind is its hooks.
A kind judges lineages (lineage.py: a stray and its descendants, one account) and
acts on each of their members. Its decisions are plain functions of numbers,
testable on a recorded sample.

A kind's reason is its `reason` label in the metrics and in the stats' by-reason
counters; ANY labels what serves no one budget. A new kind is a module here, a row
in KINDS, and its option rows in reaper/options.py: OPTIONS, and BUDGETS and
IDLE_BUDGET_HINT, which tests/test_budget_kinds.py holds to DESTS (as it holds the
lists in docs/budgets.md and docs/metrics.md to REASONS).

This module imports nothing at run time: it is read by the metrics whether budgets
are on or not.
"""
from __future__ import annotations

TYPE_CHECKING = False    # typing's, without importing typing (mypy takes it as true)
if TYPE_CHECKING:                # the kinds' interface, for mypy (typing is not loaded at run time)
    from collections.abc import Callable, Iterable
    from typing import Any, Protocol

    class Sample(Protocol):
        """What a kind reads of the sample (enforcer.Sample): read only."""

        cfg: Any
        watch: bool

        def lineages(self) -> list[Any]: ...

        def eligible_lineages(self, now: float) -> list[Any]: ...

        def members(self) -> Iterable[Any]: ...

        def alive(self, key: tuple[int, int]) -> bool: ...

        def v2_taken(self) -> bool: ...

    class Actions(Protocol):
        """The one door a kind acts through (actions.Actions), at the level --budget-action names."""

        OBSERVE: int
        NICE: int
        THROTTLE: int
        TERMINATE: int
        level: int
        log: Any

        def once(self, key: str, msg: str, level: str = "info") -> None: ...

        def violation(self, reason: str, t: Any = None) -> None: ...

        def nice(self, t: Any, reason: str) -> None: ...

        def count(self, action: str, reason: str) -> None: ...

        def kill(self, t: Any, now: float, reason: str, why: str) -> None: ...

        def cycle(self, t: Any, fraction: float, now: float, group: Any) -> None: ...

        def ran_stopped(self, t: Any) -> float | None: ...

        def release(self, t: Any, now: float) -> None: ...

        def mechanism(self, reason: str, name: str) -> None: ...

        def act(self, t: Any, action: str, fn: Callable[[Any], Any], reason: str) -> bool: ...

# (reason, the Config attributes that turn the kind on: any one of them given), in the
# order the kinds judge each sample.
KINDS = (
    ("cpu", ("cpu_budget", "cpu_budget_total")),
    ("memory", ("memory_budget", "memory_budget_total")),
    ("age", ("stray_max_age",)),
)
REASONS = tuple(reason for reason, _ in KINDS)
DESTS = tuple(dest for _, dests in KINDS for dest in dests)
ANY = "any"      # the reason of an action for no one budget (a stray reaper may not read or pin)


def turned_on(cfg: Any) -> list[str]:
    """The reasons of the kinds cfg turns on, in KINDS' order."""
    return [reason for reason, dests in KINDS if any(getattr(cfg, d) is not None for d in dests)]


def load(cfg: Any) -> list[Any]:
    """The Kind classes of the kinds cfg turns on, in KINDS' order."""
    from importlib import import_module

    return [import_module(f"{__name__}.{reason}").Kind for reason in turned_on(cfg)]


class Kind:
    """What the engine asks of a kind. One instance per run, made with the sample
    it reads (Sample: cfg, lineages, ...) and the door it acts through (Actions)."""

    reason = ""
    State: Any = None    # what it keeps of each lineage: State(stray), with `over`; None: nothing
    cgroup: Any = None   # the cgroup holder it made (live, dying, close, version, base, mount), if any
    mechanism: Any = None    # how it holds its budget (stats), decided on first need
    timed = False        # it judges a lineage at a time of its own, sleeping or not (due, past_due)
    due_why = ""         # why a dormant stray is tracked again when it comes due (said with -vv)

    def __init__(self, sample: Sample, act: Actions) -> None:
        self.sample = sample
        self.act = act
        self.cfg = sample.cfg

    def state(self, stray: Any) -> Any:
        """A new lineage's state of this kind (kept in its Account.kinds[reason]), or None."""
        return None if self.State is None else self.State(stray)

    def done_with(self, acct: Any) -> bool:
        """Nothing is left for this kind to do to acct while it sleeps (its state as a
        new lineage's is then all it keeps): it may be kept dormant (dormant.py)."""
        return True

    def busy(self, acct: Any) -> bool:
        """acct's lineage must stay awake for this kind (over, held: it is read every sample)."""
        return bool(getattr(acct.kinds.get(self.reason), "over", False))

    def cycling(self, acct: Any) -> bool:
        """acct's lineage is duty-cycled by this kind (hops.catch looks for its forks)."""
        return False

    def due(self, since: float) -> float:
        """timed: when it must judge a lineage first seen at since (monotonic seconds):
        the schedule wakes a sleeping one then."""
        raise NotImplementedError

    def past_due(self, since: float, now: float) -> bool:
        """timed: that time has come at now (the lineage stays awake)."""
        return False

    def judges_all(self) -> bool:
        """It judges every lineage at every sample (a budget of all strays together): no
        lineage is left out of a sample's judgement, and none sleeps as a record."""
        return False

    def exact_above(self) -> int | None:
        """Private memory above this is read exactly (procctl.Handle.private_memory)."""
        return None

    def cow_above(self) -> int | None:
        """A stray sharing more than this copy-on-write has its private memory read again
        at every sample (it becomes its own without its RSS moving when the sharers free
        it), and its lineage stays awake."""
        return None

    def judge(self, now: float) -> None:
        """One sample, after the measures: who is over, and the response."""

    def over(self, t: Any) -> bool:
        """t counts as over this budget at the last sample (reaper_strays_over_budget)."""
        return bool(getattr(t.kinds.get(self.reason), "over", False))

    def drop(self, t: Any, alive: bool) -> None:
        """t is no longer a stray (alive) or is gone: undo what holds it."""

    def joined(self, t: Any, now: float) -> None:
        """t joined its lineage between two samples (a pid hop the duty cycle caught):
        what the lineage is under applies to it at once."""

    def retire(self, acct: Any) -> None:
        """acct's lineage has no member left: let go of what holds it (its cgroup)."""

    def closing(self) -> None:
        """reaper's exit, before the cgroups are removed."""

    # --- the cgroup a lineage is held in (escapes.py keeps its members there) ------------

    def leaf_of(self, acct: Any) -> str | None:
        """The cgroup directory every member of acct must be in, if this kind holds one."""
        return None

    def placed(self, t: Any, moved: bool) -> None:
        """t was found in its lineage's cgroup, or moved into it (moved: the first time)."""

    def leaking(self, acct: Any) -> str | None:
        """Why acct, in its cgroup for the whole last interval, is not held by it (it
        used more than its cgroup allows), or None."""
        return None

    def reassert(self, acct: Any) -> None:
        """Writes acct's cgroup's limit again (after leaking said why)."""

    def escaped(self, acct: Any, now: float) -> None:
        """A member of acct was found outside its cgroup (and put back): hold it otherwise
        too while it keeps leaving, if this kind can."""

    def give_up(self, acct: Any, why: str) -> None:
        """acct's members keep leaving its cgroup, or cannot be moved back: hold the
        budget without it from now on."""

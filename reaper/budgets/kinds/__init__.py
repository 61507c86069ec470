"""The budget kinds: one module each, named after its reason, listed in KINDS.

    cpu.py     --cpu-budget, --cpu-budget-total: over budget on demand, the total's
               shares, nice/throttle/terminate (the duty cycle's control law)
    memory.py  --memory-budget, --memory-budget-total: private memory, the biggest
               first over the total, memory cgroups (memory_cgroup.py) under throttle
    age.py     --stray-max-age: SIGTERM that long after a stray was first seen

A kind's module defines `Kind` (see Kind below): each sample the enforcer
(enforcer.py) measures every stray and then asks each kind that is on, in KINDS'
order, to judge and respond through the enforcer's actions (renice, SIGTERM, ...).
A kind judges lineages (lineage.py: a stray and its descendants, one account) and
acts on each of their members. Its decisions are plain functions of numbers,
testable on a recorded sample.

A kind's reason is its `reason` label in the metrics and in the stats' by-reason
counters; ANY labels what serves no one budget. A new kind is a module here, a row
in KINDS, and its option rows in reaper/options.py: OPTIONS, and BUDGETS and
IDLE_BUDGET_HINT, which tests/test_budget_kinds.py holds to DESTS (as it holds the
lists in docs/budgets.md and docs/metrics.md to REASONS).

This module imports nothing: it is read by the metrics whether budgets are on or not.
"""

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


def turned_on(cfg) -> list:
    """The reasons of the kinds cfg turns on, in KINDS' order."""
    return [reason for reason, dests in KINDS if any(getattr(cfg, d) is not None for d in dests)]


def load(cfg) -> list:
    """The Kind classes of the kinds cfg turns on, in KINDS' order."""
    from importlib import import_module

    return [import_module(f"{__name__}.{reason}").Kind for reason in turned_on(cfg)]


class Kind:
    """What the enforcer asks of a kind. One instance per run, made with the enforcer
    (enf: its cfg, log, level, tracked strays and actions)."""

    reason = ""
    State = None         # what it keeps of each lineage: State(stray), with `over`; None: nothing
    cgroup = None        # the cgroup holder it made (live, dying, close, version, base), if any
    mechanism = None     # how it holds its budget (stats), decided on first need

    def __init__(self, enf) -> None:
        self.enf = enf
        self.cfg = enf.cfg

    def state(self, stray):
        """A new lineage's state of this kind (kept in its Account.kinds[reason]), or None."""
        return None if self.State is None else self.State(stray)

    def done_with(self, acct) -> bool:
        """Nothing is left for this kind to do to acct while it sleeps (its state as a
        new lineage's is then all it keeps): it may be kept dormant (dormant.py)."""
        return True

    def judge(self, now: float) -> None:
        """One sample, after the measures: who is over, and the response."""

    def over(self, t) -> bool:
        """t counts as over this budget at the last sample (reaper_strays_over_budget)."""
        return bool(getattr(t.kinds.get(self.reason), "over", False))

    def drop(self, t, alive: bool) -> None:
        """t is no longer a stray (alive) or is gone: undo what holds it."""

    def joined(self, t, now: float) -> None:
        """t joined its lineage between two samples (a pid hop the duty cycle caught):
        what the lineage is under applies to it at once."""

    def retire(self, acct) -> None:
        """acct's lineage has no member left: let go of what holds it (its cgroup)."""

    def closing(self) -> None:
        """reaper's exit, before the cgroups are removed."""

    # --- the cgroup a lineage is held in (escapes.py keeps its members there) ------------

    def leaf_of(self, acct) -> "str | None":
        """The cgroup directory every member of acct must be in, if this kind holds one."""
        return None

    def placed(self, t, moved: bool) -> None:
        """t was found in its lineage's cgroup, or moved into it (moved: the first time)."""

    def leaking(self, acct) -> "str | None":
        """Why acct, in its cgroup for the whole last interval, is not held by it (it
        used more than its cgroup allows), or None."""
        return None

    def reassert(self, acct) -> None:
        """Writes acct's cgroup's limit again (after leaking said why)."""

    def give_up(self, acct, why: str) -> None:
        """acct's members keep leaving its cgroup, or cannot be moved back: hold the
        budget without it from now on."""

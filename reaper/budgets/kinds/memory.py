"""Memory budgets: --memory-budget (each stray), --memory-budget-total (all together).

A stray is judged by what it alone holds (its private memory: Handle.private_memory),
never by pages it shares, and a lineage (lineage.py: a stray and its descendants) by
what its members hold together. A lineage past its --budget-grace is over
--memory-budget when it holds more (over_each); strays holding more than
--memory-budget-total together are over it, the biggest lineages first until the rest
fit (biggest_first).

The response: observe and nice as for CPU; throttle moves a stray, when first seen
(a burst: memory_cgroup.MAKE_EACH new cgroups a sample, the biggest strays first, the
others awake until their turn), into a memory cgroup of reaper's own
(memory_cgroup.py) whose limit is its budget: the kernel caps what it allocates from
then on, and a stray whose private memory is over its budget in all (what it held
before the move included) is terminated, as is one no cgroup holds (found over it, no
memory cgroup, reaper watch); terminate sends SIGTERM at the first sample past the
grace that sees it over. A stray the kernel's OOM killer ends inside its cgroup is
said and counted (oom_kill).
"""
from __future__ import annotations

TYPE_CHECKING = False    # typing's, without importing typing (mypy takes it as true)
if TYPE_CHECKING:
    from typing import Any


from reaper.budgets.kinds import Kind as _Kind
from reaper.budgets.lineage import who
from reaper.budgets.memory_cgroup import MAKE_EACH, MemoryCgroup
from reaper.procctl import Gone
from reaper.budgets.throttle import Unavailable


# --- the decisions, on one sample's numbers (bytes) ----------------------------------

def over_each(held: dict[Any, int], budget: int) -> set[Any]:
    """The strays (held: key -> private memory, those past their grace) over budget."""
    return {key for key, mem in held.items() if mem > budget}


def biggest_first(held: dict[Any, int], total_held: int, total: int) -> set[Any]:
    """The strays over --memory-budget-total: of held (key -> private memory, those past
    their grace, in the order found), the biggest first, until what all strays hold
    (total_held, those in their grace included) fits the total."""
    over = set()
    for key, mem in sorted(held.items(), key=lambda kv: -kv[1]):
        if total_held <= total:
            break
        over.add(key)
        total_held -= mem
    return over


def size(n: Any) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


# --- the kind ------------------------------------------------------------------------

class State:
    """What the memory budget keeps of one lineage."""

    __slots__ = ("over", "leaf", "oom0", "tried", "gave_up")

    def __init__(self, stray: Any) -> None:
        self.over = False
        self.leaf: str | None = None     # memory cgroup directory its members are held in
        self.oom0 = 0                    # that leaf's OOM kills already said (leaves are reused)
        self.tried = False               # its memory cgroup was decided (made, or why not)
        self.gave_up = False             # its members kept leaving the leaf: judged by the sample only


class Kind(_Kind):
    reason = "memory"
    State = State
    cgroup: MemoryCgroup | None = None

    def busy(self, acct: Any) -> bool:
        s = acct.kinds.get("memory")
        if s is not None and not s.tried and self.act.level == self.act.THROTTLE:
            return True                  # awake until its turn for a memory cgroup (a burst: _confine)
        return s is not None and bool(s.over or s.leaf or self._sharing(acct))

    def exact_above(self) -> "int | None":
        budget: int | None = self.cfg.memory_budget
        return budget

    def cow_above(self) -> "int | None":
        """A quarter of the smallest memory budget (as pulse.py's memory trigger): a stray
        sharing that much copy-on-write is read every sample (issue 33.3)."""
        budgets = [b for b in (self.cfg.memory_budget, self.cfg.memory_budget_total) if b is not None]
        return min(budgets) // 4 if budgets else None

    def _sharing(self, a: Any) -> bool:
        """A member shares enough copy-on-write to go over without its RSS moving."""
        floor = self.cow_above()
        return floor is not None and any(t.use.cow > floor for t in a.members.values())

    def judge(self, now: float) -> None:
        """Judges what each lineage holds in all (its members' private memory), inside its
        memory cgroup or not: the cgroup caps what it allocates after the move, not what
        it held before."""
        cfg, act = self.cfg, self.act
        live = [a for a in self.sample.lineages()
                if any(t.use.mem is not None and t.refused is None for t in a.members.values())]
        held = {id(a): self._held(a) for a in live}
        if self.cgroup is not None:
            self.cgroup.new_sample()
        if act.level == act.THROTTLE:
            # The biggest first: a burst of new strays is moved MAKE_EACH new leaves a sample.
            for a in sorted((a for a in live if not a.kinds["memory"].tried), key=lambda a: -held[id(a)]):
                self._confine(a, held[id(a)])
        past = [a for a in live if now - a.since >= cfg.budget_grace]
        over_one, over_all = set(), set()
        if cfg.memory_budget is not None:
            for a in past:
                if len(a.members) > 1 and held[id(a)] > cfg.memory_budget:
                    held[id(a)] = self._exact(a)     # each member alone was under: its exact figure not read
            over_one = over_each({id(a): held[id(a)] for a in past}, cfg.memory_budget)
        if cfg.memory_budget_total is not None:
            total = sum(held.values())
            if total > cfg.memory_budget_total:
                held = {id(a): self._exact(a) for a in live}
                total = sum(held.values())
            over_all = biggest_first({id(a): held[id(a)] for a in past}, total, cfg.memory_budget_total)
        for a in live:
            s = a.kinds["memory"]
            over = id(a) in over_one or id(a) in over_all
            if over and not s.over:
                act.violation("memory", a.first())
                what = f"over --memory-budget {size(cfg.memory_budget)}" if id(a) in over_one else \
                    f"strays together over --memory-budget-total {size(cfg.memory_budget_total)}"
                # Named: the member that holds most of it (the lineage's first may be an idle
                # `timeout` or shell).
                act.log.warn(f"{who(a.biggest())} holds {size(held[id(a)])}{_with(a)}, "
                             f"{what}: {'terminate' if act.level >= act.THROTTLE else cfg.budget_action}")
            s.over = over
            if not over:
                continue
            for t in list(a.members.values()):
                if t.action == "none":
                    t.action = "observe"
                act.nice(t, "memory")
                if act.level >= act.THROTTLE:
                    act.kill(t, now, "memory", f"holds {size(t.use.mem)}{_with(a)}, over its memory budget")
        if self.cgroup is not None:
            self.cgroup.trim()

    @staticmethod
    def _held(a: Any) -> int:
        """What a lineage holds: its members' private memory (each one's figure, the
        exact one read where that one alone is over the budget: Handle.private_memory)."""
        return sum(t.use.mem for t in a.members.values() if t.use.mem is not None and t.refused is None)

    def _exact(self, a: Any) -> int:
        """A lineage's total with each member's exact private memory (smaps_rollup), read
        only when the cheap figures are over a budget."""
        for t in a.members.values():
            if t.use.mem is not None and t.refused is None:
                try:
                    mem = t.handle.private_memory(exact_above=0)
                except (Gone, OSError):
                    continue
                t.use.cow = max(0, t.use.cow + t.use.mem - mem)   # what it shares is what it may come to hold
                t.use.mem = mem
        return self._held(a)

    # --- the cap (throttle) ------------------------------------------------------------

    def _memory_cgroup(self) -> MemoryCgroup | None:
        """The memory cgroup, made on first need; None where none can be used (said once)."""
        act = self.act
        if self.mechanism is None:
            try:
                self.cgroup = MemoryCgroup.probe(skip_v2=self.sample.v2_taken(), total=self.cfg.memory_budget_total)
                self.mechanism = self.cgroup.kind
                act.log.info(f"capping strays' memory with the {self.cgroup.kind.replace('_', ' ')} memory "
                             f"controller in {self.cgroup.base}")
            except (Unavailable, OSError) as e:
                self.mechanism = "terminate"
                why = e if isinstance(e, Unavailable) else f"memory cgroup setup failed ({e.strerror})"
                act.log.info(f"{why}: strays over their memory budget are terminated instead")
            act.mechanism("memory", self.mechanism)
        return self.cgroup

    def _confine(self, a: Any, held: int) -> None:
        """throttle: moves a lineage, when first seen, into a memory cgroup whose limit is
        its budget (a member found later is put there by escapes.hold). What it held
        before the move stays charged where it was (charges never move with a process):
        the cap holds what it allocates from then on, and the sample judges what it
        holds in all (judge). A fixed limit of the whole budget, never budget minus what
        it held: a stray that frees what it held and allocates again is never killed by
        its cap below its budget."""
        cfg, act, s = self.cfg, self.act, a.kinds["memory"]
        s.tried = True
        t = a.first()
        if self.sample.watch:
            if self.mechanism is None:
                self.mechanism = "terminate"
                act.mechanism("memory", "terminate")
                act.log.info("reaper watch holds memory budgets by terminate: a stray moved into the "
                             "sidecar's own cgroup would be charged to the sidecar")
            return
        if cfg.memory_budget is not None and held >= cfg.memory_budget:
            act.once("mem-over-found", f"stray {t.key[0]} ({t.comm}) already holds {size(held)}, over "
                                       f"--memory-budget {size(cfg.memory_budget)}, when found: it is "
                                       "terminated when its grace is over, not capped", "warn")
            return
        mc = self._memory_cgroup()
        if mc is None:
            return
        if not mc.may_take():
            s.tried = False              # its turn at a later sample: a burst makes MAKE_EACH leaves a sample
            act.once("memory-burst", f"many new strays at once: moved into memory cgroups {MAKE_EACH} new "
                                     "ones a sample at most, the biggest first", "debug")
            return
        leaf = None
        try:
            leaf = mc.take_leaf(cfg.memory_budget)
            oom0 = mc.oom_kills(leaf)
            moved = []
            for m in list(a.members.values()):
                if m.refused is not None:
                    continue
                try:
                    m.handle.checked(lambda: mc.move(m.key[0], leaf))
                except Gone:
                    continue
                moved.append(m)
        except OSError as e:
            if leaf is not None:
                mc.give_back(leaf)
            act.once("memory-move", f"cannot move stray {t.key[0]} into {mc.base} ({e.strerror}): "
                                    "strays over their memory budget are terminated instead", "warn")
            return
        if not moved:
            mc.give_back(leaf)
            return
        s.leaf, s.oom0 = leaf, oom0
        a.settled.pop("memory", None)
        for m in moved:
            m.placed["memory"] = leaf
            self.placed(m, moved=True)

    def placed(self, t: Any, moved: bool) -> None:
        if t.action in ("none", "observe"):
            t.action = "throttle"
        if moved:
            self.act.count("throttle_memory_cgroup", "memory")

    # --- escapes (escapes.py) -----------------------------------------------

    def leaf_of(self, a: Any) -> str | None:
        s = a.kinds["memory"]
        return None if s.gave_up or self.cgroup is None else s.leaf

    def give_up(self, a: Any, why: str) -> None:
        a.kinds["memory"].gave_up = True
        for t in a.members.values():
            t.placed.pop("memory", None)
        t = a.first()
        if t is not None:
            self.act.log.warn(f"{who(t)} {why}: no longer capped, terminated when over its memory budget")

    # --- a stray let go -----------------------------------------------------

    def drop(self, t: Any, alive: bool) -> None:
        """A member's memory cgroup when it stops being a stray: moved back if alive; if
        one of its lineage died of the OOM killer inside, that is said and counted."""
        mc, s = self.cgroup, t.kinds["memory"]
        placed = t.placed.pop("memory", None)
        if s.leaf is None or mc is None:
            return
        if alive and placed is not None:
            try:
                t.handle.checked(lambda: mc.move(t.key[0], mc.parent))
            except (Gone, OSError):
                pass
        # Alive or not: a stray the OOM killer chose may still be exiting (its memory
        # gone, its state not yet Z) when the sample that drops it runs.
        self._said_oom(t, s)

    def _said_oom(self, t: Any, s: Any) -> None:
        if self.cgroup is None:
            return
        n = self.cgroup.oom_kills(s.leaf)
        if n > s.oom0:
            s.oom0 = n
            self.act.count("oom_kill", "memory")
            self.act.log.warn(f"stray {t.key[0]} ({t.comm}) was killed by the kernel's OOM killer inside its "
                              f"memory cgroup (its budget: {size(self.cfg.memory_budget)})")

    def done_with(self, a: Any) -> bool:
        """A member over its budget is judged once its grace ends; one sharing much
        copy-on-write is read every sample; throttle moves every lineage into a memory
        cgroup when first judged (_confine)."""
        budget = self.cfg.memory_budget
        if budget is not None and any((t.use.mem or 0) > budget for t in a.members.values()):
            return False
        if self._sharing(a):
            return False                 # read every sample while it shares that much (busy)
        return self.act.level != self.act.THROTTLE or a.kinds["memory"].tried

    def judges_all(self) -> bool:
        return self.cfg.memory_budget_total is not None

    def retire(self, a: Any) -> None:
        """The lineage's last member is gone: its leaf goes back to the pool
        (memory_cgroup.py), not away: a removed leaf that still holds the strays' page
        cache would linger as a dying cgroup."""
        s = a.kinds["memory"]
        if s.leaf is not None and self.cgroup is not None:
            self.cgroup.give_back(s.leaf)
        s.leaf = None

    def closing(self) -> None:
        for t in self.sample.members():
            # A stray the kernel's OOM killer ended since the last sample is still said.
            if t.kinds["memory"].leaf is not None and not self.sample.alive(t.key):
                self.drop(t, alive=False)


def _with(a: Any) -> str:
    """How many processes a lineage's figure covers, where more than one."""
    n = len(a.members)
    return f" with {n - 1} more of its lineage" if n > 1 else ""

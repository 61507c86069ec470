"""CPU budgets: --cpu-budget (each stray), --cpu-budget-total (all strays together).

A stray past its --budget-grace is over --cpu-budget when it uses more than that,
averaged over --budget-window (over_each). Strays together are over
--cpu-budget-total when they use more (over_total); each one is then held to a
share of the total in proportion to its demand (shares). "Over budget" is judged on
demand, not on use: a duty-cycled stray that would use more than RELEASE of its
budget if let run stays over budget (and stays throttled), as does one pressing
against its cgroup's quota. A lineage (lineage.py: a stray and its descendants) is
judged as one stray, on its members' CPU together, and every member gets the response,
a new one at its first sample: one cgroup, or one duty cycle (its members stopped and
resumed together, DutyCycler.Group).

The response, each step including the ones before (the level of the actions door):

    nice       nice 19 and SCHED_IDLE; a stray found as an orphan or below an idle
               Ray worker that leads its own session also gets its autogroup reniced
    throttle   a cgroup of reaper's own (throttle.py: v2, v1), else the door's
               SIGSTOP/SIGCONT duty cycle, run for duty_fraction() of each period
    terminate  after --budget-kill-after seconds over budget
"""
from __future__ import annotations

TYPE_CHECKING = False    # typing's, without importing typing (mypy takes it as true)
if TYPE_CHECKING:
    from typing import Any

import errno
import time

from reaper.budgets.kinds import Kind as _Kind
from reaper.budgets.lineage import who
from reaper.procctl import Gone
from reaper.budgets.throttle import CgroupThrottle, DutyCycler, Unavailable

RELEASE = 0.9          # a duty-cycled stray is let go below this share of its budget
SLOW_SPEED = 0.25      # duty-cycling: the least speed (cores while let run) its control assumes
CAPPED_MARGIN = 1.05   # a stray in a cgroup capped at its budget: over beyond this much of it
LEAST_DEMAND = 1e-3    # the demand a stray that shows none is given in the total's shares
LEAST_FRACTION = 0.01  # duty-cycling: the least share of each period a stray runs
QUIET_WINDOWS = 6      # an over-budget episode ends after this many --budget-window under budget
RAN_STOPPED_MAX = 0.2  # duty-cycling: a member that ran this share of the time it was stopped is resumed by another


# --- the decisions, on one sample's numbers (cores) ----------------------------------

def over_each(rate: float | None, demand: float | None, cycled: bool, budget: float,
              pressing: bool | None = None) -> bool:
    """A stray over --cpu-budget: it used more than budget over the window (rate), or,
    duty-cycled, would use more than RELEASE of it if let run (demand). pressing: in a
    cgroup capped at its budget, whether it hit the quota since the last sample (None:
    in no such cgroup); it stays over while it presses."""
    if pressing is not None:
        return pressing or (rate or 0.0) > budget * CAPPED_MARGIN
    if cycled:
        return (demand or 0.0) > budget * RELEASE
    return (rate or 0.0) > budget


def over_total(use: float, demand: float, total: float, cycled: bool, pressing: bool = False) -> bool:
    """Strays past their grace over --cpu-budget-total: together they use more (use),
    or, some of them duty-cycled (cycled), would use more than RELEASE of it if let run
    (demand); or the cgroup that holds them all hit the total's quota (pressing)."""
    return pressing or use > total or (cycled and demand > total * RELEASE)


def shares(demands: dict[Any, float | None], total: float) -> dict[Any, float]:
    """{key: cores} each stray is held to while strays are over the total: the total in
    proportion to each one's demand (key: cores it would use if let run, or None)."""
    least = {key: max(d or 0.0, LEAST_DEMAND) for key, d in demands.items()}
    dsum = sum(least.values())
    return {key: total * d / dsum for key, d in least.items()}


def duty_fraction(target: float, demand: float | None, fraction: float | None = None,
                  used: float | None = None) -> float:
    """The share of each duty period a stray may run to use target cores.

    A stray's first (fraction None): target / demand (demand: cores it uses while
    running), demand taken as at least one core: a stray slowed by contention (it is
    SCHED_IDLE) shows a low demand, and when the contention ends it would run at full
    speed for most of each period. From there the fraction follows the CPU it actually
    used over the last sample (used): half the error each time, in run time at the
    speed it ran at while let run over the window (its demand, at least SLOW_SPEED).
    Contention that starts mid-throttle (a busy neighbour of the idle class) is thus
    made up in a few samples rather than a window's worth; the window's speed, not the
    last sample's, keeps bursty contention from swinging it over the budget.

    Never more run time than a stray at SLOW_SPEED needs: one starved by busier work
    stays under its budget anyway, and when that work ends it runs at most
    target / SLOW_SPEED cores for one sample before the control catches it."""
    if fraction is None:
        fraction = target / max(demand or 1.0, 1.0)
    elif used is not None:
        fraction += 0.5 * (target - used) / max(demand or 1.0, SLOW_SPEED)
    return min(1.0, target / SLOW_SPEED, max(LEAST_FRACTION, fraction))


# --- the kind ------------------------------------------------------------------------

LEAK_FACTOR = 1.5      # a lineage alone in its cgroup that used more than this times its quota...
LEAK_SLACK = 0.05      # ...plus this many cores over a whole sample is not held by it (escapes.py)


_NONE: frozenset[tuple[int, int]] = frozenset()


def _done(s: Any, key: Any) -> None:
    """key's autogroup needs nothing more (a set per lineage only once one does)."""
    if s.autogroup_done is _NONE:
        s.autogroup_done = set()
    s.autogroup_done.add(key)


class State:
    """What the CPU budget keeps of one lineage."""

    __slots__ = ("over", "over_since", "autogroup_done", "leaf", "cycling", "fraction",
                 "no_cgroup", "warned", "under_since", "escaped_at", "escape_hold")

    def __init__(self, stray: Any) -> None:
        self.over = False
        self.over_since: float | None = None
        # Members whose autogroup was reniced, or needs none (Handle.autogroup_nice).
        self.autogroup_done: set[tuple[int, int]] | frozenset[tuple[int, int]] = _NONE   # its own set once one is added
        self.leaf: str | None = None     # cpu cgroup directory its members are held in
        self.cycling = False             # its members are duty-cycled (SIGSTOP/SIGCONT)
        self.fraction = 1.0              # share of each duty period they may run
        self.no_cgroup = False           # they kept leaving their cgroup: duty-cycled instead
        self.warned = False              # its over-budget episode was said (one warning per episode)
        self.escaped_at: float | None = None     # when a member was last found out of its cgroup
        self.escape_hold = False         # duty-cycled on top of its cgroup while it escapes
        self.under_since: float | None = None    # when it went back under budget (the episode's end: QUIET_WINDOWS)


class Kind(_Kind):
    reason = "cpu"
    State = State
    cgroup: CgroupThrottle | None = None

    def busy(self, acct: Any) -> bool:
        s = acct.kinds.get("cpu")
        return s is not None and bool(s.over or s.cycling or s.leaf)

    def cycling(self, acct: Any) -> bool:
        s = acct.kinds.get("cpu")
        return s is not None and bool(s.cycling)

    def judges_all(self) -> bool:
        return self.cfg.cpu_budget_total is not None

    def judge(self, now: float) -> None:
        cfg, act = self.cfg, self.act
        eligible = self.sample.eligible_lineages(now)
        over_one = set()
        if cfg.cpu_budget is not None:
            for a in eligible:
                own = self._own_leaf(a)
                pressing = None if own is None or self.cgroup is None else self.cgroup.pressing(own)
                if over_each(a.use.rate, a.use.demand, a.kinds["cpu"].cycling, cfg.cpu_budget, pressing):
                    over_one.add(id(a))
        over_all = False
        if cfg.cpu_budget_total is not None and eligible:
            pressing = False
            if self.cgroup is not None and any(a.kinds["cpu"].leaf for a in eligible):
                pressing = self.cgroup.pressing(self.cgroup.base)
            over_all = over_total(sum(a.use.rate or 0.0 for a in eligible),
                                  sum(a.use.demand or 0.0 for a in eligible), cfg.cpu_budget_total,
                                  any(a.kinds["cpu"].cycling for a in eligible), pressing)
        share = shares({id(a): a.use.demand for a in eligible}, cfg.cpu_budget_total) if over_all else {}

        for a in self.sample.lineages():
            s = a.kinds["cpu"]
            over = id(a) in over_one or id(a) in share
            if over and not s.over:
                self._violation(a, over_all and id(a) not in over_one, now)
            if not over:
                s.over_since = None
                if s.over:
                    s.under_since = now
            s.over = over
            if not over:
                if s.escape_hold and self._escaping(s, now):
                    pass                # under budget, but it left its cgroup lately: still duty-cycled
                elif s.escape_hold:
                    self._unhold(a, now)
                elif s.cycling:
                    self._release(a, now)
                continue
            self._respond(a, cfg.cpu_budget if id(a) in over_one else None, share.get(id(a)), now)

    def joined(self, t: Any, now: float) -> None:
        """A hop of a duty-cycled lineage: niced and duty-cycled like its lineage, now."""
        s = t.acct.kinds["cpu"]
        if not s.over:
            return
        self.act.nice(t, "cpu")
        if s.cycling and self.act.level >= self.act.THROTTLE and t.refused is None:
            t.cycled = True
            t.action = "throttle"
            self.act.count("throttle_sigstop", "cpu")
            self.act.cycle(t, s.fraction, now, _group(t.acct))

    def _own_leaf(self, a: Any) -> str | None:
        """a's cgroup if it is its own (capped at its own budget), not the shared one."""
        s = a.kinds["cpu"]
        if self.cgroup is None or s.leaf is None or s.no_cgroup or s.leaf.endswith("/shared"):
            return None
        leaf: str = s.leaf
        return leaf

    def _violation(self, a: Any, total: bool, now: float) -> None:
        """a went over budget: counted each time (reaper_budget_violations_total), said
        once per episode. An episode ends when a has stayed under budget for QUIET_WINDOWS
        windows (a minute by default): a lineage crossing its budget up and down meanwhile
        is warned once. The warning names the member that burns most of the CPU."""
        cfg, s = self.cfg, a.kinds["cpu"]
        t = a.first()
        s.over_since = time.monotonic()
        self.act.violation("cpu", t)
        if s.warned and (s.under_since is None or now - s.under_since < QUIET_WINDOWS * cfg.budget_window):
            return
        s.warned, s.under_since = True, None
        t = a.busiest()
        if total:
            what = f"strays together over --cpu-budget-total {cfg.cpu_budget_total:g}"
        else:
            what = f"over --cpu-budget {cfg.cpu_budget:g}"
        self.act.log.warn(f"{who(t)} uses {a.use.rate or 0:.2f} cores, "
                          f"{what} (window {cfg.budget_window:g}s): {cfg.budget_action}")

    def _respond(self, a: Any, budget: float | None, share: float | None, now: float) -> None:
        """The configured response to a lineage over budget (its own budget if over that,
        its share of the total if over that), step by step, on every member (a new one
        at its first sample); a member reaper may not act on is left alone from the
        first refusal."""
        act = self.act
        for t in list(a.members.values()):
            if t.action == "none":
                t.action = "observe"
            act.nice(t, "cpu")
            if act.level >= act.NICE and t.refused is None and t.key not in a.kinds["cpu"].autogroup_done:
                self._renice_autogroup(a, t)
        if act.level >= act.THROTTLE:
            self._throttle(a, budget, share, now)
        if act.level >= act.TERMINATE:
            self._terminate(a, now)

    def _renice_autogroup(self, a: Any, t: Any) -> None:
        # Everything in an orphan's or an idle task's session is a stray: its autogroup
        # may be reniced; not so for --stray-match.
        s = a.kinds["cpu"]
        if t.reason == "match":
            _done(s, t.key)
            return
        try:
            done = t.handle.autogroup_nice(19)
        except Gone:
            _done(s, t.key)
            return
        except OSError as e:            # NotPermitted too: the file may be root's when the stray is not
            if e.errno == errno.EAGAIN:
                return      # unprivileged: one autogroup change per 100 ms, machine-wide; next sample
            _done(s, t.key)
            self.act.once("fail-autogroup_nice", f"cannot renice the autogroup of stray {t.key[0]} ({t.comm}): "
                                                 f"{e.strerror}; going on without it", "warn")
            return
        _done(s, t.key)
        if done:
            self.act.count("autogroup_nice", "cpu")

    # --- throttling --------------------------------------------------------

    def _choose_mechanism(self) -> None:
        if self.mechanism is not None:
            return
        act = self.act
        try:
            self.cgroup = CgroupThrottle.probe(skip_v2=self.sample.v2_taken())
            self.mechanism = self.cgroup.kind
            if self.cfg.cpu_budget_total is not None:
                self.cgroup.set_total(self.cfg.cpu_budget_total)
            act.log.info(f"throttling strays with the {self.cgroup.kind.replace('_', ' ')} cpu controller "
                         f"in {self.cgroup.base}")
        except Unavailable as e:
            self.mechanism = "sigstop"
            act.log.info(f"{e}: throttling by SIGSTOP/SIGCONT")
        except OSError as e:
            self.mechanism = "sigstop"
            act.log.info(f"cgroup setup failed ({e.strerror}): throttling by SIGSTOP/SIGCONT")
        act.mechanism("cpu", self.mechanism)

    def _throttle(self, a: Any, budget: float | None, share: float | None, now: float) -> None:
        act, s = self.act, a.kinds["cpu"]
        self._choose_mechanism()
        members = [t for t in a.members.values() if t.refused is None and t.term_at is None]
        if self.cgroup is not None and (not s.cycling or s.escape_hold) and not s.no_cgroup:
            d = self.cgroup.leaf_dir(a.root, budget)
            # (new members are put in it by escapes.hold)
            if s.leaf == d or self._move_into(a, members, budget):
                if not self._escaping(s, now):
                    if s.escape_hold:
                        self._unhold(a, now)
                    return
                s.escape_hold = True    # it left its cgroup lately: duty-cycled too, whatever its cgroup
        if s.cycling and not s.escape_hold and self._resumed_behind(a, members, now):
            return
        target = min(x for x in (budget, share) if x is not None)
        if not s.cycling:
            s.fraction = duty_fraction(target, a.use.demand)
            s.cycling = True
        else:
            s.fraction = duty_fraction(target, a.use.demand, s.fraction, a.use.last_rate())
        for t in members:
            if not t.cycled:
                t.cycled = True
                t.action = "throttle"
                act.count("throttle_sigstop", "cpu")
            act.cycle(t, s.fraction, now, _group(a))
        if act.log.enabled(3):
            act.log.debug(f"lineage of {a.root[0]}: uses {a.use.rate or 0:.3f}, demand {a.use.demand or 0:.3f}, "
                          f"target {target:.3f}: runs {s.fraction:.3f} of each period")

    def _resumed_behind(self, a: Any, members: list[Any], now: float) -> bool:
        """A member of duty-cycled a ran while it was stopped (another process sends it
        SIGCONT): the duty cycle cannot hold a, and no cgroup does (none can be made, or
        it kept leaving it). Its members are terminated (SIGTERM, SIGKILL after --grace),
        under the throttle action too: said once, counted as sigstop_defeated. True if so."""
        ran = max((r for r in (self.act.ran_stopped(t) for t in members) if r is not None), default=None)
        if ran is None or ran <= RAN_STOPPED_MAX:
            return False
        act = self.act
        act.once("sigstop-defeated", f"{who(a.busiest())} ran {ran:.0%} of the time it was stopped "
                                     f"(another process resumes it with SIGCONT): the duty cycle cannot hold it "
                                     f"and no cgroup does; terminating it (and any other such stray)", "warn")
        act.count("sigstop_defeated", "cpu")
        a.kinds["cpu"].cycling = False
        for t in members:
            act.kill(t, now, "cpu", "resumed while stopped")
        return True

    def _move_into(self, a: Any, members: list[Any], budget: float | None) -> bool:
        """Moves a's members into its cgroup (its own, or the shared one); False if it
        cannot be made or a member cannot be moved: then the lineage is duty-cycled."""
        s, cg = a.kinds["cpu"], self.cgroup
        assert cg is not None                # the mechanism is a cgroup
        try:
            d = cg.leaf(a.root, budget)
        except OSError as e:
            return self._no_cgroup(a, e)
        old, s.leaf = s.leaf, d
        a.settled.pop("cpu", None)
        for t in members:
            try:
                t.handle.checked(lambda: cg.move(t.key[0], d))
            except Gone:
                continue
            except OSError as e:        # NotPermitted too: another user's process
                return self._no_cgroup(a, e)
            t.placed["cpu"] = d
            self.placed(t, moved=True)
        if old is not None and old != d:
            cg.drop_leaf(old)
        cg.pressing(d)
        return True

    def _no_cgroup(self, a: Any, e: OSError) -> bool:
        a.kinds["cpu"].no_cgroup = True
        self.act.once("cgroup-move", f"cannot move stray {a.root[0]} into {self.cgroup and self.cgroup.base} "
                                     f"({e.strerror}): duty-cycling it instead", "warn")
        return False

    def placed(self, t: Any, moved: bool) -> None:
        if t.action in ("none", "observe", "nice"):
            t.action = "throttle"
        if moved:
            self.act.count("throttle_cgroup", "cpu")

    def _unhold(self, a: Any, now: float) -> None:
        """a's members leave the duty cycle (they were also in their cgroup, or are under
        budget): let run."""
        s, act = a.kinds["cpu"], self.act
        s.cycling = s.escape_hold = False
        for t in a.members.values():
            if t.cycled:
                act.release(t, now)
                t.cycled = False

    def _escaping(self, s: Any, now: float) -> bool:
        """A member left the lineage's cgroup within the last window (s: its State)."""
        return s.escaped_at is not None and now - s.escaped_at < self.cfg.budget_window

    def escaped(self, a: Any, now: float) -> None:
        """A member left a's cgroup: duty-cycled as well for a window from now (_throttle),
        so that leaving again gains it nothing."""
        a.kinds["cpu"].escaped_at = now

    def _release(self, a: Any, now: float) -> None:
        """a is back under budget: its members are let run."""
        self._unhold(a, now)
        t = a.first()
        if t is not None:
            self.act.log.info(f"stray {t.key[0]} ({t.comm}) back under budget: resumed")

    def _terminate(self, a: Any, now: float) -> None:
        over_since = a.kinds["cpu"].over_since
        if over_since is None or now - over_since < self.cfg.budget_kill_after:
            return
        for t in list(a.members.values()):
            self.act.kill(t, now, "cpu", f"over budget for {self.cfg.budget_kill_after:g}s")

    # --- escapes (escapes.py) -----------------------------------------------

    def leaf_of(self, a: Any) -> str | None:
        s = a.kinds["cpu"]
        return None if s.no_cgroup or self.cgroup is None else s.leaf

    def leaking(self, a: Any) -> str | None:
        """Measured, not estimated (lineage.py): the cores of the members alive through
        the whole last interval."""
        own = self._own_leaf(a)
        rates = [t.own_rate() for t in a.members.values()]
        used = sum(r for r in rates if r is not None)
        if own is None or self.cfg.cpu_budget is None or self.cgroup is None:
            return None
        cap = min(self.cfg.cpu_budget, self.cgroup.total or self.cfg.cpu_budget)
        if used <= cap * LEAK_FACTOR + LEAK_SLACK:
            return None
        return f"used {used:.2f} cores in its cgroup {own}, capped at {cap:g}"

    def reassert(self, a: Any) -> None:
        own = self._own_leaf(a)
        if own is not None and self.cgroup is not None:
            try:
                self.cgroup.leaf(a.root, self.cfg.cpu_budget)
            except OSError:
                pass

    def give_up(self, a: Any, why: str) -> None:
        s = a.kinds["cpu"]
        s.no_cgroup = True
        for t in a.members.values():
            t.placed.pop("cpu", None)
            if t.action == "throttle" and not t.cycled:
                t.action = "nice" if t.niced else "observe"     # not throttled until the duty cycle holds it
        t = a.first()
        if t is not None:
            self.act.log.warn(f"{who(t)} {why}: duty-cycled (SIGSTOP/SIGCONT) instead")

    # --- a stray let go -----------------------------------------------------

    def drop(self, t: Any, alive: bool) -> None:
        """t is no longer a stray: out of its lineage's cgroup (the cgroup goes with the
        lineage's last member: retire)."""
        if t.key in t.kinds["cpu"].autogroup_done:
            t.kinds["cpu"].autogroup_done.discard(t.key)
        leaf = t.placed.pop("cpu", None)
        if leaf is None or self.cgroup is None or not alive:
            return
        try:
            t.handle.checked(lambda: self.cgroup.move(t.key[0], self.cgroup.parent))
        except (Gone, OSError):
            pass

    def retire(self, a: Any) -> None:
        s = a.kinds["cpu"]
        if s.leaf is not None and self.cgroup is not None:
            self.cgroup.drop_leaf(s.leaf)
        s.leaf = None


def _group(a: Any) -> DutyCycler.Group:
    """a's members are stopped and resumed together: their stops are the lineage's."""
    if a.duty is None:
        a.duty = DutyCycler.Group()
    group: DutyCycler.Group = a.duty
    return group

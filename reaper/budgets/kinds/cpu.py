"""CPU budgets: --cpu-budget (each stray), --cpu-budget-total (all strays together).

A stray past its --budget-grace is over --cpu-budget when it uses more than that,
averaged over --budget-window (over_each). Strays together are over
--cpu-budget-total when they use more (over_total); each one is then held to a
share of the total in proportion to its demand (shares). "Over budget" is judged on
demand, not on use: a duty-cycled stray that would use more than RELEASE of its
budget if let run stays over budget (and stays throttled), as does one pressing
against its cgroup's quota.

The response, each step including the ones before (the enforcer's level):

    nice       nice 19 and SCHED_IDLE; a stray found as an orphan or below an idle
               Ray worker that leads its own session also gets its autogroup reniced
    throttle   a cgroup of reaper's own (throttle.py: v2, v1), else the enforcer's
               SIGSTOP/SIGCONT duty cycle, run for duty_fraction() of each period
    terminate  after --budget-kill-after seconds over budget
"""
from __future__ import annotations

import errno
import os
import time
from typing import Optional

from reaper.budgets.kinds import Kind as _Kind
from reaper.procctl import Gone
from reaper.budgets.throttle import CgroupThrottle, Unavailable

RELEASE = 0.9          # a duty-cycled stray is let go below this share of its budget
SLOW_SPEED = 0.25      # duty-cycling: the least speed (cores while let run) its control assumes
CAPPED_MARGIN = 1.05   # a stray in a cgroup capped at its budget: over beyond this much of it
LEAST_DEMAND = 1e-3    # the demand a stray that shows none is given in the total's shares
LEAST_FRACTION = 0.01  # duty-cycling: the least share of each period a stray runs


# --- the decisions, on one sample's numbers (cores) ----------------------------------

def over_each(rate: Optional[float], demand: Optional[float], cycled: bool, budget: float,
              pressing: Optional[bool] = None) -> bool:
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


def shares(demands: dict, total: float) -> dict:
    """{key: cores} each stray is held to while strays are over the total: the total in
    proportion to each one's demand (key: cores it would use if let run, or None)."""
    least = {key: max(d or 0.0, LEAST_DEMAND) for key, d in demands.items()}
    dsum = sum(least.values())
    return {key: total * d / dsum for key, d in least.items()}


def duty_fraction(target: float, demand: Optional[float], fraction: Optional[float] = None,
                  used: Optional[float] = None) -> float:
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

class State:
    """What the CPU budget keeps of one stray."""

    __slots__ = ("over", "over_since", "autogroup_pending", "leaf", "fraction")

    def __init__(self, stray) -> None:
        self.over = False
        self.over_since: Optional[float] = None
        # Everything in an orphan's or an idle task's session is a stray: its autogroup
        # may be reniced (procctl.Handle.autogroup_nice); not so for --stray-match.
        self.autogroup_pending = stray.reason != "match"
        self.leaf: Optional[str] = None  # cpu cgroup directory it was moved into
        self.fraction = 1.0              # share of each duty period it may run


class Kind(_Kind):
    reason = "cpu"
    State = State
    cgroup: Optional[CgroupThrottle] = None

    def judge(self, now: float) -> None:
        cfg, enf = self.cfg, self.enf
        eligible = enf.eligible(now)
        over_one = set()
        if cfg.cpu_budget is not None:
            for t in eligible:
                leaf = t.kinds["cpu"].leaf
                own = leaf if leaf and not leaf.endswith("/shared") and self.cgroup is not None else None
                pressing = None if own is None else self.cgroup.pressing(own)
                if over_each(t.use.rate, t.use.demand, t.cycled, cfg.cpu_budget, pressing):
                    over_one.add(t.key)
        over_all = False
        if cfg.cpu_budget_total is not None and eligible:
            pressing = False
            if self.cgroup is not None and any(t.kinds["cpu"].leaf for t in eligible):
                pressing = self.cgroup.pressing(self.cgroup.base)
            over_all = over_total(sum(t.use.rate or 0.0 for t in eligible),
                                  sum(t.use.demand or 0.0 for t in eligible), cfg.cpu_budget_total,
                                  any(t.cycled for t in eligible), pressing)
        share = shares({t.key: t.use.demand for t in eligible}, cfg.cpu_budget_total) if over_all else {}

        for t in enf.tracked.values():
            s = t.kinds["cpu"]
            over = t.key in over_one or t.key in share
            if over and not s.over:
                self._violation(t, over_all and t.key not in over_one)
            if not over:
                s.over_since = None
            s.over = over
            if not over:
                if t.cycled:
                    enf.duty.release(t.key, now)
                    t.cycled = False
                    enf.log.info(f"stray {t.key[0]} ({t.comm}) back under budget: resumed")
                continue
            self._respond(t, cfg.cpu_budget if t.key in over_one else None, share.get(t.key), now)

    def _violation(self, t, total: bool) -> None:
        cfg = self.cfg
        t.kinds["cpu"].over_since = time.monotonic()
        self.enf.violation("cpu", t)
        if total:
            what = f"strays together over --cpu-budget-total {cfg.cpu_budget_total:g}"
        else:
            what = f"over --cpu-budget {cfg.cpu_budget:g}"
        self.enf.log.warn(f"stray {t.key[0]} ({t.comm}, {t.reason}) uses {t.use.rate or 0:.2f} cores, "
                          f"{what} (window {cfg.budget_window:g}s): {cfg.budget_action}")

    def _respond(self, t, budget: Optional[float], share: Optional[float], now: float) -> None:
        """The configured response to a stray over budget (its own budget if over that,
        its share of the total if over that), step by step; a stray reaper may not act
        on is left alone from the first refusal."""
        enf = self.enf
        enf.nice(t, "cpu")
        if enf.level >= 1 and t.kinds["cpu"].autogroup_pending and t.refused is None:
            self._renice_autogroup(t)
        if enf.level >= 2 and t.refused is None:
            self._throttle(t, budget, share, now)
        if enf.level >= 3 and t.refused is None:
            self._terminate(t, now)

    def _renice_autogroup(self, t) -> None:
        s = t.kinds["cpu"]
        try:
            done = t.handle.autogroup_nice(19)
        except Gone:
            s.autogroup_pending = False
            return
        except OSError as e:            # NotPermitted too: the file may be root's when the stray is not
            if e.errno == errno.EAGAIN:
                return      # unprivileged: one autogroup change per 100 ms, machine-wide; next sample
            s.autogroup_pending = False
            self.enf.once("fail-autogroup_nice", f"cannot renice the autogroup of stray {t.key[0]} ({t.comm}): "
                                                 f"{e.strerror}; going on without it", "warn")
            return
        s.autogroup_pending = False
        if done:
            self.enf.count("autogroup_nice", "cpu")

    # --- throttling --------------------------------------------------------

    def _choose_mechanism(self) -> None:
        if self.mechanism is not None:
            return
        enf = self.enf
        try:
            self.cgroup = CgroupThrottle.probe(skip_v2=enf.v2_taken())
            self.mechanism = self.cgroup.kind
            if self.cfg.cpu_budget_total is not None:
                self.cgroup.set_total(self.cfg.cpu_budget_total)
            enf.log.info(f"throttling strays with the {self.cgroup.kind.replace('_', ' ')} cpu controller "
                         f"in {self.cgroup.base}")
        except Unavailable as e:
            self.mechanism = "sigstop"
            enf.log.info(f"{e}: throttling by SIGSTOP/SIGCONT")
        except OSError as e:
            self.mechanism = "sigstop"
            enf.log.info(f"cgroup setup failed ({e.strerror}): throttling by SIGSTOP/SIGCONT")
        enf.stats.mechanism = self.mechanism

    def _throttle(self, t, budget: Optional[float], share: Optional[float], now: float) -> None:
        enf, s = self.enf, t.kinds["cpu"]
        self._choose_mechanism()
        if self.cgroup is not None and not t.cycled:
            want = "shared" if budget is None else f"s{t.key[0]}.{t.key[1]}"
            if s.leaf is not None and os.path.basename(s.leaf) == want:
                return
            try:
                d = self.cgroup.leaf(t.key, budget)
                t.handle.checked(lambda: self.cgroup.move(t.key[0], d))
                s.leaf = d
                t.action = "throttle"
                enf.count("throttle_cgroup", "cpu")
                self.cgroup.pressing(d)
                return
            except Gone:
                return
            except OSError as e:
                enf.once("cgroup-move", f"cannot move stray {t.key[0]} into {self.cgroup.base} "
                                        f"({e.strerror}): duty-cycling it instead", "warn")
        target = min(x for x in (budget, share) if x is not None)
        if not t.cycled:
            s.fraction = duty_fraction(target, t.use.demand)
            t.cycled = True
            t.action = "throttle"
            enf.count("throttle_sigstop", "cpu")
        else:
            s.fraction = duty_fraction(target, t.use.demand, s.fraction, t.use.last_rate())
        if enf.log.enabled(3):
            enf.log.debug(f"stray {t.key[0]}: uses {t.use.rate or 0:.3f}, demand {t.use.demand or 0:.3f}, "
                          f"target {target:.3f}: runs {s.fraction:.3f} of each period")
        enf.duty.set(t.key, t.handle, s.fraction, now)

    def _terminate(self, t, now: float) -> None:
        over_since = t.kinds["cpu"].over_since
        if over_since is None or now - over_since < self.cfg.budget_kill_after:
            return
        self.enf.kill(t, now, "cpu", f"over budget for {self.cfg.budget_kill_after:g}s")

    # --- a stray let go -----------------------------------------------------

    def drop(self, t, alive: bool) -> None:
        leaf = t.kinds["cpu"].leaf
        if leaf is None or self.cgroup is None:
            return
        if alive:
            try:
                t.handle.checked(lambda: self.cgroup.move(t.key[0], self.cgroup.parent))
            except (Gone, OSError):
                pass
        self.cgroup.drop_leaf(leaf)

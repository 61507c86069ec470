"""Budgets for strays: sample, compare with the budgets, respond.

Every --budget-interval the enforcer refreshes the process table, finds the
strays (strays.py), reads each one's CPU time and resident memory (psutil) and
averages the CPU over --budget-window. A stray past its --budget-grace that uses more than
--cpu-budget, or strays that together use more than --cpu-budget-total, get the
response --budget-action names, each step including the ones before it:

    observe    one log line per violation, metrics
    nice       nice 19 and SCHED_IDLE (and --stray-cpus affinity)
    throttle   a hard cap: a cgroup of reaper's own, else SIGSTOP/SIGCONT duty-cycling
    terminate  after --budget-kill-after seconds over budget: SIGTERM, SIGKILL after --grace

Memory (--memory-budget, --memory-budget-total) is judged by what a stray alone
holds (Handle.private_memory), never by pages it shares. With throttle a stray is
moved, when first seen, into a memory cgroup of reaper's own (memory_cgroup.py)
whose limit is its budget: the kernel caps what it allocates from then on, and
a stray whose private memory is over its budget in all (what it held before the
move included) is terminated, as is one no cgroup holds (found over it, no memory
cgroup, reaper watch); terminate sends SIGTERM at the first sample past the grace
that sees it over. Lifetime (--stray-max-age): SIGTERM that long after a stray was first
seen, whatever the action but observe. Actions are counted by reason (cpu,
memory, age). At start, the empty stray cgroups of reapers that are gone are
removed (cleanup.py).

"Over budget" is judged on demand, not on use: a duty-cycled stray that would
use more than its budget if let run stays over budget (and stays throttled), as
does one pressing against its cgroup's quota.

A stray reaper may not act on (another user's: EPERM, EACCES) is named once,
counted in actions["not_permitted"] and left alone from then on; the others are
held to their budget all the same. No ordinary OS fault escapes tick() or
close(), and close() resumes every stray it stopped whatever failed before.
"""
from __future__ import annotations

import errno
import os
import signal
import time
from collections import deque
from typing import Optional

from reaper.budgets import cleanup, stray_cpus
from reaper.budgets.memory_cgroup import MemoryCgroup
from reaper.budgets.procctl import Gone, Handle, NotPermitted, pidfds_work
from reaper.budgets.strays import Finder
from reaper.budgets.throttle import CgroupThrottle, DutyCycler, Unavailable
from reaper.proctable import ProcTable

LEVELS = {"observe": 0, "nice": 1, "throttle": 2, "terminate": 3}
RELEASE = 0.9          # a duty-cycled stray is let go below this share of its budget
SLOW_SPEED = 0.25      # duty-cycling: the least speed (cores while let run) its control assumes


class Tracked:
    """One stray, pinned by (pid, start)."""

    def __init__(self, key, stray, handle: Handle, now: float) -> None:
        self.key = key
        self.handle = handle
        self.comm = stray.comm
        self.reason = stray.reason
        self.since = now                 # first sample that saw it as a stray
        self.since_wall = time.time()
        self.hist: deque = deque()       # (t, cpu seconds, run seconds)
        self.rate: Optional[float] = None    # cores used, averaged over the window
        self.demand: Optional[float] = None  # cores it would use if never stopped
        self.over = False
        self.over_since: Optional[float] = None
        self.niced = False
        # Everything in an orphan's or an idle task's session is a stray: its autogroup
        # may be reniced (procctl.Handle.autogroup_nice); not so for --stray-match.
        self.autogroup_pending = stray.reason != "match"
        self.pinned = False
        self.leaf: Optional[str] = None  # cgroup directory it was moved into
        self.cycled = False              # duty-cycled
        self.fraction = 1.0              # share of each duty period it may run
        self.term_at: Optional[float] = None
        self.killed = False
        self.action = "none"             # the strongest response applied so far
        self.last_cpu = None
        self.refused: Optional[NotPermitted] = None   # set once reaper may not act on it
        self.mem: Optional[int] = None   # private memory at the last sample, bytes (Handle.private_memory)
        self.mem_leaf: Optional[str] = None   # memory cgroup directory it was moved into
        self.mem_oom0 = 0                # that leaf's OOM kills when it was moved in (leaves are reused)
        self.mem_tried = False           # its memory cgroup was decided (made, or why not)
        self.mem_over = False
        self.age_done = False            # --stray-max-age acted (or reported)
        self.term_reason = "cpu"         # what its SIGTERM was for: cpu, memory, age


class Enforcer:
    name = "budget"

    def __init__(self, cfg, log, stats, scope) -> None:
        self.cfg = cfg
        self.log = log
        self.stats = stats
        self.scope = scope
        self.level = LEVELS[cfg.budget_action]
        self.table = ProcTable()
        self.finder = Finder(cfg, scope)
        self.tracked: dict = {}
        self.duty = DutyCycler()
        self.cgroup: Optional[CgroupThrottle] = None
        self.mechanism: Optional[str] = None     # decided on first need
        self.memory: Optional[MemoryCgroup] = None
        self.memory_mechanism: Optional[str] = None   # decided on first need
        self.watch = bool(getattr(scope, "watch", False))
        self.memory_on = cfg.memory_budget is not None or cfg.memory_budget_total is not None
        self.said: set = set()                   # things said once
        self.unpinned: set = set()               # keys of strays reaper may not even read
        self.refusals: list = []                 # (what, pid, comm, strerror) not said yet
        self.next_sample = time.monotonic()      # first sample right away
        self.cpus = None
        try:
            self.cpus, msg = stray_cpus.resolve(cfg.stray_cpus)
            if msg:
                self.log.info(msg)
        except Exception as e:                   # never fatal: leave affinity alone
            self.log.warn(f"--stray-cpus {cfg.stray_cpus}: {e}; affinity left alone")
        self._remove_stale_cgroups()
        if not pidfds_work():
            self._once("nopidfd", "no pidfd support: signals to strays go through kill() "
                                  "after a start-time check")
        self.log.debug(f"budgets on: per stray {cfg.cpu_budget}, total {cfg.cpu_budget_total}, "
                       f"memory {cfg.memory_budget}, {cfg.memory_budget_total}, max age {cfg.stray_max_age}, "
                       f"action {cfg.budget_action}, every {cfg.budget_interval:g}s")

    def _remove_stale_cgroups(self) -> None:
        """The stray cgroups of reapers that are gone (cleanup.py); never fatal."""
        try:
            removed, kept = cleanup.remove_stale()
        except Exception as e:               # a surprise here must not keep budgets off
            self.log.warn(f"could not look for stale stray cgroups: {e!r}")
            return
        self.stats.stale_cgroups_removed += len(removed)
        if removed:
            self.log.info(f"removed {len(removed)} stray cgroup(s) left by reapers that are gone: "
                          f"{', '.join(removed[:5])}{' ...' if len(removed) > 5 else ''}")
        if kept:
            self.log.warn(f"stray cgroup(s) left by reapers that are gone still hold processes, "
                          f"left in place: {', '.join(kept[:5])}{' ...' if len(kept) > 5 else ''}")

    # --- Plugin protocol ---------------------------------------------------

    def next_deadline(self) -> Optional[float]:
        due = self.duty.next_deadline()
        return self.next_sample if due is None else min(due, self.next_sample)

    def tick(self, now: float) -> None:
        try:
            if now >= self.next_sample:
                self.next_sample += self.cfg.budget_interval
                if self.next_sample <= now:
                    self.next_sample = now + self.cfg.budget_interval
                self.sample(now)
            if self.duty.members and self.draining:
                self.duty.close(now)        # reaper drains everything: nothing may stay stopped
                for t in self.tracked.values():
                    t.cycled = False
        finally:
            # Whatever the sample met, the duty cycle moves on: its deadline must not stay behind.
            self.duty.step(time.monotonic())
            self._take_duty_faults()
            self._say_refusals()

    def close(self) -> None:
        now = time.monotonic()
        try:
            self.duty.close(now)            # every stopped stray resumed, whatever failed before
        finally:
            self._take_duty_faults()
            self._say_refusals()
            for t in self.tracked.values():
                # A stray the kernel's OOM killer ended since the last sample is still said.
                if t.mem_leaf is not None and not self.tracked_alive(t.key):
                    self._memory_gone(t, alive=False)
            self._remove_cgroups()
            for t in self.tracked.values():
                t.handle.close()
            self.tracked.clear()

    def _remove_cgroups(self) -> None:
        left = []
        for cg in (self.cgroup, self.memory):
            if cg is None:
                continue
            try:
                left += cg.close()
            except OSError as e:
                left.append(f"{cg.base} ({e.strerror})")
        if left:
            self.log.warn(f"could not remove cgroup(s) {', '.join(left)}")

    # --- one sample ----------------------------------------------------------

    def _once(self, key: str, msg: str, level: str = "info") -> None:
        if key not in self.said:
            self.said.add(key)
            getattr(self.log, level)(msg)

    @property
    def draining(self) -> bool:
        # The supervisor's phase (pause mode has no main child at all).
        return not getattr(self.scope, "watch", False) and getattr(self.scope, "phase", "running") != "running"

    def sample(self, now: float) -> None:
        cfg = self.cfg
        self.table.refresh(now, self.finder.reapers())
        found = self.finder.find(self.table)

        for key in [k for k in self.tracked if k not in found]:
            self._drop(self.tracked.pop(key), now, alive=self.tracked_alive(key))
        self.unpinned &= found.keys()
        for key, stray in found.items():
            if key in self.tracked:
                self.tracked[key].comm = stray.comm     # it may have exec'd since
            elif key not in self.unpinned:
                self._track(key, stray, now)

        window = cfg.budget_window
        for key, t in list(self.tracked.items()):
            if t.refused is not None and t.refused.what == "read":
                continue
            try:
                cpu = t.handle.cpu_seconds()
            except Gone:
                self._drop(self.tracked.pop(key), now, alive=False)
                continue
            except NotPermitted as e:
                self._refuse(t, e)
                continue
            except OSError as e:
                self._once("fail-read", f"cannot read the CPU time of stray {key[0]} ({t.comm}): "
                                        f"{e.strerror}; it is skipped while this lasts", "warn")
                continue
            try:
                t.mem = t.handle.private_memory(exact_above=cfg.memory_budget)
            except (Gone, OSError):
                t.mem = None                 # gone: dropped at the next sample
            if t.last_cpu is not None:
                self.stats.stray_cpu_seconds += max(0.0, cpu - t.last_cpu)
            t.last_cpu = cpu
            run = now - t.since - self.duty.stopped_total(key, now)
            t.hist.append((now, cpu, run))
            while len(t.hist) > 2 and t.hist[1][0] <= now - window:
                t.hist.popleft()
            t0, c0, r0 = t.hist[0]
            if now - t0 >= min(window, cfg.budget_interval) * 0.5 and len(t.hist) > 1:
                t.rate = (cpu - c0) / (now - t0)
                t.demand = (cpu - c0) / (run - r0) if run - r0 > 1e-3 else t.rate

        self.stats.samples += 1
        self.stats.strays = len(self.tracked)
        if self.draining:
            # reaper drains everything now: resume what is stopped and stand back.
            self.duty.close(now)
            for t in self.tracked.values():
                t.cycled = False
            self._publish()
            return
        self._enforce(now)
        if self.memory_on:
            self._enforce_memory(now)
        if cfg.stray_max_age is not None:
            self._enforce_age(now)
        self._follow_up(now)
        if self.memory is not None:
            self.memory.trim()
        self._publish()

    def _track(self, key, stray, now: float) -> None:
        try:
            handle = Handle(*key)
        except Gone:
            return
        except NotPermitted as e:
            self.unpinned.add(key)                  # not pinned again every sample
            self.refusals.append((e.what, key[0], stray.comm, e.strerror))
            self._count("not_permitted", "any")
            return
        self.tracked[key] = Tracked(key, stray, handle, now)
        self.stats.strays_seen += 1
        self.log.debug(f"stray {key[0]} ({stray.comm}): {stray.reason}")

    def tracked_alive(self, key) -> bool:
        from reaper.proctable import read_stat

        st = read_stat(key[0])
        return st is not None and st[1] == key[1] and st[3] not in ("Z", "X")

    def _enforce(self, now: float) -> None:
        cfg = self.cfg
        eligible = [t for t in self.tracked.values()
                    if now - t.since >= cfg.budget_grace and t.rate is not None]
        if self.cpus is not None:
            for t in eligible:
                if not t.pinned and t.refused is None:
                    self._act(t, "affinity", lambda h: h.set_affinity(self.cpus))
                    t.pinned = True

        # Per-stray budget.
        over_one = set()
        if cfg.cpu_budget is not None:
            for t in eligible:
                if self._over(t, cfg.cpu_budget, t.leaf if t.leaf and not t.leaf.endswith("/shared") else None):
                    over_one.add(t.key)
        # Total budget.
        over_total = False
        if cfg.cpu_budget_total is not None and eligible:
            if self.cgroup is not None and any(t.leaf for t in eligible):
                pressing = self.cgroup.pressing(self.cgroup.base)
            else:
                pressing = False
            demand = sum(t.demand or 0.0 for t in eligible)
            use = sum(t.rate or 0.0 for t in eligible)
            cycled = any(t.cycled for t in eligible)
            over_total = pressing or use > cfg.cpu_budget_total or \
                (cycled and demand > cfg.cpu_budget_total * RELEASE)

        total_share = {}
        if over_total:
            dsum = sum(max(t.demand or 0.0, 1e-3) for t in eligible)
            for t in eligible:
                total_share[t.key] = cfg.cpu_budget_total * max(t.demand or 0.0, 1e-3) / dsum

        for t in self.tracked.values():
            over = t.key in over_one or t.key in total_share
            if over and not t.over:
                self._violation(t, over_total and t.key not in over_one)
            if not over:
                t.over_since = None
            t.over = over
            if not over:
                if t.cycled:
                    self.duty.release(t.key, now)
                    t.cycled = False
                    self.log.info(f"stray {t.key[0]} ({t.comm}) back under budget: resumed")
                continue
            self._respond(t, over_one, total_share, now)

    def _respond(self, t: Tracked, over_one: set, total_share: dict, now: float) -> None:
        """The configured response to a stray over budget, step by step; a stray
        reaper may not act on is left alone from the first refusal."""
        if self.level >= 1 and not t.niced:
            t.niced = True
            if self._act(t, "nice", lambda h: h.renice(19)):
                t.action = "nice"
            self._act(t, "sched_idle", lambda h: h.sched_idle())
        if self.level >= 1 and t.autogroup_pending and t.refused is None:
            self._renice_autogroup(t)
        if self.level >= 2 and t.refused is None:
            budget = self.cfg.cpu_budget if t.key in over_one else None
            share = total_share.get(t.key)
            self._throttle(t, budget, share, now)
        if self.level >= 3 and t.refused is None:
            self._terminate(t, now)

    def _over(self, t: Tracked, budget: float, leaf: Optional[str]) -> bool:
        if leaf is not None and self.cgroup is not None:
            # Capped by its own cgroup: over budget while it presses on the quota.
            return self.cgroup.pressing(leaf) or (t.rate or 0.0) > budget * 1.05
        if t.cycled:
            return (t.demand or 0.0) > budget * RELEASE
        return (t.rate or 0.0) > budget

    def _violation(self, t: Tracked, total: bool) -> None:
        cfg = self.cfg
        t.over_since = time.monotonic()
        self._count_violation("cpu")
        if t.action == "none":
            t.action = "observe"
        if total:
            what = f"strays together over --cpu-budget-total {cfg.cpu_budget_total:g}"
        else:
            what = f"over --cpu-budget {cfg.cpu_budget:g}"
        self.log.warn(f"stray {t.key[0]} ({t.comm}, {t.reason}) uses {t.rate or 0:.2f} cores, "
                      f"{what} (window {cfg.budget_window:g}s): {cfg.budget_action}")

    def _act(self, t: Tracked, action: str, fn, reason: str = "cpu") -> bool:
        if t.refused is not None:
            return False
        try:
            fn(t.handle)
        except Gone:
            return False
        except NotPermitted as e:
            self._refuse(t, e, reason)
            return False
        except OSError as e:
            self._once(f"fail-{action}", f"cannot apply {action} to stray {t.key[0]} ({t.comm}): "
                                         f"{e.strerror}; going on without it", "warn")
            return False
        self._count(action, reason)
        return True

    def _count(self, action: str, reason: str) -> None:
        self.stats.actions[action] += 1
        self.stats.actions_by_reason[(action, reason)] += 1

    def _renice_autogroup(self, t: Tracked) -> None:
        try:
            done = t.handle.autogroup_nice(19)
        except Gone:
            t.autogroup_pending = False
            return
        except OSError as e:            # NotPermitted too: the file may be root's when the stray is not
            if e.errno == errno.EAGAIN:
                return      # unprivileged: one autogroup change per 100 ms, machine-wide; next sample
            t.autogroup_pending = False
            self._once("fail-autogroup_nice", f"cannot renice the autogroup of stray {t.key[0]} ({t.comm}): "
                                              f"{e.strerror}; going on without it", "warn")
            return
        t.autogroup_pending = False
        if done:
            self._count("autogroup_nice", "cpu")

    # --- throttling --------------------------------------------------------

    def _choose_mechanism(self) -> None:
        if self.mechanism is not None:
            return
        try:
            self.cgroup = CgroupThrottle.probe(skip_v2=self.memory is not None and self.memory.version == 2)
            self.mechanism = self.cgroup.kind
            if self.cfg.cpu_budget_total is not None:
                self.cgroup.set_total(self.cfg.cpu_budget_total)
            self.log.info(f"throttling strays with the {self.cgroup.kind.replace('_', ' ')} cpu controller "
                          f"in {self.cgroup.base}")
        except Unavailable as e:
            self.mechanism = "sigstop"
            self.log.info(f"{e}: throttling by SIGSTOP/SIGCONT")
        except OSError as e:
            self.mechanism = "sigstop"
            self.log.info(f"cgroup setup failed ({e.strerror}): throttling by SIGSTOP/SIGCONT")
        self.stats.mechanism = self.mechanism

    def _throttle(self, t: Tracked, budget: Optional[float], share: Optional[float], now: float) -> None:
        self._choose_mechanism()
        if self.cgroup is not None and not t.cycled:
            want = "shared" if budget is None else f"s{t.key[0]}.{t.key[1]}"
            if t.leaf is None or os.path.basename(t.leaf) != want:
                try:
                    d = self.cgroup.leaf(t.key, budget)
                    t.handle.checked(lambda: self.cgroup.move(t.key[0], d))
                    t.leaf = d
                    t.action = "throttle"
                    self._count("throttle_cgroup", "cpu")
                    self.cgroup.pressing(d)
                    return
                except Gone:
                    return
                except OSError as e:
                    self._once("cgroup-move", f"cannot move stray {t.key[0]} into {self.cgroup.base} "
                                              f"({e.strerror}): duty-cycling it instead", "warn")
            else:
                return
        # Duty-cycling. It must run target/demand of the time (demand: cores it
        # uses while running). It starts with demand taken as at least one core: a
        # stray slowed by contention (it is SCHED_IDLE) shows a low demand, and when
        # the contention ends it would run at full speed for most of each period.
        # From there the fraction follows the CPU it actually used over the last
        # sample: half the error each time, in run time at the speed it ran at
        # while let run over the window (its demand, at least SLOW_SPEED).
        # Contention that starts mid-throttle (a busy neighbour of the idle class)
        # is thus made up in a few samples rather than a window's worth; the
        # window's speed, not the last sample's, keeps bursty contention from
        # swinging it over the budget.
        target = min(x for x in (budget, share) if x is not None)
        want = target / max(t.demand or 1.0, 1.0)
        if not t.cycled:
            t.cycled = True
            t.fraction = want
            t.action = "throttle"
            self._count("throttle_sigstop", "cpu")
        elif len(t.hist) >= 2:
            (t0, c0, _), (t1, c1, _) = t.hist[-2], t.hist[-1]
            if t1 > t0:
                used = (c1 - c0) / (t1 - t0)
                t.fraction += 0.5 * (target - used) / max(t.demand or 1.0, SLOW_SPEED)
        # Never more run time than a stray at SLOW_SPEED needs: one starved by busier
        # work stays under its budget anyway, and when that work ends it runs at most
        # target / SLOW_SPEED cores for one sample before the control catches it.
        t.fraction = min(1.0, target / SLOW_SPEED, max(0.01, t.fraction))
        if self.log.enabled(3):
            self.log.debug(f"stray {t.key[0]}: uses {t.rate or 0:.3f}, demand {t.demand or 0:.3f}, "
                           f"target {target:.3f}: runs {t.fraction:.3f} of each period")
        self.duty.set(t.key, t.handle, t.fraction, now)

    # --- terminate ---------------------------------------------------------

    def _terminate(self, t: Tracked, now: float) -> None:
        if t.over_since is None or now - t.over_since < self.cfg.budget_kill_after:
            return
        self._kill(t, now, "cpu", f"over budget for {self.cfg.budget_kill_after:g}s")

    def _kill(self, t: Tracked, now: float, reason: str, why: str) -> None:
        """SIGTERM (and SIGCONT: a stopped process must run to exit), once; the
        SIGKILL follows --grace seconds later (_follow_up)."""
        if t.term_at is not None or t.refused is not None:
            return
        try:
            if t.cycled:
                self.duty.release(t.key, now)
                t.cycled = False
            t.handle.signal(signal.SIGTERM)
            t.handle.signal(signal.SIGCONT)
            t.term_at = now
            t.term_reason = reason
            t.action = "terminate"
            self._count("terminate", reason)
            self.log.warn(f"stray {t.key[0]} ({t.comm}) {why}: SIGTERM")
        except Gone:
            pass
        except NotPermitted as e:
            self._refuse(t, e, reason)
        except OSError as e:
            self._once("fail-terminate", f"cannot terminate stray {t.key[0]} ({t.comm}): {e.strerror}", "warn")

    def _follow_up(self, now: float) -> None:
        """SIGKILL for every stray still alive --grace seconds after its SIGTERM."""
        for t in self.tracked.values():
            if t.term_at is None or t.killed or now - t.term_at < self.cfg.grace or t.refused is not None:
                continue
            try:
                t.handle.signal(signal.SIGKILL)
                t.killed = True
                t.action = "kill"
                self._count("kill", t.term_reason)
                self.log.warn(f"stray {t.key[0]} ({t.comm}) still alive {self.cfg.grace:g}s after SIGTERM: SIGKILL")
            except Gone:
                t.killed = True
            except NotPermitted as e:
                self._refuse(t, e, t.term_reason)
            except OSError as e:
                self._once("fail-terminate", f"cannot terminate stray {t.key[0]} ({t.comm}): {e.strerror}", "warn")

    def _count_violation(self, reason: str) -> None:
        self.stats.violations[self.cfg.budget_action] += 1
        self.stats.violations_by_reason[(self.cfg.budget_action, reason)] += 1

    # --- memory --------------------------------------------------------------

    def _memory_cgroup(self) -> Optional[MemoryCgroup]:
        """The memory cgroup, made on first need; None where none can be used (said once)."""
        if self.memory_mechanism is None:
            try:
                self.memory = MemoryCgroup.probe(skip_v2=self.cgroup is not None and self.cgroup.version == 2,
                                                 total=self.cfg.memory_budget_total)
                self.memory_mechanism = self.memory.kind
                self.log.info(f"capping strays' memory with the {self.memory.kind.replace('_', ' ')} memory "
                              f"controller in {self.memory.base}")
            except (Unavailable, OSError) as e:
                self.memory_mechanism = "terminate"
                why = e if isinstance(e, Unavailable) else f"memory cgroup setup failed ({e.strerror})"
                self.log.info(f"{why}: strays over their memory budget are terminated instead")
            self.stats.memory_mechanism = self.memory_mechanism
        return self.memory

    def _confine(self, t: Tracked) -> None:
        """throttle: moves a stray, when first seen, into a memory cgroup whose limit is
        its budget. What it held before the move stays charged where it was (charges
        never move with a process): the cap holds what it allocates from then on, and
        the sample judges what it holds in all (_enforce_memory). A fixed limit of
        the whole budget, never budget minus what it held: a stray that frees what it
        held and allocates again is never killed by its cap below its budget."""
        cfg = self.cfg
        t.mem_tried = True
        if t.mem is None or t.refused is not None:
            return
        if self.watch:
            if self.memory_mechanism is None:
                self.memory_mechanism = self.stats.memory_mechanism = "terminate"
                self.log.info("reaper watch holds memory budgets by terminate: a stray moved into the "
                              "sidecar's own cgroup would be charged to the sidecar")
            return
        if cfg.memory_budget is not None and t.mem >= cfg.memory_budget:
            self._over_when_found(t)
            return
        mc = self._memory_cgroup()
        if mc is None:
            return
        leaf = None
        try:
            leaf = mc.take_leaf(cfg.memory_budget)
            oom0 = mc.oom_kills(leaf)
            t.handle.checked(lambda: mc.move(t.key[0], leaf))
        except Gone:
            if leaf is not None:
                mc.give_back(leaf)
            return
        except OSError as e:
            if leaf is not None:
                mc.give_back(leaf)
            self._once("memory-move", f"cannot move stray {t.key[0]} into {mc.base} ({e.strerror}): "
                                      "strays over their memory budget are terminated instead", "warn")
            return
        t.mem_leaf, t.mem_oom0 = leaf, oom0
        if t.action in ("none", "observe"):
            t.action = "throttle"
        self._count("throttle_memory_cgroup", "memory")

    def _over_when_found(self, t: Tracked) -> None:
        self._once("mem-over-found", f"stray {t.key[0]} ({t.comm}) already holds {_size(t.mem)}, over "
                                     f"--memory-budget {_size(self.cfg.memory_budget)}, when found: it is "
                                     "terminated when its grace is over, not capped", "warn")

    def _enforce_memory(self, now: float) -> None:
        """Judges what each stray holds in all, inside its memory cgroup or not: the
        cgroup caps what it allocates after the move, not what it held before."""
        cfg = self.cfg
        live = [t for t in self.tracked.values() if t.mem is not None and t.refused is None]
        if self.level == 2:
            for t in live:
                if not t.mem_tried:
                    self._confine(t)
        past = [t for t in live if now - t.since >= cfg.budget_grace]
        over_one, over_total = set(), set()
        if cfg.memory_budget is not None:
            over_one = {t.key for t in past if t.mem > cfg.memory_budget}
        if cfg.memory_budget_total is not None:
            held = sum(t.mem for t in live)
            if held > cfg.memory_budget_total:
                held = self._exact_total(live)
            for t in sorted(past, key=lambda t: -t.mem):
                if held <= cfg.memory_budget_total:
                    break
                over_total.add(t.key)       # the biggest first, until the rest fit
                held -= t.mem
        for t in live:
            over = t.key in over_one or t.key in over_total
            if over and not t.mem_over:
                self._count_violation("memory")
                if t.action == "none":
                    t.action = "observe"
                what = f"over --memory-budget {_size(cfg.memory_budget)}" if t.key in over_one else \
                    f"strays together over --memory-budget-total {_size(cfg.memory_budget_total)}"
                self.log.warn(f"stray {t.key[0]} ({t.comm}, {t.reason}) holds {_size(t.mem)}, "
                              f"{what}: {'terminate' if self.level >= 2 else cfg.budget_action}")
            t.mem_over = over
            if not over:
                continue
            if self.level >= 1 and not t.niced:
                t.niced = True
                if self._act(t, "nice", lambda h: h.renice(19), "memory"):
                    t.action = "nice"
                self._act(t, "sched_idle", lambda h: h.sched_idle(), "memory")
            if self.level >= 2:
                self._kill(t, now, "memory", f"holds {_size(t.mem)}, over its memory budget")

    @staticmethod
    def _exact_total(live: list) -> int:
        """The strays' total with each one's exact private memory (smaps_rollup), read
        only when the cheap figures together exceed --memory-budget-total."""
        for t in live:
            try:
                t.mem = t.handle.private_memory(exact_above=0)
            except (Gone, OSError):
                pass
        return sum(t.mem for t in live)

    def _memory_gone(self, t: Tracked, alive: bool) -> None:
        """A tracked stray's memory cgroup when it stops being one: moved back if alive;
        if it died of the OOM killer inside, that is said and counted. The leaf goes
        back to the pool (memory_cgroup.py), not away: a removed leaf that still holds
        the stray's page cache would linger as a dying cgroup."""
        mc = self.memory
        if t.mem_leaf is None or mc is None:
            return
        if alive:
            try:
                t.handle.checked(lambda: mc.move(t.key[0], mc.parent))
            except (Gone, OSError):
                pass
        elif mc.oom_kills(t.mem_leaf) > t.mem_oom0:
            self._count("oom_kill", "memory")
            self.log.warn(f"stray {t.key[0]} ({t.comm}) was killed by the kernel's OOM killer inside its "
                          f"memory cgroup (its budget: {_size(self.cfg.memory_budget)})")
        mc.give_back(t.mem_leaf)
        t.mem_leaf = None

    # --- lifetime ---------------------------------------------------------------

    def _enforce_age(self, now: float) -> None:
        limit = self.cfg.stray_max_age
        for t in self.tracked.values():
            if t.age_done or t.refused is not None or now - t.since < limit:
                continue
            t.age_done = True
            self._count_violation("age")
            if self.level == 0:
                if t.action == "none":
                    t.action = "observe"
                self.log.warn(f"stray {t.key[0]} ({t.comm}, {t.reason}) first seen {now - t.since:.0f}s ago, "
                              f"past --stray-max-age {limit:g}: observe")
            else:
                self._kill(t, now, "age", f"first seen {limit:g}s ago (--stray-max-age)")

    # --- strays reaper may not act on -------------------------------------------

    def _refuse(self, t: Tracked, e: NotPermitted, reason: str = "any") -> None:
        """Leaves t alone from now on: nothing refused is retried every sample."""
        if t.refused is not None:
            return
        t.refused = e
        t.action = "not_permitted"
        if t.cycled:
            self.duty.release(t.key, time.monotonic())    # if stopped, resumed where possible
            t.cycled = False
        self.refusals.append((e.what, t.key[0], t.comm, e.strerror))
        self._count("not_permitted", reason)

    def _take_duty_faults(self) -> None:
        for key, signame, e in self.duty.take_faults():
            t = self.tracked.get(key)
            if t is None:
                continue
            t.cycled = False                 # the cycle dropped it
            if isinstance(e, NotPermitted):
                self._refuse(t, e)
            else:
                self._once(f"fail-{signame}", f"cannot send {signame} to stray {key[0]} ({t.comm}): "
                                              f"{e.strerror}; it is no longer duty-cycled", "warn")

    def _say_refusals(self) -> None:
        """One line per kind of action refused since the last call, naming the strays."""
        if not self.refusals:
            return
        by_what: dict = {}
        for what, pid, comm, why in self.refusals:
            by_what.setdefault(what, []).append((pid, comm, why))
        self.refusals = []
        for what, strays in by_what.items():
            named = ", ".join(f"{pid} ({comm}, uid {_owner(pid)})" for pid, comm, _ in strays[:10])
            more = f" and {len(strays) - 10} more" if len(strays) > 10 else ""
            one = len(strays) == 1
            self.log.warn(f"uid {os.geteuid()} may not {what} stray{'' if one else 's'} {named}{more}: "
                          f"{strays[0][2]}; {'it is' if one else 'they are'} left alone, "
                          f"not held to {'its' if one else 'their'} budget")

    # --- bookkeeping ---------------------------------------------------------

    def _drop(self, t: Tracked, now: float, alive: bool) -> None:
        if alive:
            self.duty.release(t.key, now)        # no longer a stray: let it run
        else:
            self.duty.forget(t.key)
        if t.leaf is not None and self.cgroup is not None:
            if alive:
                try:
                    t.handle.checked(lambda: self.cgroup.move(t.key[0], self.cgroup.parent))
                except (Gone, OSError):
                    pass
            self.cgroup.drop_leaf(t.leaf)
        self._memory_gone(t, alive)
        t.handle.close()

    def _count_cgroups(self) -> dict:
        try:
            return _cgroups_of((self.cgroup, self.memory))
        except OSError:
            return {"live": 0}

    def _publish(self) -> None:
        b = self.stats
        b.over_budget = {
            "cpu": sum(1 for t in self.tracked.values() if t.over),
            "memory": sum(1 for t in self.tracked.values() if t.mem_over),
            # Past --stray-max-age and still there (SIGTERM'd, or observed only).
            "age": sum(1 for t in self.tracked.values() if t.age_done),
        }
        b.cgroups = self._count_cgroups()
        self.stats.stray_list = [
            {"pid": t.key[0], "name": t.comm, "cpu_cores": round(t.rate or 0.0, 3),
             "memory_bytes": t.mem or 0, "action": t.action, "since": round(t.since_wall, 3)}
            for t in sorted(self.tracked.values(), key=lambda t: -(t.rate or 0.0))
        ]


def _cgroups_of(holders) -> dict:
    """{"live": n} and, where the kernel says (cgroup v2), "dying": the cgroups reaper holds."""
    out = {"live": 0}
    for cg in holders:
        if cg is None:
            continue
        out["live"] += cg.live()
        dying = cg.dying()
        if dying is not None:
            out["dying"] = out.get("dying", 0) + dying
    return out


def _size(n) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _owner(pid: int) -> str:
    try:
        return str(os.stat(f"/proc/{pid}").st_uid)
    except OSError:
        return "?"

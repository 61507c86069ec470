"""Budgets for strays: sample, track, act; each budget kind judges (kinds/).

Every --budget-interval the enforcer reads the strays that may have changed (one
/proc/PID/stat each: CPU, RSS, name; private memory when the RSS moved), lists /proc
for new strays (strays.py) when a pid was handed out, and averages the CPU over
--budget-window (Usage). Lineages whose CPU did not move for a window sleep: read
again when reaper's cgroup's counters say something nobody read ran (pulse.py), or
every pulse.QUIET_MAX seconds. Then each budget kind that is on
(kinds/: cpu, memory, age, in that order) judges which strays are over its budget
past their --budget-grace and responds through the one door it acts by (actions.py),
as far as --budget-action goes, each step including the ones before it:

    observe    one log line per violation, metrics
    nice       nice 19 and SCHED_IDLE (and --stray-cpus affinity)
    throttle   a hard cap: a cgroup of reaper's own, else SIGSTOP/SIGCONT duty-cycling
    terminate  SIGTERM (CPU: after --budget-kill-after seconds over budget; memory: at
               once), SIGKILL after --grace

--stray-max-age sends SIGTERM whatever the action but observe. The engine is this
module: the Policy plugin (next_deadline, tick, close) and sample(), the pipeline
(scan, measure, hold, pin, the kinds judge, follow up, rest, publish). It wires the
parts, each the only writer of its own state, and nothing else holds it:

    book.py      who is known: the strays tracked (Tracked, pinned against pid reuse
                 by procctl.Handle) and dormant (dormant.py), their lineages
                 (lineage.py: a stray's descendants share its account, so that a fork
                 that lets its parent exit starts no grace, age or CPU afresh), the
                 scan, the one track() (hops.py: a lineage's fork between samples)
    schedule.py  who is read when: awake lineages, sleepers due (pulse.py), scans
    reader.py    how a stray is read: CPU, memory, the CPU of what reaper reaped
    actions.py   how reaper acts: the kinds' door, the duty cycle, SIGTERM and its
                 SIGKILL, refusals, and the counts by reason (a kind's, or "any")
    publish.py   what the stats show: over budget, cgroups, the stray list

A kind reads the sample through Sample (below): the lineages it judges, read only.
The cgroups a lineage must stay in are kept by escapes.py. At start, the empty stray
cgroups of reapers that are gone are removed (cleanup.py).

A stray reaper may not act on (another user's: EPERM, EACCES) is named once,
counted in actions["not_permitted"] and left alone from then on; the others are
held to their budget all the same. No ordinary OS fault escapes tick() or
close(), and close() resumes every stray it stopped whatever failed before.
"""
from __future__ import annotations

import time

from reaper.budgets import cleanup, escapes, hops
from reaper.budgets.actions import Actions
from reaper.budgets.book import Book, tracked_alive
from reaper.budgets.kinds import load as load_kinds
from reaper.budgets.lineage import Tracked, Usage, boot_ticks
from reaper.budgets.publish import publish
from reaper.budgets.reader import Reader
from reaper.budgets.schedule import Schedule
from reaper.budgets.strays import Finder
from reaper.procctl import pidfds_work

__all__ = ["Enforcer", "Sample", "Tracked", "Usage"]


class Enforcer:
    """The budgets engine: the Policy plugin (next_deadline, tick, close) and sample(),
    the pipeline; its parts own their state (book, schedule, reader, act)."""

    name = "budget"

    def __init__(self, cfg, log, stats, scope, reaped=None) -> None:
        self.cfg = cfg
        self.log = log
        self.stats = stats
        self.scope = scope
        self.reaped = reaped                     # reaped.ReapedCPU where reaper reaps the orphans
        self.prev_sample: float | None = None
        self.next_sample = time.monotonic()      # first sample right away
        self.act = act = Actions(cfg, log, stats)
        self.view = view = Sample(cfg, scope)
        self.kinds = kinds = [kind(view, act) for kind in load_kinds(cfg)]   # the budgets that are on, in order
        if cfg.stray_cpus is not None:           # stray_cpus.py (and values.py) loaded only then
            act.confine(cfg.stray_cpus)
        self.finder = Finder(cfg, scope)
        self.book = book = Book(cfg, log, stats, kinds, act, self.finder, reaped, act.cpus)
        self.schedule = schedule = Schedule(cfg, scope, kinds, act, book, act.cpus)
        self.reader = Reader(cfg, stats, scope, kinds, act, book, schedule, reaped, time.monotonic())
        book.wire(schedule, self.reader)
        view.wire(kinds, book, schedule)
        self._remove_stale_cgroups()
        if not pidfds_work():
            act.once("nopidfd", "no pidfd support: signals to strays go through kill() "
                                "after a start-time check")
        self.log.debug(f"budgets on: per stray {cfg.cpu_budget}, total {cfg.cpu_budget_total}, "
                       f"memory {cfg.memory_budget}, {cfg.memory_budget_total}, max age {cfg.stray_max_age}, "
                       f"action {cfg.budget_action}, every {cfg.budget_interval:g}s")

    def _remove_stale_cgroups(self) -> None:
        """The stray cgroups of reapers that are gone (cleanup.py); never fatal."""
        self.stats.stale_cgroups_removed += cleanup.remove_and_say(self.log, "stray")

    # --- Plugin protocol ---------------------------------------------------

    def next_deadline(self) -> float | None:
        due = self.act.duty.next_deadline()
        return self.next_sample if due is None else min(due, self.next_sample)

    def tick(self, now: float) -> None:
        act = self.act
        try:
            if now >= self.next_sample:
                self.next_sample += self.cfg.budget_interval
                if self.next_sample <= now:
                    self.next_sample = now + self.cfg.budget_interval
                self.sample(now)
            if act.duty.members and self.schedule.draining:
                act.drain(now, self.book.tracked.values())   # reaper drains everything: nothing may stay stopped
        finally:
            # Whatever the sample met, the duty cycle moves on: its deadline must not stay behind.
            act.duty.step(time.monotonic())
            if act.duty.lost:
                hops.catch(self.book, self.kinds, act, self.stats, act.duty.take_lost(), self.schedule.draining)
            act.take_duty_faults(self.book.tracked)
            act.say_refusals()

    def close(self) -> None:
        now = time.monotonic()
        act = self.act
        try:
            act.duty.close(now)             # every stopped stray resumed, whatever failed before
            self.book.count_final()
        finally:
            act.take_duty_faults(self.book.tracked)
            act.say_refusals()
            for kind in self.kinds:
                kind.closing()
            self._remove_cgroups()
            self.book.close()

    def _remove_cgroups(self) -> None:
        left = []
        for cg in self.view.cgroups():
            try:
                left += cg.close()
            except OSError as e:
                left.append(f"{cg.base} ({e.strerror})")
        if left:
            self.log.warn(f"could not remove cgroup(s) {', '.join(left)}")

    # --- one sample ----------------------------------------------------------

    def sample(self, now: float) -> None:
        """One sample. /proc is listed (the scan: new strays, gone ones) when a pid was
        handed out, when the cgroup's CPU says something nobody read ran, and every
        pulse.SCAN_EVERY seconds; every stray is read when that CPU adds up
        (pulse.QUIET_CPU: a sweep). Otherwise only the awake lineages are read (those
        whose CPU moved within the window, held, over, or being terminated) and the
        sleeping strays that are due (pulse.QUIET_MAX)."""
        book, schedule, reader, act = self.book, self.schedule, self.reader, self.act
        boot = boot_ticks()                      # before the scan: whatever starts later is new
        book.start(boot)
        schedule.start()
        schedule.sweep(reader.read_awake(now))
        rescanned = schedule.scan_due(now)
        if rescanned:
            book.scan(now, boot)
            reader.keep_main(self.finder.kept)
        reader.measure(now, rescanned)
        schedule.swept_done()
        self.stats.samples += 1
        self.stats.strays = len(book.tracked) + len(book.dormant)
        judged = schedule.lineages
        if schedule.draining:
            # reaper drains everything now: resume what is stopped and stand back.
            act.drain(now, book.tracked.values())
            publish(self.stats, judged(), self.kinds, book)
            return
        escapes.hold(self.kinds, judged(), book, act, self.prev_sample, now)
        if act.cpus is not None:             # --stray-cpus: every stray past its grace, whatever the action
            for t in self.view.eligible(now):
                act.pin(t)
        for kind in self.kinds:
            kind.judge(now)
        act.follow_up([t for a in judged() for t in a.members.values()], now)
        schedule.rest(now)
        self.prev_sample = now
        publish(self.stats, judged(), self.kinds, book)


class Sample:
    """What a kind reads of the sample (kinds.Sample): the lineages it judges, those past
    their grace, the strays, the cgroups the kinds hold. Read only."""

    __slots__ = ("cfg", "scope", "kinds", "book", "schedule")

    def __init__(self, cfg, scope) -> None:
        self.cfg = cfg
        self.scope = scope
        self.kinds: list = []
        self.book = self.schedule = None

    def wire(self, kinds: list, book, schedule) -> None:
        self.kinds, self.book, self.schedule = kinds, book, schedule

    @property
    def watch(self) -> bool:
        return bool(self.scope.watch)

    @property
    def draining(self) -> bool:
        return self.schedule.draining

    def lineages(self) -> list:
        """The lineages the kinds judge at this sample (Schedule.lineages)."""
        return self.schedule.lineages()

    def eligible_lineages(self, now: float) -> list:
        """The lineages past their --budget-grace whose CPU use is measured."""
        return [a for a in self.lineages() if now - a.since >= self.cfg.budget_grace and a.use.rate is not None]

    def eligible(self, now: float) -> list:
        """The strays whose lineage is past its --budget-grace and has its CPU use measured."""
        return [t for a in self.eligible_lineages(now) for t in a.members.values()]

    def members(self):
        """Every tracked stray."""
        return self.book.tracked.values()

    alive = staticmethod(tracked_alive)

    def cgroups(self) -> list:
        """The cgroup holders the kinds made, in the kinds' order."""
        return [kind.cgroup for kind in self.kinds if kind.cgroup is not None]

    def v2_taken(self) -> bool:
        """A kind holds a cgroup of the v2 hierarchy: a process is in one cgroup of it only,
        so the first kind to need v2 takes it and the others use v1 or fall back."""
        return any(cg.version == 2 for cg in self.cgroups())

"""Who the budgets read when: the awake lineages, the sleeping strays, the scans.

A lineage is awake while its CPU moves (its members are read at every sample); one
whose CPU did not move for a whole window, past its grace and held, over or
terminated by nothing (no kind busy with it: Kind.busy), rests: its members are read
again at a sweep (pulse.py: the cgroup's CPU says something nobody read ran) or by
pulse.QUIET_MAX, and one that is plain sleeps as a dormant record (Book.sleep_small).
/proc is listed when a pid was handed out, after an exec, and every pulse.SCAN_EVERY
seconds. A kind with a timer (Kind.due: --stray-max-age's) wakes a sleeping lineage
when it comes due (timers).

Schedule is the only writer of what it holds; the sample's Sample view (enforcer.py)
asks it for the lineages the kinds judge.
"""
from __future__ import annotations

from collections import deque

# _heapq: heapq's C functions without heapq.py (its pure-Python fallbacks cost PID 1 memory).
from _heapq import heapify, heappop, heappush

from reaper.budgets import dormant, pulse


class Schedule:
    def __init__(self, cfg, scope, kinds: list, act, book, cpus) -> None:
        self.cfg = cfg
        self.scope = scope                       # the supervisor's (or watch's): its phase
        self.kinds = kinds
        self.act = act                           # actions.Actions: once
        self.book = book
        self.cpus = cpus                         # --stray-cpus: a stray not pinned yet stays awake
        budgets = [b for b in (cfg.memory_budget, cfg.memory_budget_total) if b is not None]
        self.pulse = pulse.Pulse(min(budgets) // 4 if budgets else None)   # the cheap triggers (pulse.py)
        self.seq = 0                             # samples so far
        self.last_scan = float("-inf")           # when /proc was last listed
        self.swept = True                        # this sample reads every stray
        self.awake: dict = {}                    # id(account) -> account: its members read every sample
        self.resting: deque = deque()            # (due, key): sleeping strays, read by QUIET_MAX at the latest
        # (kind, heap of [when due, n, account or dormant key], lineage -> its one entry) of
        # each kind with a timer (Kind.due): one entry per lineage however often it sleeps
        self.timers = [(kind, [], {}) for kind in kinds if kind.timed]
        self.due_n = 0                           # tie-breaker of the timers' entries
        self.fresh: list = []                    # strays tracked since the last sample: read at once
        self.judge_all = any(kind.judges_all() for kind in kinds)   # a budget of all strays together

    @property
    def draining(self) -> bool:
        # The supervisor's phase (pause mode has no main child at all).
        return not self.scope.watch and self.scope.phase != "running"

    def start(self) -> None:
        """A sample starts."""
        self.seq += 1

    def sweep(self, explained: float) -> bool:
        """Whether this sample reads every stray (pulse.Pulse.account, or the drain)."""
        self.swept = self.pulse.account(explained) or self.draining
        return self.swept

    def scan_due(self, now: float) -> bool:
        """/proc is listed at this sample (it is, now): at a sweep, after a fork, with
        --stray-match (a process may exec into a match at any time, forking nothing),
        and every pulse.SCAN_EVERY seconds."""
        forked = self.pulse.forked()
        if self.swept or forked or self.cfg.stray_match or now - self.last_scan >= pulse.SCAN_EVERY:
            self.last_scan = now
            return True
        return False

    def rescan_soon(self) -> None:
        """A stray exec'd: /proc is listed at the next sample."""
        self.last_scan = float("-inf")

    def swept_done(self) -> None:
        if self.swept:
            self.pulse.swept()

    def lineages(self) -> list:
        """The lineages the kinds judge at this sample (lineage.Account): every one at
        a sweep or where a budget of all strays together is on, else the awake ones
        (a sleeping lineage is over no budget, and its figures have not moved)."""
        if self.swept or self.judge_all:
            return self.book.accounts
        return [a for a in self.awake.values() if a.members]

    # --- who is read --------------------------------------------------------------

    def wake(self, a) -> None:
        if id(a) not in self.awake:
            self.awake[id(a)] = a
            self.book.changed()

    def unwake(self, a) -> None:
        self.awake.pop(id(a), None)

    def fresh_one(self, t) -> None:
        """t, tracked since the last sample, is read at once."""
        self.fresh.append(t)

    def take_fresh(self) -> list:
        fresh, self.fresh = self.fresh, []
        return fresh

    def rest_until(self, due: float, key) -> None:
        """Sleeping stray key is read by due at the latest."""
        self.resting.append((due, key))

    def due_now(self, now: float) -> list:
        """The sleeping strays due to be read (taken off the queue)."""
        q, out = self.resting, []
        while q and q[0][0] <= now:
            out.append(q.popleft()[1])
        return out

    def clear_resting(self) -> None:
        """A sweep reads every stray: none is due any more."""
        self.resting.clear()

    # --- who sleeps ---------------------------------------------------------------

    def say_asleep(self) -> None:
        self.act.once("rest", f"strays asleep: read again when the cgroup's CPU says so "
                              f"({self.pulse.file or 'not readable: at every sample'}), "
                              f"or every {pulse.QUIET_MAX:g}s", "debug")

    def due(self, since: float, what, now: float | None = None, was=None) -> None:
        """what (an account, or a dormant stray's key), first seen at since, is judged when
        each timed kind says (Kind.due); at now, by those not due yet. One entry per
        lineage and timer however often it falls asleep (a lineage that naps every few
        seconds for a week must not push one each time, issue 33.7): a lineage queued
        already has its entry point at what it is now; was: the account a dormant stray
        slept from (its entry is the stray's now)."""
        ident = _lineage(what)
        for kind, h, queued in self.timers:
            e = queued.get(ident)
            if e is None and was is not None and was is not what:
                e = queued.get(_lineage(was))
                if e is not None and e[2] is was:
                    del queued[_lineage(was)]
                else:
                    e = None
            if e is not None:
                e[2] = what
                queued[ident] = e
            elif now is None or not kind.past_due(since, now):
                self.due_n += 1
                e = [kind.due(since), self.due_n, what]
                heappush(h, e)
                queued[ident] = e

    def _prune_timers(self) -> None:
        """The entries of lineages gone before they came due are let go, once they are
        most of a heap (wake_due): each stays within twice the strays known."""
        book = self.book
        limit = 2 * (len(book.tracked) + len(book.dormant)) + AGE_SLACK
        for i, (kind, h, queued) in enumerate(self.timers):
            if len(h) <= limit:
                continue
            keep = [e for e in h if queued.get(_lineage(e[2])) is e
                    and (e[2] in book.dormant if isinstance(e[2], tuple) else bool(e[2].members))]
            heapify(keep)
            self.timers[i] = (kind, keep, {_lineage(e[2]): e for e in keep})

    def wake_due(self, now: float) -> None:
        """The sleeping lineages a timed kind must judge now (or about to): woken."""
        self._prune_timers()
        soon = now + self.cfg.budget_interval
        for kind, h, queued in self.timers:
            while h and h[0][0] <= soon:
                e = heappop(h)
                a = e[2]
                if queued.get(_lineage(a)) is e:
                    del queued[_lineage(a)]
                if isinstance(a, tuple):
                    if a not in self.book.dormant:
                        continue
                    a = self.book.thaw(a, kind.due_why).acct
                if a.members:
                    self.wake(a)

    def rest(self, now: float) -> None:
        """The awake lineages that have not moved for a whole window, are past their
        grace and are held, over or terminated by nothing: read again when the
        cgroup's CPU says so (a sweep) or by pulse.QUIET_MAX."""
        if self.draining:
            return
        due = now + pulse.QUIET_MAX
        book = self.book
        for aid, a in list(self.awake.items()):
            if not a.members:
                del self.awake[aid]
                continue
            if not self._sleeping(a, now):
                continue
            del self.awake[aid]
            self.say_asleep()
            a.use.rest(now, self.cfg.budget_window, a.since)
            if dormant.may_keep(book, a):
                book.sleep_small(a)
                continue
            for key in a.members:
                self.resting.append((due, key))
            self.due(a.since, a, now)

    def _sleeping(self, a, now: float) -> bool:
        if a.use.rate != 0.0 or (self.cpus is not None and now - a.since < self.cfg.budget_grace):
            return False
        if a.duty is not None or a.terminated():
            return False
        for kind, _, _ in self.timers:
            if kind.past_due(a.since, now):
                return False
        for kind in self.kinds:
            if kind.busy(a):
                return False
        for t in a.members.values():
            if t.term_at is not None or t.cycled or t.read_at != now or (self.cpus is not None and not t.pinned):
                return False
        return True


AGE_SLACK = 64           # entries of gone lineages tolerated in a timer's heap before it is pruned


def _lineage(what) -> tuple:
    """What names a lineage in the timers' heaps: a dormant stray's key, else its account's
    root (a dormant stray thawed is alone in a lineage whose root is its key)."""
    return what if isinstance(what, tuple) else what.root

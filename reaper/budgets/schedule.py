"""Who the budgets read when: the awake lineages, the sleeping strays, the scans.

A lineage is awake while its CPU moves (its members are read at every sample); one
whose CPU did not move for a whole window, past its grace and held, over or
terminated by nothing (no kind busy with it: Kind.busy), rests: its members are read
again at a sweep (pulse.py: the cgroup's CPU says something nobody read ran) or by
pulse.QUIET_MAX, and one that is plain sleeps as a dormant record (Book.sleep_small).
/proc is listed when a pid was handed out, after an exec, and every pulse.SCAN_EVERY
seconds. --stray-max-age wakes a sleeping lineage when it comes due (age_due).

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
        self.age_due: list = []                  # heap of [since + max age, n, account or dormant key]
        self.aging: dict = {}                    # lineage (its root, or dormant key) -> its one entry
        self.age_n = 0                           # tie-breaker of age_due's entries
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

    def due(self, now: float) -> list:
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

    def due_age(self, since: float, what, was=None) -> None:
        """what (an account, or a dormant stray's key) is judged when past --stray-max-age.
        One entry per lineage however often it falls asleep (a lineage that naps every
        few seconds for a week must not push one each time): a lineage queued already
        has its entry point at what it is now; was: the account a dormant stray slept
        from (its entry is the stray's now)."""
        limit = self.cfg.stray_max_age
        if limit is None:
            return
        ident = _lineage(what)
        e = self.aging.get(ident)
        if e is None and was is not None and was is not what:
            e = self.aging.get(_lineage(was))
            if e is not None and e[2] is was:
                del self.aging[_lineage(was)]
            else:
                e = None
        if e is not None:
            e[2] = what
            self.aging[ident] = e
            return
        self.age_n += 1
        e = [since + limit, self.age_n, what]
        heappush(self.age_due, e)
        self.aging[ident] = e

    def _prune_aged(self) -> None:
        """The entries of lineages gone before their age came are let go, once they are
        most of the heap (wake_aged): it stays within twice the strays known."""
        dormant_ = self.book.dormant
        keep = [e for e in self.age_due if self.aging.get(_lineage(e[2])) is e
                and (e[2] in dormant_ if isinstance(e[2], tuple) else bool(e[2].members))]
        self.aging = {_lineage(e[2]): e for e in keep}
        heapify(keep)
        self.age_due = keep

    def wake_aged(self, now: float) -> None:
        """The sleeping lineages past --stray-max-age (or about to be): judged now."""
        limit = self.cfg.stray_max_age
        if limit is None:
            return
        book = self.book
        if len(self.age_due) > 2 * (len(book.tracked) + len(book.dormant)) + AGE_SLACK:
            self._prune_aged()
        h = self.age_due
        while h and h[0][0] <= now + self.cfg.budget_interval:
            e = heappop(h)
            a = e[2]
            if self.aging.get(_lineage(a)) is e:
                del self.aging[_lineage(a)]
            if isinstance(a, tuple):
                if a not in self.book.dormant:
                    continue
                a = self.book.thaw(a, "past --stray-max-age").acct
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
            if self.cfg.stray_max_age is not None and now - a.since < self.cfg.stray_max_age:
                self.due_age(a.since, a)

    def _sleeping(self, a, now: float) -> bool:
        if a.use.rate != 0.0 or (self.cpus is not None and now - a.since < self.cfg.budget_grace):
            return False
        if a.duty is not None or a.terminated() or (self.cfg.stray_max_age is not None
                                                    and now - a.since >= self.cfg.stray_max_age):
            return False
        for kind in self.kinds:
            if kind.busy(a):
                return False
        for t in a.members.values():
            if t.term_at is not None or t.cycled or t.read_at != now or (self.cpus is not None and not t.pinned):
                return False
        return True


AGE_SLACK = 64           # entries of gone lineages tolerated in the age heap before it is pruned


def _lineage(what) -> tuple:
    """What names a lineage in the age heap: a dormant stray's key, else its account's
    root (a dormant stray thawed is alone in a lineage whose root is its key)."""
    return what if isinstance(what, tuple) else what.root

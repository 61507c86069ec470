"""The CPU of strays that no sample read, taken from what reaper reaped: exact where it reaps.

Every orphan reaper reaps hands it that process's whole CPU time: wait4()'s rusage, its
own and that of the children it waited for (the C core adds it up for the orphans it
reaps silently, the statistics for those reaped as events: Stats.orphan_cpu_seconds).
What the samples did not count of it is that total less what they read of the orphans
reaper reaped: a member's last moments after its last sample, the members of a lineage
born and gone between two samples (pid hops, however fast), the children a stray waited
for, a stray gone before it could be pinned. ReapedCPU counts that difference in
stray_cpu_seconds as it grows, never twice.

What a member that reaper does not reap was read of goes to the stray that reaps it
(its parent, carry), and counts when that one is reaped. A lineage's CPU includes what
its members reaped (waited): the children a member waits for (a shell loop, make,
xargs, a fork-per-job worker) are counted from its cutime+cstime as they grow, less
what was read of those that were members (carried): a child read once, or never,
counts all the same, its last moments too; what a member reaped before its first read
is not counted. Reaper's children that are not
strays (an orphaned raylet, a --protect'ed orphan; the main child and the services are
reaped as events and never in the total) are read each sample, one stat each, and what
was read of them is taken off: only their last interval would be counted as a stray's.

In `reaper watch` mode reaper reaps nothing of the namespace it watches: there the CPU
a sample missed is estimated (hops.count_unseen).
"""
from __future__ import annotations

from collections.abc import Callable

from reaper.procfs.processes import CLK_TCK, read_stat


class ReapedCPU:
    def __init__(self, total: Callable[[], float]) -> None:
        self.total = total               # CPU seconds of every orphan reaped so far
        self.base = total()              # what was reaped before the budgets started
        self.read = 0.0                  # what the samples read of orphans reaped since (or soon)
        self.counted = 0.0               # what count() added so far
        self.others: dict = {}           # (pid, start) -> CPU seconds read: reaper's children, not strays

    def gone(self, t, tracked: dict, procs: dict, reapers) -> None:
        """Tracked member t is gone (reaped): what the samples read of it (and of the
        members it reaped) is in the total if reaper reaped it, or its parent was gone
        too (t was re-parented to reaper, or its CPU went to a parent reaper reaps);
        a parent stray that lives keeps it until it goes in turn."""
        if t.ppid in reapers or not carry(t, tracked, procs):
            self.read += (t.last_cpu or 0.0) + t.carried

    def read_others(self, table, reaper: int, strays, kept, rescan: bool = True) -> None:
        """One stat of each of reaper's children that is neither a stray nor kept (the
        main child, the services); those gone since the last sample are taken off.
        They are looked for among reaper's children at a rescan (the table was listed
        again), else those found then are read again."""
        seen = {}
        if rescan:
            found = []
            for pid in table.children.get(reaper, ()):
                if pid in kept:
                    continue
                p = table.procs.get(pid)
                if p is not None and (pid, p.start) not in strays:
                    found.append((pid, p.start))
        else:
            found = list(self.others)
        for pid, start in found:
            st = read_stat(pid)
            if st is not None and st[1] == start:
                seen[(pid, start)] = st[4] / CLK_TCK
        for key, cpu in self.others.items():
            if key not in seen:
                self.read += cpu
        self.others = seen

    def count(self) -> float:
        """CPU seconds of reaped strays that no sample read and that were not counted yet."""
        unseen = self.total() - self.base - self.read
        if unseen <= self.counted:
            return 0.0
        new, self.counted = unseen - self.counted, unseen
        return new


def carry(t, tracked: dict, procs: dict) -> bool:
    """Gone member t's CPU as counted (its own, and what it reaped) goes to its parent if
    that lives (its reaper: its cutime grows by it, waited); False if its parent is gone
    (t was re-parented to reaper). A parent that is not a stray (a Ray worker) keeps none."""
    parent = procs.get(t.ppid)
    if parent is None:
        return False
    p = tracked.get((parent.pid, parent.start))
    if p is not None:
        p.carried += (t.last_cpu or 0.0) + t.carried
    return True


def waited(t) -> float:
    """The CPU seconds of the children member t waited for that were not counted yet:
    its cutime+cstime grown since its first read, less what was counted of them
    (carried: the members among them, as read; what this counted before). Counted into
    carried, so never twice; called when every member of its lineage was read at this
    sample (a child found gone and its parent's cutime are then read together)."""
    if t.waited0 is None or t.waited_at is None:
        return 0.0
    cut0, carried0 = t.waited0
    unseen = (t.waited_at - cut0) - (t.carried - carried0)
    if unseen <= 0:
        return 0.0
    t.carried += unseen
    return unseen


def of(scope, stats) -> ReapedCPU | None:
    """A ReapedCPU where reaper reaps the orphans (PID 1, a subreaper), else None."""
    if scope.watch or stats is None:
        return None
    return ReapedCPU(lambda: stats.orphan_cpu_seconds)

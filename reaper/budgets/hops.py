"""A lineage between two samples (lineage.py): what its members do that no sample sees.

A member that forks and exits between two samples (a pid hop) leaves a gap: the CPU it
burnt after its last sample, and whatever its descendants burnt before one of them is
seen. count_unseen estimates it, once per member gone, at the speed measured last:
never more than one interval at that speed. A duty-cycled member's CPU is read each time
the duty cycle stops it (throttle.DutyCycler), so its last moments are mostly measured.

And a duty-cycled member found gone (its stop or its resume met ESRCH) may have forked
first: catch looks at once among reaper's children born since the last sample for its
fork (re-parented to reaper, never exec'd, its group, session and command line: what
lineage.Linker calls a hop) and makes it a member held like its lineage (Kind.joined),
so a fork runs free for a duty period at most, not until the next sample.
"""
from __future__ import annotations

import time

from reaper.budgets.lineage import CLK_TCK, Tracked, read_groups
from reaper.budgets.strays import Stray, kept_cmdline
from reaper.procfs.processes import read_children, read_cmdline, read_stat


def predecessor(t: Tracked, gone: list) -> Tracked | None:
    """The member of t's lineage that vanished lately and was born last before t."""
    before = [g for g in gone if isinstance(g, Tracked) and g.acct is t.acct and g.key[1] <= t.key[1]]
    return max(before, key=lambda g: g.key[1]) if before else None


def count_unseen(stats, t: Tracked, in_stats: bool = True) -> None:
    """A lineage seen again in t, born since the last sample, after t.pred vanished:
    the CPU burnt between pred's last sample and t's birth (pred's last moments, and any
    member born and gone in between) is estimated at the speed measured last: pred's own
    (over its last interval, else since its fork), else its lineage's over the last
    interval, else t's since its fork. Counted in the lineage, and in stats.stray_cpu_seconds
    unless in_stats is False (where reaper reaps the lineage, reaped.py counts it exactly)."""
    pred, t.pred = t.pred, None
    if pred.tail_counted or pred.read_boot is None:
        return
    pred.tail_counted = True
    speed = pred.own_rate()
    if speed is None and pred.newborn:
        speed = _speed(pred.last_cpu, pred.read_boot - pred.key[1])
    if speed is None:
        speed = t.acct.use.last_rate()
    if speed is None:
        speed = _speed(t.last_cpu, t.read_boot - t.key[1])
    gap = max(0, t.key[1] - pred.read_boot) / CLK_TCK
    if speed and gap:
        t.acct.gone_cpu += speed * gap
        if in_stats:
            stats.stray_cpu_seconds += speed * gap


def _speed(cpu: float | None, ticks: int) -> float | None:
    """Cores used: cpu seconds over ticks of life (None for less than 50 ms of it)."""
    if cpu is None or ticks < 0.05 * CLK_TCK:
        return None
    return cpu * CLK_TCK / ticks


def catch(book, kinds: list, act, stats, lost: list, draining: bool) -> None:
    """lost: (key, CPU seconds at its last stop or None, boot ticks then) of duty cycle
    members found gone. Their last CPU is counted; the forks of those of a duty-cycled
    lineage join it (Book.track) and are held at once (Kind.joined). Reads: reaper's
    children, then one stat of each child born since the last sample's scan and not
    looked at yet. book: book.Book; act: the actions door (its duty cycle steps on);
    stats: BudgetStats (the CPU counted)."""
    now = time.monotonic()
    gone = []
    for key, cpu, ticks in lost:
        t = book.tracked.get(key)
        if t is None:
            continue
        if cpu is not None and t.last_cpu is not None and cpu > t.last_cpu:
            stats.stray_cpu_seconds += cpu - t.last_cpu             # what it used to its last stop
            t.last_cpu, t.read_boot = cpu, ticks
        if t.groups is not None and any(kind.cycling(t.acct) for kind in kinds):
            gone.append(t)
    if not gone or draining:
        return
    for reaper in book.finder.reapers():
        for pid in read_children(reaper):
            if book.looked_at(pid):
                continue                     # known to this sample's table, or looked at already
            t = _hop_of(book, pid, gone, now)
            if t is not None:
                for kind in kinds:
                    kind.joined(t, now)
    act.duty.step(now)                       # a new member past its run time this period stops now


def _hop_of(book, pid: int, gone: list, now: float) -> Tracked | None:
    """pid as a new member of the lineage of one of gone, if it is that one's fork."""
    st = read_stat(pid)
    if st is None or st[3] in ("Z", "X"):
        return None
    key = (pid, st[1])
    groups = read_groups(*key)
    if key in book.tracked or groups is None or not groups[2]:
        return None
    cmdline = kept_cmdline(read_cmdline(pid))
    for g in gone:
        if g.groups[:2] == groups[:2] and g.cmdline == cmdline and key[1] >= g.seen_boot:
            return book.track(key, Stray(pid, key[1], st[0], st[2], cmdline, g.reason), now, groups=groups, hop=g)
    return None

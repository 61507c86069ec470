"""Sleeping strays kept small: thousands of them must not make PID 1 big (issue 25).

A tracked stray (lineage.Tracked) costs about 3 KB: its record, its lineage's account,
each budget kind's state of it, a few points of CPU history. A stray that sleeps alone
in its lineage needs none of that: its budgets judge nothing of it until its CPU moves.
So such a stray is kept as a Dormant record instead, about 250 bytes: its identity,
its verdict (name, command line, why a stray, groups, parent: one copy shared among
copies of one program) and its figures packed in one bytes object.

A stray is dormant from its first sample when it opens a lineage of its own that needs
nothing more (a plain new stray), or once its lineage, a plain one of one member, rests
(enforcer._rest: its CPU did not move over a window). What "plain" means is
Enforcer.may_sleep_small's: no action beyond observe taken, no cgroup, no duty
cycle, no SIGTERM, every kind's state as a new lineage's, leading no process group or
session of its lineage, under its memory budget, and no budget of all strays together
on (those judge every lineage at every sample).

A dormant stray is read (one /proc/PID/stat) at a sweep (pulse.py: the cgroup's CPU
says something nobody read ran) and at least every pulse.QUIET_MAX seconds; a read
that finds its CPU moved (or it running) thaws it: it is a tracked stray again, its
lineage as it was (first sight, CPU, flags), read at once and awake. So is one that
anything needs as a tracked stray: a new stray whose parent or session it is
(lineage.Linker), one that exec'd or vanished (the scan), one past its max age.
"""
from __future__ import annotations

import struct
import sys
import time
from typing import Optional

from reaper.budgets.lineage import Tracked
from reaper.budgets.strays import Stray

# since, read_at, base, last_cpu, gone_cpu, carried (seconds); rss, mem, read_boot (-1: none); flags
_NUMS = struct.Struct("<6d4q")
NEWBORN, NICED, PINNED, RESTED, TAIL_COUNTED = 1, 2, 4, 8, 16


class Dormant:
    """One sleeping stray: its key, what it shares with its copies (its verdict: name,
    command line, why a stray, groups, parent, action taken) and its figures, packed."""

    __slots__ = ("key", "verdict", "nums")

    def __init__(self, key: tuple, verdict: tuple, nums: bytes) -> None:
        self.key, self.verdict, self.nums = key, verdict, nums

    comm = property(lambda self: self.verdict[0])
    cmdline = property(lambda self: self.verdict[1])
    reason = property(lambda self: self.verdict[2])
    groups = property(lambda self: self.verdict[3])
    ppid = property(lambda self: self.verdict[4])
    action = property(lambda self: self.verdict[5])

    def figures(self) -> tuple:
        """(since, read_at, base, last_cpu, gone_cpu, carried, rss, mem, read_boot, flags)"""
        return _NUMS.unpack(self.nums)

    @property
    def last_cpu(self) -> float:
        return _NUMS.unpack_from(self.nums)[3]

    @property
    def rss(self) -> int:
        return _NUMS.unpack_from(self.nums)[6]

    @property
    def mem(self) -> int:
        m = _NUMS.unpack_from(self.nums)[7]
        return 0 if m < 0 else m

    def with_memory(self, rss: int, mem: Optional[int]) -> None:
        f = list(self.figures())
        f[6], f[7] = rss, -1 if mem is None else mem
        self.nums = _NUMS.pack(*f)


class Shared:
    """One copy of each verdict (name, command line, reason, groups, parent, action)
    among the dormant strays: leaked copies of one program share it. Rebuilt from the
    live records when it holds twice as many as there are records."""

    def __init__(self) -> None:
        self.verdicts: dict = {}

    def verdict(self, v: tuple) -> tuple:
        return self.verdicts.setdefault(v, v)

    def prune(self, records) -> None:
        if len(self.verdicts) > 2 * len(records) + 64:
            self.verdicts = {}
            for d in records:
                d.verdict = self.verdict(d.verdict)


def pack(since: float, read_at: float, base: float, last_cpu: float, gone_cpu: float, carried: float,
         rss: Optional[int], mem: Optional[int], read_boot: Optional[int], flags: int) -> bytes:
    return _NUMS.pack(since, read_at, base, last_cpu, gone_cpu, carried, -1 if rss is None else rss,
                      -1 if mem is None else mem, -1 if read_boot is None else read_boot, flags)


def freeze(t: Tracked, shared: Shared) -> Dormant:
    """t, alone in its lineage and plain (Enforcer.may_sleep_small), as a Dormant record."""
    a = t.acct
    flags = ((NEWBORN if t.newborn else 0) | (NICED if t.niced else 0) | (PINNED if t.pinned else 0)
             | (RESTED if a.use.rate == 0.0 else 0) | (TAIL_COUNTED if t.tail_counted else 0))
    nums = pack(a.since, t.read_at or 0.0, t.base, t.last_cpu or 0.0, a.gone_cpu, t.carried, t.rss,
                t.use.mem, t.read_boot, flags)
    verdict = (sys.intern(t.comm), sys.intern(t.cmdline), t.reason, t.groups, t.ppid, t.action)
    return Dormant(t.key, shared.verdict(verdict), nums)


def thaw(d: Dormant, handle, kinds: list, seen_boot: int, seen_before: int) -> Tracked:
    """d as a tracked stray again, alone in a lineage as it was: first sight, CPU, flags;
    a lineage that rested has rested (its rate is 0 and one point of history is kept)."""
    since, read_at, base, last_cpu, gone_cpu, carried, rss, mem, read_boot, flags = d.figures()
    key = d.key
    stray = Stray(key[0], key[1], d.ppid, d.comm, d.cmdline, d.reason)
    t = Tracked(key, stray, handle, since, kinds, None, d.groups, bool(flags & NEWBORN))
    a = t.acct
    a.since_wall = time.time() - (time.monotonic() - since)
    a.gone_cpu = gone_cpu
    t.base, t.last_cpu, t.read_at, t.carried = base, last_cpu, read_at, carried
    t.rss = None if rss < 0 else rss
    t.use.mem = None if mem < 0 else mem
    t.read_boot = None if read_boot < 0 else read_boot
    t.niced, t.pinned, t.tail_counted = bool(flags & NICED), bool(flags & PINNED), bool(flags & TAIL_COUNTED)
    t.action = d.action
    t.seen_boot, t.seen_before = seen_boot, seen_before
    t.read_seq = -1                      # read before, not at any sample of this run's count
    if flags & RESTED:
        a.use.rate = a.use.demand = 0.0
    a.use.hist = [(read_at, a.cpu(), max(0.0, read_at - since))]
    return t


def row_figures(d: Dormant) -> tuple:
    """(memory bytes, since as wall time) for d's row in the stray list."""
    f = d.figures()
    return (0 if f[7] < 0 else f[7]), time.time() - (time.monotonic() - f[0])


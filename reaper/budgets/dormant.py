"""Sleeping strays kept small: thousands of them must not make PID 1 big (issue 25).

A tracked stray (lineage.Tracked) costs about 3 KB: its record, its lineage's account,
each budget kind's state of it, a few points of CPU history. A stray that sleeps alone
in its lineage needs none of that: its budgets judge nothing of it until its CPU moves.
So such a stray is kept as one packed record instead, about 120 bytes, by pid (its
start time in it: the record of a reused pid is not the new process's): its figures,
a digest of its command line, and the number of its verdict (name, why a stray,
groups, parent, action taken), of which one copy is kept for all the strays that share
it. Its command line itself is not kept (read again when it is tracked again): what
a dormant stray costs does not depend on the command line it chose (issue 33.6).

A stray is dormant from its first sample when it opens a lineage of its own that needs
nothing more (a plain new stray), or once its lineage, a plain one of one member, rests
(Schedule.rest: its CPU did not move over a window). What "plain" means is
may_keep's: no action beyond observe taken, no cgroup, no duty cycle, no SIGTERM,
every kind's state as a new lineage's with nothing left for it to do (Kind.done_with:
under throttle, the memory budget moves each lineage into a memory cgroup when it
first judges it), leading no process group or session of its lineage, under its
memory budget, and no budget of all strays together on (those judge every lineage at
every sample).

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
from collections.abc import Iterator

# _heapq: heapq's C functions without heapq.py (its pure-Python fallbacks cost PID 1 memory).
from _heapq import heappush, heappushpop

from reaper.budgets.lineage import Tracked
from reaper.budgets.strays import Stray, kept_cmdline
from reaper.procfs.processes import read_cmdline
from reaper.stats import TOP_STRAYS

# start ticks, verdict number, flags; since, read_at, base, last_cpu, gone_cpu, carried
# (seconds); rss and private memory (KiB, NONE: unknown); read_boot (ticks, -1: none);
# the command line's digest (cmdline_digest)
_PACKED = struct.Struct("<qIB6dIIqQ")
_START = struct.Struct("<q")
_HEAD = struct.Struct("<qI")
NONE = 0xFFFFFFFF
NEWBORN, NICED, PINNED, RESTED, TAIL_COUNTED = 1, 2, 4, 8, 16


class Dormant:
    """One dormant stray as read from its record (made when asked for, not kept)."""

    __slots__ = ("key", "verdict", "figures")

    def __init__(self, key: tuple, verdict: tuple, figures: tuple) -> None:
        self.key, self.verdict, self.figures = key, verdict, figures

    comm = property(lambda self: self.verdict[0])
    reason = property(lambda self: self.verdict[1])
    groups = property(lambda self: self.verdict[2])
    ppid = property(lambda self: self.verdict[3])
    action = property(lambda self: self.verdict[4])
    digest = property(lambda self: self.figures[12])

    def same_cmdline(self, cmdline: str) -> bool:
        """cmdline (as strays.Finder keeps it) is the one it had when it fell asleep."""
        return cmdline_digest(cmdline) == self.digest
    since = property(lambda self: self.figures[3])
    last_cpu = property(lambda self: self.figures[6])
    rss = property(lambda self: _bytes(self.figures[9]))
    mem = property(lambda self: _bytes(self.figures[10]) or 0)


def cmdline_digest(cmdline: str) -> int:
    """What a dormant record keeps of its command line: str's hash (keyed afresh at every
    start), 64 bits."""
    return hash(cmdline) & 0xFFFFFFFFFFFFFFFF


def _kib(n: int | None) -> int:
    return NONE if n is None else min(NONE - 1, (n + 1023) >> 10)


def _bytes(kib: int) -> int | None:
    return None if kib == NONE else kib << 10


class Records:
    """The dormant strays: (pid, start) -> Dormant, as a dict is asked (in, get, pop,
    iteration, len), kept as pid -> packed bytes, verdicts counted by use."""

    def __init__(self) -> None:
        self.by_pid: dict = {}           # pid -> _PACKED bytes
        self.verdicts: list = []         # number -> verdict tuple, or None once unused
        self.numbers: dict = {}          # verdict -> number
        self.uses: list = []             # number -> records that use it
        self.free: list = []             # numbers unused

    def __len__(self) -> int:
        return len(self.by_pid)

    def __contains__(self, key) -> bool:
        b = self.by_pid.get(key[0])
        return b is not None and _START.unpack_from(b)[0] == key[1]

    def __iter__(self) -> Iterator[tuple]:
        """The keys, one at a time (records may be taken out meanwhile)."""
        for pid in list(self.by_pid):
            b = self.by_pid.get(pid)
            if b is not None:
                yield pid, _START.unpack_from(b)[0]

    def _view(self, pid: int, b: bytes) -> Dormant:
        f = _PACKED.unpack(b)
        return Dormant((pid, f[0]), self.verdicts[f[1]], f)

    def comm(self, key) -> str | None:
        """The name of key's record (one short unpack), or None if there is none."""
        b = self.by_pid.get(key[0])
        if b is None:
            return None
        start, n = _HEAD.unpack_from(b)
        return self.verdicts[n][0] if start == key[1] else None

    def get(self, key) -> Dormant | None:
        return self._view(key[0], self.by_pid[key[0]]) if key in self else None

    def values(self) -> Iterator[Dormant]:
        """The records, one at a time (records may be taken out meanwhile): thousands of
        them are never all made at once."""
        for pid in list(self.by_pid):
            b = self.by_pid.get(pid)
            if b is not None:
                yield self._view(pid, b)

    def pop(self, key) -> Dormant:
        d = self.get(key)
        if d is None:
            raise KeyError(key)
        del self.by_pid[key[0]]
        n = d.figures[1]
        self.uses[n] -= 1
        if not self.uses[n]:
            del self.numbers[self.verdicts[n]]
            self.verdicts[n] = None
            self.free.append(n)
        return d

    def put(self, t: Tracked) -> None:
        """t, alone in its lineage and plain (may_keep), kept as a record."""
        old = self.by_pid.get(t.key[0])
        if old is not None:
            self.pop((t.key[0], _START.unpack_from(old)[0]))     # its pid's last holder, gone
        a = t.acct
        flags = ((NEWBORN if t.newborn else 0) | (NICED if t.niced else 0) | (PINNED if t.pinned else 0)
                 | (RESTED if a.use.rate == 0.0 else 0) | (TAIL_COUNTED if t.tail_counted else 0))
        n = self._number((sys.intern(t.comm), t.reason, t.groups, t.ppid, t.action))
        self.by_pid[t.key[0]] = _PACKED.pack(
            t.key[1], n, flags, a.since, t.read_at or 0.0, t.base, t.last_cpu or 0.0, a.gone_cpu, t.carried,
            _kib(t.rss), _kib(t.use.mem), -1 if t.read_boot is None else t.read_boot, cmdline_digest(t.cmdline))

    def set_memory(self, key, rss: int, mem: int | None) -> None:
        f = list(_PACKED.unpack(self.by_pid[key[0]]))
        f[9], f[10] = _kib(rss), _kib(mem)
        self.by_pid[key[0]] = _PACKED.pack(*f)

    def _number(self, verdict: tuple) -> int:
        n = self.numbers.get(verdict)
        if n is None:
            if self.free:
                n = self.free.pop()
                self.verdicts[n] = verdict
                self.uses[n] = 0
            else:
                n = len(self.verdicts)
                self.verdicts.append(verdict)
                self.uses.append(0)
            self.numbers[verdict] = n
        self.uses[n] += 1
        return n


def thaw(d: Dormant, handle, kinds: list, seen_boot: int, seen_before: int) -> Tracked:
    """d as a tracked stray again, alone in a lineage as it was: first sight, CPU, flags;
    a lineage that rested has rested (its rate is 0 and one point of history is kept)."""
    _, _, flags, since, read_at, base, last_cpu, gone_cpu, carried, rss, mem, read_boot, _ = d.figures
    key = d.key
    # Its command line read again (not kept while it slept); an exec since is the scan's to see.
    stray = Stray(key[0], key[1], d.ppid, d.comm, sys.intern(kept_cmdline(read_cmdline(key[0]))), d.reason)
    t = Tracked(key, stray, handle, since, kinds, None, d.groups, bool(flags & NEWBORN))
    a = t.acct
    a.since_wall = time.time() - (time.monotonic() - since)
    a.gone_cpu = gone_cpu
    t.base, t.last_cpu, t.read_at, t.carried = base, last_cpu, read_at, carried
    t.rss, t.use.mem = _bytes(rss), _bytes(mem)
    t.read_boot = None if read_boot < 0 else read_boot
    t.niced, t.pinned, t.tail_counted = bool(flags & NICED), bool(flags & PINNED), bool(flags & TAIL_COUNTED)
    t.action = d.action
    t.seen_boot, t.seen_before = seen_boot, seen_before
    t.read_seq = -1                      # read before, not at any sample of this run's count
    if flags & RESTED:
        a.use.rate = a.use.demand = 0.0
    a.use.hist = [(read_at, a.cpu(), max(0.0, read_at - since))]
    return t


def since_wall(d: Dormant) -> float:
    """When d's lineage was first seen, as wall time (its row in the stray list)."""
    return time.time() - (time.monotonic() - d.since)


def may_keep(book, a) -> bool:
    """Lineage a (book's: book.Book), resting or new, can be kept as a dormant record:
    alone in its lineage, and nothing holds, marks or will judge it but what a new
    lineage has."""
    if not book.small or len(a.members) != 1 or a.duty is not None or not a.plain():
        return False
    t = a.first()
    if (t.refused is not None or t.term_at is not None or t.cycled or t.killed or t.placed or t.pred is not None
            or t.action not in ("none", "observe") or (book.cpus is not None and not t.pinned)):
        return False
    for gid in dict.fromkeys(t.groups[:2] if t.groups else ()):
        e = book.linker.led.get(gid)
        if gid == t.key[0] or (e is not None and e[1] is a):
            return False                 # its groups name its lineage (Linker: group, session)
    if any(u is t for u in book.unlinked):
        return False                     # a hop may join it at the next sample
    for kind in book.kinds:
        if not kind.done_with(a) or not _as_new(a.kinds.get(kind.reason), kind):
            return False
    return True


class Known:
    """The strays the enforcer knows, tracked or dormant, as the linker and reaped.py
    ask for them: get() thaws a dormant one (it is needed as a tracked one: a parent,
    a session's maker); `in` does not."""

    __slots__ = ("book",)

    def __init__(self, book) -> None:
        self.book = book

    def get(self, key, default=None):
        book = self.book
        t = book.tracked.get(key)
        if t is None:
            t = book.ghosts.get(key)
        if t is None and key in book.dormant:
            t = book.thaw(key, "a new stray's parent or session")
        return default if t is None else t

    def __contains__(self, key) -> bool:
        return key in self.book.tracked or key in self.book.dormant

    def comm(self, key) -> str | None:
        """The name key's record holds (tracked or dormant, thawing nothing), or None."""
        t = self.book.tracked.get(key)
        return self.book.dormant.comm(key) if t is None else t.comm


def _as_new(state, kind) -> bool:
    """A kind's state of a lineage is as a new lineage's (nothing to keep but defaults)."""
    if state is None:
        return True
    fresh = kind.state(None)
    return all(getattr(state, f) == getattr(fresh, f) for f in type(state).__slots__)


def top(records: Records) -> list:
    """The records holding most memory (Stats.TOP_STRAYS of them), the most first: the
    dormant strays the stray list shows (they use no CPU)."""
    top: list = []                       # (memory, n, record): the least first
    for n, d in enumerate(records.values()):
        if len(top) < TOP_STRAYS:
            heappush(top, (d.mem, n, d))
        elif d.mem > top[0][0]:
            heappushpop(top, (d.mem, n, d))
    return [d for _, _, d in sorted(top, reverse=True)]

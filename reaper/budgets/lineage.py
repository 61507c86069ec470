"""Lineages: a stray and its descendants share one account, so that forking and
letting the parent exit (pid hopping) starts nothing afresh.

A stray's account (Account) holds what its budgets judge: when it was first seen
(its grace and its age: the oldest ancestor's), the CPU its members used (those gone
included), what each budget kind keeps of it (kinds/*.py: its cgroups, its duty
fraction, whether it is over) and the SIGTERM it was sent. Every process reaper
tracks (enforcer.Tracked) is a member of one account; a new stray joins the account
of the first rule that links it (Linker.find), else opens its own:

    parent   its parent is a stray reaper tracks ((pid, start) of the parent, read
             from the table this sample: a reused pid has another start);
    cgroup   it is in a cgroup reaper made for one lineage (a child forked in a
             cgroup is in it already): read only while reaper holds such cgroups;
    group    its process group or session is one a stray of the lineage leads (as
             first seen). The kernel never hands out a pid still in use as a group or
             session id, so the id names that group for as long as a member of the
             lineage is in it; a live leader is checked by its start time all the same;
    session  its session's id is the pid of a member, alive (checked by its start
             time) or vanished in the last two samples: a session is entered only by
             birth, so it descends from the member that made it (setsid), whenever
             that member did;
    hop      its parent is gone (it was re-parented to reaper), it has not exec'd
             since its fork (the kernel's PF_FORKNOEXEC task flag) and, within a
             sample of one where a member of a lineage vanished, it appeared, born
             after the last sample that saw that member (its start time), in the
             same process group and session and with the same command line (what
             fork() leaves), and no member of another lineage that vanished then
             would match as well. A new orphan of the main tree has exec'd its
             program: never a hop. A fork-copy that opened a lineage of its own
             while the member it hopped from still lived (descheduled between its
             fork and its exit) joins that member's lineage at the next sample, if
             the member is gone by then (Book._late_hops).

What cannot be linked: a member born and gone between two samples that leaves its
group and session (setsid), or execs, or changes its command line, before a sample
sees its descendant, in a lineage that holds no cgroup; a double fork whose middle
process exits at once while the first lives on past the next sample; nor the hops of
two lineages that look alike (forks of one program in one group) ending in the same
interval. A
hop is recognised by coincidence: a forked, never exec'd orphan of the same command
line, group and session, born in the very interval in which a member of exactly one
such lineage died, joins that lineage (and its age) though it is not its descendant.
"""
from __future__ import annotations

import os
import time

from reaper.procfs.processes import stat_fields

CLK_TCK = os.sysconf("SC_CLK_TCK")


def boot_ticks() -> int:
    """Now, in the clock ticks after boot that /proc/PID/stat's start time counts in."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * CLK_TCK)


PF_FORKNOEXEC = 0x40     # task flag: forked, and has not exec'd since


def read_groups(pid: int, start: int) -> tuple | None:
    """(process group, session, forked but not exec'd since) of pid if it is still the
    process that started at start; None if gone or unreadable. One short read of
    /proc/PID/stat (fields 5, 6 and the task flags, 9)."""
    st = stat_fields(pid, maxsplit=21)
    if st is None:
        return None
    f = st[1]
    try:
        if int(f[19]) != start:
            return None
        return int(f[2]), int(f[3]), bool(int(f[6]) & PF_FORKNOEXEC)
    except (IndexError, ValueError):
        return None


class Usage:
    """CPU time over the window (of one process, or of a lineage), and private memory."""

    __slots__ = ("hist", "rate", "demand", "mem", "cow")

    def __init__(self) -> None:
        self.hist: list = []             # (t, cpu seconds, run seconds)
        self.rate: float | None = None       # cores used, averaged over the window
        self.demand: float | None = None     # cores it would use if never stopped
        self.mem: int | None = None      # private memory at the last sample, bytes (Handle.private_memory)
        self.cow = 0                     # what it shares copy-on-write besides (Handle.memory): its own once
                                         # the sharers free it, its RSS unmoved (reader.Reader.cow_due)

    def add(self, now: float, cpu: float, run: float, window: float, interval: float) -> None:
        """A sample: its CPU seconds, and the seconds it was let run since first seen.
        After a rest (not read for longer than the window), its CPU at the window's start
        is taken as at its last read: what it used since counts in the window (an upper
        bound: a sleeper that wakes is judged no later than if it had been read)."""
        if len(self.hist) == 1 and self.hist[0][0] < now - window:
            t0, c0, r0 = self.hist[0]
            self.hist[0] = (now - window, c0, max(r0, run - window))
        self.hist.append((now, cpu, run))
        drop = 0
        while len(self.hist) - drop > 2 and self.hist[drop + 1][0] <= now - window:
            drop += 1
        if drop:
            del self.hist[:drop]
        t0, c0, r0 = self.hist[0]
        if now - t0 >= min(window, interval) * 0.5 and len(self.hist) > 1:
            self.rate = (cpu - c0) / (now - t0)
            self.demand = (cpu - c0) / (run - r0) if run - r0 > 1e-3 else self.rate

    def rest(self, now: float, window: float, since: float) -> None:
        """It did not move over the window: one point is all it keeps (its CPU was the
        same since the window's start, or since it was first seen)."""
        if self.hist:
            t, c, r = self.hist[-1]
            back = min(window, now - since)
            self.hist = [(t - back, c, max(0.0, r - back))]

    def last_rate(self) -> float | None:
        """Cores used between the last two samples; None before there are two."""
        if len(self.hist) < 2:
            return None
        (t0, c0, _), (t1, c1, _) = self.hist[-2], self.hist[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else None


class Account:
    """One lineage: what its members share. kinds: what each budget kind keeps of it."""

    __slots__ = ("root", "since", "since_wall", "members", "use", "gone_cpu", "duty", "_terms", "_escapes",
                 "_settled", "kinds")

    def __init__(self, root: tuple, since: float, on: list, stray) -> None:
        self.root = root                 # (pid, start) of the first member seen
        self.since = since               # monotonic: its first member's first sample
        self.since_wall = time.time()
        self.members: dict = {}          # key -> Tracked: the live members
        self.use = Usage()               # the lineage's CPU (every member's, the gone ones' too)
        self.gone_cpu = 0.0              # CPU counted of members gone
        self.duty = None                 # throttle.DutyCycler.Group: its members' stops, once made
        # Made on first use (most lineages never need them): terms, escapes, settled.
        self._terms = self._escapes = self._settled = None
        self.kinds = {k.reason: k.state(stray) for k in on}

    @property
    def terms(self) -> dict:
        """reason -> (monotonic, boot ticks) of its first SIGTERM."""
        if self._terms is None:
            self._terms = {}
        return self._terms

    @property
    def escapes(self) -> dict:
        """reason -> times a member left the cgroup it belongs in."""
        if self._escapes is None:
            self._escapes = {}
        return self._escapes

    @property
    def settled(self) -> dict:
        """reason -> since when every member has been in that cgroup."""
        if self._settled is None:
            self._settled = {}
        return self._settled

    def plain(self) -> bool:
        """No SIGTERM sent, no escape counted, no cgroup settled in (dormant.may_keep)."""
        return not (self._terms or self._escapes or self._settled)

    def terminated(self) -> bool:
        """A SIGTERM was sent to a member."""
        return bool(self._terms)

    def cpu(self) -> float:
        """CPU the lineage used, as far as reaper saw it."""
        return self.gone_cpu + sum(t.last_cpu - t.base for t in self.members.values() if t.last_cpu is not None)

    def first(self):
        """The member that names the lineage in a log line: its oldest live one."""
        return next(iter(self.members.values()), None)

    def busiest(self):
        """The member that used the most CPU between its last two reads (the one a warning
        names: the lineage's work may be done by any member); its oldest if none was read twice."""
        best, most = self.first(), -1.0
        for t in self.members.values():
            r = t.own_rate()
            if r is not None and r > most:
                best, most = t, r
        return best

    def biggest(self):
        """The member that holds the most memory at its last read (the one a memory warning
        names); the oldest if none was read."""
        best, most = self.first(), -1
        for t in self.members.values():
            if t.use.mem is not None and t.use.mem > most:
                best, most = t, t.use.mem
        return best

    def leave(self, t) -> None:
        """t is no longer a member: what it used stays counted."""
        if self.members.pop(t.key, None) is not None and t.last_cpu is not None:
            self.gone_cpu += t.last_cpu - t.base


class Tracked:
    """One stray, pinned by (pid, start) (handle: procctl.Handle): what the enforcer
    knows of it and did to it. What it shares with its lineage (its first sight, the
    CPU, what each budget kind keeps: kinds[reason]) is its account, acct."""

    __slots__ = ("key", "handle", "comm", "cmdline", "reason", "groups", "newborn", "acct", "use", "base",
                 "last_cpu", "read_at", "prev", "action", "refused", "niced", "pinned", "cycled", "term_at",
                 "term_reason", "killed", "placed", "read_boot", "seen_boot", "seen_before", "tail_counted",
                 "pred", "ppid", "carried", "waited_at", "waited0", "read_seq", "rss", "row")

    def __init__(self, key, stray, handle, now: float, on: list, acct: "Account | None" = None,
                 groups: tuple | None = None, newborn: bool = False) -> None:
        self.key = key
        self.handle = handle
        self.comm = stray.comm
        self.cmdline = stray.cmdline
        self.reason = stray.reason
        self.groups = groups             # (process group, session, forked and not exec'd) when first seen
        self.newborn = newborn           # born after the previous sample: all its CPU is a stray's
        self.acct = acct if acct is not None else Account(key, now, on, stray)
        self.acct.members[key] = self
        self.use = Usage()               # its private memory (its CPU is its lineage's: acct.use)
        self.base = 0.0                  # CPU it had used before it was a stray (not counted)
        self.last_cpu: float | None = None
        self.read_at: float | None = None        # when last_cpu was read (monotonic)
        self.prev: tuple | None = None           # (when, CPU) of the read before
        self.action = "none"             # the strongest response applied so far
        self.refused: "OSError | None" = None    # procctl.NotPermitted, once reaper may not act on it
        self.niced = False
        self.pinned = False              # --stray-cpus affinity set
        self.cycled = False              # in the duty cycle (SIGSTOP/SIGCONT)
        self.term_at: float | None = None
        self.term_reason: str | None = None      # what its SIGTERM was for: a kind's reason
        self.killed = False
        self.placed: dict = {}           # reason -> the cgroup it was found in or moved into
        self.read_boot: int | None = None        # boot ticks of the sample that last read its CPU
        self.seen_boot = 0               # boot ticks of the last sample that found it
        self.seen_before = 0             # ... and of the one before that
        self.tail_counted = False        # the CPU its descendants burnt unseen was estimated once
        self.pred: "Tracked" | None = None       # the member gone before it was born: hops.count_unseen
        self.ppid = stray.ppid           # its parent at the last sample: who reaps it (reaped.py)
        self.carried = 0.0               # CPU counted of what it reaped: members read, the rest (reaped.py)
        self.waited_at: float | None = None      # CPU of the children it waited for (cutime+cstime), last read
        self.waited0: tuple | None = None        # (waited_at, carried) at its first read: reaped.waited
        self.read_seq = 0                # the enforcer's sample that read it last (0: never)
        self.rss: int | None = None      # its RSS at that read: private memory is read again when it moves
        self.row: dict | None = None     # its entry in the stray list (Stats.stray_list)

    def own_rate(self) -> float | None:
        """Cores it used between its last two reads; None before there are two."""
        if self.prev is None or self.read_at is None or self.read_at <= self.prev[0]:
            return None
        return (self.last_cpu - self.prev[1]) / (self.read_at - self.prev[0])

    @property
    def since(self) -> float:
        """Its lineage's first sample: its grace and age count from there."""
        return self.acct.since

    @property
    def since_wall(self) -> float:
        return self.acct.since_wall

    @property
    def kinds(self) -> dict:
        return self.acct.kinds


def lineages(members) -> list:
    """The accounts of members (Tracked), each once, in the members' order."""
    seen, out = set(), []
    for t in members:
        a = t.acct
        if id(a) not in seen:
            seen.add(id(a))
            out.append(a)
    return out


def who(t) -> str:
    """A member as a log line names it: pid, name, why a stray, and its lineage's root."""
    root = t.acct.root
    of = "" if root == t.key else f", lineage of {root[0]}"
    return f"stray {t.key[0]} ({t.comm}, {t.reason}{of})"


def hop_from(start: int, cmdline: str, groups: tuple, gone, seen=lambda g: g.seen_boot):
    """The member (of gone: lists, the latest first) a fork-copy born at start, with
    cmdline and groups (read_groups'), is a hop of; None if none, or if members of more
    than one lineage would do (forks of one main-tree process that come and go in waves,
    each its own lineage, are not chained). seen(g): boot ticks it must be born after."""
    if not groups[2]:
        return None                      # exec'd since its fork
    for vanished in gone:
        hops = [g for g in vanished if g.groups is not None and g.groups[:2] == groups[:2]
                and g.cmdline == cmdline and start >= seen(g)]
        if not hops:
            continue
        if len({id(g.acct) for g in hops}) == 1:
            return max(hops, key=lambda g: g.key[1])
        return None
    return None


def join(t, acct) -> None:
    """Moves t, alone in a lineage of its own, into acct (a hop found a sample late)."""
    t.acct.members.pop(t.key, None)
    t.acct = acct
    acct.members[t.key] = t


class Ghost:
    """A stray the scan found that was gone before it could be pinned (Handle), in a
    lineage: its descendants (by parent, or by a hop) still find that lineage."""

    def __init__(self, key, acct, groups, cmdline: str, seen_boot: int) -> None:
        self.key, self.acct, self.groups, self.cmdline, self.seen_boot = key, acct, groups, cmdline, seen_boot
        self.placed: dict = {}
        self.read_boot = None            # its CPU was never read: nothing to estimate from
        self.tail_counted = True


class Linker:
    """Finds the account a new stray belongs to (the module's rules)."""

    def __init__(self) -> None:
        self.led: dict = {}              # group or session id -> (leader key, Account)
        self.prev_boot: int | None = None      # boot ticks at the previous sample's scan

    def find(self, stray, groups, table, known, gone: tuple, reapers, in_leaf, lost=frozenset()) -> tuple:
        """(Account or None, rule, via): the account stray joins, by which rule, through
        which member (its parent, or the one that vanished before a hop; None
        otherwise). groups: read_groups' (pgrp, sid, forked) or None; known: key ->
        Tracked or Ghost of this sample; gone: the members that vanished at this sample,
        and at the one before; in_leaf(): the account whose cgroup holds it (read on
        demand), or None; lost: the keys of strays this scan found that were gone
        before they could be pinned (a parent that ended since the scan)."""
        parent = table.procs.get(stray.ppid)
        if parent is not None and parent.start <= stray.start:
            t = known.get((parent.pid, parent.start))
            if t is not None:
                return t.acct, "parent", t
        a = in_leaf()
        if a is not None and a.members:
            return a, "cgroup", None
        if groups is None:
            return None, "", None
        for gid in dict.fromkeys(groups[:2]):
            entry = self.led.get(gid)
            if entry is None:
                continue
            (lpid, lstart), a = entry
            leader = table.procs.get(gid)
            if (leader is None or leader.start == lstart) and lstart <= stray.start:
                return a, "group", None
        # A session is only ever entered by birth: its id is the pid of the member that
        # made it (setsid), alive or gone lately, even if it did so after it was first seen.
        sid = groups[1]
        leader = table.procs.get(sid)        # (a zombie leader is still in the table)
        maker = known.get((sid, leader.start)) if leader is not None else None
        if maker is None:
            maker = next((g for vanished in gone for g in vanished if g.key[0] == sid
                          and (leader is None or leader.start == g.key[1])), None)
        if maker is not None and maker.key[1] <= stray.start:
            self.led[sid] = (maker.key, maker.acct)     # the session names the lineage from now on
            return maker.acct, "session", None
        orphaned = stray.ppid in reapers or (parent is not None and (parent.pid, parent.start) in lost)
        if orphaned:
            g = hop_from(stray.start, stray.cmdline, groups, gone, lambda g: g.seen_boot)
            if g is not None:
                return g.acct, "hop", g
        return None, "", None

    def note(self, t) -> None:
        """A new member: the groups it leads name its lineage from now on."""
        for gid in dict.fromkeys(t.groups[:2] if t.groups else ()):
            if gid == t.key[0]:
                self.led[gid] = (t.key, t.acct)

    def prune(self, tracked: dict) -> None:
        """Keeps a group only while a live member of its lineage is in it (as first seen):
        then its id cannot have been handed to another process."""
        held = {(id(t.acct), gid) for t in tracked.values() for gid in (t.groups[:2] if t.groups else ())}
        self.led = {gid: e for gid, e in self.led.items() if (id(e[1]), gid) in held}

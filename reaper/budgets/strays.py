"""Which processes are strays.

A stray is a live process that is (1) outside the trees reaper keeps (the main
child's and every supervised process's): an adopted orphan and everything
below it; (2) with Ray-aware detection, below a Ray worker whose title is
exactly ``ray::IDLE`` (its task returned, the child outlived it); (3) matched
by --stray-match. Never: reaper itself, PID 1, a process entered from outside
the namespace (ppid 0), Ray's own processes (told by their executable and
script: reaper/budgets/ray.py, never by a name), the children of a real raylet
(Ray's workers and agents), anything matched by --protect. An orphaned raylet
(`ray start` without --block) does not make its tree an orphan's: below it only
rule (2) finds strays. --no-ray-aware turns
off rule (2) only: Ray's own processes are never strays.

In ``reaper watch`` mode reaper is nobody's ancestor: the orphans are the
processes re-parented to PID 1 of the namespace and everything below them.
"""
from __future__ import annotations

import os
import sys
import time
from collections import namedtuple

from reaper import scope as scopes
from reaper.budgets.ray import UNDECIDED, RayProcesses
from reaper.procfs.processes import Proc, ProcTable, read_cmdline, read_comm, read_stat

RAY_IDLE = "ray::IDLE"
KNOWN = None             # find(): a stray the enforcer keeps, its verdict unchanged
REJUDGE_EVERY = 300.0    # seconds: a stray's command line is read again at least this often
# New processes judged per find: JUDGE_EACH at least, more while JUDGE_TIME lasts (each
# reads /proc and may ask ray.py: about 0.2 ms, more on a loaded node). A burst of
# thousands is taken over a few samples, the loop free to reap between them (issue
# 33.12); the rest are judged at the next scans (behind).
JUDGE_EACH = 128
JUDGE_TIME = 0.05
# Characters of a command line reaper keeps of a stray (its verdict, its lineage's hop rule):
# a longer one is kept as its start and a digest of the whole, so that what reaper holds per
# stray never depends on what the stray chooses (reaper reads up to 8 KB; issue 33.6).
CMDLINE_KEPT = 256


class Stray(namedtuple("Stray", "pid start ppid comm cmdline reason")):
    # start: clock ticks after boot ((pid, start) is the identity); reason: orphan,
    # ray-idle or match. collections' namedtuple: typing's would cost PID 1 its memory.
    __slots__ = ()


class Finder:
    def __init__(self, cfg, scope) -> None:
        self.scope = scope
        self.match = _compiled(cfg.stray_match)
        self.protect = _compiled(cfg.protect)
        self.ray_aware = cfg.ray_aware
        self.ray = RayProcesses()
        self.ray_seen = False            # a raylet was found at some point
        self.ray_kept = 0                # entries of ray.cache after its last prune
        self.judged: dict = {}           # (pid, start) -> _judge(): verdicts of this scan (not of known strays)
        self.forgotten: set = set()      # keys seen to exec since the last scan: judged afresh
        self.full_at = float("-inf")     # the table's full read these verdicts date from
        self.kept = None                 # the processes of the trees reaper keeps, at the last find
        self.behind = False              # the last find left new processes to judge (JUDGE_EACH)

    @property
    def watch(self) -> bool:
        return bool(self.scope.watch)

    def reapers(self) -> list:
        """Processes whose children to re-read each sample: they adopt orphans."""
        return [1] if self.watch else [self.scope.pid]

    def find(self, table: ProcTable, known=None) -> dict:
        """(pid, start) -> why a stray (orphan, ray-idle, match) for every stray in the
        table now; stray() makes its Stray. known: the strays the enforcer keeps (`in`,
        comm(key): the name its record holds): one whose verdict stands maps to KNOWN, its
        verdict kept by the enforcer only (thousands of strays: no record made twice,
        or made again at every scan)."""
        procs = table.procs
        me = self.scope.pid
        found: dict = {}                 # pid -> reason

        self.kept = None                 # the main tree's processes (not in watch mode)
        if self.watch:
            visible = None               # the whole namespace
            roots = [p.pid for p in procs.values() if p.ppid == 1 and p.pid != me]
        else:
            kept = scopes.kept(self.scope, procs, table.children)
            self.kept = kept
            # As PID 1 the namespace is reaper's; as a subreaper, only its descendants.
            visible = None if self.scope.is_pid1 else scopes.members(self.scope, procs, table.children)
            roots = [c for c in table.children.get(me, ()) if c not in kept]
        # A real raylet is named raylet (its comm comes from its executable); the
        # name only picks the candidates, the executable decides.
        named = {p.pid: self.ray.kind(p.pid, p.start) for p in procs.values() if p.comm == "raylet"}
        raylets = [pid for pid, k in named.items() if k == "raylet"]
        self.ray_seen = self.ray_seen or bool(raylets)
        # An orphaned raylet (`ray start` without --block, reaper watch, pause mode)
        # is not an orphan's tree: what runs below it is Ray's, judged by rule (2).
        # Nor, until told, is one whose check is UNDECIDED (ray.py).
        ray_trees = table.descendants([pid for pid, k in named.items() if k in ("raylet", UNDECIDED)])
        for pid in table.descendants(roots):
            if pid not in ray_trees:
                found[pid] = "orphan"

        ray_system: set = set()
        for r in raylets:
            for w in table.children.get(r, ()):
                ray_system.add(w)        # Ray's workers and agents
                if not self.ray_aware or (visible is not None and w not in visible):
                    continue
                # comm holds the title's first 15 characters; confirm on the full title.
                if read_comm(w) == RAY_IDLE and read_cmdline(w) == RAY_IDLE:
                    for d in table.descendants(table.children.get(w, ())):
                        found.setdefault(d, "ray-idle")

        if self.match:
            for p in procs.values():
                if p.pid in found or (visible is not None and p.pid not in visible):
                    continue
                cmd = read_cmdline(p.pid)
                if any(rx.search(cmd) for rx in self.match):
                    found[p.pid] = "match"

        strays = {}
        judged, self.judged = self.judged, {}
        forgotten, self.forgotten = self.forgotten, set()
        rejudge = table.last_full - self.full_at >= REJUDGE_EVERY
        fresh, self.behind = 0, False    # new processes judged by this find (JUDGE_EACH, JUDGE_TIME)
        until = time.monotonic() + JUDGE_TIME
        if rejudge:
            # Every verdict afresh now and then: an exec that keeps the name (exec -a, the
            # same program) or a new argv is seen within REJUDGE_EVERY.
            judged, self.full_at = {}, table.last_full
        for pid, reason in found.items():
            p = procs.get(pid)
            if p is None or pid == me or pid == 1 or p.ppid == 0 or pid in ray_system:
                continue
            key = (pid, p.start)
            if known is not None and not rejudge and key not in forgotten and known.comm(key) == p.comm:
                strays[key] = KNOWN
                continue
            seen = None if key in forgotten else judged.get(key)
            if seen is None or seen[0] != p.comm:
                if known is None or key not in known:
                    if fresh >= JUDGE_EACH and time.monotonic() >= until:
                        self.behind = True       # new: judged at a later scan
                        continue
                    fresh += 1
                seen = self._judge(pid, p)
                if seen is None:         # UNDECIDED (ray.py): no verdict, no action; asked again next scan
                    continue
            self.judged[key] = seen
            if seen[1] is not None:
                strays[key] = reason
        if len(self.ray.cache) > max(512, 2 * self.ray_kept):
            self.ray.prune({(p.pid, p.start) for p in procs.values()})
            self.ray_kept = len(self.ray.cache)      # pruned again once it doubles
        return strays

    def stray(self, key: tuple, reason: str, table: ProcTable) -> Stray:
        """The Stray find() found at key, for reason."""
        p, seen = table.procs[key[0]], self.judged[key]
        return Stray(key[0], key[1], p.ppid, seen[2], seen[1], reason)

    def settled(self, known) -> None:
        """The enforcer keeps the strays of this scan now: their verdicts are its (see find)."""
        self.judged = {k: v for k, v in self.judged.items() if k not in known}

    def judge_now(self, key: tuple, comm: str) -> tuple | None:
        """(name, command line) of key, a stray seen to exec (its name is comm now), if it
        is still one; None if it is not (protected, Ray's, a zombie), or is gone."""
        seen = self._judge(key[0], Proc(key[0], 0, "S", comm, key[1]))
        return None if seen is None or seen[1] is None else (seen[2], seen[1])

    def verdict(self, key: tuple) -> tuple:
        """(name, command line) find() judged key by."""
        seen = self.judged[key]
        return seen[2], seen[1]

    def _judge(self, pid: int, p) -> tuple:
        """(comm as the table had it, command line or None if not a stray, comm now):
        kept per (pid, start) while its comm stays (an exec renames it): a sleeping
        stray's command line is not read again every sample. None while Ray's check of
        it is UNDECIDED: neither a stray nor left alone for good, judged at the next scan."""
        cmd = read_cmdline(pid)
        if not cmd and not _has_program(pid):
            return p.comm, None, ""      # a zombie or a kernel thread: nothing to budget
        # An empty command line alone proves nothing: a process may blank its own
        # argv (setproctitle("")) to look like one. /proc decides, not the process.
        if any(rx.search(cmd) for rx in self.protect):
            return p.comm, None, ""
        kind = self.ray.kind(pid, p.start)
        if kind is not None:             # UNDECIDED (ray.py): None, no verdict yet
            return None if kind is UNDECIDED else (p.comm, None, "")
        self.ray.cache.pop((pid, p.start), None)    # not Ray's: judged holds that (a few bytes a stray)
        # One copy of a command line and a name: thousands of copies of one program share it.
        return p.comm, sys.intern(kept_cmdline(cmd)), sys.intern(read_comm(pid) or p.comm)

    def forget(self, key) -> None:
        """key was seen to exec (or rename itself): judged afresh at the next scan."""
        self.judged.pop(key, None)
        self.forgotten.add(key)


def kept_cmdline(cmd: str) -> str:
    """What reaper keeps of a command line: itself up to CMDLINE_KEPT characters, else its
    start and a digest of the whole (str's hash: keyed afresh at every start, so no
    process can make two command lines that match here on purpose)."""
    if len(cmd) <= CMDLINE_KEPT:
        return cmd
    return f"{cmd[:CMDLINE_KEPT - 20]}...#{hash(cmd) & 0xFFFFFFFFFFFFFFFF:016x}"


def _compiled(patterns) -> list:
    """The patterns compiled; re (and its enum) loaded only when there are some."""
    if not patterns:
        return []
    import re

    return [re.compile(r) for r in patterns]


def _has_program(pid: int) -> bool:
    """pid is a live process running a program: not a zombie (state Z or X) and not a
    kernel thread (no executable)."""
    st = read_stat(pid)
    if st is None or st[3] in ("Z", "X"):
        return False
    try:
        os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        return False                 # a kernel thread, or gone
    except OSError:
        return True                  # another user's: its exe is there, not ours to read
    return True

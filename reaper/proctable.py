"""A cheap, incremental view of the process table: pid -> ppid, start time, name.

A full read of /proc/*/stat costs about 12 ms of CPU per 1,000 processes, more
than the budget sampler may spend (1% of a core at a 1 s interval). So a
refresh lists /proc (its directory entries carry an inode number that changes
when a pid is reused) and reads the stat file only of processes that are new,
whose pid was reused, or whose parent may have changed (their cached parent is
gone, or they now appear among the children of a reaping process). A full read
every FULL_EVERY seconds catches anything else (a re-parenting under a zombie
parent, a subreaper deep in the tree).
"""
from __future__ import annotations

import os
from typing import Iterable, NamedTuple, Optional

FULL_EVERY = 30.0


class Proc(NamedTuple):
    pid: int
    inode: int
    ppid: int
    start: int        # start time in clock ticks after boot: with pid, the identity
    comm: str         # the kernel's name (15 chars); Ray sets it to the process title


def read_stat(pid: int) -> Optional[tuple]:
    """(ppid, start ticks, comm, state, utime+stime ticks) or None if gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 2048)
    except OSError:
        return None
    finally:
        os.close(fd)
    lpar, rpar = data.find(b"("), data.rfind(b")")
    if lpar < 0 or rpar < 0:
        return None
    f = data[rpar + 2:].split(b" ", 21)
    try:
        return (int(f[1]), int(f[19]), data[lpar + 1:rpar].decode(errors="replace"),
                f[0].decode(), int(f[11]) + int(f[12]))
    except (IndexError, ValueError):
        return None


def read_children(pid: int) -> list:
    """Direct children of pid's main thread (one small read)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def read_cmdline(pid: int) -> str:
    try:
        fd = os.open(f"/proc/{pid}/cmdline", os.O_RDONLY)
    except OSError:
        return ""
    try:
        data = os.read(fd, 8192)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return data.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def read_comm(pid: int) -> str:
    try:
        fd = os.open(f"/proc/{pid}/comm", os.O_RDONLY)
    except OSError:
        return ""
    try:
        return os.read(fd, 64).rstrip(b"\n").decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


class ProcTable:
    def __init__(self) -> None:
        self.procs: dict = {}           # pid -> Proc
        self.children: dict = {}        # ppid -> [pid]
        self.last_full = float("-inf")
        self.stat_reads = 0             # for the benchmark

    def refresh(self, now: float, reapers: Iterable[int] = ()) -> None:
        """Brings the table up to date. reapers: pids that adopt orphans (reaper
        itself, PID 1 in watch mode); their current children are re-read."""
        full = now - self.last_full >= FULL_EVERY
        if full:
            self.last_full = now
        old = self.procs
        procs = {}
        stale = []
        for entry in os.scandir("/proc"):
            name = entry.name
            if not name[0].isdigit():
                continue
            pid = int(name)
            try:
                ino = entry.inode()
            except OSError:
                continue
            p = old.get(pid)
            if p is not None and p.inode == ino and not full:
                procs[pid] = p
            else:
                stale.append((pid, ino))
        # A parent that vanished left its children with a new parent.
        gone = old.keys() - procs.keys()
        if gone:
            for pid, p in procs.items():
                if p.ppid in gone:
                    stale.append((pid, p.inode))
        for r in reapers:
            for pid in read_children(r):
                p = procs.get(pid)
                if p is not None and p.ppid != r:
                    stale.append((pid, p.inode))
        for pid, ino in stale:
            st = read_stat(pid)
            self.stat_reads += 1
            if st is None:
                procs.pop(pid, None)
                continue
            procs[pid] = Proc(pid, ino, st[0], st[1], st[2])
        self.procs = procs
        children: dict = {}
        for p in procs.values():
            children.setdefault(p.ppid, []).append(p.pid)
        self.children = children

    def descendants(self, roots: Iterable[int]) -> set:
        out = set()
        todo = [r for r in roots if r in self.procs]
        while todo:
            pid = todo.pop()
            if pid in out:
                continue
            out.add(pid)
            todo.extend(self.children.get(pid, ()))
        return out

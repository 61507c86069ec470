"""Processes as /proc shows them: one record (Proc), one parser of /proc/PID/stat, the
whole table at once (scan) or kept up to date cheaply (ProcTable), and the tree below
a process (descendants).

ProcTable: a full read of /proc/*/stat costs about 12 ms of CPU per 1,000 processes, more
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
import sys
from collections import namedtuple
from collections.abc import Iterable

from reaper.procfs.cgroups import read_pid_cgroup

FULL_EVERY = 120.0


CLK_TCK = os.sysconf("SC_CLK_TCK")
CGROUP_TEXT_MAX = 8192      # bytes of /proc/PID/cgroup read_cgroup() reads at most


# collections' namedtuple, not typing's NamedTuple: typing (with re and enum) would cost
# PID 1 about 1 MB of memory.
class Proc(namedtuple("Proc", "pid ppid state comm start inode", defaults=(0,))):
    # state: one letter, as in /proc/PID/stat: R S D Z T ... (as of its last read)
    # comm: the kernel's name (15 chars), never the command line; Ray sets it to the title
    # start: start time in clock ticks after boot: with pid, the identity
    # inode: of its /proc entry (ProcTable: a new one when the pid is reused); 0 if not read
    __slots__ = ()

    @property
    def started(self) -> float:
        """Its start, in seconds after boot (as /proc/uptime counts)."""
        return self.start / CLK_TCK


def stat_fields(pid: int, proc: str = "/proc", maxsplit: int = -1) -> tuple | None:
    """(comm, [the fields after it: state, ppid, ...]) of proc/PID/stat, or None if gone.
    The name is what lies between the first '(' and the last ')': it may hold anything."""
    try:
        fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY)
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
    return data[lpar + 1:rpar].decode(errors="replace"), data[rpar + 2:].split(b" ", maxsplit)


def read_stat(pid: int) -> tuple | None:
    """(ppid, start ticks, comm, state, utime+stime ticks) or None if gone."""
    st = stat_fields(pid, maxsplit=21)
    if st is None:
        return None
    comm, f = st
    try:
        return (int(f[1]), int(f[19]), comm, f[0].decode(), int(f[11]) + int(f[12]))
    except (IndexError, ValueError):
        return None


PF_EXITING = 0x4                 # the kernel's task flag: do_exit() has begun


def exiting(pid: int) -> bool:
    """pid is gone, a zombie, or on its way out (PF_EXITING): its cgroup and its figures
    are the kernel's tearing down, not its own doing."""
    st = stat_fields(pid, maxsplit=7)
    if st is None:
        return True
    f = st[1]
    try:
        return f[0] in (b"Z", b"X", b"x") or bool(int(f[6]) & PF_EXITING)
    except (IndexError, ValueError):
        return False


PAGE = os.sysconf("SC_PAGE_SIZE")


class Counters(namedtuple("Counters", "state cpu rss comm reaped", defaults=(0,))):
    """What one read of /proc/PID/stat tells of a process found earlier: its state
    (R S D Z T ...), CPU (utime + stime, clock ticks, every thread's), resident memory
    (bytes), the kernel's name (a new one after an exec, or a prctl) and the CPU of the
    children it waited for (cutime + cstime, clock ticks)."""
    __slots__ = ()


def read_counters(pid: int, start: int) -> Counters | None:
    """pid's counters if it is still the process that started at start (a reused pid has
    another start time); None if gone or reused. One short read."""
    st = stat_fields(pid, maxsplit=22)
    if st is None:
        return None
    comm, f = st
    try:
        if int(f[19]) != start:
            return None
        return Counters(f[0].decode(), int(f[11]) + int(f[12]), int(f[21]) * PAGE, comm, int(f[13]) + int(f[14]))
    except (IndexError, ValueError):
        return None


def last_pid(proc: str = "/proc") -> int | None:
    """The pid handed out last in this PID namespace (/proc/loadavg's last field): it
    moves at every fork, and only then. None if unreadable."""
    try:
        fd = os.open(f"{proc}/loadavg", os.O_RDONLY)
    except OSError:
        return None
    try:
        return int(os.read(fd, 128).split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)


def read_proc(pid: int, inode: int = 0) -> "Proc | None":
    st = read_stat(pid)
    if st is None:
        return None
    ppid, start, comm, state, _cpu = st
    # One copy of each name: thousands of copies of one program share it (issue 25).
    return Proc(pid, ppid, state, sys.intern(comm), start, inode)


def scan() -> dict:
    """pid -> Proc for every process visible in this PID namespace (one full read);
    empty when /proc cannot be listed."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if name.isdigit():
            p = read_proc(int(name))
            if p is not None:
                table[p.pid] = p
    return table


def children_index(procs) -> dict:
    """ppid -> [pid] of procs (Proc records)."""
    children: dict = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    return children


def below(children: dict, roots: Iterable[int]) -> set:
    """Every pid below roots in a children index (roots themselves left out)."""
    found, todo = set(), list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def descendants(table: dict, root: int) -> set:
    """Pids below root in the parent tree of table (pid -> Proc), root left out."""
    return below(children_index(table.values()), [root])


def read_children(pid: int) -> list:
    """Direct children of pid's main thread (one small read)."""
    return _thread_children(pid, pid)


def read_all_children(pid: int) -> list:
    """Direct children of every thread of pid (a thread may fork too)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out = []
    for tid in tids:
        if tid.isdigit():
            out += _thread_children(pid, int(tid))
    return out


def _thread_children(pid: int, tid: int) -> list:
    try:
        fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY)
    except OSError:
        return []
    try:
        # Large reads: the kernel walks the list of children again at every read() call.
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return [int(x) for x in b"".join(chunks).split()]
    except (OSError, ValueError):
        return []
    finally:
        os.close(fd)


def _read_small(pid: int, name: str, limit: int, proc: str = "/proc") -> bytes:
    """At most limit bytes of /proc/PID/name (a kernel file: it never blocks); b"" when gone."""
    try:
        fd = os.open(f"{proc}/{pid}/{name}", os.O_RDONLY)
    except OSError:
        return b""
    try:
        return os.read(fd, limit)
    except OSError:
        return b""
    finally:
        os.close(fd)


def visible() -> bool:
    """/proc is there and shows this process (not an empty directory bound over it)."""
    return os.path.exists("/proc/self/stat")


def signal_masks(pid: int) -> "tuple | None":
    """(pending, blocked, ignored) signal masks of pid from /proc/PID/status, pending
    being its main thread's and the process's shared ones; None if gone or unreadable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f if line[:3] in (b"Sig", b"Shd"))
        return (int(fields[b"SigPnd"], 16) | int(fields[b"ShdPnd"], 16),
                int(fields[b"SigBlk"], 16), int(fields[b"SigIgn"], 16))
    except (OSError, ValueError, KeyError):
        return None


def read_cmdline(pid: int) -> str:
    return _read_small(pid, "cmdline", 8192).rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def read_comm(pid: int) -> str:
    return _read_small(pid, "comm", 64).rstrip(b"\n").decode(errors="replace")


def read_cgroup(pid: int, proc: str = "/proc") -> str:
    """proc/PID/cgroup as text, through the one reader (procfs/cgroups.py), bounded at
    CGROUP_TEXT_MAX (a path is at most a few hundred bytes); "" when gone or longer."""
    data = read_pid_cgroup(pid, CGROUP_TEXT_MAX, proc)
    return "" if data is None else data.decode(errors="replace")


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
        stale: dict = {}                # pid -> inode: to read (one dict, no tuple per process)
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
                stale[pid] = ino
        # A parent that vanished left its children with a new parent.
        gone = old.keys() - procs.keys()
        if gone:
            for pid, p in procs.items():
                if p.ppid in gone:
                    stale[pid] = p.inode
        for r in reapers:
            for pid in read_children(r):
                p = procs.get(pid)
                if p is not None and p.ppid != r:
                    stale[pid] = p.inode
        for pid, ino in stale.items():
            p = read_proc(pid, ino)
            self.stat_reads += 1
            if p is None:
                procs.pop(pid, None)
                continue
            procs[pid] = p
        self.procs = procs
        self.children = children_index(procs.values())

    def descendants(self, roots: Iterable[int]) -> set:
        """roots (those in the table) and every pid below them."""
        roots = [r for r in roots if r in self.procs]
        return set(roots) | below(self.children, roots)

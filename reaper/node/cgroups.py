"""Live and dying memory cgroups of the node, on either hierarchy, and on v2 the cgroups
that hold the dying ones.

A removed memory cgroup stays "dying" while a page is still charged to it (the page
cache of a file it wrote, say): the kernel keeps and walks it, invisible as a directory.
- cgroup v1: /proc/cgroups counts every memory cgroup, dying ones included; the live
  ones are the directories of the memory hierarchy. Dying = the difference. Which
  cgroup a dying one belonged to, v1 does not say.
- cgroup v2: the root's cgroup.stat counts them: nr_dying_subsys_memory (kernel 6.12+)
  or else nr_dying_descendants (every dying cgroup, memory or not). Each level's
  cgroup.stat counts its own subtree, so the cgroups that hold the dying ones are found
  by descending only where dying ones are (holders()).

The host's /sys is read at SYS/fs/cgroup (--sys, for a host's /sys mounted elsewhere).
"""
from __future__ import annotations

import os
from typing import NamedTuple

from reaper.nodestats import proc_cgroups
from reaper.procfs.cgroups import read_cgroup_stat
from reaper.text import display

MAX_DIRS = 200_000       # live directories counted at most (a runaway host)
MAX_READS = 5_000        # cgroup.stat files read at most per holders() pass
TOP = 5
LABEL_MAX = 200


class Hierarchies(NamedTuple):
    v1_memory: "str | None"     # the v1 memory hierarchy's top directory
    v2: "str | None"            # the unified hierarchy's top directory
    v2_memory: bool             # the memory controller is on v2


def hierarchies(sys: str = "/sys") -> Hierarchies:
    """Where the memory cgroups are: a unified host (SYS/fs/cgroup is cgroup2), a hybrid
    one (v1 controllers, cgroup2 at SYS/fs/cgroup/unified) or a v1-only one."""
    top = os.path.join(sys, "fs", "cgroup")
    if os.path.exists(os.path.join(top, "cgroup.controllers")):
        return Hierarchies(None, top, "memory" in _words(os.path.join(top, "cgroup.controllers")))
    v1 = None
    try:
        names = sorted(os.listdir(top))
    except OSError:
        names = []
    for name in names:           # "memory", or a mount that joins it with others
        d = os.path.join(top, name)
        if "memory" in name.split(",") and os.path.exists(os.path.join(d, "memory.usage_in_bytes")):
            v1 = d
            break
    unified = os.path.join(top, "unified")
    v2 = unified if os.path.exists(os.path.join(unified, "cgroup.controllers")) else None
    return Hierarchies(v1, v2, bool(v2) and "memory" in _words(os.path.join(unified, "cgroup.controllers")))


def _words(path: str) -> list:
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return []


def count_dirs(top: str, limit: int = MAX_DIRS) -> "int | None":
    """Directories at and below top (symbolic links not followed), at most limit; None
    if top cannot be listed."""
    try:
        todo = [top]
        os.listdir(top)
    except OSError:
        return None
    n = 0
    while todo and n < limit:
        d = todo.pop()
        n += 1
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            todo.append(e.path)
                    except OSError:
                        pass
        except OSError:
            continue
    return n


class MemoryCgroups(NamedTuple):
    version: int         # the hierarchy that holds the memory controller: 1 or 2
    live: int
    dying: int
    source: str          # where the counts came from, for the report


def memory_cgroups(proc: str = "/proc", sys: str = "/sys", h: "Hierarchies | None" = None) -> "MemoryCgroups | None":
    """The node's memory cgroups now; None when neither hierarchy can say."""
    h = h or hierarchies(sys)
    if h.v2 is not None and h.v2_memory:
        st = read_cgroup_stat(h.v2)
        if st is None:
            return None
        if "memory" in st.dying_subsys:
            return MemoryCgroups(2, st.subsys.get("memory", st.live + 1), st.dying_subsys["memory"],
                                 "cgroup.stat nr_subsys_memory, nr_dying_subsys_memory")
        return MemoryCgroups(2, st.live + 1, st.dying, "cgroup.stat nr_descendants, nr_dying_descendants")
    if h.v1_memory is not None:
        counts = proc_cgroups(proc)
        live = count_dirs(h.v1_memory)
        if not counts or "memory" not in counts or live is None:
            return None
        return MemoryCgroups(1, live, max(0, counts["memory"] - live), "/proc/cgroups against the directories")
    return None


def _dying(st, memory: bool) -> int:
    return st.dying_subsys.get("memory", st.dying) if memory else st.dying


def holders(top: str, memory: bool = True, max_reads: int = MAX_READS, limit: int = TOP) -> list:
    """[(cgroup path below top, dying cgroups directly below it)], the limit largest: a
    live cgroup holds the dying ones its cgroup.stat counts beyond those its live
    children count. Descends only where there are dying ones; reads at most max_reads
    cgroup.stat files."""
    root = read_cgroup_stat(top)
    if root is None or _dying(root, memory) == 0:
        return []
    found, stack, reads = [], [(top, _dying(root, memory))], 1
    while stack and reads < max_reads:
        d, dying = stack.pop()
        below = 0
        try:
            children = [e.path for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for c in children:
            if reads >= max_reads:
                break
            st = read_cgroup_stat(c)
            reads += 1
            n = 0 if st is None else _dying(st, memory)
            if n > 0:
                below += n
                stack.append((c, n))
        own = dying - below
        if own > 0:
            rel = "/" + os.path.relpath(d, top) if d != top else "/"
            found.append((display(rel.replace("/./", "/")[:LABEL_MAX]), own))
    found.sort(key=lambda x: (-x[1], x[0]))
    return found[:limit]


class Growth:
    """The dying count's growth per second over a window (first and last reading in it)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.points: list = []       # (when, dying), one per reading: bounded by window / interval

    def add(self, now: float, dying: int) -> None:
        self.points.append((now, dying))
        while self.points and self.points[0][0] < now - self.window:
            self.points.pop(0)

    def per_second(self) -> "float | None":
        if len(self.points) < 2 or self.points[-1][0] <= self.points[0][0]:
            return None
        (t0, n0), (t1, n1) = self.points[0], self.points[-1]
        return (n1 - n0) / (t1 - t0)

"""What the node says, read-only, for the metrics: per-core CPU, cgroup counts
(/proc/cgroups, the visible tree, the root cgroup.stat of cgroup v2), the pids
controller, reaper's own size. Built on reaper/procfs (processes, cgroups, system): the
files are read there; this module computes (ratios, a walk of the cgroup tree).

The exporter reads it at scrape time and from its sampler thread. Nothing else
runs when metrics are off. Every reader tolerates
processes vanishing mid-scan and files that do not exist on this kernel, and
says "unreadable" (None, or an empty table) rather than a zero that would look
healthy: some sandboxes bind an empty directory over /proc.
"""
from __future__ import annotations

import os
from typing import NamedTuple

from reaper.procfs.cgroups import CgroupStat, enabled, mounts, own_dir, read_cgroup_stat, read_number
from reaper.procfs.processes import CLK_TCK
# The readers the metrics call through this module (the metrics to import them from procfs/system.py).
from reaper.procfs.system import own_rss, proc_cgroups, read_cpu_times, uptime  # noqa: F401

SATURATED = 0.95                 # a core at or above this busy ratio counts as saturated
CPU_MODES = ("user", "system", "irq", "softirq", "steal")
MAX_CGROUP_DIRS = 200_000        # stop counting cgroup directories beyond this (a runaway host)


# --- per-core CPU ---------------------------------------------------------------

class CpuSampler:
    """Busy ratios per core over the last interval, seconds each core spent saturated,
    and seconds in which any core was.

    /proc/stat is host-wide even inside a container: this is the per-core view
    that finds one core at 100 % system time while the machine average looks fine.
    The accounting is per core whatever is exported (reaper/metrics/sections/node_cpu.py exports a
    summary of it by default, the per-core figures with --node-metrics per-core).
    """

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.ratios: dict = {}        # cpu -> {mode: ratio, "busy": ratio}
        self.seconds: dict = {}       # cpu -> seconds the last interval lasted on it (its jiffies)
        self.saturated: dict = {}     # cpu -> seconds at >= SATURATED (never removed: its max only grows)
        self.any_saturated = 0.0      # seconds in which at least one core was at >= SATURATED
        self._prev = read_cpu_times(proc)
        self.available = bool(self._prev)

    def busiest_saturated(self) -> float:
        """The saturated seconds of the core that has most: a max over counters that
        only grow, so it only grows too."""
        return max(dict(self.saturated).values(), default=0.0)

    def sample(self) -> None:
        cur = read_cpu_times(self.proc)
        ratios, seconds = {}, {}
        any_saturated = 0.0           # the interval, as long as the longest saturated core counted it
        for cpu, now in cur.items():
            before = self._prev.get(cpu)
            if before is None:
                continue
            d = [max(0, a - b) for a, b in zip(now, before)]
            total = sum(d)
            if total <= 0:
                continue
            user, nice, system, idle, iowait, irq, softirq, steal = d
            busy = (total - idle - iowait) / total
            ratios[cpu] = {"user": (user + nice) / total, "system": system / total, "irq": irq / total,
                           "softirq": softirq / total, "steal": steal / total, "busy": busy}
            seconds[cpu] = total / CLK_TCK
            self.saturated.setdefault(cpu, 0.0)
            if busy >= SATURATED:
                self.saturated[cpu] += total / CLK_TCK
                any_saturated = max(any_saturated, total / CLK_TCK)
        self.any_saturated += any_saturated
        self._prev = cur
        self.seconds = seconds
        self.ratios = ratios


# --- cgroups --------------------------------------------------------------------

class Pids(NamedTuple):
    current: float
    max: float        # inf when no limit


def cgroup_pids(proc: str = "/proc") -> "Pids | None":
    """pids.current of reaper's cgroup and the tightest pids.max on the way up; None if unreadable."""
    found = own_dir("pids", proc, or_v2=True)
    if found is None:
        return None
    where = found[1]
    current = read_number(os.path.join(where, "pids.current"))
    if current is None:
        return None
    limit, d = float("inf"), where
    while True:
        value = read_number(os.path.join(d, "pids.max"))
        if value is None:           # the top of what is visible
            break
        limit = min(limit, value)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return Pids(current, limit)


def visible_memory_cgroups(proc: str = "/proc") -> "int | None":
    """Memory cgroups that exist as directories in the visible hierarchy (live ones).

    Inside a container with its own cgroup namespace this is only its subtree;
    with the host hierarchy visible it is the node's live count.
    """
    for m in mounts(proc):
        if (m.version == 1 and "memory" in m.options) or m.version == 2:
            if m.version == 2 and not enabled(m, "memory"):
                continue
            n = 0
            for _, dirs, _ in os.walk(m.point):
                n += 1
                if n >= MAX_CGROUP_DIRS:
                    break
            return n
    return None


def _depth(root: str) -> int:
    """How far below this cgroup namespace's root a mount's root lies. Inside a private
    cgroup namespace the host's hierarchy, mounted in, shows its root as /../..: above
    ours, so it counts below zero (the highest wins, not the shortest path)."""
    return sum(-1 if p == ".." else 1 for p in root.split("/") if p not in ("", "."))


def cgroup_stat(proc: str = "/proc") -> "CgroupStat | None":
    """cgroup.stat at the top of the visible cgroup v2 hierarchy: a container's own
    subtree, the host's where the host's cgroupfs is mounted. None without one."""
    v2 = sorted((m for m in mounts(proc) if m.version == 2), key=lambda m: _depth(m.root))
    for m in v2:
        st = read_cgroup_stat(m.point)
        if st is not None:
            return st
    return None

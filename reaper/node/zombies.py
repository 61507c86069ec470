"""The host's zombies (state Z) grouped by cgroup: the pod or service whose process
does not reap its children. A zombie's own proc/PID/cgroup reads "/" on recent kernels
(an exited task has left its cgroups), so where it does, the parent's cgroup is taken:
the parent is the process that must reap it. One pass over proc/*/stat, bounded in time
(SCAN_BUDGET): on a node of tens of thousands of processes the count is what the pass
reached (partial says so)."""
from __future__ import annotations

import os
import time
from typing import NamedTuple

from reaper.node.culprits import pick_cgroup
from reaper.procfs.processes import read_cgroup, stat_fields

SCAN_BUDGET = 0.25       # seconds at most per pass
TOP = 5


class Zombies(NamedTuple):
    total: int
    by_cgroup: list      # [(cgroup, count)], the TOP with most
    partial: bool


def count_zombies(proc: str = "/proc", budget: float = SCAN_BUDGET, clock=time.monotonic) -> "Zombies | None":
    try:
        names = os.listdir(proc)
    except OSError:
        return None
    deadline = clock() + budget
    total, groups, partial = 0, {}, False
    for i, name in enumerate(names):
        if not name.isdigit():
            continue
        if i % 64 == 0 and clock() >= deadline:
            partial = True
            break
        st = stat_fields(int(name), proc, maxsplit=2)
        if st is None or st[1][0] != b"Z":
            continue
        total += 1
        cg = pick_cgroup(read_cgroup(int(name), proc))
        if cg in ("", "/") and len(st[1]) > 1 and st[1][1].isdigit():
            cg = pick_cgroup(read_cgroup(int(st[1][1]), proc)) or cg
        groups[cg] = groups.get(cg, 0) + 1
    top = sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]
    return Zombies(total, top, partial)

"""Stray cgroups left behind by reapers that are gone (killed with SIGKILL, say):
removed when budgets start, so that one per killed reaper cannot pile up.

A reaper-strays.* directory is its creator's as long as the creator holds its
flock (cgroupfs.make_owned); the kernel drops the lock when the creator dies. So
a directory whose lock can be taken has no live creator, in whatever PID
namespace or container it ran, and is removed if empty (the kernel refuses to
remove a cgroup that holds a process, so a stray still inside keeps it, and it is
named). A directory whose lock is held is never touched.
"""
from __future__ import annotations

import os

from reaper.budgets.cgroupfs import PREFIX, close_fd, lock, remove
from reaper.procfs.cgroups import own_dir


def hierarchies() -> list:
    """reaper's own cgroup directories where it makes stray cgroups (cpu, memory, v2)."""
    out = []
    for controller in ("cpu", "memory", ""):
        where = own_dir(controller)
        if where is not None and where[1] not in out:
            out.append(where[1])
    return out


def remove_stale(parents=None) -> tuple:
    """(removed, kept): stale directories removed, and stale ones that are not
    empty and so were left. Never raises for what it finds."""
    removed, kept = [], []
    for parent in hierarchies() if parents is None else parents:
        try:
            names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
        except OSError:
            continue
        for name in names:
            d = os.path.join(parent, name)
            try:
                fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not lock(fd):
                    continue                 # its creator lives: never touched
                leaves = [os.path.join(d, n) for n in os.listdir(d) if os.path.isdir(os.path.join(d, n))]
                ok = all([remove(leaf) for leaf in leaves])     # reclaimed first: no dying cgroup
                if ok and remove(d):
                    removed.append(d)
                else:
                    kept.append(d)
            except OSError:
                kept.append(d)
            finally:
                close_fd(fd)
    return removed, kept

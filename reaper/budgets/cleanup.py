"""Stray cgroups left behind by reapers that are gone (killed with SIGKILL, say):
removed when budgets start, so that one per killed reaper cannot pile up.

A reaper-strays.* directory is its creator's as long as the creator holds its
flock (cgroupfs.make_owned); the kernel drops the lock when the creator dies. So
a directory whose lock can be taken has no live creator, in whatever PID
namespace or container it ran, and is removed if empty (the kernel refuses to
remove a cgroup that holds a process, so a stray still inside keeps it, and it is
named). A directory whose lock is held is never touched.

The leftovers' ends (reaper/leftovers/mechanisms.py) own reaper-leftovers.*
directories the same way, in the v2 and freezer hierarchies; one its creator left
frozen (killed between FROZEN and THAWED) is thawed first, so that what it holds
runs again (and takes a SIGKILL already sent) instead of staying frozen for good.
"""
from __future__ import annotations

import os

from reaper.budgets.cgroupfs import PREFIX, close_fd, lock, remove
from reaper.procfs.cgroups import own_dir


STRAY_CONTROLLERS = ("cpu", "memory", "")        # where the budgets make cgroups (v1 cpu, memory; v2)


def hierarchies(controllers=STRAY_CONTROLLERS) -> list:
    """reaper's own cgroup directories in those controllers' hierarchies ("" for v2)."""
    out = []
    for controller in controllers:
        where = own_dir(controller)
        if where is not None and where[1] not in out:
            out.append(where[1])
    return out


def remove_stale(parents=None, prefix: str = PREFIX) -> tuple:
    """(removed, kept): stale prefix* directories removed, and stale ones that are
    not empty and so were left. Never raises for what it finds."""
    removed, kept = [], []
    for parent in hierarchies() if parents is None else parents:
        try:
            names = [n for n in os.listdir(parent) if n.startswith(prefix)]
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
                _thaw(d)
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


def remove_and_say(log, what: str, parents=None, prefix: str = PREFIX) -> int:
    """remove_stale(), said: one INFO line naming what was removed, one WARN line for
    what is kept because it holds processes; what = "stray" or "leftover". Never raises
    (a surprise here must not keep the piece that asks off). Returns how many went."""
    try:
        removed, kept = remove_stale(parents, prefix)
    except Exception as e:
        log.warn(f"could not look for stale {what} cgroups: {e!r}")
        return 0
    if removed:
        log.info(f"removed {len(removed)} {what} cgroup(s) left by reapers that are gone: {_first(removed)}")
    if kept:
        log.warn(f"{what} cgroup(s) left by reapers that are gone still hold processes, "
                 f"left in place: {_first(kept)}")
    return len(removed)


def _first(paths: list) -> str:
    return ", ".join(paths[:5]) + (" ..." if len(paths) > 5 else "")


def _thaw(d: str) -> None:
    """A v1 freezer directory its dead creator left FROZEN: THAWED (best effort)."""
    state = os.path.join(d, "freezer.state")
    try:
        with open(state) as f:
            if f.read().strip() == "THAWED":
                return
        with open(state, "w") as f:
            f.write("THAWED")
    except OSError:
        pass                                 # no freezer here (v1 cpu, memory; v2)

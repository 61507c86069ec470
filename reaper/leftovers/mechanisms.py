"""How reaper makes sure no fork of a leftover outlives its end.

Chosen once, at start, in this order (the first that works here):
- cgroup.kill (cgroup v2, a hierarchy reaper may write): the leftovers are moved
  into a cgroup of their own when their SIGTERM goes out, so that what they fork
  during the grace is born inside it; the SIGKILL is one write of "1" to
  cgroup.kill, which the kernel applies to every member, forks in flight included.
- freezer (cgroup v1, a writable freezer hierarchy): the same cgroup; at the
  SIGKILL it is frozen first (a frozen process cannot fork, exit or be reused),
  every member gets SIGKILL, and it is thawed.
- sweeps (no cgroup reaper may make): at the SIGKILL, the leftovers and what they
  forked are stopped (SIGSTOP) and their children read again until a round finds
  none new (a stopped process forks no more), then all get SIGKILL. A child whose
  parent exits between two rounds is re-parented to reaper and can be missed.

Each end's cgroup is a reaper-leftovers.<random> directory its reaper holds a lock on
(budgets/cgroupfs.py's owned directories): one left by a reaper that is gone (killed
in an end) is removed when the next reaper's leftovers piece starts (remove_stale).

A process in a cgroup Ray manages (Ray's resource isolation, cgroup v2: a path
with a ray-node_/ray_node_ component) is never moved: it is ended by sweeps.
Every signal goes through a pidfd taken while the identity held (procctl.py).
"""
from __future__ import annotations

import os

from reaper.budgets import cleanup
from reaper.budgets.cgroupfs import close_fd, make_owned, write
from reaper.procfs.cgroups import own_dir
from reaper.procfs.processes import read_cgroup

CGROUP_KILL = "cgroup.kill"
FREEZER = "freezer"
SWEEPS = "sweeps"
PREFIX = "reaper-leftovers."
CONTROLLERS = ("", "freezer")        # the hierarchies ends make cgroups in (v2, v1 freezer)


def remove_stale(log) -> int:
    """The ends' cgroups of reapers that are gone, removed when empty, the rest named
    (budgets/cleanup.py); never raises. Returns how many went."""
    return cleanup.remove_and_say(log, "leftover", cleanup.hierarchies(CONTROLLERS), PREFIX)


def ray_managed(pid: int) -> bool:
    """pid's cgroup v2 path is one Ray's resource isolation made."""
    for line in read_cgroup(pid).splitlines():
        if line.startswith("0::") and ("/ray-node_" in line or "/ray_node_" in line):
            return True
    return False


class Cgroups:
    """One cgroup per end, below reaper's own, in the hierarchy of `version`."""

    def __init__(self, version: int, base: str) -> None:
        self.name = CGROUP_KILL if version == 2 else FREEZER
        self.version = version
        self.base = base
        self.locks: dict = {}            # directory -> the fd holding its owner's lock

    def make(self) -> str:
        """A new, owned cgroup below base; raises OSError."""
        d, fd = make_owned(self.base, PREFIX)
        self.locks[d] = fd
        return d

    def move(self, d: str, handle) -> bool:
        """handle's process into d, its identity checked around the write; False if not."""
        if ray_managed(handle.pid):
            return False

        try:
            handle.checked(lambda: write(os.path.join(d, "cgroup.procs"), str(handle.pid)))
        except OSError:
            return False
        return True

    def kill(self, d: str, signal_key) -> None:
        """SIGKILL to every member of d."""
        if self.version == 2:
            write(os.path.join(d, "cgroup.kill"), "1")
            return
        state = os.path.join(d, "freezer.state")
        write(state, "FROZEN")
        try:
            for pid in members(d):
                signal_key(pid)
        finally:
            write(state, "THAWED")

    def remove(self, d: str) -> bool:
        """True once d is gone; its lock is let go only then (until reaper exits,
        a directory that would not go stays its own)."""
        try:
            os.rmdir(d)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        close_fd(self.locks.pop(d, None))
        return True


def members(d: str) -> list:
    try:
        with open(os.path.join(d, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def choose():
    """A Cgroups for the best mechanism that works here, or None (sweeps)."""
    for version, controller in ((2, ""), (1, "freezer")):
        found = own_dir(controller)
        if found is None or found[0] != version:
            continue
        c = Cgroups(version, found[1])
        try:
            d = c.make()
        except OSError:
            continue
        ok = os.path.exists(os.path.join(d, "cgroup.kill" if version == 2 else "freezer.state"))
        c.remove(d)
        if ok:
            return c
    return None

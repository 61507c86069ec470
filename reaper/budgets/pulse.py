"""The cheap triggers that let the enforcer leave sleeping strays unread.

Reading one stray costs one /proc/PID/stat read (about 10 us); thousands of sleeping
strays read every second would make PID 1 a CPU consumer of its own. Two counters,
one read each, say when something may have changed:

- the pid handed out last in the namespace (/proc/loadavg): it moves at every fork,
  so a sample that sees it still lists /proc only every SCAN_EVERY seconds;
- the CPU time of reaper's own cgroup (cgroup v1 cpuacct.usage, else v2 cpu.stat
  usage_usec), which counts every process in it, strays included: what it grew by,
  less reaper's own CPU and less what the strays and main-tree processes read at two
  samples in a row used, is CPU nobody read. Once that unexplained CPU adds up to
  QUIET_CPU seconds, every stray is read (a sweep): a stray that starts burning among
  thousands of sleeping ones is read at the sample after it burnt QUIET_CPU (twice
  that at most where a process read is outside the cgroup: the sum has a floor).

Where a memory budget is on, a third: the memory charged to reaper's cgroup (v1
memory.usage_in_bytes, v2 memory.current). Growing by a quarter of the smallest
memory budget since the last sweep makes one: a sleeper that starts allocating uses
little CPU for what it takes.

The counters only ever cause more reads: a cgroup that cannot be read (or holds the
whole machine, busy with others) sweeps at every sample, as before. A stray that left
reaper's cgroup is not in its counter: every stray is read at least every QUIET_MAX
seconds all the same.
"""
from __future__ import annotations

import os
import time

from reaper.procfs.cgroups import own_dir
from reaper.procfs.processes import last_pid

SCAN_EVERY = 30.0      # seconds: /proc is listed at least this often, forks or not
QUIET_MAX = 60.0       # seconds: a sleeping stray is read at least this often
QUIET_CPU = 0.05       # CPU seconds nobody read that make every stray read


def cgroup_usage_file() -> str | None:
    """The file that counts the CPU of reaper's cgroup: v1 cpuacct.usage (ns), else
    v2 cpu.stat (usage_usec); None if neither can be read."""
    found = own_dir("cpuacct")
    if found is not None and _usage(os.path.join(found[1], "cpuacct.usage")) is not None:
        return os.path.join(found[1], "cpuacct.usage")
    found = own_dir("")
    if found is not None and _usage(os.path.join(found[1], "cpu.stat")) is not None:
        return os.path.join(found[1], "cpu.stat")
    return None


def cgroup_memory_file() -> str | None:
    """The file that counts the memory charged to reaper's cgroup (v1
    memory.usage_in_bytes, else v2 memory.current); None if neither can be read."""
    for controller, name in (("memory", "memory.usage_in_bytes"), ("", "memory.current")):
        found = own_dir(controller)
        if found is not None and _number(os.path.join(found[1], name)) is not None:
            return os.path.join(found[1], name)
    return None


def _number(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return int(os.read(fd, 64))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _usage(path: str) -> float | None:
    """CPU seconds in a cpuacct.usage or cpu.stat file; None if unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        if path.endswith("cpuacct.usage"):
            return int(data) / 1e9
        for line in data.split(b"\n"):
            if line.startswith(b"usage_usec "):
                return int(line.split()[1]) / 1e6
    except ValueError:
        pass
    return None


class Pulse:
    """The two counters, read once a sample."""

    def __init__(self, memory_step: int | None = None, usage_file: str | None = "auto") -> None:
        self.file = cgroup_usage_file() if usage_file == "auto" else usage_file
        self.step = memory_step              # bytes of growth that make a sweep; None: not watched
        self.memory_file = cgroup_memory_file() if memory_step is not None else None
        self.memory_low: int | None = None       # the least memory charged since the last sweep
        self.pid: int | None = None          # last_pid at the last scan
        self.usage: float | None = None      # the cgroup's CPU at the last sample
        self.own = time.process_time()
        self.unexplained = 0.0               # CPU seconds nobody read since the last sweep

    def forked(self) -> bool:
        """A pid was handed out since the last call that said so (or it cannot be told)."""
        pid = last_pid()
        if pid is None or pid != self.pid:
            self.pid = pid
            return True
        return False

    def account(self, explained: float) -> bool:
        """The cgroup's CPU since the last sample, less reaper's own and explained (what
        the processes read at both samples used), added up; True if every stray must be
        read now (a sweep: call swept() after it)."""
        usage = _usage(self.file) if self.file is not None else None
        own = time.process_time()
        if usage is None or self.usage is None:
            self.usage, self.own = usage, own
            return True
        grown = usage - self.usage - (own - self.own) - explained
        self.usage, self.own = usage, own
        # Summed, not clamped at each sample: /proc counts in clock ticks, and a tick
        # rounded off at one read comes back at the next. The floor bounds what a
        # process read but outside the cgroup (so counted twice as explained) can hide.
        self.unexplained = max(-QUIET_CPU, self.unexplained + grown)
        return self.unexplained >= QUIET_CPU or self._memory_grew()

    def _memory_grew(self) -> bool:
        if self.step is None:
            return False
        now = _number(self.memory_file) if self.memory_file is not None else None
        if now is None:
            return True
        if self.memory_low is None or now < self.memory_low:
            self.memory_low = now
        return now - self.memory_low >= self.step

    def swept(self) -> None:
        self.unexplained = 0.0
        self.memory_low = None

"""While a core is saturated: the processes that spend the most system time, from their
own counters (proc/PID/stat: stime, and processor, the core they last ran on) and their
cgroup (proc/PID/cgroup), which names the pod or the service.

The cost is bounded in time, not in processes: a scan reads stat files until its budget
(SCAN_BUDGET seconds) is spent and goes on from there at the next sample, so a node of
10,000 processes is covered in a few samples. The processes whose system time grew at
the last reading ("hot", at most HOT_MAX) are read first, every sample, and so are the
processes that were running (state R or D) at their first reading: once found, a
culprit is followed at one-second resolution. A share needs two readings of the same
process (same pid, same start time): a process is named at the earliest one sample
after the pass first reaches it, and the readings are dropped when the episode ends.
"""
from __future__ import annotations

import os
import time
from typing import NamedTuple

from reaper.procfs.cgroups import parse_pid_cgroup
from reaper.procfs.processes import CLK_TCK, read_cgroup, stat_fields
from reaper.text import display

TOP = 5                  # culprits named (labels: bounded)
SCAN_BUDGET = 0.03       # seconds of reading per scan (3 % of a core at one scan a second)
HOT_MAX = 256            # processes re-read first at every scan
LABEL_MAX = 200          # characters of a cgroup path kept for a label or a line
CLOCK_EVERY = 16         # reads between looks at the clock
MIN_RATIO = 0.01         # less system time than this share of a core is not named
TASKS_MAX = 128          # threads of a named process read to find the core it burns


class Culprit(NamedTuple):
    pid: int
    comm: str            # as the kernel has it (15 bytes), shown on one line
    cpu: int             # the core it last ran on (-1: unknown)
    cgroup: str
    ratio: float         # system time over the interval between its two readings, share of one core
    seconds: float       # that system time, seconds


def pick_cgroup(text: str) -> str:
    """The path of proc/PID/cgroup that names a pod or a service: the memory
    controller's (v1), else the unified hierarchy's (0::), else the first one."""
    memory = unified = first = None
    for line in parse_pid_cgroup(text):
        first = line.path if first is None else first
        if "memory" in line.controllers:
            memory = line.path
        elif line.hierarchy == "0" and not line.controllers:
            unified = line.path
    path = next((p for p in (memory, unified, first) if p is not None), "")
    return display(path[:LABEL_MAX])


class _Reading(NamedTuple):
    start: int
    stime: int
    when: float


class KernelTime:
    """The per-process scan. scan() once a sample while some core is saturated,
    reset() when none is any more."""

    def __init__(self, proc: str = "/proc", budget: float = SCAN_BUDGET, clock=time.monotonic) -> None:
        self.proc = proc
        self.budget = budget
        self.clock = clock
        self.readings: dict = {}     # pid -> _Reading
        self.queue: list = []        # pids of the current pass still to read (popped from the end)
        self.hot: list = []          # pids whose system time grew at their last reading
        self._running: list = []
        self.threads: dict = {}      # (tid, start) -> stime, of the threads of the last named processes
        self.scans = 0
        self.passes = 0              # full passes over the process list begun
        self.reads = 0               # stat files read (for the benchmark)
        self.available = True        # proc could be listed at the last pass

    def reset(self) -> None:
        self.readings, self.queue, self.hot, self.threads = {}, [], [], {}

    def scan(self) -> list:
        """Reads what the budget allows; returns the top TOP culprits (Culprit), by
        system time, among the processes read twice."""
        self.scans += 1
        deadline = self.clock() + self.budget
        grown: dict = {}             # pid -> (ratio, ticks, comm, cpu)
        self._running = []           # first read while running: read again at the next scan
        done = set()
        for pid in self.hot:
            self._read(pid, grown)
            done.add(pid)
        if not self.queue:
            self._new_pass()
        n = 0
        while self.queue:
            n += 1
            if n % CLOCK_EVERY == 0 and self.clock() >= deadline:
                break
            pid = self.queue.pop()
            if pid not in done:
                self._read(pid, grown)
        ranked = sorted(grown.items(), key=lambda kv: (-kv[1][1], kv[0]))
        self.hot = ([pid for pid, _ in ranked] + self._running)[:HOT_MAX]
        top = []
        threads: dict = {}
        for pid, (ratio, ticks, comm, cpu) in [r for r in ranked if r[1][0] >= MIN_RATIO][:TOP]:
            cpu = self._busiest_thread_cpu(pid, threads, cpu)
            top.append(Culprit(pid, comm, cpu, pick_cgroup(read_cgroup(pid, self.proc)), ratio, ticks / CLK_TCK))
        self.threads = threads
        return top

    def _busiest_thread_cpu(self, pid: int, threads: dict, cpu: int) -> int:
        """The core of the thread of pid whose system time grew most since the last scan
        (a process's own stat gives its main thread's core: a Go or Java daemon burns its
        time in others); the main thread's where none grew or there are no readings yet.
        Reads at most TASKS_MAX threads, of the TOP processes named only."""
        try:
            tids = os.listdir(f"{self.proc}/{pid}/task")[:TASKS_MAX]
        except OSError:
            return cpu
        best = 0
        for tid in tids:
            if not tid.isdigit():
                continue
            st = stat_fields(int(tid), f"{self.proc}/{pid}/task")
            if st is None:
                continue
            f = st[1]
            try:
                key, stime, where = (tid, int(f[19])), int(f[12]), int(f[36])
            except (IndexError, ValueError):
                continue
            threads[key] = stime
            grew = stime - self.threads.get(key, stime)
            if grew > best:
                best, cpu = grew, where
        return cpu

    def _new_pass(self) -> None:
        try:
            names = os.listdir(self.proc)
        except OSError:
            self.available = False
            return
        self.available = True
        pids = [int(n) for n in names if n.isdigit()]
        live = set(pids)
        self.readings = {p: r for p, r in self.readings.items() if p in live}
        pids.sort(reverse=True)      # popped from the end: ascending
        self.queue = pids
        self.passes += 1

    def _read(self, pid: int, grown: dict) -> None:
        st = stat_fields(pid, self.proc)
        self.reads += 1
        if st is None:
            self.readings.pop(pid, None)
            return
        comm, f = st
        try:
            stime, start = int(f[12]), int(f[19])
            cpu = int(f[36]) if len(f) > 36 else -1
        except (IndexError, ValueError):
            return
        now = self.clock()
        before = self.readings.get(pid)
        self.readings[pid] = _Reading(start, stime, now)
        if before is None or before.start != start or now <= before.when:
            if f[0] in (b"R", b"D"):
                self._running.append(pid)
            return
        ticks = stime - before.stime
        if ticks > 0:
            grown[pid] = (ticks / CLK_TCK / (now - before.when), ticks, display(comm), cpu)

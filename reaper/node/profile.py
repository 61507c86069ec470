"""What one sampled core did over a kernel-time streak: from perf samples (perf.Sample,
every task that ran on the core), the processes by their share of the core's samples,
and the kernel functions they were in (the sampled address's function) with the callers
that led there most often.

The processes are the samples' own pids: only those are read in /proc (their name and
cgroup), so the cost does not grow with the processes on the node. Tables are bounded
(PIDS_MAX processes, FUNCS_MAX functions a process) whatever the samples say.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from reaper.node.perf import KERNEL_MIN

TOP = 5              # functions of a core (metric labels: bounded)
CALLERS = 3          # callers shown after a function
PIDS_MAX = 1024
FUNCS_MAX = 256
IDLE = re.compile(r"idle|halt|mwait")     # the idle task's own functions: an idle core, not kernel work


class Function(NamedTuple):
    name: str
    ratio: float         # share of the core's samples
    callers: tuple       # the most frequent callers, nearest first


class Culprit(NamedTuple):
    pid: int
    ratio: float         # share of the core's samples, any mode
    kernel_ratio: float  # share of the core's samples in the kernel
    functions: list      # [Function], most samples first


class _Pid:
    __slots__ = ("samples", "kernel", "funcs", "tids")

    def __init__(self) -> None:
        self.samples = 0
        self.kernel = 0
        self.funcs: dict = {}        # function -> [samples, {callers: samples}]
        self.tids: dict = {}         # tid -> samples (the busiest thread, for the name)


class Profile:
    def __init__(self, cpu: int, started: float) -> None:
        self.cpu = cpu
        self.started = started
        self.ended: "float | None" = None
        self.samples = 0
        self.kernel = 0
        self.pids: dict = {}         # pid -> _Pid
        self.funcs: dict = {}        # function -> samples, every process's
        self.names: dict = {}        # pid -> (comm, cgroup), read when the streak ended

    def add(self, samples: list, symbols) -> None:
        for s in samples:
            self.samples += 1
            p = self.pids.get(s.pid)
            if p is None:
                if len(self.pids) >= PIDS_MAX:
                    continue
                p = self.pids[s.pid] = _Pid()
            p.samples += 1
            if len(p.tids) < 64 or s.tid in p.tids:
                p.tids[s.tid] = p.tids.get(s.tid, 0) + 1
            chain = s.chain or ((s.ip,) if s.ip >= KERNEL_MIN else ())
            if not chain:
                continue
            name = symbols.name(chain[0])
            if s.pid == 0 and IDLE.search(name):
                continue
            self.kernel += 1
            p.kernel += 1
            self.funcs[name] = self.funcs.get(name, 0) + 1
            f = p.funcs.get(name)
            if f is None:
                if len(p.funcs) >= FUNCS_MAX:
                    continue
                f = p.funcs[name] = [0, {}]
            f[0] += 1
            callers = _callers(chain, name, symbols)
            if len(f[1]) < 64 or callers in f[1]:
                f[1][callers] = f[1].get(callers, 0) + 1

    def top_functions(self, n: int = TOP) -> list:
        """[(function, share of the core's samples)], every process's samples."""
        total = max(self.samples, 1)
        ranked = sorted(self.funcs.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        return [(name, count / total) for name, count in ranked]

    def culprits(self, n: int = 3, functions: int = 3) -> list:
        """[Culprit], the processes with most kernel samples (pid 0, the idle task or a
        process outside this PID namespace, included: its share is the core's too)."""
        total = max(self.samples, 1)
        ranked = sorted(((pid, p) for pid, p in self.pids.items() if p.kernel),
                        key=lambda kv: (-kv[1].kernel, kv[0]))[:n]
        out = []
        for pid, p in ranked:
            funcs = []
            for name, (count, callers) in sorted(p.funcs.items(), key=lambda kv: (-kv[1][0], kv[0]))[:functions]:
                best = max(callers.items(), key=lambda kv: kv[1])[0] if callers else ()
                funcs.append(Function(name, count / total, best))
            out.append(Culprit(pid, p.samples / total, p.kernel / total, funcs))
        return out

    def busiest_tid(self, pid: int) -> int:
        p = self.pids.get(pid)
        return max(p.tids.items(), key=lambda kv: kv[1])[0] if p and p.tids else pid


def _callers(chain: tuple, name: str, symbols) -> tuple:
    out, last = [], name
    for a in chain[1:]:
        c = symbols.name(a)
        if c != last:
            out.append(c)
            last = c
            if len(out) >= CALLERS:
                break
    return tuple(out)


def path(f: Function) -> str:
    """'function <- caller <- caller'."""
    return " <- ".join((f.name,) + f.callers)

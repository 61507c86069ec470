"""The chain from a NIC event back to the kernel function: an event of the kernel log (or
a queue's interrupts standing still) tied to what preceded it on the core that serves
that queue, or, when the queue's core is not known, on any core saturated in kernel
time in the LOOKBACK seconds before it:

    eth0 transmit queue 3 stalled at 12:00:07 (ena: TX q 3 paused for too long); cpu1 had
    been saturated in kernel time for 6 s before it: kubelet (pid 123) in
    mem_cgroup_nr_lru_pages; 68,612 dying memory cgroups against 240 live
"""
from __future__ import annotations

import time
from typing import NamedTuple

LOOKBACK = 10.0          # seconds before an event a core's kernel-time saturation still counts
SLACK = 1.0              # a sample's length: a streak is known to within it


class Span(NamedTuple):
    cpu: int
    start: float         # seconds on the monotonic clock (the kernel log's clock)
    end: float           # now, for an ongoing one


class Chain(NamedTuple):
    event: object        # kmsg.Event
    cpu: "int | None"    # None: no core saturated in kernel time before it
    seconds: float       # how long that core had been saturated in kernel time at the event
    culprit: str         # 'kubelet (pid 123) in mem_cgroup_nr_lru_pages', or ''
    memory: str          # '68,612 dying memory cgroups against 240 live', or ''
    wall: float          # the event's time of day (time.time())

    @property
    def linked(self) -> bool:
        return self.cpu is not None

    def text(self) -> str:
        e = self.event
        at = time.strftime("%H:%M:%S", time.localtime(self.wall))
        head = f"{headline(e)} at {at} ({e.what()})"
        if self.cpu is None:
            return f"{head}; no core saturated in kernel time in the {LOOKBACK:.0f} s before it"
        tail = f": {self.culprit}" if self.culprit else ": nobody named"
        tail += f"; {self.memory}" if self.memory else ""
        return f"{head}; cpu{self.cpu} had been saturated in kernel time for {self.seconds:.0f} s before it{tail}"


def headline(e) -> str:
    if e.kind in ("tx_paused", "tx_timeout"):
        return f"{e.device} transmit queue {e.queue} stalled"
    if e.kind == "irq_stalled":
        return f"{e.device} queue {e.queue}'s interrupts stopped"
    if e.kind == "napi_starved":
        return f"{e.device}'s napi poll starved"
    if e.kind == "reset":
        return f"{e.device} reset"
    return f"cpu{e.cpu} soft lockup" if e.cpu is not None else e.kind


def candidates(e, queue_cpus: dict) -> "set | None":
    """The cores that serve the event's queue (or the one it names); None: any core."""
    if e.kind in ("soft_lockup", "irq_stalled") and e.cpu is not None:
        return {e.cpu}
    cpus = queue_cpus.get((e.device, e.queue)) if e.queue is not None else None
    if cpus is None and e.queue is None:
        cpus = set().union(*(c for (dev, _), c in queue_cpus.items() if dev == e.device)) or None
    return cpus


def link(e, spans: list, queue_cpus: dict) -> "tuple | None":
    """(cpu, seconds saturated in kernel time before e) of the span that fits best."""
    cpus = candidates(e, queue_cpus)
    best = None
    for s in spans:
        if cpus is not None and s.cpu not in cpus:
            continue
        if s.start > e.when + SLACK or s.end < e.when - LOOKBACK:
            continue
        before = max(0.0, min(e.when, s.end) - s.start)
        if best is None or before > best[1]:
            best = (s.cpu, before)
    return best


def memory_text(mem) -> str:
    if mem is None or mem.dying <= 0 or mem.dying < mem.live:
        return ""
    return f"{mem.dying:,} dying memory cgroups against {mem.live:,} live"

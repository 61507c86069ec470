"""Saturation streaks per core: how long each core has been at or above the threshold
without a break, the longest within a window, and the completed ones by the mode that
dominated them.

A streak is a run of consecutive saturated intervals of the sampler (one second by
default), its length the sum of those intervals as the core's own jiffies count them.
So a burst shows as a streak only if it fills at least one interval at the threshold:
a 1.5 s burst that straddles two intervals at 75 % each is not seen, and a streak's
length is known to within one interval on each side.
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

from reaper.nodestats import CPU_MODES

# Histogram buckets of completed streaks, seconds: 5 is the network driver's Tx watchdog
# (ENA resets the NIC after 5 s without Tx completions), 20 the soft-lockup watchdog.
BUCKETS = (1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
KERNEL_MODES = ("system", "softirq", "irq")
SIGNATURE_SECONDS = 5.0


class Streak(NamedTuple):
    cpu: int
    seconds: float
    mode: str          # the mode with most time over the streak
    share: float       # that mode's share of the streak's time
    end: float         # monotonic time it ended (or was last seen, while ongoing)

    @property
    def in_kernel(self) -> bool:
        return self.mode in KERNEL_MODES


def dominant(modes: dict) -> tuple:
    """(mode, share) of the mode with most seconds in modes (mode -> seconds)."""
    total = sum(modes.values())
    mode = max(CPU_MODES, key=lambda m: modes.get(m, 0.0))
    return mode, (modes.get(mode, 0.0) / total if total > 0 else 0.0)


class _Ongoing:
    __slots__ = ("seconds", "modes")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.modes = dict.fromkeys(CPU_MODES, 0.0)


class Streaks:
    """Fed one sample of per-core ratios at a time (nodestats.CpuSampler's ratios and
    seconds). Its state is per core: the ongoing streak, and the completed ones of the
    last window (at most one per two intervals: bounded by window / interval)."""

    def __init__(self, threshold: float = 0.95, window: float = 600.0) -> None:
        self.threshold = threshold
        self.window = window
        self.ongoing: dict = {}          # cpu -> _Ongoing
        self.recent: dict = {}           # cpu -> deque of (end, seconds) within the window
        self.cpus: tuple = ()            # the cores seen in the last sample
        self.counts = {m: [0] * (len(BUCKETS) + 1) for m in CPU_MODES}   # per bucket, +Inf last
        self.sums = dict.fromkeys(CPU_MODES, 0.0)

    def update(self, now: float, ratios: dict, seconds: dict) -> list:
        """One sample; returns the streaks it ended (Streak)."""
        ended = []
        for cpu, r in ratios.items():
            dt = seconds.get(cpu, 0.0)
            if r["busy"] >= self.threshold:
                s = self.ongoing.get(cpu)
                if s is None:
                    s = self.ongoing[cpu] = _Ongoing()
                s.seconds += dt
                for m in CPU_MODES:
                    s.modes[m] += r[m] * dt
            elif cpu in self.ongoing:
                ended.append(self._end(cpu, now))
        self.cpus = tuple(sorted(ratios))
        self._forget(now)
        return ended

    def _end(self, cpu: int, now: float) -> Streak:
        s = self.ongoing.pop(cpu)
        mode, share = dominant(s.modes)
        self.recent.setdefault(cpu, deque()).append((now, s.seconds))
        counts = self.counts[mode]
        for i, bound in enumerate(BUCKETS):
            if s.seconds <= bound:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
        self.sums[mode] += s.seconds
        return Streak(cpu, s.seconds, mode, share, now)

    def _forget(self, now: float) -> None:
        for q in self.recent.values():
            while q and q[0][0] < now - self.window:
                q.popleft()

    def current(self, cpu: int) -> float:
        s = self.ongoing.get(cpu)
        return s.seconds if s is not None else 0.0

    def longest(self, cpu: int) -> float:
        """The longest streak of cpu within the window, the ongoing one included."""
        return max([self.current(cpu)] + [secs for _, secs in list(self.recent.get(cpu, ()))])

    def now_ongoing(self, now: float) -> list:
        """The ongoing streaks as Streak records (their end: now)."""
        out = []
        for cpu, s in list(self.ongoing.items()):
            mode, share = dominant(s.modes)
            out.append(Streak(cpu, s.seconds, mode, share, now))
        return out

    def histogram(self) -> dict:
        """mode -> (cumulative [(bound, count)] with +Inf last, sum)."""
        out = {}
        for m in CPU_MODES:
            acc, rows = 0, []
            for bound, n in zip(BUCKETS + (float("inf"),), self.counts[m]):
                acc += n
                rows.append((bound, acc))
            out[m] = (rows, self.sums[m])
        return out

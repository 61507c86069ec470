"""The sampler of ``reaper node``: one sample a second of the per-core CPU (its streaks),
the per-process scan while a core is saturated, and at longer intervals the memory
cgroups, the holders of dying ones and the zombies. Run from reaper node's loop (its
main thread); the collector and the report read what it keeps, whole objects replaced
at each sample (the scrape runs in the HTTP server's thread).
"""
from __future__ import annotations

import time
from collections import deque

from reaper.node import cgroups, chain, culprits, nic, profile, sampling, streaks, zombies
from reaper.nodestats import CpuSampler
from reaper.policy import SayOnce

SAMPLE_INTERVAL = 1.0
CGROUP_INTERVAL = 10.0      # live directories walked, /proc/cgroups or cgroup.stat read
HOLDERS_INTERVAL = 30.0     # the v2 walk down to the holders of dying cgroups
ZOMBIE_INTERVAL = 30.0      # one pass over proc/*/stat
HELD_MAX = 64               # processes remembered as having held saturated cores
HELD_MIN = 0.05             # seconds of system time below which a process held nothing worth a name


class Held:
    """A process's system time summed over the scans that named it."""

    __slots__ = ("pid", "comm", "cpu", "cgroup", "seconds", "peak")

    def __init__(self, c: culprits.Culprit) -> None:
        self.pid, self.comm, self.cpu, self.cgroup = c.pid, c.comm, c.cpu, c.cgroup
        self.seconds = 0.0
        self.peak = 0.0             # its highest share of one core


def describe(c, function: str = "") -> str:
    """One culprit (Culprit or Held) for a log line, with the kernel function it was
    sampled in most ('f <- caller <- ...') when there is one."""
    share = f", {c.ratio:.0%} of a core" if hasattr(c, "ratio") else f", {c.seconds:.1f} s system time"
    where = f" on cpu{c.cpu}" if c.cpu >= 0 else ""
    return f"{c.comm} (pid {c.pid}{where}{share}, cgroup {c.cgroup or '?'})" + (f" in {function}" if function else "")


def kernel_share(r: "dict | None") -> float:
    """A core's share of the last sample in system, irq and softirq time."""
    return (r["system"] + r["irq"] + r["softirq"]) if r else 0.0


class Monitor:
    def __init__(self, proc: str, sys: str, threshold: float, window: float, log, clock=time.monotonic,
                 kmsg_path: "str | None" = None, nic_stats: frozenset = frozenset()) -> None:
        self.proc, self.sys, self.window, self.log, self.clock = proc, sys, window, log, clock
        self.cpu = CpuSampler(proc)             # raises OSError: no proc/stat
        self.streaks = streaks.Streaks(threshold, window)
        self.kernel = culprits.KernelTime(proc, clock=clock)
        self.sampling = sampling.Sampling(proc, log)
        self.nic = nic.Nic(proc, sys, log, kmsg_path, nic_stats, clock=clock)
        self.kernel_since: dict = {}  # cpu -> when its ongoing saturation in kernel time began
        self.spans: deque = deque(maxlen=4 * HELD_MAX)     # chain.Span of ended kernel-time saturations
        self.hier = cgroups.hierarchies(sys)
        self.growth = cgroups.Growth(window)
        self.memory = None          # cgroups.MemoryCgroups
        self.first_memory = None    # the first count (the report's growth)
        self.holders: list = []     # [(cgroup, dying below it)]
        self.zombies = None         # zombies.Zombies
        self.top: list = []         # the last kernel-time attribution (Culprit), kept until the next
        self.held: dict = {}        # pid -> Held, over the whole run (bounded)
        self.episode: dict = {}     # pid -> Held, while some core is saturated
        self.signalled: set = set() # cores whose ongoing streak was logged as a signature
        self.ended: list = []       # completed streaks of the run, the longest kept (the report)
        self.samples = 0
        self._due = {"memory": 0.0, "holders": 0.0, "zombies": 0.0}
        # Each reader fails alone: said once, left out while it fails (its value False).
        self.guard = SayOnce(lambda name, e: log.warn(f"node: reading {name} failed ({e!r}): left out while it fails"),
                             default=False)

    # --- one sample --------------------------------------------------------------

    def sample(self, now: float) -> None:
        self.samples += 1
        if self.guard.run("per-core CPU", self.cpu.sample) is False:
            self.cpu.ratios, self.cpu.seconds = {}, {}      # stale ratios would look live
        ended = self.streaks.update(now, self.cpu.ratios, self.cpu.seconds)
        saturated = set(self.streaks.ongoing)
        kernel = {c for c in saturated if kernel_share(self.cpu.ratios.get(c)) >= sampling.KERNEL_SHARE}
        if self.sampling.available and \
                self.guard.run("kernel functions", self.sampling.update, now, kernel, saturated) is False:
            self.sampling.off = "the sampler failed"          # said once by the guard
            self.sampling.stop()
        for cpu in [c for c in self.kernel_since if c not in saturated]:
            self.spans.append(chain.Span(cpu, self.kernel_since.pop(cpu), now))
        for cpu in kernel:
            self.kernel_since.setdefault(cpu, now - self.cpu.seconds.get(cpu, 1.0))
        for s in ended:
            self._ended(s)
        if self.guard.run("NIC", self.nic.sample, now, self.kernel_since, self.kernel_spans(now), self.culprit,
                       self.memory) is False:
            self.nic.close()
            self.nic = nic.Nic(self.proc, self.sys, self.log, None)
        if self.streaks.ongoing:
            self._attribute(now, bool(kernel))
        else:
            self.kernel.reset()
            self.episode = {}
        self._periodic(now)

    def _attribute(self, now: float, in_kernel: bool) -> None:
        """The processes that held saturated cores in the kernel: from the sampled cores'
        samples, or, where sampling is off, from the per-process scan. Kept until the next
        kernel-time streak: a core busy in user mode later does not replace them."""
        if self.sampling.available:
            top = self.sampling.culprits(culprits.TOP)
        else:
            top = self.kernel.scan()
        if top and in_kernel:
            self.top = top
        for c in top:
            for table in (self.held, self.episode):
                h = table.get(c.pid)
                if h is None:
                    h = table[c.pid] = Held(c)
                h.cpu, h.seconds, h.peak = c.cpu, h.seconds + c.seconds, max(h.peak, c.ratio)
            _bound(self.held)
        for s in self.streaks.now_ongoing(now):
            if s.cpu not in self.signalled and s.seconds >= streaks.SIGNATURE_SECONDS and s.in_kernel:
                self.signalled.add(s.cpu)
                named = "; ".join(describe(c, self.function(c.pid, s.cpu)) for c in top) or \
                    "none named yet (a pass over many processes takes several samples; softirq and irq time is " \
                    "no process's)"
                self.log.warn(f"cpu{s.cpu} saturated for {s.seconds:.0f} s ({s.mode} {s.share:.0%}): "
                              f"kernel time: {named}")

    def _ended(self, s: streaks.Streak) -> None:
        self.ended.append(s)
        if len(self.ended) > 2 * HELD_MAX:
            self.ended = sorted(self.ended, key=lambda x: -x.seconds)[:HELD_MAX]
        if s.cpu in self.signalled:
            self.signalled.discard(s.cpu)
            held = sorted((h for h in self.episode.values() if h.seconds >= HELD_MIN),
                          key=lambda h: -h.seconds)[:culprits.TOP]
            named = "; ".join(describe(h, self.function(h.pid, s.cpu)) for h in held) or "none named"
            self.log.warn(f"cpu{s.cpu} saturation ended after {s.seconds:.0f} s ({s.mode} {s.share:.0%}): "
                          f"kernel time over it: {named}")

    def kernel_spans(self, now: float) -> list:
        """chain.Span of the saturations in kernel time, ended and ongoing."""
        return list(self.spans) + [chain.Span(cpu, start, now) for cpu, start in self.kernel_since.items()]

    def culprit(self, cpu: int, when: float) -> str:
        """Who held cpu in the kernel around when: 'kubelet (pid 123) in f', from the
        core's samples, else from the processes named on it; '' if nobody."""
        prof = self.sampling.profiles().get(cpu)
        if prof is not None and prof.started <= when + chain.SLACK and \
                (prof.ended is None or prof.ended >= when - chain.LOOKBACK):
            for c in prof.culprits(3, 1):
                if c.pid:
                    comm, _ = self.sampling.name(prof, c.pid)
                    return f"{comm} (pid {c.pid})" + (f" in {c.functions[0].name}" if c.functions else "")
        held = [h for h in self.episode.values() if h.cpu == cpu] or [h for h in self.held.values() if h.cpu == cpu]
        if held:
            h = max(held, key=lambda h: h.seconds)
            return f"{h.comm} (pid {h.pid})"
        return ""

    def function(self, pid: int, cpu: int) -> str:
        """The kernel function pid was sampled in most on cpu ('f <- caller <- ...'), or ''."""
        prof = self.sampling.profiles().get(cpu)
        for c in prof.culprits(5, 1) if prof is not None else ():
            if c.pid == pid and c.functions:
                return profile.path(c.functions[0])
        return ""

    def _periodic(self, now: float) -> None:
        if now >= self._due["memory"]:
            self._due["memory"] = now + CGROUP_INTERVAL
            m = self.guard.run("memory cgroups", cgroups.memory_cgroups, self.proc, self.sys, self.hier) or None
            self.memory = m
            if m is not None:
                self.first_memory = self.first_memory or m
                self.growth.add(now, m.dying)
        if now >= self._due["holders"]:
            self._due["holders"] = now + HOLDERS_INTERVAL
            if self.hier.v2 is not None:
                self.holders = self.guard.run("dying cgroup holders", cgroups.holders, self.hier.v2,
                                           self.hier.v2_memory) or []
        if now >= self._due["zombies"]:
            self._due["zombies"] = now + ZOMBIE_INTERVAL
            self.zombies = self.guard.run("zombies", zombies.count_zombies, self.proc) or None

    def close(self) -> None:
        self.sampling.stop()
        self.nic.close()

    def refresh(self, now: float) -> None:
        """The periodic reads now (the report's last figures)."""
        self._due = dict.fromkeys(self._due, 0.0)
        self._periodic(now)


def _bound(table: dict) -> None:
    if len(table) > HELD_MAX:
        for pid, _ in sorted(table.items(), key=lambda kv: kv[1].seconds)[:len(table) - HELD_MAX]:
            del table[pid]

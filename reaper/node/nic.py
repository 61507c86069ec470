"""The NIC side of reaper node, run from the Monitor's sample: the kernel log's events
(kmsg.py), the NIC queues' interrupts and their early warning (queues.py), the
drivers' counters (ethtool.py), and each event's chain back to the core that starved
it (chain.py). A source that cannot be read is said once and left off.
"""
from __future__ import annotations

import time
from collections import deque

from reaper.node import chain, ethtool, kmsg, queues
from reaper.procfs import system

QUEUE_MAP_INTERVAL = 60.0    # IRQs of the NIC queues and their cores, read again
QUEUE_IDLE_INTERVAL = 5.0    # /proc/interrupts read this often while no core is saturated in kernel time
ETHTOOL_INTERVAL = 10.0
EVENTS_MAX = 256             # events and chains kept for the report
WARN_AGAIN = 30.0            # a device's chain is logged once in this long (its events come in bursts)


class Nic:
    def __init__(self, proc: str, sys: str, log, kmsg_path: "str | None", asked: frozenset = frozenset(),
                 clock=time.monotonic, wall=time.time) -> None:
        self.proc, self.sys, self.log, self.clock, self.wall = proc, sys, log, clock, wall
        self.off: dict = {}                  # source -> why it is off (said once)
        self.kernel_log = None
        if kmsg_path:
            try:
                self.kernel_log = kmsg.KernelLog(kmsg_path)
            except OSError as e:
                self._off("kernel log", f"{kmsg_path}: {e.strerror} (reading /dev/kmsg needs CAP_SYSLOG where "
                                            "kernel.dmesg_restrict is 1)")
        self.ethtool = None
        try:
            self.ethtool = ethtool.Reader(asked)
        except OSError as e:
            self._off("driver counters", f"socket: {e.strerror}")
        self.counts = kmsg.Counts()
        self.events: deque = deque(maxlen=EVENTS_MAX)
        self.chains: deque = deque(maxlen=EVENTS_MAX)
        self.chained = 0                     # events tied to a core saturated in kernel time
        self.watch = queues.Watch()
        self.queue_map: dict = {}            # irq -> queues.Queue
        self.queue_cpus: dict = {}           # (device, queue) -> {cpu}
        self.stats: dict = {}                # iface -> (driver, {stat: value})
        self.first_stats: "dict | None" = None
        self._due = {"map": 0.0, "queues": 0.0, "ethtool": 0.0}
        self._warned: dict = {}              # device -> when its chain was last logged

    def _off(self, source: str, why: str) -> None:
        if source not in self.off:
            self.off[source] = why
            self.log.warn(f"node: {source} not read: {why}")

    def sample(self, now: float, kernel_since: dict, spans: list, culprit, memory) -> None:
        """kernel_since: cpu -> when its kernel-time saturation began (ongoing); spans:
        chain.Span of the kernel-time streaks, ended and ongoing; culprit(cpu, when) ->
        text; memory: the last MemoryCgroups."""
        events = self._kernel_log()
        events += self._queues(now, kernel_since)
        for e in events:
            self.counts.add(e)
            self.events.append(e)
            found = chain.link(e, spans, self.queue_cpus)
            c = chain.Chain(e, found[0] if found else None, found[1] if found else 0.0,
                            culprit(found[0], e.when) if found else "", chain.memory_text(memory) if found else "",
                            self.wall() - (self.clock() - e.when))
            self.chains.append(c)
            if c.linked:
                self.chained += 1
                if now - self._warned.get(e.device, float("-inf")) >= WARN_AGAIN:
                    self._warned[e.device] = now
                    self.log.warn(c.text())
        if now >= self._due["ethtool"] and self.ethtool is not None:
            self._due["ethtool"] = now + ETHTOOL_INTERVAL
            self.read_stats()

    def read_stats(self) -> None:
        try:
            self.stats = self.ethtool.read()
        except OSError as e:
            self._off("driver counters", f"SIOCETHTOOL: {e.strerror}")
            self.ethtool.close()
            self.ethtool = None
            return
        if self.first_stats is None:
            self.first_stats = self.stats

    def _kernel_log(self) -> list:
        if self.kernel_log is None:
            return []
        try:
            return self.kernel_log.poll()
        except OSError as e:
            self._off("kernel log", f"{self.kernel_log.path}: {e.strerror}")
            self.kernel_log.close()
            self.kernel_log = None
            return []

    def _queues(self, now: float, kernel_since: dict) -> list:
        if now < self._due["queues"] and not kernel_since:
            return []
        self._due["queues"] = now + QUEUE_IDLE_INTERVAL
        parsed = system.read_interrupts(self.proc)
        if parsed is None:
            return []
        counts = queues.queue_counts(parsed)
        if now >= self._due["map"] or any(irq not in self.queue_map for irq in counts):
            self._due["map"] = now + QUEUE_MAP_INTERVAL
            self.queue_map = queues.queues(counts, self.proc, self.sys)
            cpus: dict = {}
            for q in self.queue_map.values():
                if q.cpu >= 0:
                    cpus.setdefault((q.device, q.queue), set()).add(q.cpu)
            self.queue_cpus = cpus
        return self.watch.update(now, counts, self.queue_map, kernel_since)

    def grown(self) -> list:
        """[(iface, driver, stat, growth)] of the counters that grew since the first reading."""
        out = []
        for iface, (drv, stats) in sorted(self.stats.items()):
            before = (self.first_stats or {}).get(iface, (drv, {}))[1]
            for name, v in sorted(stats.items()):
                if name in before and v > before[name]:
                    out.append((iface, drv, name, v - before[name]))
        return out

    def close(self) -> None:
        if self.kernel_log is not None:
            self.kernel_log.close()
        if self.ethtool is not None:
            self.ethtool.close()

"""reaper node's Prometheus families, read at scrape time from the Monitor (under its
lock: a sample replaces what a scrape reads) and from the kernel's per-core counters
(pressure, softnet, interrupts), which cost one small read each and are read only
when scraped. Labels are bounded: one series per core where the figure is per core,
the top 5 where it names processes or cgroups."""
from __future__ import annotations

import threading
import time

from reaper.node import interrupts, pressure, softnet

SOURCES = ("proc_stat", "processes", "cgroups", "pressure", "softnet", "interrupts", "kernel_functions", "kernel_log",
           "driver_counters")
CACHE = 0.5         # seconds a read of the per-core counters serves scrapes


class NodeCollector:
    def __init__(self, monitor, lock: threading.Lock) -> None:
        self.m = monitor
        self.lock = lock
        self._cache: dict = {}

    def _fresh(self, name: str, read):
        now = time.monotonic()
        hit = self._cache.get(name)
        if hit is None or now - hit[0] > CACHE:
            hit = self._cache[name] = (now, read(self.m.proc))
        return hit[1]

    def collect(self):
        from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G, \
            HistogramMetricFamily as H
        from prometheus_client.utils import floatToGoString

        from reaper import __version__

        available = {}
        g = G("reaper_build_info", "reaper's version and mode", labels=["version", "mode"])
        g.add_metric([__version__, "node"], 1)
        yield g
        with self.lock:
            m = self.m
            st = m.streaks
            yield G("reaper_node_cpu_saturation_threshold_ratio", "Busy share at or above which a core counts as "
                                                                  "saturated (--threshold)", value=st.threshold)
            available["proc_stat"] = m.cpu.available and "per-core CPU" not in m.guard.failed
            cur = G("reaper_node_cpu_saturation_streak_seconds", "How long the core has been saturated without a "
                                                                 "break (0 when it is not)", labels=["cpu"])
            top = G("reaper_node_cpu_saturation_streak_max_seconds", "The core's longest saturation streak, ended "
                                                                     "or ongoing, within --window", labels=["cpu"])
            for cpu in st.cpus:
                cur.add_metric([str(cpu)], st.current(cpu))
                top.add_metric([str(cpu)], st.longest(cpu))
            yield cur
            yield top
            h = H("reaper_node_cpu_saturation_streak_length_seconds", "Completed saturation streaks, node-wide, by "
                                                                      "the mode that dominated them", labels=["mode"])
            for mode, (rows, total) in st.histogram().items():
                h.add_metric([mode], [(floatToGoString(b), n) for b, n in rows], total)
            yield h
            g = G("reaper_node_kernel_time_top_ratio", "Kernel time of the processes with most while a core was "
                                                       "saturated in kernel time (the top 5 of the last sample, kept "
                                                       "until the next kernel-time streak): share of one core; cpu: "
                                                       "the core",
                  labels=["pid", "comm", "cpu", "cgroup"])
            for c in m.top:
                g.add_metric([str(c.pid), c.comm, str(c.cpu), c.cgroup], c.ratio)
            yield g
            g = G("reaper_node_kernel_function_top_ratio", "Kernel functions a core saturated in kernel time was "
                                                           "sampled in (perf cpu-clock, the 5 with most samples of the "
                                                           "ongoing streak, else of the core's last one): share of the "
                                                           "core's samples", labels=["cpu", "function"])
            for cpu, prof in sorted(m.sampling.profiles().items()):
                for name, ratio in prof.top_functions():
                    g.add_metric([str(cpu), name], ratio)
            yield g
            available["kernel_functions"] = m.sampling.available
            yield from self._nic(C, available)
            yield C("reaper_node_kernel_time_scans", "Per-process scans (one a sample while a core is saturated and "
                                                    "sampling is off)",
                    value=m.kernel.scans)
            available["processes"] = m.kernel.available and m.zombies is not None
            mem = m.memory
            available["cgroups"] = mem is not None
            if mem is not None:
                g = G("reaper_node_memory_cgroups", f"Memory cgroups of the node (cgroup v{mem.version}: "
                                                    f"{mem.source}): live, and dying (removed, still held by "
                                                    "charged memory)", labels=["state"])
                g.add_metric(["live"], mem.live)
                g.add_metric(["dying"], mem.dying)
                yield g
            rate = m.growth.per_second()
            if rate is not None:
                yield G("reaper_node_memory_cgroups_dying_growth_per_second", "Growth of the dying memory cgroups "
                                                                              "over --window", value=rate)
            if m.hier.v2 is not None:
                g = G("reaper_node_cgroup_dying_children", "Dying cgroups directly below a live cgroup of the v2 "
                                                           "hierarchy (the 5 that hold most)", labels=["cgroup"])
                for path, n in m.holders:
                    g.add_metric([path], n)
                yield g
            z = m.zombies
            if z is not None:
                yield G("reaper_node_zombies", "Processes of the host in state Z", value=z.total)
                g = G("reaper_node_zombies_by_cgroup", "Zombies by cgroup (the 5 with most)", labels=["cgroup"])
                for path, n in z.by_cgroup:
                    g.add_metric([path], n)
                yield g
        yield from self._counters(C, available)
        g = G("reaper_node_source_available", "1 if reaper node could read the source at its last read",
              labels=["source"])
        for source in SOURCES:
            g.add_metric([source], 1 if available.get(source) else 0)
        yield g

    def _nic(self, C, available):
        n = self.m.nic
        available["kernel_log"] = n.kernel_log is not None
        available["driver_counters"] = n.ethtool is not None
        c = C("reaper_node_nic_events", "NIC and watchdog events: the kernel log's (ENA's TX pause, napi "
                                        "starvation and reset, NETDEV WATCHDOG and mlx5 transmit timeouts, soft "
                                        "lockups) and queues whose interrupts stopped on a core saturated in kernel "
                                        "time", labels=["device", "kind"])
        for (device, kind), count in sorted(n.counts.counts.items()):
            c.add_metric([device, kind], count)
        yield c
        yield C("reaper_node_nic_chains", "NIC events that followed a saturation in kernel time of the core serving "
                                          "the queue (or of any core, when that is not known) within 10 s",
                value=n.chained)
        c = C("reaper_node_nic_driver_stats", "Drivers' statistics (ethtool -S): ENA's reset reasons, every "
                                              "*_allowance_exceeded, and those asked for (--nic-stats)",
              labels=["device", "driver", "stat"])
        for iface, (drv, stats) in sorted(n.stats.items()):
            for name, v in sorted(stats.items()):
                c.add_metric([iface, drv, name], v)
        yield c

    def _counters(self, C, available):
        psi = self._fresh("pressure", pressure.read_pressure)
        available["pressure"] = psi is not None
        if psi is not None:
            c = C("reaper_node_pressure_stalled_seconds", "Time tasks stalled on a resource (/proc/pressure: some: "
                                                          "at least one; full: all non-idle)",
                  labels=["resource", "kind"])
            for res, kinds in sorted(psi.items()):
                for kind, p in sorted(kinds.items()):
                    c.add_metric([res, kind], p.total)
            yield c
        net = self._fresh("softnet", softnet.read_softnet)
        available["softnet"] = net is not None
        if net is not None:
            for name, doc, field in (
                    ("reaper_node_softnet_processed", "Packets the receive softirq processed, per core", "processed"),
                    ("reaper_node_softnet_dropped", "Packets dropped with the backlog full, per core", "dropped"),
                    ("reaper_node_softnet_times_squeezed", "Times the receive softirq stopped with work left (its "
                                                           "budget or time ran out), per core", "squeezed")):
                c = C(name, doc, labels=["cpu"])
                for cpu, s in sorted(net.items()):
                    c.add_metric([str(cpu)], getattr(s, field))
                yield c
        irq = self._fresh("interrupts", interrupts.read_interrupts)
        available["interrupts"] = irq is not None
        if irq is not None:
            c = C("reaper_node_interrupts", "Interrupts per core (every line of /proc/interrupts)", labels=["cpu"])
            for cpu, n in sorted(irq.items()):
                c.add_metric([str(cpu)], n)
            yield c


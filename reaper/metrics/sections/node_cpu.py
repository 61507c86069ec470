"""Node CPU from the sampler thread (sampler.CpuPart). summary (the default): a fixed
number of series whatever the cores; per-core: also 7 series per core; off: nothing
(no sampler)."""
from __future__ import annotations

from reaper.metrics import names as N


def collect(r, available):
    from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

    from reaper import nodestats

    mode = r.cfg.node_metrics
    if mode == "off":
        return
    cpu = r.x.cpu                      # None once the sampler switched it off
    available["proc_stat"] = cpu is not None and cpu.available
    if not available["proc_stat"] or not cpu.ratios:
        return
    ratios = dict(cpu.ratios)          # one sample: the sampler replaces the dict whole
    sat = f"{nodestats.SATURATED:.0%}"
    g = G(N.NODE_CPU_BUSIEST_RATIO, "The highest per-core ratio over the last second, by mode "
                                    "(busy: all non-idle time)", labels=["mode"])
    for m in ("busy",) + nodestats.CPU_MODES:
        g.add_metric([m], max(ratio[m] for ratio in ratios.values()))
    yield g
    yield G(N.NODE_CPUS, "Cores sampled from the host-wide /proc/stat", value=len(ratios))
    yield G(N.NODE_CPU_SATURATED_CORES, f"Cores at >= {sat} busy over the last second",
            value=sum(1 for ratio in ratios.values() if ratio["busy"] >= nodestats.SATURATED))
    yield C(N.NODE_CPU_ANY_SATURATED_SECONDS, f"Seconds in which at least one core was at >= {sat} "
                                              "busy", value=cpu.any_saturated)
    yield C(N.NODE_CPU_BUSIEST_SATURATED_SECONDS, f"Seconds at >= {sat} busy of the core that has "
                                                  "most of them", value=cpu.busiest_saturated())
    if mode != "per-core":
        return
    g = G(N.NODE_CPU_MODE_RATIO, "Share of each core's time in a mode over the last second "
                                 "(host-wide /proc/stat)", labels=["cpu", "mode"])
    busy = G(N.NODE_CPU_BUSY_RATIO, "Share of each core's time not idle (nor iowait) over the "
                                    "last second", labels=["cpu"])
    for n in sorted(ratios):
        for m in nodestats.CPU_MODES:
            g.add_metric([str(n), m], ratios[n][m])
        busy.add_metric([str(n)], ratios[n]["busy"])
    yield g
    yield busy
    c = C(N.NODE_CPU_SATURATED_SECONDS, f"Seconds each core spent at >= {sat} busy", labels=["cpu"])
    for n, secs in sorted(dict(cpu.saturated).items()):
        c.add_metric([str(n)], secs)
    yield c

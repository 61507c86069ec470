"""The collector prometheus_client asks at each collection: the registered sections
(reaper/metrics/sections/), each run under one guard, then reaper_source_available,
which says which sources (SOURCES) the sections could read for this scrape."""
from __future__ import annotations

from reaper.metrics import names as N
from reaper.metrics.reading import Reading
from reaper.metrics.sections import SECTIONS
from reaper.policy import SayOnce

# What the sections read; reaper_source_available says which they could read for a scrape.
SOURCES = ("proc", "proc_stat", "proc_cgroups", "cgroup_pids", "cgroup_tree", "cgroup_stat", "self_memory")


def guard(log) -> SayOnce:
    """A scrape-time guard (policy.SayOnce): a part whose collection raises is left out
    of that scrape (said once, the first time), the rest is served; it is asked again
    next scrape. run(name, collected, collect, *args)."""
    return SayOnce(lambda name, e: log.warn(f"metrics: collecting {name} failed ({e!r}): left out while it fails"),
                   default=[])


def collected(collect, *args) -> list:
    """collect(*args)'s families as a list: a generator raises while it is run, inside the guard."""
    return list(collect(*args))


class Guarded:
    """Another collector (prometheus_client's ProcessCollector) under the guard."""

    def __init__(self, inner, name: str, log) -> None:
        self.inner, self.name = inner, name
        self.guard = guard(log)

    def collect(self):
        return self.guard.run(self.name, collected, self.inner.collect)


class ReaperCollector:
    """Reads Stats, /proc and the sampler's results at scrape time, section by section."""

    def __init__(self, exporter, scope) -> None:
        self.reading = Reading(exporter, scope)
        self.guard = guard(exporter.log)

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        r, available = self.reading, {}
        for name, section in SECTIONS:
            yield from self.guard.run(name, collected, section, r, available)
        g = GaugeMetricFamily(N.SOURCE_AVAILABLE,
                              "1 if reaper could read the source for this scrape; the metrics of a source "
                              "it could not read are left out", labels=["source"])
        for source in SOURCES:
            if source == "proc_stat" and r.cfg.node_metrics == "off":
                continue                   # not read by choice (--node-metrics off), not unreadable
            g.add_metric([source], 1 if available.get(source) else 0)
        yield g

    def invalidate(self) -> None:
        self.reading.invalidate()

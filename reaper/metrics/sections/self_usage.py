"""reaper's own CPU time and resident memory."""
from __future__ import annotations

import os

from reaper.metrics import names as N


def collect(r, available):
    from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

    from reaper import nodestats

    t = os.times()
    c = C(N.CPU_SECONDS, "reaper's own CPU time", labels=["mode"])
    c.add_metric(["user"], t.user)
    c.add_metric(["system"], t.system)
    yield c
    rss = nodestats.own_rss()
    available["self_memory"] = rss is not None
    if rss is not None:
        yield G(N.RESIDENT_MEMORY_BYTES, "reaper's own resident memory", value=rss)

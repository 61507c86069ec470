"""The end-of-life drain: how the processes left ended, and how long it took."""
from __future__ import annotations

from reaper.metrics import names as N
from reaper.metrics.reading import copy

RESULTS = ("terminated", "killed", "survived", "not_permitted")     # stats.Stats.drain's keys


def collect(r, available):
    from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

    s = r.stats
    c = C(N.DRAIN_PROCESSES, "Processes left when the main child ended, by how they ended "
                             "(terminated by SIGTERM, killed by SIGKILL, survived SIGKILL, "
                             "not_permitted: reaper may not signal it)",
          labels=["result"])
    drain = copy(s.drain)
    for result in RESULTS:
        c.add_metric([result], drain.get(result, 0))
    yield c
    if s.drain_seconds is not None:
        yield G(N.DRAIN_DURATION_SECONDS, "How long the drain took", value=s.drain_seconds)

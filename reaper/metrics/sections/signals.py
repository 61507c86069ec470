"""Signals received and forwarded, by name."""
from __future__ import annotations

from reaper.metrics import names as N
from reaper.metrics.reading import copy


def collect(r, available):
    from prometheus_client.core import CounterMetricFamily as C

    s = r.stats
    for name, doc, counter in (
            (N.SIGNALS_RECEIVED, "Signals reaper received, by name", s.signals_received),
            (N.SIGNALS_FORWARDED, "Signals reaper forwarded to the main child, by name as sent",
             s.signals_forwarded)):
        c = C(name, doc, labels=["signal"])
        for sig, n in sorted(copy(counter).items()):
            c.add_metric([sig], n)
        yield c

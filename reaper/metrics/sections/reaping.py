"""Children reaped: by kind and outcome, their CPU, the reap latency histogram."""
from __future__ import annotations

from reaper.metrics import names as N
from reaper.metrics.reading import copy


def collect(r, available):
    from prometheus_client.core import CounterMetricFamily as C, HistogramMetricFamily
    from prometheus_client.utils import floatToGoString

    from reaper.stats import REAP_LATENCY_BUCKETS

    s = r.stats
    c = C(N.REAPED, "Children reaped, by kind (main, orphan, supervised) and outcome "
                    "(exited_0, exited_nonzero or the signal name)", labels=["kind", "outcome"])
    for (kind, outcome), n in sorted(copy(s.reaped).items()):
        c.add_metric([kind, outcome], n)
    yield c
    yield C(N.REAPED_CPU_SECONDS, "User plus system CPU of every child reaped", value=s.reaped_cpu_seconds)
    buckets, acc = [], 0
    counts = list(s.latency_buckets)
    for bound, n in zip(REAP_LATENCY_BUCKETS, counts):
        acc += n
        buckets.append((floatToGoString(bound), acc))
    buckets.append(("+Inf", acc + counts[-1]))
    h = HistogramMetricFamily(N.REAP_LATENCY_SECONDS, "Time from the wake-up that found an exited child to its reap")
    h.add_metric([], buckets, s.latency_sum)
    yield h

"""What went wrong and reaper went on: errors caught, pieces restarted, log lines lost."""
from __future__ import annotations

from reaper.metrics import names as N


def collect(r, available):
    from prometheus_client.core import CounterMetricFamily as C

    s = r.stats
    yield C(N.POLICY_ERRORS, "Errors caught in policy code (reaper went on)", value=s.policy_errors)
    restarts = C(N.POLICY_RESTARTS, "Pieces started again after a failure switched them off", labels=["piece"])
    for piece, n in sorted(s.policy_restarts.items()):
        restarts.add_metric([piece], n)
    yield restarts
    yield C(N.LOG_LINES_DROPPED, "Log lines stderr could not take at once (dropped: reaper "
                                 "never waits on stderr)", value=r.log.dropped)

"""Supervised services (reaper/services/): only when there are some."""
from __future__ import annotations

from reaper.metrics import names as N


def collect(r, available):
    from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

    services = list(r.stats.services)
    if not services:
        return
    # The states are the runner's enumeration; imported only when services run (the
    # runner is loaded then), the one piece-to-piece import of the metrics.
    from reaper.services.runner import STATES

    up = G(N.SERVICE_UP, "1 while the service's process runs", labels=["service"])
    ready = G(N.SERVICE_READY, "1 once the service said it is ready (its current run; "
                               "only --service-ready services say so)", labels=["service"])
    starts = C(N.SERVICE_STARTS, "Times the service was started (failed starts included)",
               labels=["service"])
    failed = G(N.SERVICE_FAILED, "1 once the service was given up (the restart limit, or a "
                                 "failure under --restart never)", labels=["service"])
    state = G(N.SERVICE_STATE, "The service's state: 1 for the current one", labels=["service", "state"])
    code = G(N.SERVICE_LAST_EXIT_CODE, "The exit code of the service's last run (128+N: killed "
                                       "by signal N); absent before its first exit", labels=["service"])
    since = G(N.SERVICE_START_TIME_SECONDS, "When the service's current or last run started, "
                                            "seconds since the epoch", labels=["service"])
    pid = G(N.SERVICE_PID, "The pid of the service's current run in reaper's PID namespace, while it "
                           "runs", labels=["service"])
    floods = C(N.SERVICE_READY_FLOODS, "Runs of the service whose readiness fd reaper gave up "
                                       "on: too much written without a newline", labels=["service"])
    for svc in services:
        up.add_metric([svc.name], 1 if svc.pid is not None else 0)
        ready.add_metric([svc.name], 1 if svc.ready else 0)
        starts.add_metric([svc.name], svc.starts)
        failed.add_metric([svc.name], 1 if svc.failed else 0)
        for st in STATES:
            state.add_metric([svc.name, st], 1 if svc.state == st else 0)
        if svc.last_exit_code is not None:
            code.add_metric([svc.name], svc.last_exit_code)
        if svc.started_at is not None:
            since.add_metric([svc.name], svc.started_at)
        if svc.pid is not None:
            pid.add_metric([svc.name], svc.pid)
        floods.add_metric([svc.name], svc.ready_floods)
    yield from (up, ready, starts, failed, state, code, since, pid, floods)

"""The pids controller of reaper's cgroup: tasks now, and the tightest limit above."""
from __future__ import annotations

from reaper.metrics import names as N


def collect(r, available):
    from prometheus_client.core import GaugeMetricFamily as G

    from reaper import nodestats

    pids = r.fresh("cgroup_pids", nodestats.cgroup_pids)
    available["cgroup_pids"] = pids is not None
    yield G(N.CGROUP_PIDS_AVAILABLE, "1 if the pids controller of reaper's cgroup is readable",
            value=0 if pids is None else 1)
    if pids is not None:
        yield G(N.CGROUP_PIDS, "Tasks in reaper's cgroup (pids.current)", value=pids.current)
        yield G(N.CGROUP_PIDS_MAX, "Tightest pids.max from reaper's cgroup up (+Inf: no limit)", value=pids.max)

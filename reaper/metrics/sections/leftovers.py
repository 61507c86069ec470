"""What ended Ray workers and services left running (reaper/leftovers/), from the
piece's Published numbers in Stats.leftovers; nothing while that piece is off.

Labels are bounded: an action (reported, terminated, killed, stopped), an owner kind
(ray, service, unknown) and a device path, one of the files the --devices globs match
(at most MAX_DEVICES of them); never a pid or a job id.
"""
from __future__ import annotations

from reaper.metrics import names as N
from reaper.metrics.reading import copy

MAX_DEVICES = 64
ACTIONS = ("reported", "terminated", "killed", "stopped")
OWNER_KINDS = ("ray", "service", "unknown")


def collect(r, available):
    from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

    pub = r.stats.leftovers
    if pub is None:
        return
    c = C(N.LEFTOVERS, "Processes left behind by an owner that ended (a Ray worker, a service), "
                       "by what was done to them (--leftovers)", labels=["action"])
    done = copy(pub.leftovers)
    for action in ACTIONS:
        c.add_metric([action], done.get(action, 0))
    yield c
    o = C(N.LEFTOVER_OWNERS_ENDED, "Owners that ended leaving processes behind, by kind "
                                   "(ray, service, unknown: orphaned before reaper saw their owner)",
          labels=["kind"])
    owners = copy(pub.owners)
    for kind in OWNER_KINDS:
        o.add_metric([kind], owners.get(kind, 0))
    yield o
    g = G(N.LEFTOVER_DEVICE_HOLDERS, "Leftovers of ended owners holding the device open now",
          labels=["device"])
    for dev, n in sorted(copy(pub.holders).items())[:MAX_DEVICES]:
        g.add_metric([dev], n)
    yield g
    gpu = pub.gpu
    if gpu is not None:
        m = G(N.LEFTOVER_GPU_MEMORY_BYTES, "GPU memory held by leftovers of ended owners now, by "
                                           "device (--gpu-memory; where NVML's pids are reaper's)",
              labels=["device"])
        for dev, n in sorted(copy(gpu).items())[:MAX_DEVICES]:
            m.add_metric([dev], n)
        yield m
    yield G(N.LEFTOVERS_TRACKED, "Processes reaper knows the owner of (below a Ray worker or a "
                                 "service) at its last sample", value=pub.tracked)

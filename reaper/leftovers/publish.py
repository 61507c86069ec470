"""What the leftovers piece tells: the one log line per ended owner, and its
numbers for the metrics (reaper/metrics.py calls families() at each scrape).

Metric labels are bounded: an action (reported, terminated, killed, stopped), an
owner kind (ray, service, unknown) and a device path, one of the files the
--devices globs match (at most MAX_DEVICES of them); never a pid or a job id.
"""
from __future__ import annotations

from reaper.text import display

MAX_DEVICES = 64


class Published:
    """Read by the exporter's thread: plain attributes, replaced whole."""

    def __init__(self, mode: str, mechanism: str) -> None:
        self.mode = mode
        self.mechanism = mechanism
        self.leftovers = {}          # action -> leftovers it was applied to
        self.owners = {}             # owner kind -> owners ended with leftovers
        self.holders = {}            # device -> leftovers of ended owners holding it now
        self.tracked = 0             # processes noted below an owner at the last sample
        self.gpu = None              # device -> GPU bytes leftovers hold now (--gpu-memory), else None

    def count(self, table: dict, key: str, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n


def size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def line(end) -> str:
    """One line for an owner ended with leftovers."""
    n = len(end.members)
    held = end.held
    parts = [f"leftovers of {end.owner.describe()}: {n} process{'es' if n != 1 else ''}"]
    if held:
        parts.append(f"{end.holders()} holding {', '.join(display(d) for d in held)}")
    parts.append(f"{size(end.memory)} resident")
    for dev, (before, after, own) in sorted(end.gpu.items()):
        said = [f"{size(before)} in use at the owner's end" if before is not None else "",
                f"{size(after)} after" if after is not None else "",
                f"the leftovers' own {size(own)}" if own is not None else ""]
        if any(said):
            parts.append(f"GPU memory on {display(dev)}: " + ", ".join(x for x in said if x))
    parts.append(end.result)
    rel = end.release() if end.mode == "end" else ""
    if rel:
        parts.append(rel)
    return "; ".join(parts)


def families(pub):
    """The leftovers' metric families (prometheus_client's), for the exporter."""
    from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

    if pub is None:
        return
    c = C("reaper_leftovers", "Processes left behind by an owner that ended (a Ray worker, a service), "
                              "by what was done to them (--leftovers)", labels=["action"])
    for action in ("reported", "terminated", "killed", "stopped"):
        c.add_metric([action], pub.leftovers.get(action, 0))
    yield c
    o = C("reaper_leftover_owners_ended", "Owners that ended leaving processes behind, by kind "
                                          "(ray, service, unknown: orphaned before reaper saw their owner)",
          labels=["kind"])
    for kind in ("ray", "service", "unknown"):
        o.add_metric([kind], pub.owners.get(kind, 0))
    yield o
    g = G("reaper_leftover_device_holders", "Leftovers of ended owners holding the device open now",
          labels=["device"])
    for dev, n in sorted(pub.holders.items())[:MAX_DEVICES]:
        g.add_metric([dev], n)
    yield g
    if pub.gpu is not None:
        m = G("reaper_leftover_gpu_memory_bytes", "GPU memory held by leftovers of ended owners now, by "
                                                  "device (--gpu-memory; where NVML's pids are reaper's)",
              labels=["device"])
        for dev, n in sorted(pub.gpu.items())[:MAX_DEVICES]:
            m.add_metric([dev], n)
        yield m
    yield G("reaper_leftovers_tracked", "Processes reaper knows the owner of (below a Ray worker or a "
                                        "service) at its last sample", value=pub.tracked)

"""What the leftovers piece tells: the one log line per ended owner, and its
numbers (Published, in Stats.leftovers) for the metrics' section
(reaper/metrics/sections/leftovers.py), whose labels are bounded: never a pid or a
job id.
"""
from __future__ import annotations

from reaper.text import display


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


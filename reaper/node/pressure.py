"""Pressure stall information: the share of time tasks waited for a resource
(/proc/pressure/cpu, memory, io; irq on kernels 6.1+ built with
CONFIG_IRQ_TIME_ACCOUNTING, "full" only). A missing file is a resource this kernel
does not report, left out."""
from __future__ import annotations

from typing import NamedTuple

RESOURCES = ("cpu", "memory", "io", "irq")


class Pressure(NamedTuple):
    avg10: float         # percent of the last 10 s
    avg60: float
    avg300: float
    total: float         # seconds stalled since boot


def parse_pressure(text: str) -> dict:
    """kind ("some", "full") -> Pressure from one pressure file's lines."""
    out = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        fields = dict(f.partition("=")[::2] for f in rest.split())
        try:
            out[kind] = Pressure(float(fields["avg10"]), float(fields["avg60"]), float(fields["avg300"]),
                                 int(fields["total"]) / 1e6)
        except (KeyError, ValueError):
            continue
    return out


def read_pressure(proc: str = "/proc") -> "dict | None":
    """resource -> {kind: Pressure} for the files this kernel has; None without any."""
    out = {}
    for res in RESOURCES:
        try:
            with open(f"{proc}/pressure/{res}") as f:
                text = f.read()
        except OSError:          # not on this kernel, or PSI off (psi=0): EOPNOTSUPP
            continue
        parsed = parse_pressure(text)
        if parsed:
            out[res] = parsed
    return out or None

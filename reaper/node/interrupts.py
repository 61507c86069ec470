"""Interrupts per core: the sum of every line of /proc/interrupts (device IRQs and the
architecture's own: timer, rescheduling, function calls...) for each core's column.
Per-IRQ series would grow with the devices; per core is what shows a core flooded."""
from __future__ import annotations

from reaper.procfs import system


def parse_interrupts(text: str) -> dict:
    """cpu -> interrupts since boot. The header names the columns (CPU0 CPU1 ...; offline
    cores have none); a line with fewer numbers (ERR, MIS) counts where it has them."""
    return per_cpu(system.parse_interrupts(text))


def per_cpu(parsed: tuple) -> dict:
    cpus, lines = parsed
    out = dict.fromkeys(cpus, 0)
    for line in lines:
        for cpu, n in zip(cpus, line.counts):
            out[cpu] += n
    return out


def read_interrupts(proc: str = "/proc") -> "dict | None":
    parsed = system.read_interrupts(proc)
    return None if parsed is None else per_cpu(parsed)

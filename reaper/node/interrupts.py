"""Interrupts per core: the sum of every line of /proc/interrupts (device IRQs and the
architecture's own: timer, rescheduling, function calls...) for each core's column.
Per-IRQ series would grow with the devices; per core is what shows a core flooded."""
from __future__ import annotations


def parse_interrupts(text: str) -> dict:
    """cpu -> interrupts since boot. The header names the columns (CPU0 CPU1 ...; offline
    cores have none); a line with fewer numbers (ERR, MIS) counts where it has them."""
    lines = text.splitlines()
    if not lines:
        return {}
    cpus = []
    for name in lines[0].split():
        if name.startswith("CPU") and name[3:].isdigit():
            cpus.append(int(name[3:]))
    out = dict.fromkeys(cpus, 0)
    for line in lines[1:]:
        _, sep, rest = line.partition(":")
        if not sep:
            continue
        for cpu, value in zip(cpus, rest.split()):
            if not value.isdigit():
                break
            out[cpu] += int(value)
    return out


def read_interrupts(proc: str = "/proc") -> "dict | None":
    try:
        with open(f"{proc}/interrupts") as f:
            return parse_interrupts(f.read())
    except OSError:
        return None

"""/proc/net/softnet_stat: per core, the packets the network receive softirq processed,
those dropped (the backlog was full) and the times it stopped with work left (the
time_squeeze: its budget or its 2 ms ran out). Hexadecimal columns; the 13th is the
core's number on kernels 5.10+ (before, the row's number is: offline cores have no row
either way, so the numbers may skip)."""
from __future__ import annotations

from typing import NamedTuple


class Softnet(NamedTuple):
    processed: int
    dropped: int
    squeezed: int


def parse_softnet(text: str) -> dict:
    """cpu -> Softnet."""
    out = {}
    for i, line in enumerate(text.splitlines()):
        try:
            cols = [int(c, 16) for c in line.split()]
        except ValueError:
            continue
        if len(cols) < 3:
            continue
        cpu = cols[12] if len(cols) >= 13 else i
        out[cpu] = Softnet(cols[0], cols[1], cols[2])
    return out


def read_softnet(proc: str = "/proc") -> "dict | None":
    try:
        with open(f"{proc}/net/softnet_stat") as f:
            return parse_softnet(f.read())
    except OSError:
        return None

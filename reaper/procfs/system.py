"""Node-wide and self figures from /proc: the uptime, per-core CPU times (/proc/stat),
/proc/cgroups, /proc/interrupts (one parser for reaper node's per-core and per-queue
figures and --stray-cpus auto), reaper's own resident size. Read-only; proc: where /proc is (a recorded
tree in the tests, --proc for reaper node). reaper/nodestats.py makes the metrics'
figures from them."""
from __future__ import annotations

import os
from collections import namedtuple


def uptime(proc: str = "/proc") -> float:
    """Seconds since boot; raises OSError or ValueError where /proc cannot say."""
    with open(f"{proc}/uptime") as f:
        return float(f.read().split()[0])


def own_rss(proc: str = "/proc") -> "int | None":
    """This process's resident memory in bytes; None if /proc cannot say."""
    try:
        with open(f"{proc}/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None


def read_cpu_times(proc: str = "/proc") -> dict:
    """cpu number -> jiffies (user, nice, system, idle, iowait, irq, softirq, steal);
    raises OSError where /proc/stat cannot be read."""
    out = {}
    with open(f"{proc}/stat") as f:
        for line in f:
            if not line.startswith("cpu"):
                break
            name, *values = line.split()
            if name == "cpu":
                continue
            out[int(name[3:])] = tuple(int(v) for v in values[:8]) + (0,) * (8 - len(values[:8]))
    return out


def proc_cgroups(proc: str = "/proc") -> "dict | None":
    """controller -> num_cgroups from /proc/cgroups (host-wide; on recent kernels v1
    controllers only); None if it cannot be read."""
    out = {}
    try:
        with open(f"{proc}/cgroups") as f:
            for line in f:
                if line.startswith("#"):
                    continue
                parts = line.split()
                if len(parts) >= 4 and parts[2].isdigit():
                    out[parts[0]] = int(parts[2])
    except OSError:
        return None
    return out


class IrqLine(namedtuple("IrqLine", "irq counts name")):
    # irq: the line's head ("24", or the architecture's own: "NMI", "LOC", "ERR");
    # counts: its interrupts per CPU column, in the header's order, as far as the line
    # has numbers (ERR and MIS have one); name: its last word (a device IRQ's action,
    # e.g. a NIC queue's "eth0-Tx-Rx-3").
    __slots__ = ()


def parse_interrupts(text: str) -> tuple:
    """/proc/interrupts as (cpus, lines): the CPU numbers of the header's columns
    (offline cores have none) and an IrqLine for every line."""
    rows = text.splitlines()
    if not rows:
        return [], []
    cpus = [int(w[3:]) for w in rows[0].split() if w.startswith("CPU") and w[3:].isdigit()]
    lines = []
    for row in rows[1:]:
        head, sep, rest = row.partition(":")
        if not sep:
            continue
        words = rest.split()
        counts = []
        for w in words[:len(cpus)]:
            if not w.isdigit():
                break
            counts.append(int(w))
        lines.append(IrqLine(head.strip(), tuple(counts), words[-1] if words else ""))
    return cpus, lines


def read_interrupts(proc: str = "/proc") -> "tuple | None":
    """parse_interrupts() of proc/interrupts; None where it cannot be read."""
    try:
        with open(f"{proc}/interrupts") as f:
            return parse_interrupts(f.read())
    except OSError:
        return None


def read_irq_affinity(irq: int, proc: str = "/proc", names=("effective_affinity_list",)) -> "str | None":
    """proc/irq/IRQ's CPU list (the first of `names` that reads: the effective affinity,
    then, where asked, smp_affinity_list), as text ("0-3,8"); None where none reads
    or all are empty."""
    for name in names:
        try:
            with open(f"{proc}/irq/{irq}/{name}") as f:
                text = f.read(256).strip()
        except OSError:
            continue
        if text:
            return text
    return None

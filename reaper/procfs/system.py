"""Node-wide and self figures from /proc: the uptime, per-core CPU times (/proc/stat),
/proc/cgroups, reaper's own resident size. Read-only; proc: where /proc is (a recorded
tree in the tests, --proc for reaper node). reaper/nodestats.py makes the metrics'
figures from them."""
from __future__ import annotations

import os


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

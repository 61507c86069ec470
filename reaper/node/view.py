"""The node's view for `reaper stats` and `reaper top` pointed at a `reaper node`
endpoint: from one scrape's samples (name, labels, value: prometheus_client's Sample or
any object with those fields), the rows a person reads. Pure: no I/O, no clock; the
rates of the counters (pressure) need the previous scrape's samples and the seconds
between them.

    rows(samples, before=None, seconds=None) -> [(section, text)]

Sections, in order: cores (each saturated core: its streak, its longest in the window),
functions (each sampled core's kernel functions), culprits (the processes that held a
core in the kernel), memory (live and dying memory cgroups, who holds them), nic (events
by device and kind, the chains, drivers' counters that are not 0), pressure (share
stalled since the previous scrape). Text is built from labels, which a process controls
(comm, cgroup): the exporter has already cut and escaped them; they are shown as they are.
"""
from __future__ import annotations

TOP = 5


def _by_name(samples) -> dict:
    out: dict = {}
    for s in samples:
        out.setdefault(s.name, []).append(s)
    return out


def rows(samples, before=None, seconds: "float | None" = None) -> list:
    got = _by_name(samples)
    out = []
    out += _cores(got)
    out += _functions(got)
    out += _culprits(got)
    out += _memory(got)
    out += _nic(got)
    if before is not None and seconds:
        out += _pressure(got, _by_name(before), seconds)
    return out


def _cpu_key(s) -> int:
    c = s.labels.get("cpu", "")
    return int(c) if c.isdigit() else -1


def _cores(got: dict) -> list:
    now = {s.labels.get("cpu"): s.value for s in got.get("reaper_node_cpu_saturation_streak_seconds", ())}
    longest = sorted(got.get("reaper_node_cpu_saturation_streak_max_seconds", ()),
                     key=lambda s: (-s.value, _cpu_key(s)))
    out = []
    for s in longest:
        cpu = s.labels.get("cpu", "?")
        if s.value <= 0 and not now.get(cpu):
            continue
        ongoing = f"saturated for {now[cpu]:.0f} s now, " if now.get(cpu) else ""
        out.append(("cores", f"cpu{cpu}: {ongoing}longest streak {s.value:.0f} s in the window"))
    return out[:16] or [("cores", "no core saturated in the window")]


def _functions(got: dict) -> list:
    by_cpu: dict = {}
    for s in got.get("reaper_node_kernel_function_top_ratio", ()):
        by_cpu.setdefault(s.labels.get("cpu", "?"), []).append(s)
    out = []
    for cpu in sorted(by_cpu, key=lambda c: int(c) if c.isdigit() else -1):
        top = sorted(by_cpu[cpu], key=lambda s: -s.value)[:TOP]
        out.append(("functions", f"cpu{cpu}: " + ", ".join(f"{s.labels.get('function', '?')} {s.value:.0%}"
                                                             for s in top)))
    return out


def _culprits(got: dict) -> list:
    top = sorted(got.get("reaper_node_kernel_time_top_ratio", ()), key=lambda s: -s.value)[:TOP]
    return [("culprits", f"{s.labels.get('comm', '?')} (pid {s.labels.get('pid', '?')}, {s.value:.0%} of "
                         f"cpu{s.labels.get('cpu', '?')}, cgroup {s.labels.get('cgroup') or '?'})") for s in top]


def _memory(got: dict) -> list:
    state = {s.labels.get("state"): s.value for s in got.get("reaper_node_memory_cgroups", ())}
    out = []
    if "live" in state and "dying" in state:
        out.append(("memory", f"memory cgroups: live {state['live']:,.0f}, dying {state['dying']:,.0f}"))
    holders = sorted(got.get("reaper_node_cgroup_dying_children", ()), key=lambda s: -s.value)[:TOP]
    if holders:
        out.append(("memory", "dying ones held below: " + ", ".join(
            f"{s.labels.get('cgroup', '?')} ({s.value:,.0f})" for s in holders)))
    return out


def _nic(got: dict) -> list:
    out = []
    events = sorted(got.get("reaper_node_nic_events_total", ()), key=lambda s: (-s.value, s.labels.get("device", "")))
    if events:
        out.append(("nic", "events: " + ", ".join(f"{s.labels.get('device', '?')} {s.labels.get('kind', '?')} "
                                                  f"{s.value:,.0f}" for s in events[:8])))
    chains = got.get("reaper_node_nic_chains_total", ())
    if chains and chains[0].value:
        out.append(("nic", f"{chains[0].value:,.0f} of them after a core saturated in kernel time"))
    stats = sorted((s for s in got.get("reaper_node_nic_driver_stats_total", ()) if s.value),
                   key=lambda s: (s.labels.get("device", ""), s.labels.get("stat", "")))
    if stats:
        out.append(("nic", "driver counters: " + ", ".join(f"{s.labels.get('device', '?')} {s.labels.get('stat', '?')} "
                                                           f"{s.value:,.0f}" for s in stats[:8])))
    return out


def _pressure(got: dict, before: dict, seconds: float) -> list:
    then = {(s.labels.get("resource"), s.labels.get("kind")): s.value
            for s in before.get("reaper_node_pressure_stalled_seconds_total", ())}
    parts = []
    for s in sorted(got.get("reaper_node_pressure_stalled_seconds_total", ()),
                    key=lambda s: (s.labels.get("resource", ""), s.labels.get("kind", ""))):
        key = (s.labels.get("resource"), s.labels.get("kind"))
        if key in then:
            parts.append(f"{key[0]} {key[1]} {max(0.0, s.value - then[key]) / seconds:.1%}")
    return [("pressure", "stalled: " + ", ".join(parts))] if parts else []

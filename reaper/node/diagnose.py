"""``reaper node --diagnose SECONDS``: watch that long, then say in plain words what the
node did: the saturated cores with their streaks and modes, the processes that held
them, the dying memory cgroups against the live ones and who holds them, pressure,
the network receive path, the zombies. The signature of the incident (exit status 1):
a core saturated in the kernel (system, softirq or irq time dominating) for 5 s or
more, or dying memory cgroups over ten times the live ones and over a thousand."""
from __future__ import annotations

from typing import NamedTuple

from reaper.node import interrupts, pressure, softnet
from reaper.node.monitor import HELD_MIN
from reaper.node.streaks import KERNEL_MODES, SIGNATURE_SECONDS

DYING_RATIO = 10         # dying memory cgroups over this many times the live ones ...
DYING_MIN = 1000         # ... and over this many: the signature


class Counters(NamedTuple):
    """The kernel's per-core counters at one moment (the report's differences)."""
    when: float
    pressure: "dict | None"
    softnet: "dict | None"
    interrupts: "dict | None"


def counters(proc: str, when: float) -> Counters:
    return Counters(when, pressure.read_pressure(proc), softnet.read_softnet(proc), interrupts.read_interrupts(proc))


def signature_streaks(streaks: list) -> list:
    return [s for s in streaks if s.seconds >= SIGNATURE_SECONDS and s.mode in KERNEL_MODES]


def dying_signature(mem) -> bool:
    return mem is not None and mem.dying > DYING_RATIO * mem.live and mem.dying > DYING_MIN


def report(m, before: Counters, after: Counters) -> tuple:
    """(the report's text, whether it found a signature)."""
    seconds = max(after.when - before.when, 1e-9)
    seen = list(m.ended) + m.streaks.now_ongoing(after.when)
    cores = len(m.streaks.cpus)
    lines = [f"reaper node: watched {seconds:.0f} s, {cores} cores, saturated = at least "
             f"{m.streaks.threshold:.0%} busy for a whole one-second sample", ""]
    lines += _cores(seen)
    lines += _held(m)
    lines += _functions(m, after.when)
    mem_lines, mem_found = _memory(m)
    lines += mem_lines
    lines += _pressure(before, after, seconds)
    lines += _network(before, after, seconds)
    lines += _nic(m)
    lines += _zombies(m)
    found = signature_streaks(seen)
    verdict = []
    for s in sorted(found, key=lambda s: -s.seconds)[:5]:
        verdict.append(f"cpu{s.cpu} was saturated for {s.seconds:.0f} s, {s.mode} time {s.share:.0%} "
                       f"(5 s is the network driver's Tx watchdog)")
    if mem_found:
        verdict.append(f"{m.memory.dying} dying memory cgroups against {m.memory.live} live ones")
    verdict += [c.text() for c in m.nic.chains if c.linked][-5:]
    if verdict:
        lines += ["Signature found:"] + [f"  - {v}" for v in verdict]
    else:
        lines.append(f"No signature: no core saturated in the kernel for {SIGNATURE_SECONDS:g} s or more, "
                     f"dying memory cgroups not over {DYING_RATIO} times the live ones and {DYING_MIN}, and no NIC "
                     "event after a core saturated in kernel time.")
    return "\n".join(lines) + "\n", bool(verdict)


def _cores(seen: list) -> list:
    out = ["Saturated cores:"]
    by_cpu: dict = {}
    for s in seen:
        by_cpu.setdefault(s.cpu, []).append(s)
    if not by_cpu:
        return out + ["  none", ""]
    for cpu in sorted(by_cpu, key=lambda c: -max(s.seconds for s in by_cpu[c]))[:16]:
        streaks = by_cpu[cpu]
        longest = max(streaks, key=lambda s: s.seconds)
        long_ones = sum(1 for s in streaks if s.seconds >= SIGNATURE_SECONDS)
        out.append(f"  cpu{cpu}: longest streak {longest.seconds:.0f} s ({longest.mode} {longest.share:.0%}), "
                   f"{len(streaks)} streak{'s' if len(streaks) != 1 else ''}, {long_ones} of "
                   f"{SIGNATURE_SECONDS:g} s or more")
    if len(by_cpu) > 16:
        out.append(f"  ... and {len(by_cpu) - 16} more cores")
    return out + [""]


def _held(m) -> list:
    out = ["Processes with most system time while a core was saturated:"]
    held = sorted((h for h in m.held.values() if h.seconds >= HELD_MIN), key=lambda h: -h.seconds)[:5]
    if not held:
        return out + ["  none named (no core saturated long enough for two readings, or the time was softirq or "
                      "irq time, which is no process's)", ""]
    for h in held:
        where = f"last on cpu{h.cpu}" if h.cpu >= 0 else "core unknown"
        out.append(f"  {h.comm} (pid {h.pid}): {h.seconds:.1f} s of system time, up to {h.peak:.0%} of a core, "
                   f"{where}, cgroup {h.cgroup or '?'}")
    return out + [""]


def _functions(m, now: float) -> list:
    """Each sampled core's streak: who it ran and the kernel functions it was in."""
    out = ["Kernel functions (the saturated core sampled while it was in kernel time):"]
    if not m.sampling.available:
        return out + [f"  not sampled: {m.sampling.off}", ""]
    profiles = m.sampling.profiles()
    if not profiles:
        return out + ["  none sampled (no core saturated mostly in kernel time)", ""]
    for cpu, prof in sorted(profiles.items(), key=lambda kv: kv[1].started, reverse=True)[:8]:
        end = prof.ended if prof.ended is not None else now
        state = "ongoing" if prof.ended is None else f"ended {now - end:.0f} s before the report"
        out.append(f"  cpu{cpu}, {end - prof.started:.0f} s sampled ({prof.samples} samples, {state}):")
        out += [f"    {line}" for line in m.sampling.line(prof, 3)]
        tops = ", ".join(f"{name} {ratio:.0%}" for name, ratio in prof.top_functions())
        out.append(f"    the core's functions: {tops}")
    return out + [""]


def _memory(m) -> tuple:
    mem = m.memory
    if mem is None:
        return ["Memory cgroups: cannot be counted here (no cgroup hierarchy with the memory controller under "
                f"{m.sys}/fs/cgroup)", ""], False
    times = f" ({mem.dying / mem.live:.0f} times the live ones)" if mem.live and mem.dying >= mem.live else ""
    out = [f"Memory cgroups (cgroup v{mem.version}, {mem.source}):",
           f"  live {mem.live}, dying {mem.dying}{times}"]
    first = m.first_memory
    if first is not None and first is not mem:
        out.append(f"  dying ones during the watch: {mem.dying - first.dying:+d}")
    if m.holders:
        out.append("  held below: " + ", ".join(f"{path} ({n})" for path, n in m.holders))
    elif mem.version == 1 and mem.dying:
        out.append("  who holds them: cgroup v1 does not say (a removed cgroup leaves no directory)")
    return out + [""], dying_signature(mem)


def _pressure(before: Counters, after: Counters, seconds: float) -> list:
    if not before.pressure or not after.pressure:
        return ["Pressure: not reported by this kernel", ""]
    parts = []
    for res in pressure.RESOURCES:
        a, b = before.pressure.get(res), after.pressure.get(res)
        if not a or not b:
            continue
        kinds = [f"{kind} {(b[kind].total - a[kind].total) / seconds:.1%}" for kind in ("some", "full")
                 if kind in a and kind in b]
        parts.append(f"{res} " + ", ".join(kinds))
    return ["Pressure (share of the watch stalled): " + "; ".join(parts), ""]


def _network(before: Counters, after: Counters, seconds: float) -> list:
    out = []
    if before.softnet is not None and after.softnet is not None:
        drops = {c: after.softnet[c].dropped - before.softnet[c].dropped
                 for c in after.softnet if c in before.softnet}
        squeezes = {c: after.softnet[c].squeezed - before.softnet[c].squeezed
                    for c in after.softnet if c in before.softnet}
        worst = [f"cpu{c} {n}" for c, n in sorted(squeezes.items(), key=lambda kv: -kv[1])[:3] if n > 0]
        out.append(f"Network receive (softnet): {sum(drops.values())} packets dropped, "
                   f"{sum(squeezes.values())} time squeezes" + (f" ({', '.join(worst)})" if worst else ""))
    if before.interrupts is not None and after.interrupts is not None:
        rates = {c: (after.interrupts[c] - before.interrupts.get(c, 0)) / seconds for c in after.interrupts}
        busiest = sorted(rates.items(), key=lambda kv: -kv[1])[:3]
        out.append("Interrupts per second, busiest cores: " + ", ".join(f"cpu{c} {r:.0f}" for c, r in busiest))
    return out + [""] if out else []


def _nic(m) -> list:
    """The NIC events (kernel log, stalled queue interrupts), each with its chain, and
    the drivers' counters that grew."""
    n = m.nic
    out = ["NIC events (kernel log, queue interrupts):"]
    chains = list(n.chains)
    if not chains:
        out.append("  none" + (f" (kernel log not read: {n.off['kernel log']})" if "kernel log" in n.off else ""))
    for c in chains[-10:]:
        out.append(f"  {c.text()}")
    if len(chains) > 10:
        out.append(f"  ... and {len(chains) - 10} earlier")
    grown = n.grown()
    if grown:
        out.append("Driver counters that grew: " + ", ".join(f"{i} {name} +{d}" for i, _, name, d in grown[:12]))
    return out + [""]


def _zombies(m) -> list:
    z = m.zombies
    if z is None:
        return []
    text = f"Zombie processes on the host: {z.total}" + (" (counted in part: too many processes)" if z.partial else "")
    if z.by_cgroup:
        text += "; by cgroup: " + ", ".join(f"{path} ({n})" for path, n in z.by_cgroup)
    return [text, ""]

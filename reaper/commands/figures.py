"""How reaper stats and reaper top show the figures of a page (a
reaper.metrics.client.View): numbers, durations, lists, and the rows both show
(role, lifetime, processes). Unknown numbers (NaN, ±Inf) show as "?", absent ones as "-".
"""
import math
import time

from reaper.metrics import names as N
from reaper.metrics.client import known, on


def fmt(v, spec: str) -> str:
    return format(v, spec) if known(v) else "?"


def n(v) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return "?"
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:.3g}"


def dur(secs: float) -> str:
    if not known(secs) or secs < 0:        # a start time in the future: not an uptime
        return "?"
    secs = int(secs)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def seconds(v: float) -> str:
    if not known(v):
        return "?"
    if v == 0:
        return "0s"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if v >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v * 1e6:.3g}µs"


def pairs(d: dict, show=n) -> str:
    items = [(k, v) for k, v in sorted(d.items()) if v]
    return ", ".join(f"{k} {show(v)}" for k, v in items) if items else "none"


def bound(le) -> str:
    return "+Inf" if le == math.inf else seconds(le)


def quantile(buckets: dict, q: float):
    """Upper bound of the bucket holding quantile q of a cumulative histogram; None
    when unknown (a count that is not a number, a bound that is not one)."""
    bounds = []
    for le, count in buckets.items():
        try:
            b = float(le)
        except ValueError:
            return None
        if math.isnan(b) or not known(count):
            return None
        bounds.append((b, count))
    bounds.sort()
    if not bounds or bounds[-1][1] == 0:
        return None
    target = q * bounds[-1][1]
    for le, count in bounds:
        if count >= target:
            return le
    return bounds[-1][0]


def role(v) -> str:
    """init: PID 1 of its namespace; subreaper: reaper not PID 1; watch: the sidecar; node."""
    mode = v.info("mode")
    pid = v.get(N.PID)
    if mode in ("watch", "node"):
        return mode
    return "init" if pid == 1 else "subreaper" if known(pid) else "?"


def lifetime(v, ended: "float | None" = None, now: "float | None" = None) -> str:
    """"up 3m02s" while it runs; a finished run (phase done, its file written at ended):
    "ran 3m02s, ended 2026-12-02 01:02:03 UTC (11m ago)"."""
    now = time.time() if now is None else now
    start = v.get(N.START_TIME_SECONDS)
    if v.current(N.PHASE, "phase") == "done" and ended is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ended))
        return f"ran {dur(ended - start) if start else '?'}, ended {when} ({dur(now - ended)} ago)"
    return f"up {dur(now - start) if start else '?'}"


def head(v, now: "float | None" = None, ended: "float | None" = None) -> str:
    """The first line: version, role, pid, lifetime, phase."""
    phase = v.current(N.PHASE, "phase")
    paused = ", pause mode" if mode(v) == "pause" else ""
    return (f"reaper {v.info('version')} ({role(v)}{paused}), pid {n(v.get(N.PID))}, {lifetime(v, ended, now)}"
            + (f", phase {phase}" if phase else ""))


def processes(v) -> str:
    """One snapshot: the process table's counts (all = main tree + others), then the
    budgets' strays, which come from their own last sample."""
    procs = v.by(N.PROCESSES, "class")
    if not procs:
        return "-"
    every, tree = procs.get("all"), procs.get("main_tree")
    if tree is None:
        text = f"{n(every)} live"
    else:
        others = every - tree if known(every) and known(tree) else None
        text = f"{n(every)} live: main tree {n(tree)}, others {n(others)}"
    if v.rows(N.BUDGET_INFO):
        text += f"; strays {n(procs.get('stray'))} (the budgets' last sample)"
    elif tree is None and procs.get("stray") is not None:
        text += f"; strays {n(procs.get('stray'))}"
    return text


def services(v) -> list:
    """The supervised services' names, in the page's order."""
    return list(dict.fromkeys(s.labels.get("service", "") for s in v.rows(N.total(N.SERVICE_STARTS))))


def mode(v) -> str:
    """What the reaper on the page does, for which rows apply: init (PID 1 or a
    subreaper, with a main child), pause (init without one: -P), watch (the sidecar:
    it reaps nothing), node (reaper node: the node's view only)."""
    m = v.info("mode")
    if m in ("watch", "node"):
        return m
    states = v.rows(N.MAIN_CHILD_STATE)
    if m == "init" and states and all(s.value == 0 for s in states):       # each state known not set
        return "pause"
    return "init"


# The labels' values in words; a value not listed shows as it is (a newer reaper's).
OUTCOMES = {"exited_0": "exited 0", "exited_nonzero": "exited with an error"}
KINDS = {"main": "the main child", "orphan": "orphans", "supervised": "service runs"}
ACTIONS = {"nice": "reniced", "sched_idle": "set to SCHED_IDLE", "affinity": "pinned to spare cores",
           "autogroup_nice": "their autogroup reniced", "throttle_sigstop": "throttled by SIGSTOP",
           "throttle_cgroup": "throttled in a cgroup", "throttle_memory_cgroup": "held in a memory cgroup",
           "oom_kill": "killed by the OOM killer", "terminate": "sent SIGTERM", "kill": "sent SIGKILL",
           "not_permitted": "not permitted to act on", "observe": "only observed"}
MECHANISMS = {"nice": "renice", "sigstop": "SIGSTOP and SIGCONT", "cgroup_v1": "a cgroup v1 quota",
              "cgroup_v2": "a cgroup v2 quota", "terminate": "SIGTERM when over"}
REASONS = {"cpu": "CPU", "memory": "memory", "age": "age", "any": "any budget"}
LEFTOVER_ACTIONS = {"reported": "reported", "terminated": "ended by SIGTERM", "killed": "killed by SIGKILL",
                    "stopped": "stopped (SIGSTOP)"}


def outcome(label: str) -> str:
    return OUTCOMES.get(label) or (f"killed by {label}" if label.startswith("SIG") else label)


def counted(d: dict, words: dict = None, show=n) -> str:
    """"3 exited 0, 1 killed by SIGTERM": the non-zero counts of d, most first, each
    with its label in words; "" when there is none."""
    words = words or {}
    items = sorted(((k, c) for k, c in d.items() if c), key=lambda kc: (-kc[1] if known(kc[1]) else 0, kc[0]))
    return ", ".join(f"{show(c)} {words.get(k, k)}" for k, c in items)


def leftovers(v) -> "str | None":
    """The leftovers of ended owners, counted (reaper/metrics/sections/leftovers.py);
    None when the piece is off (no such metrics)."""
    done = v.by(N.total(N.LEFTOVERS), "action")
    if not done and v.get(N.LEFTOVERS_TRACKED) is None:
        return None
    owners = v.by(N.total(N.LEFTOVER_OWNERS_ENDED), "kind")
    total, ended = sum(c for c in done.values() if known(c)), sum(c for c in owners.values() if known(c))
    text = "none left behind by an ended owner" if not total else \
        (f"{n(total)} {'process' if total == 1 else 'processes'} left behind by {n(ended)} ended "
         f"{'owner' if ended == 1 else 'owners'}"
         f" ({counted(owners, {'ray': 'Ray worker', 'service': 'service', 'unknown': 'unknown'})}): "
         + counted(done, LEFTOVER_ACTIONS))
    holders = v.by(N.LEFTOVER_DEVICE_HOLDERS, "device")
    if any(on(c) for c in holders.values()):
        text += "; of them holding a device now: " + \
            ", ".join(f"{n(c)} {dev}" for dev, c in sorted(holders.items()) if c)
    tracked = v.get(N.LEFTOVERS_TRACKED)
    if tracked is not None:
        text += f"; {n(tracked)} running processes below a Ray worker or a service"
    return text


def node_rows(v, samples, before=None, seconds=None) -> list:
    """reaper node's view (reaper/node/view.py's rows: cores, functions, culprits, memory,
    nic, pressure when there is a scrape before), then the host's zombies."""
    from reaper.node import view

    # view.py formats numbers as they are: a sample that is not a known number is left out.
    def finite(page):
        return None if page is None else [s for s in page if known(s.value)]
    rows = view.rows(finite(samples), finite(before), seconds)
    # The ended streaks by the mode that dominated them (user, system, irq...): the histogram's counts.
    length = N.NODE_CPU_SATURATION_STREAK_LENGTH_SECONDS
    ended = {m: c for m, c in v.by(length + "_count", "mode").items() if on(c)}
    if ended:
        spent = v.by(length + "_sum", "mode")
        at = max((i + 1 for i, r in enumerate(rows) if r[0] == "cores"), default=0)
        rows.insert(at, ("cores", "ended streaks by the mode that dominated them: " + ", ".join(
            f"{m} {n(c)} ({dur(spent.get(m))} in all)" for m, c in sorted(ended.items(), key=lambda mc: -mc[1]))))
    zombies = v.get(N.NODE_ZOMBIES)
    if zombies is not None:
        by = sorted(((s.labels.get("cgroup", ""), s.value) for s in v.rows(N.NODE_ZOMBIES_BY_CGROUP)),
                    key=lambda cv: -cv[1] if known(cv[1]) else 0)
        rows.append(("zombies", f"{n(zombies)} on the host" +
                     (f"; by cgroup: {', '.join(f'{c} {n(k)}' for c, k in by)}" if by and on(zombies) else "")))
    return rows

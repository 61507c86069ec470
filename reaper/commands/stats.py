"""``reaper stats``: a compact human-readable view of a running reaper's metrics, for
``kubectl exec POD -- reaper stats`` (docs/reaper-stats.md). A plain client: it only
reads, off the way to any child's exec, through reaper.metrics.client (the fetch's
bounds, the parse); the figures are worded by figures.py.

Its options are its own rows (FLAGS), read by reaper's scanner with reaper's wording;
without --url, the endpoint is where REAPER_METRICS_PORT and REAPER_METRICS_ADDRESS put it.

What it shows is hostile input (an endpoint or a file anyone may point it at): a
number that is not finite shows as unknown ("?"); the labels it prints are shown on
one line each, control characters escaped.
"""
import math
import os
import time

from reaper import options
from reaper.commands import args as client_args
from reaper.commands import figures
from reaper.commands.figures import bound, counted, dur, fmt, head, n, pairs, processes, quantile, seconds, services
from reaper.metrics import client
from reaper.metrics import names as N
from reaper.metrics.client import known, on
from reaper.options import Option
from reaper.text import display

DEFAULT_TIMEOUT = 5.0
PROG = "reaper stats"
DOCS = "docs/reaper-stats.md"
T = N.total


class Args:
    """What reaper stats was asked (the defaults: the endpoint the variables name)."""
    url = None
    file = None
    timeout = DEFAULT_TIMEOUT


# Its own rows, read by reaper's scanner (reaper/options.py): reaper's wording for errors.
FLAGS = (
    client_args.URL,
    Option("file", "", "file", "value", "a metrics file written by --metrics-file", "PATH"),
    Option("timeout", "", "timeout", "value",
           f"seconds to wait for the endpoint, at most {options.MAX_SECONDS} ({{default}})", "SECONDS",
           options.seconds),
)


def main(argv: list, sfd: "int | None" = None) -> int:
    closed = client_args.stdout_closed()
    args = client_args.parse_client(argv, PROG, FLAGS, Args, help_text, closed)
    if isinstance(args, int):
        return args
    if args.url and args.file:
        raise options.UsageError("--url and --file exclude each other")
    try:
        if args.file:
            samples, ended = client.read_file(args.file), _mtime(args.file)
        else:
            samples, ended = client.fetch(args.url or client.default_url(), args.timeout), None
    except client.Unreadable as e:
        os.write(2, f"{PROG}: {e}\n".encode())
        return 1
    return options.write_stdout(render(samples, ended), PROG, closed)


def help_text() -> str:
    from reaper import usage

    lead = ["usage: reaper stats [--url URL | --file PATH] [--timeout SECONDS]",
            "",
            "A running reaper's numbers, compact, from its metrics endpoint (or the file",
            "--metrics-file writes): for kubectl exec POD -- reaper stats."]
    return usage.render(lead, usage.option_rows(FLAGS, Args) + usage.tail(client_args.ENVIRONMENT, DOCS))


def _mtime(path: str) -> "float | None":
    """When the file was last written: a finished run's end."""
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def render(samples, ended: "float | None" = None) -> str:
    """The view; ended: when a metrics file was last written (a finished run's end)."""
    v = client.View(samples)
    mode = figures.mode(v)
    lines = [head(v, ended=ended)]
    if mode == "node":              # reaper node: the node's view, nothing of a reaper's own
        lines = [f"reaper {v.info('version')} (node)"]
        rows = figures.node_rows(v, samples)        # pressure is a rate: reaper top has it
    else:
        rows = [row for fn, modes in ROWS if mode in modes for row in fn(v)]
    title = None
    for section, text in rows:
        lines.append(f"  {section if section != title else '':<12} {text}")
        title = section or title
    # Labels are the page's words (a process's name among them): one line each, no escape sequences.
    return "\n".join(display(line) for line in lines) + "\n"


# The rows, in order: each yields (title, text) pairs, none when it has nothing to say.

def _main_child(v):
    text = v.current(N.MAIN_CHILD_STATE, "state") or "?"
    outcome = v.current(N.MAIN_CHILD_OUTCOME, "outcome")
    code = v.get(N.MAIN_CHILD_EXIT_CODE)
    if code is not None:
        text += f", exit code {n(code)}" + (f" ({outcome})" if outcome else "")
    yield "main child", text


def _services(v):
    """One line per supervised service: state, pid-less facts from the metrics."""
    parts = v.split("service")           # one pass: a page may name thousands
    now = time.time()
    for i, name in enumerate(services(v)):
        sv = parts.get(name) or client.View([])
        text = f"{name}: {sv.current(N.SERVICE_STATE, 'state') or '?'}"
        if on(sv.get(N.SERVICE_READY)):
            text += ", ready"
        starts = sv.get(T(N.SERVICE_STARTS))
        text += f", {n(starts)} {'start' if starts == 1 else 'starts'}"
        since = sv.get(N.SERVICE_START_TIME_SECONDS)
        if since is not None and on(sv.get(N.SERVICE_UP)):
            text += f", up {dur(now - since)}"
        code = sv.get(N.SERVICE_LAST_EXIT_CODE)
        if code is not None:
            text += f", last exit {n(code)}"
        yield "service", text


def _reaped(v):
    reaped = v.by(T(N.REAPED), "kind")
    total = sum(reaped.values())
    if not total:
        yield "reaped", "none yet" if known(total) or not reaped else "?"
        return
    text = f"{n(total)} {'process' if total == 1 else 'processes'} ({counted(reaped, figures.KINDS)})"
    orphans = v.by(T(N.REAPED), "outcome", kind="orphan")
    if any(orphans.values()):
        text += "; the orphans: " + counted({figures.outcome(k): c for k, c in orphans.items()})
    yield "reaped", text


def _latency(v):
    buckets = v.by(N.REAP_LATENCY_SECONDS + "_bucket", "le")
    count = v.get(N.REAP_LATENCY_SECONDS + "_count")
    if on(count):
        p50, p99 = quantile(buckets, 0.5), quantile(buckets, 0.99)
        mean = (v.get(N.REAP_LATENCY_SECONDS + "_sum") or 0) / count
        yield "reap latency", (f"exit to reap: mean {seconds(mean)}, half within {bound(p50)}, 99% within "
                               f"{bound(p99)} ({n(count)} {'reap' if count == 1 else 'reaps'})")
    elif count is not None and not known(count):
        yield "reap latency", "?"


def _zombies(v):
    zombies = v.get(N.ZOMBIES)
    text = f"{n(zombies)} now" if zombies else "none now"
    if on(zombies):
        parents = [(s.labels.get("parent_name", ""), s.labels.get("parent_pid", ""), s.value)
                   for s in v.rows(N.ZOMBIES_BY_PARENT)]
        text += f", oldest {seconds(v.get(N.ZOMBIE_OLDEST_AGE_SECONDS) or 0)}"
        text += "; their parents, which have not waited: " + \
            ", ".join(f"{name}[{pid}] {n(count)}" for name, pid, count in parents)
    yield "zombies", text


def _processes(v):
    yield "processes", processes(v)


def _signals(v):
    got = counted(v.by(T(N.SIGNALS_RECEIVED), "signal"))
    text = f"received {got}" if got else "none received"
    sent = counted(v.by(T(N.SIGNALS_FORWARDED), "signal"))
    if sent:                        # pause and watch have no main child to pass them to
        text += f"; passed on to the main child {sent}"
    yield "signals", text


def _drain(v):
    """What the end-of-life drain did, in words."""
    phase = v.current(N.PHASE, "phase") or ""
    paused = v.current(N.MAIN_CHILD_STATE, "state") is None
    took = v.get(N.DRAIN_DURATION_SECONDS)
    if phase in ("running", "") and took is None:
        yield "drain", "not started (it runs when " + \
            ("SIGTERM or SIGINT ends pause mode)" if paused else "the main child exits)")
        return
    counts = v.by(T(N.DRAIN_PROCESSES), "result")
    words = (("terminated", "ended after SIGTERM"), ("killed", "killed by SIGKILL"),
             ("survived", "survived SIGKILL"), ("not_permitted", "not permitted to signal"))
    text = ", ".join(f"{n(counts[k])} {w}" for k, w in words if counts.get(k)) or "nothing was left to stop"
    if took is not None:
        text += f"; took {seconds(took)}"
    elif phase in ("draining", "killing"):
        text += f" so far ({phase})"
    yield "drain", text


def _budgets(v):
    budget = v.rows(N.BUDGET_INFO)
    used = f"strays used {seconds(v.get(T(N.STRAY_CPU_SECONDS)) or 0)} of CPU"
    if budget:
        labels = budget[0].labels
        held = [f"{what} budget by {figures.MECHANISMS.get(m, m)}" for what, m in
                (("CPU", labels.get("mechanism", "")), ("memory", labels.get("memory_mechanism", "")))
                if m not in ("", "none")]
        text = "on" + (f" ({', '.join(held)})" if held else "") + f"; {used}"
        over = v.by(T(N.BUDGET_VIOLATIONS), "reason")
        times = sum(over.values())
        why = counted({f"for {figures.REASONS.get(k, k)}": c for k, c in over.items() if k})
        text += (f"; over a budget {n(times)} {'time' if times == 1 else 'times'}" + (f" ({why})" if why else "")
                 if times else "; none over a budget")
        acted = {f"{figures.ACTIONS.get(a, a)} for {figures.REASONS.get(r, r)}": c
                 for (a, r), c in _pairs2(v, T(N.BUDGET_ACTIONS), "action", "reason").items()}
        if acted:
            text += f"; acted on: {counted(acted)}"
    else:                           # nothing measures strays' CPU then
        text = "off (no budget option given)"
    yield "budgets", text
    memory = {s.labels.get("pid", ""): s.value for s in v.rows(N.STRAY_MEMORY_BYTES)}
    for s in sorted(v.rows(N.STRAY_CPU_CORES), key=lambda s: -s.value if known(s.value) else math.inf)[:5]:
        rss = memory.get(s.labels.get("pid", ""))
        yield "budgets", (f"stray {s.labels.get('name', '')}[{s.labels.get('pid', '')}] {fmt(s.value, '.2f')} cores"
                   + (f", {fmt(rss / 2**20, '.0f')} MiB" if rss else "")
                   + f" ({figures.ACTIONS.get(s.labels.get('action', ''), s.labels.get('action', ''))})")


def _pairs2(v, name: str, a: str, b: str) -> dict:
    out: dict = {}
    for s in v.rows(name):
        key = (s.labels.get(a, ""), s.labels.get(b, ""))
        out[key] = out.get(key, 0) + s.value
    return out


def _leftovers(v):
    text = figures.leftovers(v)
    if text is not None:
        yield "leftovers", text


def _node_cpu(v):
    busy = v.by(N.NODE_CPU_BUSY_RATIO, "cpu")
    if busy:                        # --node-metrics per-core
        top = max(busy, key=lambda c: busy[c] if known(busy[c]) else -math.inf)
        system = v.get(N.NODE_CPU_MODE_RATIO, cpu=top, mode="system") or 0
        sat = v.by(T(N.NODE_CPU_SATURATED_SECONDS), "cpu")
        yield "node cpu", (f"busiest core cpu{top} {fmt(busy[top], '.0%')} busy ({fmt(system, '.0%')} system); "
                           f"seconds saturated: {pairs({f'cpu{k}': c for k, c in sat.items()}, seconds)}")
        return
    top = v.get(N.NODE_CPU_BUSIEST_RATIO, mode="busy")
    if top is None:
        return
    system = v.get(N.NODE_CPU_BUSIEST_RATIO, mode="system") or 0       # the summary (default)
    text = f"busiest core {fmt(top, '.0%')} busy, system up to {fmt(system, '.0%')}"
    cores = v.get(N.NODE_CPUS)
    if cores is not None:
        text += f"; {n(v.get(N.NODE_CPU_SATURATED_CORES) or 0)} of {n(cores)} cores saturated now"
    any_sat = v.get(T(N.NODE_CPU_ANY_SATURATED_SECONDS))
    if any_sat is not None:
        most = v.get(T(N.NODE_CPU_BUSIEST_SATURATED_SECONDS)) or 0
        text += f"; seconds saturated: any core {seconds(any_sat)}, the busiest core {seconds(most)}"
    yield "node cpu", text


def _cgroups(v):
    if v.get(N.NODE_MEMORY_CGROUPS_AVAILABLE) is None:
        return
    mem = v.get(N.NODE_CGROUPS, controller="memory")
    text = f"{n(mem)} memory cgroups on the node (/proc/cgroups, dying ones included)" if mem is not None \
        else "memory controller not listed in /proc/cgroups"
    visible = v.get(N.VISIBLE_MEMORY_CGROUPS)
    if visible is not None:
        text += f", {n(visible)} visible to reaper"
    yield "cgroups", text


def _cgroup_v2(v):
    live = v.get(N.CGROUP_V2_DESCENDANTS, state="live")
    if live is None:
        return
    dying = v.get(N.CGROUP_V2_DESCENDANTS, state="dying") or 0
    text = (f"{n(live)} live and {n(dying)} dying cgroups below the highest cgroup v2 reaper sees "
            "(cgroup.stat; dying: removed, still holding charged memory)")
    mem_live = v.get(N.CGROUP_V2_CONTROLLER_CGROUPS, controller="memory", state="live")
    mem_dying = v.get(N.CGROUP_V2_CONTROLLER_CGROUPS, controller="memory", state="dying")
    if mem_live is not None or mem_dying is not None:
        text += f"; memory controller: {n(mem_live)} live, {n(mem_dying)} dying"
    yield "cgroup v2", text


def _pids(v):
    if on(v.get(N.CGROUP_PIDS_AVAILABLE)):
        limit = v.get(N.CGROUP_PIDS_MAX)                 # +Inf: pids.max says "max"
        yield "pids", f"{n(v.get(N.CGROUP_PIDS))} / {'max' if limit == math.inf else n(limit)} (reaper's cgroup)"


def _self(v):
    cpu = v.get(T(N.CPU_SECONDS))
    rss = v.get(N.RESIDENT_MEMORY_BYTES)
    if cpu is not None:
        yield "self", (f"reaper's own CPU {seconds(cpu)}"
                       + (f", resident memory {fmt(rss / 2**20, '.1f')} MiB" if rss else ""))


# The rows, in order, each with the modes it applies to (figures.mode): watch reaps
# nothing and has no main child, pause (-P) has no main child, reaper node has its own.
INIT, REAPS, OWN = ("init",), ("init", "pause"), ("init", "pause", "watch")
ROWS = ((_main_child, INIT), (_services, REAPS), (_reaped, REAPS), (_latency, REAPS), (_zombies, OWN),
        (_processes, OWN), (_signals, OWN), (_drain, REAPS), (_budgets, OWN), (_leftovers, REAPS), (_node_cpu, OWN),
        (_cgroups, OWN), (_cgroup_v2, OWN), (_pids, OWN), (_self, OWN))

"""``reaper stats``: a compact human-readable view of a running reaper's metrics, for
``kubectl exec POD -- reaper stats`` (docs/reaper-stats.md). A plain client: it only
reads, off the way to any child's exec, so argparse is fine here.

Its options are its own (not reaper's: reaper/options.py's table is what reaper and
reaper watch take); their default values are written once, below.
"""
import argparse
import os
import time

from reaper import options
from reaper.text import display

DEFAULT_URL = f"http://127.0.0.1:{options.DEFAULT_METRICS_PORT}/metrics"
DEFAULT_TIMEOUT = 5.0
PROG = "reaper stats"


class _Parser(argparse.ArgumentParser):
    def error(self, message):        # one line, exit 2 (argparse would print the usage too)
        raise options.UsageError(message)      # which shows bytes that are not UTF-8 as \xff


def main(argv: list, sfd: "int | None" = None) -> int:
    try:                            # fd 1 closed: its number may be reused by the fetch
        os.fstat(1)
        closed = False
    except OSError:
        closed = True
    args = _parse(argv, closed)
    try:
        text = _read_file(args.file) if args.file else _fetch(args.url or DEFAULT_URL, args.timeout)
    except OSError as e:
        os.write(2, f"{PROG}: {display(str(e))}\n".encode())
        return 1
    except UnicodeDecodeError:
        os.write(2, f"{PROG}: {display(args.file)} is not UTF-8 text\n".encode())
        return 1
    try:
        from prometheus_client.parser import text_string_to_metric_families

        samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    except Exception as e:
        os.write(2, f"{PROG}: not a Prometheus text exposition: {display(str(e))}\n".encode())
        return 1
    if not any(s.name == "reaper_build_info" for s in samples):
        os.write(2, f"{PROG}: no reaper metrics there (reaper_build_info missing)\n".encode())
        return 1
    return options.write_stdout(render(samples), PROG, closed)


def _parse(argv: list, closed: bool) -> argparse.Namespace:
    class Help(argparse.Action):    # argparse would print via sys.stdout (None when fd 1 is closed)
        def __call__(self, parser, namespace, values, option_string=None):
            raise SystemExit(options.write_stdout(parser.format_help(), PROG, closed))

    p = _Parser(prog=PROG, description="Show a running reaper's numbers.", add_help=False)
    p.add_argument("-h", "--help", action=Help, nargs=0, default=argparse.SUPPRESS,
                   help="show this help and exit")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--url", help=f"metrics endpoint (default {DEFAULT_URL})")
    src.add_argument("--file", help="a metrics file written by --metrics-file")
    p.add_argument("--timeout", type=_seconds_value, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"seconds to wait for the endpoint, at most {options.MAX_SECONDS} ({DEFAULT_TIMEOUT:g})")
    return p.parse_args(argv)


def _seconds_value(text: str) -> float:
    try:
        return options.seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise OSError(f"cannot read {path}: {e.strerror}") from None


def _fetch(url: str, timeout: float) -> str:
    import urllib.error
    import urllib.request

    if "://" not in url:
        url = "http://" + url
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        raise OSError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        reason = getattr(e.reason, "strerror", None) or str(e.reason)
        raise OSError(f"cannot fetch {url}: {reason}") from None
    except (ValueError, OSError) as e:
        raise OSError(f"cannot fetch {url}: {e}") from None


class _View:
    def __init__(self, samples) -> None:
        self.samples = samples

    def get(self, name: str, **labels):
        """Sum of the samples named name whose labels include labels; None if there is none."""
        found = [s.value for s in self.samples
                 if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        return sum(found) if found else None

    def by(self, name: str, label: str, **labels) -> dict:
        out: dict = {}
        for s in self.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                key = s.labels.get(label, "")
                out[key] = out.get(key, 0) + s.value
        return out

    def rows(self, name: str):
        return [s for s in self.samples if s.name == name]


def _n(v) -> str:
    if v is None:
        return "-"
    return str(int(v)) if float(v).is_integer() else f"{v:.3g}"


def _dur(secs: float) -> str:
    secs = int(secs)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _seconds(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    if v == 0:
        return "0s"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if v >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v * 1e6:.3g}µs"


def _pairs(d: dict, fmt=_n) -> str:
    items = [(k, v) for k, v in sorted(d.items()) if v]
    return ", ".join(f"{k} {fmt(v)}" for k, v in items) if items else "none"


def _quantile(buckets: dict, q: float):
    """Upper bound of the bucket holding quantile q of a cumulative histogram."""
    bounds = sorted((float(le), n) for le, n in buckets.items())
    if not bounds or bounds[-1][1] == 0:
        return None
    target = q * bounds[-1][1]
    for le, n in bounds:
        if n >= target:
            return le
    return bounds[-1][0]


def render(samples) -> str:
    v = _View(samples)
    info = (v.rows("reaper_build_info") or [None])[0]
    mode = info.labels.get("mode", "?") if info else "?"
    lines = []
    start = v.get("reaper_start_time_seconds")
    up = _dur(time.time() - start) if start else "?"
    phase = [k for k, n in v.by("reaper_phase", "phase").items() if n]
    pid = v.get("reaper_pid")
    # init: PID 1 of its namespace; subreaper: reaper not PID 1; watch: the sidecar.
    role = "watch" if mode == "watch" else "init" if pid == 1 else "subreaper"
    head = f"reaper {info.labels.get('version', '?') if info else '?'} ({role}), pid {_n(pid)}, up {up}"
    if phase:
        head += f", phase {phase[0]}"
    lines.append(head)

    def row(title: str, text: str) -> None:
        lines.append(f"  {title:<12} {text}")

    if mode == "init":
        state = [k for k, n in v.by("reaper_main_child_state", "state").items() if n]
        text = state[0] if state else "none (pause mode)"
        outcome = [k for k, n in v.by("reaper_main_child_outcome", "outcome").items() if n]
        if v.get("reaper_main_child_exit_code") is not None:
            text += f", exit code {_n(v.get('reaper_main_child_exit_code'))}" + (f" ({outcome[0]})" if outcome else "")
        row("main child", text)
    _services(v, row)
    reaped = v.by("reaper_reaped_total", "kind")
    orphan_outcomes = v.by("reaper_reaped_total", "outcome", kind="orphan")
    row("reaped", f"{_n(sum(reaped.values()))} ({_pairs(reaped)}); orphans by outcome: {_pairs(orphan_outcomes)}")
    buckets = v.by("reaper_reap_latency_seconds_bucket", "le")
    count = v.get("reaper_reap_latency_seconds_count") or 0
    if count:
        p50, p99 = _quantile(buckets, 0.5), _quantile(buckets, 0.99)
        mean = (v.get("reaper_reap_latency_seconds_sum") or 0) / count
        row("reap latency", f"mean {_seconds(mean)}, p50 <= {_seconds(p50)}, p99 <= {_seconds(p99)} "
                            f"over {_n(count)} {'reap' if count == 1 else 'reaps'}")
    zombies = v.get("reaper_zombies")
    parents = [(s.labels.get("parent_name", ""), s.labels.get("parent_pid", ""), s.value)
               for s in v.rows("reaper_zombies_by_parent")]
    text = f"{_n(zombies)} now"
    if zombies:
        text += f", oldest {_seconds(v.get('reaper_zombie_oldest_age_seconds') or 0)}"
        text += "; by parent: " + ", ".join(f"{name}[{pid}] {_n(n)}" for name, pid, n in parents)
    row("zombies", text)
    procs = v.by("reaper_processes", "class")
    row("processes", ", ".join(f"{k.replace('_', ' ')} {_n(n)}" for k, n in sorted(procs.items())) or "-")
    row("signals", f"received: {_pairs(v.by('reaper_signals_received_total', 'signal'))}; "
                   f"forwarded: {_pairs(v.by('reaper_signals_forwarded_total', 'signal'))}")
    if mode == "init":
        paused = not [k for k, n in v.by("reaper_main_child_state", "state").items() if n]
        row("drain", _drain(v, phase[0] if phase else "", paused))
    budget = v.rows("reaper_budget_info")
    text = f"stray CPU {_seconds(v.get('reaper_stray_cpu_seconds_total') or 0)}"
    if budget:
        mech = budget[0].labels.get('mechanism', '')
        memory = budget[0].labels.get("memory_mechanism", "none")
        text = f"on ({mech}{'' if memory in ('', 'none') else ', memory ' + memory}), " + text
        text += f"; violations: {_pairs(v.by('reaper_budget_violations_total', 'action'))}"
        text += f"; actions: {_pairs(v.by('reaper_budget_actions_total', 'action'))}"
        reasons = {k: n for k, n in v.by("reaper_budget_actions_total", "reason").items() if k != "any"}
        if reasons:
            text += f" (for {_pairs(reasons)})"
    else:
        text = "off, " + text
    row("budgets", text)
    memory = {s.labels.get("pid", ""): s.value for s in v.rows("reaper_stray_memory_bytes")}
    for s in sorted(v.rows("reaper_stray_cpu_cores"), key=lambda s: -s.value)[:5]:
        rss = memory.get(s.labels.get("pid", ""))
        row("", f"stray {s.labels.get('name', '')}[{s.labels.get('pid', '')}] "
                f"{s.value:.2f} cores" + (f", {rss / 2**20:.0f} MiB" if rss else "") +
                f" ({s.labels.get('action', '')})")
    busy = v.by("reaper_node_cpu_busy_ratio", "cpu")
    if busy:                        # --node-metrics per-core
        top = max(busy, key=lambda c: busy[c])
        system = v.get("reaper_node_cpu_mode_ratio", cpu=top, mode="system") or 0
        sat = v.by("reaper_node_cpu_saturated_seconds_total", "cpu")
        row("node cpu", f"busiest core cpu{top} {busy[top]:.0%} busy ({system:.0%} system); "
                        f"seconds saturated: {_pairs({f'cpu{k}': n for k, n in sat.items()}, _seconds)}")
    elif v.get("reaper_node_cpu_busiest_ratio", mode="busy") is not None:      # the summary (default)
        top = v.get("reaper_node_cpu_busiest_ratio", mode="busy")
        system = v.get("reaper_node_cpu_busiest_ratio", mode="system") or 0
        text = f"busiest core {top:.0%} busy, system up to {system:.0%}"
        cores = v.get("reaper_node_cpus")
        if cores is not None:
            text += f"; {_n(v.get('reaper_node_cpu_saturated_cores') or 0)} of {_n(cores)} cores saturated now"
        any_sat = v.get("reaper_node_cpu_any_saturated_seconds_total")
        if any_sat is not None:
            most = v.get("reaper_node_cpu_busiest_saturated_seconds_total") or 0
            text += f"; seconds saturated: any core {_seconds(any_sat)}, the busiest core {_seconds(most)}"
        row("node cpu", text)
    mem = v.get("reaper_node_cgroups", controller="memory")
    if v.get("reaper_node_memory_cgroups_available") is not None:
        text = f"{_n(mem)} memory cgroups on the node (/proc/cgroups, dying ones included)" if mem is not None \
            else "memory controller not listed in /proc/cgroups"
        visible = v.get("reaper_visible_memory_cgroups")
        if visible is not None:
            text += f", {_n(visible)} visible to reaper"
        row("cgroups", text)
    live = v.get("reaper_cgroup_v2_descendants", state="live")
    if live is not None:
        dying = v.get("reaper_cgroup_v2_descendants", state="dying") or 0
        text = (f"{_n(live)} live and {_n(dying)} dying cgroups below the highest cgroup v2 reaper sees "
                "(cgroup.stat; dying: removed, still holding charged memory)")
        mem_live = v.get("reaper_cgroup_v2_controller_cgroups", controller="memory", state="live")
        mem_dying = v.get("reaper_cgroup_v2_controller_cgroups", controller="memory", state="dying")
        if mem_live is not None or mem_dying is not None:
            text += f"; memory controller: {_n(mem_live)} live, {_n(mem_dying)} dying"
        row("cgroup v2", text)
    if v.get("reaper_cgroup_pids_available"):
        row("pids", f"{_n(v.get('reaper_cgroup_pids'))} / {_n(v.get('reaper_cgroup_pids_max'))} (reaper's cgroup)")
    cpu = v.get("reaper_cpu_seconds_total")
    rss = v.get("reaper_resident_memory_bytes")
    if cpu is not None:
        row("self", f"CPU {_seconds(cpu)}" + (f", RSS {rss / 2**20:.1f} MiB" if rss else ""))
    return "\n".join(lines) + "\n"


def _services(v, row) -> None:
    """One line per supervised service: state, pid-less facts from the metrics."""
    names = [s.labels.get("service", "") for s in v.rows("reaper_service_starts_total")]
    now = time.time()
    for name in names:
        state = [k for k, n in v.by("reaper_service_state", "state", service=name).items() if n]
        text = f"{name}: {state[0] if state else '?'}"
        if v.get("reaper_service_ready", service=name):
            text += ", ready"
        starts = v.get("reaper_service_starts_total", service=name)
        text += f", {_n(starts)} {'start' if starts == 1 else 'starts'}"
        since = v.get("reaper_service_start_time_seconds", service=name)
        if since is not None and v.get("reaper_service_up", service=name):
            text += f", up {_dur(now - since)}"
        code = v.get("reaper_service_last_exit_code", service=name)
        if code is not None:
            text += f", last exit {_n(code)}"
        row("service" if name == names[0] else "", text)


def _drain(v, phase: str, paused: bool = False) -> str:
    """What the end-of-life drain did, in words."""
    took = v.get("reaper_drain_duration_seconds")
    if phase in ("running", "") and took is None:
        return "not started (it runs when " + \
            ("SIGTERM or SIGINT ends pause mode)" if paused else "the main child exits)")
    counts = v.by("reaper_drain_processes_total", "result")
    words = (("terminated", "ended after SIGTERM"), ("killed", "killed by SIGKILL"),
             ("survived", "survived SIGKILL"), ("not_permitted", "not permitted to signal"))
    parts = [f"{_n(counts[k])} {w}" for k, w in words if counts.get(k)]
    text = ", ".join(parts) if parts else "nothing was left to stop"
    if took is not None:
        text += f"; took {_seconds(took)}"
    elif phase in ("draining", "killing"):
        text += f" so far ({phase})"
    return text

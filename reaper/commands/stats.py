"""``reaper stats``: a compact human-readable view of a running reaper's metrics, for
``kubectl exec POD -- reaper stats`` (docs/reaper-stats.md). A plain client: it only
reads, off the way to any child's exec. ``reaper top`` (commands/top/) reads the same
way: fetch_samples and read_samples.

Its options are its own rows (FLAGS), read by reaper's scanner with reaper's wording;
without --url, the endpoint is where REAPER_METRICS_PORT and REAPER_METRICS_ADDRESS put it.

What it reads is hostile input (an endpoint or a file anyone may point it at): the
fetch, connect to last byte, ends within --timeout; at most MAX_BYTES are read; --file
must be a regular file; a number that is not finite shows as unknown ("?"); the labels
it prints are shown on one line each, control characters escaped.
"""
import math
import os
import time

from reaper import options
from reaper.options import Option
from reaper.text import display, quoted

DEFAULT_TIMEOUT = 5.0
MAX_BYTES = 4 << 20     # 4 MiB: a reaper's page is some kB (docs/reaper-stats.md, Notes)
PROG = "reaper stats"
DOCS = "docs/reaper-stats.md"


class Args:
    """What reaper stats was asked (the defaults: the endpoint the variables name)."""
    url = None
    file = None
    timeout = DEFAULT_TIMEOUT


# Its own rows, read by reaper's scanner (reaper/options.py): reaper's wording for errors.
FLAGS = (
    Option("url", "", "url", "value", "the metrics endpoint: a URL, or HOST:PORT (default: "
           "http://127.0.0.1:PORT/metrics, PORT from REAPER_METRICS_PORT, else 9259)", "URL"),
    Option("file", "", "file", "value", "a metrics file written by --metrics-file", "PATH"),
    Option("timeout", "", "timeout", "value",
           f"seconds to wait for the endpoint, at most {options.MAX_SECONDS} ({{default}})", "SECONDS",
           options.seconds),
)
# The variables of reaper's own table that say where its endpoint is.
ENDPOINT = tuple(o for o in options.OPTIONS if o.long in ("metrics-port", "metrics-address"))
ENVIRONMENT = (("REAPER_METRICS_PORT", "the port reaper serves its metrics on (without --url)"),
               ("REAPER_METRICS_ADDRESS", "the address it binds (0.0.0.0 and :: are asked on loopback)"))


class Unreadable(Exception):
    """The page or file could not be read or is not reaper's: one line says why."""


def main(argv: list, sfd: "int | None" = None) -> int:
    try:                            # fd 1 closed: its number may be reused by the fetch
        os.fstat(1)
        closed = False
    except OSError:
        closed = True
    args = parse(argv, PROG, FLAGS, Args, help_text, closed)
    if isinstance(args, int):
        return args
    try:
        if args.file:
            samples, ended = read_samples(args.file), _mtime(args.file)
        else:
            samples, ended = fetch_samples(args.url or default_url(), args.timeout), None
    except Unreadable as e:
        os.write(2, f"{PROG}: {e}\n".encode())
        return 1
    return options.write_stdout(render(samples, ended), PROG, closed)


def parse(argv: list, prog: str, flags: tuple, defaults: type, help_text, closed: bool):
    """A client's arguments, with reaper's scanner and wording: its Args, or the exit
    status once --help or -V was answered. Raises options.UsageError."""
    requests = {"--help": options.HelpRequested, "-h": options.HelpRequested,
                "--version": options.VersionRequested, "-V": options.VersionRequested}
    from reaper.commands import answered

    scanned = answered(lambda: options.scan(argv, flags, requests), help_text, prog, closed)
    if isinstance(scanned, int):
        return scanned
    found, rest = scanned
    if rest:
        raise options.UsageError(f"unexpected argument {quoted(rest[0])}")
    args = defaults()
    for opt, flag, value in found:
        try:
            setattr(args, opt.dest, opt.parse(value))
        except ValueError as e:
            raise options.UsageError(f"{flag}: {e}") from None
    if getattr(args, "url", None) and getattr(args, "file", None):
        raise options.UsageError("--url and --file exclude each other")
    return args


def help_text() -> str:
    from reaper import usage

    head = ["usage: reaper stats [--url URL | --file PATH] [--timeout SECONDS]",
            "",
            "A running reaper's numbers, compact, from its metrics endpoint (or the file",
            "--metrics-file writes): for kubectl exec POD -- reaper stats."]
    return usage.render(head, usage.option_rows(FLAGS, Args) + usage.tail(ENVIRONMENT, DOCS))


def default_url(environ=None) -> str:
    """The endpoint reaper serves by default, where REAPER_METRICS_PORT and
    REAPER_METRICS_ADDRESS (as reaper read them) put it. Raises options.UsageError."""
    cfg = options.configure([], ENDPOINT, os.environ if environ is None else environ)
    port = cfg.metrics_port or options.DEFAULT_METRICS_PORT
    host = cfg.metrics_address
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"


def endpoint(url: str) -> str:
    """url as given, or HOST:PORT: a scheme and /metrics where none is given."""
    if "://" not in url:
        url = "http://" + url
    scheme, _, rest = url.partition("://")
    if "/" not in rest:
        url += "/metrics"
    return url


def fetch_samples(url: str, timeout: float) -> list:
    """The samples of the page at url (a URL or HOST:PORT). Raises Unreadable."""
    try:
        return _samples(_fetch(endpoint(url), timeout))
    except OSError as e:
        raise Unreadable(display(str(e))) from None


def read_samples(path: str) -> list:
    try:
        return _samples(_read_file(path))
    except OSError as e:
        raise Unreadable(display(str(e))) from None
    except UnicodeDecodeError:
        raise Unreadable(f"{display(path)} is not UTF-8 text") from None


def _mtime(path: str) -> "float | None":
    """When the file was last written: a finished run's end."""
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _samples(text: str) -> list:
    try:
        from prometheus_client.parser import text_string_to_metric_families

        samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    except Exception as e:
        raise Unreadable(f"not a Prometheus text exposition: {display(str(e))}") from None
    if not any(s.name == "reaper_build_info" for s in samples):
        raise Unreadable("no reaper metrics there (reaper_build_info missing)")
    return samples


def _read_file(path: str) -> str:
    """A regular file's text: a FIFO (whose open would wait for a writer), a device
    (/dev/zero reads without end) or more than MAX_BYTES is refused."""
    from reaper.procfs.files import Refused, read_regular

    try:
        data = read_regular(path, MAX_BYTES)
    except Refused:
        raise                       # in its own words: "PATH is not a regular file"...
    except OSError as e:
        raise OSError(f"cannot read {path}: {e.strerror}") from None
    return data.decode("utf-8")


def _fetch(url: str, timeout: float) -> str:
    """The body at url, fetched in a thread: a socket's timeout bounds each operation,
    not their sum (a server that drips a byte a second never trips it), and not the
    name lookup; the thread is given timeout seconds in all, then left behind."""
    import threading

    result: list = []
    worker = threading.Thread(target=_get, args=(url, timeout, result), name="fetch", daemon=True)
    worker.start()
    worker.join(timeout)
    if not result:
        raise _timed_out(url, timeout)
    if isinstance(result[0], Exception):
        raise result[0]
    return result[0]


def _timed_out(url: str, timeout: float) -> OSError:
    return OSError(f"cannot fetch {url}: timed out after {timeout:g}s")


def _get(url: str, timeout: float, result: list) -> None:
    """Appends the body at url (decoded) or the OSError that says why not."""
    try:
        result.append(_request(url, timeout))
    except Exception as e:          # said by the main thread, one line
        result.append(e if isinstance(e, OSError) else OSError(f"cannot fetch {url}: {e!r}"))


def _request(url: str, timeout: float) -> str:
    import http.client
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return _read_bounded(r, url).decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        raise OSError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):      # one operation took timeout: the whole did too
            raise _timed_out(url, timeout) from None
        reason = getattr(e.reason, "strerror", None) or str(e.reason)
        raise OSError(f"cannot fetch {url}: {reason}") from None
    except TimeoutError:
        raise _timed_out(url, timeout) from None
    except _TooLarge as e:
        raise OSError(str(e)) from None
    except http.client.HTTPException as e:        # LineTooLong, BadStatusLine (its line), IncompleteRead
        raise OSError(f"cannot fetch {url}: bad HTTP answer ({type(e).__name__} {quoted(str(e))})") from None
    except (ValueError, OSError) as e:
        raise OSError(f"cannot fetch {url}: {e}") from None


class _TooLarge(Exception):
    """More than MAX_BYTES (not an OSError: _request's handlers would reword it)."""


def _read_bounded(r, url: str) -> bytes:
    chunks, size = [], 0
    while True:
        chunk = r.read(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_BYTES:
            raise _TooLarge(f"{url}: more than {MAX_BYTES} bytes")
        chunks.append(chunk)


class View:
    """The samples by name: a page of a hundred thousand samples is not scanned whole
    for each number the view shows."""

    def __init__(self, samples) -> None:
        self.named: dict = {}
        for s in samples:
            self.named.setdefault(s.name, []).append(s)

    def get(self, name: str, **labels):
        """Sum of the samples named name whose labels include labels; None if there is none."""
        found = [s.value for s in self.rows(name) if all(s.labels.get(k) == v for k, v in labels.items())]
        return sum(found) if found else None

    def by(self, name: str, label: str, **labels) -> dict:
        out: dict = {}
        for s in self.rows(name):
            if all(s.labels.get(k) == v for k, v in labels.items()):
                key = s.labels.get(label, "")
                out[key] = out.get(key, 0) + s.value
        return out

    def rows(self, name: str) -> list:
        return self.named.get(name, [])

    def split(self, label: str) -> dict:
        """A _View per value of label, of the samples that have it."""
        parts: dict = {}
        for rows in self.named.values():
            for s in rows:
                if label in s.labels:
                    parts.setdefault(s.labels[label], []).append(s)
        return {key: View(rows) for key, rows in parts.items()}


# A number on the page may be NaN or ±Inf (the parser takes them): it shows as "?", and
# a flag or state that is not a known number is not set.

def _known(v) -> bool:
    return v is not None and math.isfinite(v)


def _on(v) -> bool:
    return _known(v) and v != 0


def _fmt(v, spec: str) -> str:
    return format(v, spec) if _known(v) else "?"


def _n(v) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return "?"
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:.3g}"


def _dur(secs: float) -> str:
    if not _known(secs) or secs < 0:        # a start time in the future: not an uptime
        return "?"
    secs = int(secs)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _seconds(v: float) -> str:
    if not _known(v):
        return "?"
    if v == 0:
        return "0s"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if v >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v * 1e6:.3g}µs"


def _pairs(d: dict, fmt=_n) -> str:
    items = [(k, v) for k, v in sorted(d.items()) if v]
    return ", ".join(f"{k} {fmt(v)}" for k, v in items) if items else "none"


def _bound(le) -> str:
    return "+Inf" if le == math.inf else _seconds(le)


def _quantile(buckets: dict, q: float):
    """Upper bound of the bucket holding quantile q of a cumulative histogram; None
    when unknown (a count that is not a number, a bound that is not one)."""
    bounds = []
    for le, n in buckets.items():
        try:
            bound = float(le)
        except ValueError:
            return None
        if math.isnan(bound) or not _known(n):
            return None
        bounds.append((bound, n))
    bounds.sort()
    if not bounds or bounds[-1][1] == 0:
        return None
    target = q * bounds[-1][1]
    for le, n in bounds:
        if n >= target:
            return le
    return bounds[-1][0]


def role(v) -> str:
    """init: PID 1 of its namespace; subreaper: reaper not PID 1; watch: the sidecar; node."""
    info = (v.rows("reaper_build_info") or [None])[0]
    mode = info.labels.get("mode", "?") if info else "?"
    pid = v.get("reaper_pid")
    if mode in ("watch", "node"):
        return mode
    return "init" if pid == 1 else "subreaper" if _known(pid) else "?"


def lifetime(v, ended: "float | None" = None, now: "float | None" = None) -> str:
    """"up 3m02s" while it runs; a finished run (phase done, its file written at ended):
    "ran 3m02s, ended 2026-12-02 01:02:03 UTC (11m ago)"."""
    now = time.time() if now is None else now
    start = v.get("reaper_start_time_seconds")
    phase = [k for k, n in v.by("reaper_phase", "phase").items() if _on(n)]
    if phase and phase[0] == "done" and ended is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ended))
        return f"ran {_dur(ended - start) if start else '?'}, ended {when} ({_dur(now - ended)} ago)"
    return f"up {_dur(now - start) if start else '?'}"


def processes(v) -> str:
    """One snapshot: the process table's counts (all = main tree + others), then the
    budgets' strays, which come from their own last sample."""
    procs = v.by("reaper_processes", "class")
    if not procs:
        return "-"
    every, tree = procs.get("all"), procs.get("main_tree")
    if tree is None:
        text = f"{_n(every)} live"
    else:
        others = every - tree if _known(every) and _known(tree) else None
        text = f"{_n(every)} live: main tree {_n(tree)}, others {_n(others)}"
    if v.rows("reaper_budget_info"):
        text += f"; strays {_n(procs.get('stray'))} (the budgets' last sample)"
    elif tree is None and procs.get("stray") is not None:
        text += f"; strays {_n(procs.get('stray'))}"
    return text


def render(samples, ended: "float | None" = None) -> str:
    """The view; ended: when a metrics file was last written (a finished run's end)."""
    v = View(samples)
    info = (v.rows("reaper_build_info") or [None])[0]
    mode = info.labels.get("mode", "?") if info else "?"
    lines = []
    phase = [k for k, n in v.by("reaper_phase", "phase").items() if _on(n)]
    pid = v.get("reaper_pid")
    head = f"reaper {info.labels.get('version', '?') if info else '?'} ({role(v)}), pid {_n(pid)}, " + \
        lifetime(v, ended)
    if phase:
        head += f", phase {phase[0]}"
    lines.append(head)

    def row(title: str, text: str) -> None:
        lines.append(f"  {title:<12} {text}")

    if mode == "init":
        state = [k for k, n in v.by("reaper_main_child_state", "state").items() if _on(n)]
        text = state[0] if state else "none (pause mode)"
        outcome = [k for k, n in v.by("reaper_main_child_outcome", "outcome").items() if _on(n)]
        if v.get("reaper_main_child_exit_code") is not None:
            text += f", exit code {_n(v.get('reaper_main_child_exit_code'))}" + (f" ({outcome[0]})" if outcome else "")
        row("main child", text)
    _services(v, row)
    reaped = v.by("reaper_reaped_total", "kind")
    orphan_outcomes = v.by("reaper_reaped_total", "outcome", kind="orphan")
    row("reaped", f"{_n(sum(reaped.values()))} ({_pairs(reaped)}); orphans by outcome: {_pairs(orphan_outcomes)}")
    buckets = v.by("reaper_reap_latency_seconds_bucket", "le")
    count = v.get("reaper_reap_latency_seconds_count")
    if _on(count):
        p50, p99 = _quantile(buckets, 0.5), _quantile(buckets, 0.99)
        mean = (v.get("reaper_reap_latency_seconds_sum") or 0) / count
        row("reap latency", f"mean {_seconds(mean)}, p50 <= {_bound(p50)}, p99 <= {_bound(p99)} "
                            f"over {_n(count)} {'reap' if count == 1 else 'reaps'}")
    elif count is not None and not _known(count):
        row("reap latency", "?")
    zombies = v.get("reaper_zombies")
    parents = [(s.labels.get("parent_name", ""), s.labels.get("parent_pid", ""), s.value)
               for s in v.rows("reaper_zombies_by_parent")]
    text = f"{_n(zombies)} now"
    if _on(zombies):
        text += f", oldest {_seconds(v.get('reaper_zombie_oldest_age_seconds') or 0)}"
        text += "; by parent: " + ", ".join(f"{name}[{pid}] {_n(n)}" for name, pid, n in parents)
    row("zombies", text)
    row("processes", processes(v))
    row("signals", f"received: {_pairs(v.by('reaper_signals_received_total', 'signal'))}; "
                   f"forwarded: {_pairs(v.by('reaper_signals_forwarded_total', 'signal'))}")
    if mode == "init":
        paused = not [k for k, n in v.by("reaper_main_child_state", "state").items() if _on(n)]
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
    for s in sorted(v.rows("reaper_stray_cpu_cores"), key=lambda s: -s.value if _known(s.value) else math.inf)[:5]:
        rss = memory.get(s.labels.get("pid", ""))
        row("", f"stray {s.labels.get('name', '')}[{s.labels.get('pid', '')}] "
                f"{_fmt(s.value, '.2f')} cores" + (f", {_fmt(rss / 2**20, '.0f')} MiB" if rss else "") +
                f" ({s.labels.get('action', '')})")
    busy = v.by("reaper_node_cpu_busy_ratio", "cpu")
    if busy:                        # --node-metrics per-core
        top = max(busy, key=lambda c: busy[c] if _known(busy[c]) else -math.inf)
        system = v.get("reaper_node_cpu_mode_ratio", cpu=top, mode="system") or 0
        sat = v.by("reaper_node_cpu_saturated_seconds_total", "cpu")
        row("node cpu", f"busiest core cpu{top} {_fmt(busy[top], '.0%')} busy ({_fmt(system, '.0%')} system); "
                        f"seconds saturated: {_pairs({f'cpu{k}': n for k, n in sat.items()}, _seconds)}")
    elif v.get("reaper_node_cpu_busiest_ratio", mode="busy") is not None:      # the summary (default)
        top = v.get("reaper_node_cpu_busiest_ratio", mode="busy")
        system = v.get("reaper_node_cpu_busiest_ratio", mode="system") or 0
        text = f"busiest core {_fmt(top, '.0%')} busy, system up to {_fmt(system, '.0%')}"
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
    if _on(v.get("reaper_cgroup_pids_available")):
        limit = v.get("reaper_cgroup_pids_max")                 # +Inf: pids.max says "max"
        row("pids", f"{_n(v.get('reaper_cgroup_pids'))} / {'max' if limit == math.inf else _n(limit)} "
                    "(reaper's cgroup)")
    cpu = v.get("reaper_cpu_seconds_total")
    rss = v.get("reaper_resident_memory_bytes")
    if cpu is not None:
        row("self", f"CPU {_seconds(cpu)}" + (f", RSS {_fmt(rss / 2**20, '.1f')} MiB" if rss else ""))
    # Labels are the page's words (a process's name among them): one line each, no escape sequences.
    return "\n".join(display(line) for line in lines) + "\n"


def _services(v, row) -> None:
    """One line per supervised service: state, pid-less facts from the metrics."""
    names = list(dict.fromkeys(s.labels.get("service", "") for s in v.rows("reaper_service_starts_total")))
    services = v.split("service")           # one pass: a page may name thousands
    now = time.time()
    for i, name in enumerate(names):
        sv = services.get(name) or View([])
        state = [k for k, n in sv.by("reaper_service_state", "state").items() if _on(n)]
        text = f"{name}: {state[0] if state else '?'}"
        if _on(sv.get("reaper_service_ready")):
            text += ", ready"
        starts = sv.get("reaper_service_starts_total")
        text += f", {_n(starts)} {'start' if starts == 1 else 'starts'}"
        since = sv.get("reaper_service_start_time_seconds")
        if since is not None and _on(sv.get("reaper_service_up")):
            text += f", up {_dur(now - since)}"
        code = sv.get("reaper_service_last_exit_code")
        if code is not None:
            text += f", last exit {_n(code)}"
        row("service" if i == 0 else "", text)


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

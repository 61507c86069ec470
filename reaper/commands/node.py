"""``reaper node``: the node-level detector (docs/reaper-node.md), one per node as a
DaemonSet (hostPID, the host's /proc and /sys read-only), or once by hand with
--diagnose. Per-core saturation streaks at one-second resolution, the processes that
held a saturated core in the kernel, live and dying memory cgroups, pressure, softnet,
interrupts and zombies by cgroup (reaper/node/). Read-only: it never signals, moves or
writes anything but the metrics file it is asked for.

Its options: its own rows (NODE_OPTIONS, with REAPER_NODE_* variables) and reaper's
metrics options and -v, rows of the one table in reaper/options.py, read by the same
scanner and parsers.
"""
import os
import signal
import time

from reaper import options
from reaper.options import Option
from reaper.text import quoted

PROG = "reaper node"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


def _percent(text: str) -> float:
    """A percentage, '95' or '95%', > 0 and <= 100: the ratio."""
    t = text.strip()
    t = t[:-1] if t.endswith("%") else t
    if not t or not t.isascii() or t.strip("0123456789.") or t.count(".") > 1 or t == ".":
        raise ValueError(f"expected a percentage such as 95, not {quoted(text)}")
    v = float(t)
    if not 0 < v <= 100:
        raise ValueError(f"must be a percentage > 0 and at most 100, not {quoted(text)}")
    return v / 100


def _stat_name(text: str) -> str:
    t = text.strip()
    if not t or len(t) > 32 or not t.isascii() or not t.replace("_", "").replace("-", "").replace(".", "").isalnum():
        raise ValueError(f"expected a statistic's name as `ethtool -S` prints it, not {quoted(text)}")
    return t


def _readable(text: str) -> str:
    """A path that exists ('' switches the kernel log off)."""
    if text and not os.path.exists(text):
        raise ValueError(f"no such file: {quoted(text)}")
    return text


def _directory(text: str) -> str:
    if not os.path.isdir(text):
        raise ValueError(f"not a directory: {quoted(text)}")
    return text


class NodeDefaults(options.Config):
    """The defaults of node's own options (a Config has none of them)."""
    node_window = 600.0
    node_threshold = 0.95
    node_proc = "/proc"
    node_sys = "/sys"
    node_diagnose = None
    node_kmsg = "/dev/kmsg"
    node_nic_stats: list = []


NODE_OPTIONS = (
    Option("window", "", "node_window", "value", "seconds the longest streak and the dying cgroups' growth are kept "
           "({default})",
           "SECONDS", options.seconds, env=("REAPER_NODE_WINDOW",)),
    Option("threshold", "", "node_threshold", "value", "busy percent at which a core is saturated (95)",
           "PERCENT", _percent, env=("REAPER_NODE_THRESHOLD",)),
    Option("proc", "", "node_proc", "value", "the host's /proc, mounted at DIR ({default})",
           "DIR", _directory, env=("REAPER_NODE_PROC",)),
    Option("sys", "", "node_sys", "value", "the host's /sys, mounted at DIR ({default})",
           "DIR", _directory, env=("REAPER_NODE_SYS",)),
    Option("diagnose", "", "node_diagnose", "value",
           "watch for SECONDS, print a report, exit 1 on a signature", "SECONDS", options.seconds,
           env=("REAPER_NODE_DIAGNOSE",)),
    Option("kmsg", "", "node_kmsg", "value", "the kernel log: /dev/kmsg, or a file of its records, followed "
           "('' for none) ({default})", "PATH", _readable, env=("REAPER_NODE_KMSG",)),
    Option("nic-stats", "", "node_nic_stats", "list", "a driver statistic (as `ethtool -S` names it) to "
           "export besides ENA's reset reasons and *_allowance_exceeded (repeatable)", "NAME", _stat_name,
           env=("REAPER_NODE_NIC_STATS",)),
)


def _takes(o: Option) -> bool:
    """reaper's options reaper node takes: the metrics endpoint and file, and -v."""
    return o.dest in ("metrics_port", "metrics_address", "metrics_file", "metrics_interval") or o.long == "verbose"


FLAGS = NODE_OPTIONS + tuple(o for o in options.OPTIONS if _takes(o))
VARIABLES = FLAGS + tuple(o for o in options.OPTIONS if o.long == "quiet")
HELP = {
    "verbose": "log more: each -v adds one to the default level (1: errors and warnings, the culprit "
               "lines; 2 adds events, 3 debug)",
    "metrics": "serve Prometheus metrics on the default port 9259 (without --diagnose: the default)",
}


def config(argv: list, environ=None) -> options.Config:
    """A Config from the REAPER_* variables, then the flags (a flag wins). Raises
    options.UsageError, or options.HelpRequested."""
    requests = {k: v for k, v in options.REQUESTS.items() if k not in ("--license", "-l")}
    found, rest = options.scan(argv, FLAGS, requests)
    if rest:
        raise options.UsageError(f"unexpected argument {quoted(rest[0])}")
    cfg = options.configure(found, VARIABLES, os.environ if environ is None else environ)
    for o in NODE_OPTIONS:
        if o.dest not in vars(cfg):
            setattr(cfg, o.dest, getattr(NodeDefaults, o.dest))
    if cfg.node_diagnose is None and cfg.metrics_port is None and not cfg.metrics_file:
        cfg.metrics_port = options.DEFAULT_METRICS_PORT
    elif cfg.node_diagnose is not None and not any(o.dest == "metrics_port" for o, _, _ in found):
        cfg.metrics_port = None      # --diagnose opens a port only when a flag asks (not an image's variable)
    return cfg


def help_text() -> str:
    from reaper import usage

    head = ["usage: reaper node [OPTIONS]",
            "       reaper node --diagnose SECONDS [OPTIONS]",
            "",
            "The node's detector: per-core saturation streaks, the processes holding a",
            "saturated core in the kernel and their kernel functions, NIC stalls and",
            "resets tied to that core, live and dying memory cgroups, pressure, softnet,",
            "interrupts, zombies by cgroup. Read-only. Every option also reads the",
            "REAPER_* environment variable shown beside it; a flag wins over it."]
    rows = usage.option_rows(FLAGS, NodeDefaults, HELP) + [("", ""), usage.HELP_ROW, usage.VERSION_ROW]
    environment = (("REAPER_QUIET", "errors only (as REAPER_VERBOSITY=0)"),)
    return usage.render(head, rows + usage.tail(environment, "docs/reaper-node.md"))


def main(argv: list, sfd: int) -> int:
    from reaper.commands.args import answered

    cfg = answered(lambda: config(argv), help_text, PROG)
    if isinstance(cfg, int):
        return cfg
    return _node(cfg, sfd)


def _monitor(cfg, log):
    from reaper.node.monitor import Monitor

    try:
        m = Monitor(cfg.node_proc, cfg.node_sys, cfg.node_threshold, cfg.node_window, log,
                    kmsg_path=cfg.node_kmsg or None, nic_stats=frozenset(cfg.node_nic_stats))
    except (OSError, ValueError) as e:
        raise options.UsageError(f"--proc: cannot read {cfg.node_proc}/stat: "
                                 f"{getattr(e, 'strerror', None) or e}") from None
    if not m.cpu.available:
        raise options.UsageError(f"--proc: {cfg.node_proc}/stat lists no cores")
    return m


def _serve(cfg, monitor, lock, log):
    """The metrics endpoint and file, with reaper's exporter machinery (reaper/metrics.py:
    the pre-bound port, its retries, the HTTP server, the atomic file write) serving
    reaper node's collector instead of reaper's."""
    from reaper import metrics
    from reaper.node.collector import NodeCollector

    try:
        x = metrics.prepare(cfg, None, log, mode="node")
    except metrics.SetupError as e:
        raise options.UsageError(str(e)) from None
    x.serve(NodeCollector(monitor, lock))
    return x


def _node(cfg, sfd: int) -> int:
    import threading

    from reaper._native import EV_SIGNAL, Waiter, ms_until
    from reaper.log import Log
    from reaper.node import diagnose
    from reaper.node.monitor import SAMPLE_INTERVAL

    log = Log(cfg.verbosity)
    monitor = _monitor(cfg, log)
    lock = threading.Lock()
    exporter = _serve(cfg, monitor, lock, log) if cfg.metrics_port is not None or cfg.metrics_file else None
    start = time.monotonic()
    before = diagnose.counters(cfg.node_proc, start) if cfg.node_diagnose else None
    end = start + cfg.node_diagnose if cfg.node_diagnose else None
    due = {"sample": start + SAMPLE_INTERVAL}
    if exporter is not None and exporter.file_registry is not None:
        due["file"] = start
    if exporter is not None and exporter.later is not None and exporter.sock is None:
        due["bind"] = start + 1.0
    with lock:
        monitor.refresh(start)
    log.info(f"node: watching {cfg.node_proc} and {cfg.node_sys}"
             + (f", metrics on {cfg.metrics_address}:{cfg.metrics_port}" if cfg.metrics_port else ""))
    waiter = Waiter(sfd)
    stopped = None
    while stopped is None:
        deadline = min(list(due.values()) + ([end] if end is not None else []))
        try:
            events, _, _ = waiter.wait(ms_until(deadline))
        except OSError:               # poll() without kernel memory: retry soon
            time.sleep(0.01)
            continue
        for ev in events:
            if ev.kind == EV_SIGNAL and ev.signo in STOP_SIGNALS:
                stopped = ev.signo
        now = time.monotonic()
        if end is not None and now >= end:
            break
        if stopped is None:
            _due(due, now, monitor, lock, exporter, cfg)
    if exporter is not None:
        _finish(exporter, log)
    status = _report(cfg, monitor, lock, before) if cfg.node_diagnose else 0
    monitor.close()
    log.close()
    return status


def _due(due: dict, now: float, monitor, lock, exporter, cfg) -> None:
    from reaper.node.monitor import SAMPLE_INTERVAL

    if now >= due["sample"]:
        with lock:
            try:
                monitor.sample(now)
            except Exception as e:          # a bug: one line, and the next sample
                monitor.log.event("node-sample", 0, f"node: a sample failed ({e!r})")
        due["sample"] = max(due["sample"] + SAMPLE_INTERVAL, now + SAMPLE_INTERVAL / 2)
    if "file" in due and now >= due["file"]:
        due["file"] = now + cfg.metrics_interval
        _guarded(monitor.log, "the metrics file", exporter.write_file)
    if "bind" in due and now >= due["bind"]:
        after = _guarded(monitor.log, "the metrics port", exporter.retry_bind)
        if isinstance(after, float):
            due["bind"] = now + after
        else:                         # bound and served, or given up (said once)
            del due["bind"]


def _guarded(log, what: str, fn):
    """fn(); a failure is one line, the loop goes on (the exporter's files and binds fail
    alone, as in reaper's sampler)."""
    try:
        return fn()
    except Exception as e:
        log.event(f"node-{what}", 0, f"node: {what} failed ({e!r})")
        return None


def _finish(exporter, log) -> None:
    exporter.abort()              # the server and the port
    if exporter.file_registry is not None:
        _guarded(log, "the metrics file", exporter.write_file)     # the last figures


def _report(cfg, monitor, lock, before) -> int:
    from reaper.node import diagnose

    now = time.monotonic()
    with lock:
        monitor.refresh(now)
        text, found = diagnose.report(monitor, before, diagnose.counters(cfg.node_proc, now))
    status = options.write_stdout(text, PROG)
    return status if status else (1 if found else 0)

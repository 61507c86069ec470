"""``reaper watch``: the metrics sidecar for pods with shareProcessNamespace
(docs/reaper-watch.md). It is not PID 1, reaps nothing it does not own, observes
every process in the namespace, serves the same endpoint as reaper and enforces the
budgets when asked.

Its options are reaper's own metrics and budget options, --grace and -v: rows of
the one table in reaper/options.py, read by the same scanner and the same parsers,
with the same REAPER_* variables; their help texts and defaults come from there.
"""
import os
import signal
import time

from reaper import options

PROG = "reaper watch"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


def _takes(o: options.Option) -> bool:
    """The options reaper watch takes: the metrics and budget ones (not --summary-file:
    it has no summary), --grace (the terminate action's delay), -v and --log-format."""
    return (o.section in ("metrics", "budget") and o.dest != "summary_file") or o.long in ("grace", "verbose", "log-format")


FLAGS = tuple(o for o in options.OPTIONS if _takes(o))
# The variables it reads: its flags', and REAPER_QUIET (there is no -q flag).
VARIABLES = tuple(o for o in options.OPTIONS if _takes(o) or o.long == "quiet")
# Where an option means something else here than in reaper (the rest: the table's text).
HELP = {
    "verbose": "log more: each -v adds one to the default level (1: errors and warnings; 2 adds events, "
               "3 debug); given, the variable is not read",
    "grace": "seconds between the terminate action's SIGTERM and its SIGKILL ({default})",
}


# --help, -V: as reaper's (scan() raises them).
REQUESTS = {k: v for k, v in options.REQUESTS.items() if k not in ("--license", "-l")}


class WatchScope:
    """What the metrics and the budget enforcer are told about reaper watch's scope
    (a reaper/scope.py Scope; the Supervisor plays this part in reaper): the whole PID
    namespace, with no main child and no services, running until it stops."""

    __slots__ = ("pid", "is_pid1", "main_pid", "supervised", "watch", "phase")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.is_pid1 = False
        self.main_pid = None
        self.supervised: set = set()
        self.watch = True
        self.phase = "running"


def config(argv: list, environ=None) -> options.Config:
    """A Config from the REAPER_* variables, then watch's flags (a flag wins over its
    variable, as in reaper). Raises options.UsageError, or options.HelpRequested."""
    found, rest = options.scan(argv, FLAGS, REQUESTS)
    if rest:
        raise options.UsageError(f"unexpected argument {options.quoted(rest[0])}")
    cfg = options.configure(found, VARIABLES, os.environ if environ is None else environ)
    if cfg.metrics_port is None and not cfg.metrics_file:
        cfg.metrics_port = options.DEFAULT_METRICS_PORT
    return cfg


def help_text() -> str:
    from reaper import usage

    head = ["usage: reaper watch [OPTIONS]",
            "",
            "Metrics sidecar for a shared PID namespace: observe every process, serve the",
            "metrics, enforce budgets (CPU, memory, age) on strays. Reaps nothing. Every",
            "option also reads the REAPER_* environment variable shown beside it; a flag",
            "wins over it."]
    rows = usage.option_rows(FLAGS, options.Config, HELP) + [("", ""), usage.HELP_ROW, usage.VERSION_ROW]
    environment = (("REAPER_QUIET", "errors only (as REAPER_VERBOSITY=0)"),)
    return usage.render(head, rows + usage.tail(environment, "docs/reaper-watch.md"))


def main(argv: list, sfd: int) -> int:
    from reaper.commands.args import answered

    cfg = answered(lambda: config(argv), help_text, PROG)
    if isinstance(cfg, int):
        return cfg
    if os.getpid() == 1:
        raise options.UsageError("is a sidecar and must not be PID 1 (run 'reaper -- COMMAND' as the init instead)")
    return _watch(cfg, sfd)


def _watch(cfg: options.Config, sfd: int) -> int:
    from reaper import metrics
    from reaper._native import EV_SIGNAL, Waiter, ms_until
    from reaper.policy import BUDGETS, METRICS, STATISTICS, Policy
    from reaper.log import Log
    from reaper.stats import Stats

    log = Log(cfg.verbosity, cfg.log_format)
    idle = cfg.idle_budget_options()
    if idle:
        log.warn(f"{', '.join(idle)}: {options.IDLE_BUDGET_HINT}")
    stats = Stats()
    stats.main_state = "none"
    try:
        exporter = metrics.prepare(cfg, stats, log, mode="watch")
    except metrics.SetupError as e:
        raise options.UsageError(str(e)) from None
    # From here on, the same boundary as reaper's loop: a failing piece is switched
    # off with one line; only a stop signal ends reaper watch.
    scope = WatchScope(os.getpid())
    policy = Policy(log, stats)
    policy.start(METRICS, lambda: exporter.start(scope), getattr(exporter, "abort", None))
    if cfg.budgets_enabled:
        policy.start(BUDGETS, lambda: _enforcer(cfg, log, stats, scope))
    log.info(f"watching PID namespace (pid {os.getpid()})"
             + (f", metrics on {cfg.metrics_address}:{cfg.metrics_port}" if cfg.metrics_port else ""))

    waiter = Waiter(sfd)          # children of its own (none is started) are counted in C
    stats.native = waiter.totals
    stopping = False
    while not stopping:
        try:
            events, _, _ = waiter.wait(ms_until(policy.next_deadline()))
        except OSError as e:      # poll() without kernel memory: retry soon
            log.event("wait", 0, f"wait failed: {e.strerror}; retrying")
            time.sleep(0.01)
            continue
        for ev in events:             # signals only: no pid is watched
            if ev.kind == EV_SIGNAL:
                policy.call(STATISTICS, _count_signal, stats, ev.signo)
                if ev.signo in STOP_SIGNALS:
                    log.info(f"{_signame(ev.signo)} received: stopping")
                    stopping = True
        policy.tick(time.monotonic())
    stats.phase = "done"
    policy.close()
    log.close()
    return 0


def _enforcer(cfg, log, stats, scope):
    from reaper.budgets.enforcer import Enforcer

    return Enforcer(cfg, log, stats.budget, scope)


def _count_signal(stats, signo: int) -> None:
    stats.signals_received[_signame(signo)] += 1


def _signame(signo: int) -> str:
    from reaper import signals

    return signals.name(signo)

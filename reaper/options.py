"""Command-line options and REAPER_* environment variables, from one table.

Parsing stops at the first non-option (POSIX, like dumb-init), so
``reaper sh -c 'x'`` works. The scanner is a few lines of our own rather than
getopt or argparse: both import gettext and re, milliseconds on the path from
start to the child's exec, which nothing may slow.
"""
import os

# The text helpers, for the parsers and messages here (options.digits and the others
# still work). reaper/text.py imports nothing: one small file more on the way to the
# child's exec (tests/test_import_graph.py pins what is loaded there).
from reaper.text import digits, display, quoted  # noqa: F401

DEFAULT_METRICS_PORT = 9259
BUDGET_ACTIONS = ("observe", "nice", "throttle", "terminate")
# The upper bound of every time value (--grace, the budget and metrics intervals,
# `reaper stats --timeout`): one week. Anything longer is a typo, and would
# overflow the millisecond timeouts it ends up in.
MAX_SECONDS = 7 * 86400
# The lower bound of every interval something is repeated at (--budget-interval,
# --metrics-interval, --restart-delay and --restart-max-delay, their variables and a
# service's setting files): shorter, a sample, a file write or a crashing service's
# restart would keep a core busy. A once-off time (--grace, --wait-ready, the budget
# windows and ages) has none: 0 or a tiny value means "at once" and costs nothing.
MIN_INTERVAL = 0.1
# The highest level each verbosity variable takes (tini's scale goes to 4; 4 is debug here too).
_MAX_VERBOSITY = {"REAPER_VERBOSITY": 3, "TINI_VERBOSITY": 4}


# The settings that turn budgets on; every other option of the budget section tunes them.
# The budget kinds' dests (reaper/budgets/kinds/__init__.py: DESTS, which
# tests/test_budget_kinds.py holds this equal to), spelt out here: Config.budgets_enabled
# runs before every child's exec, where nothing of reaper.budgets may be imported.
BUDGETS = ("cpu_budget", "cpu_budget_total", "memory_budget", "memory_budget_total", "stray_max_age")
IDLE_BUDGET_HINT = ("set (as a flag or its variable) but without effect: no budget is given (--cpu-budget, "
                    "--cpu-budget-total, --memory-budget, --memory-budget-total or --stray-max-age)")


class UsageError(Exception):
    """Bad input: one line on stderr and exit status 2, before the child starts."""

    def __init__(self, msg: str = "") -> None:
        super().__init__(display(msg))   # never a second line, never a surrogate


class Config:
    """Everything reaper was asked to do. A plain class, not a dataclass: importing
    dataclasses costs milliseconds on the path to the child's exec."""

    # core
    subreaper = False
    process_group = False
    single_child = False
    remap_exit = frozenset()
    pdeath_signal = 0
    warn_on_reap = False
    verbosity = 1                 # 0 errors, 1 warnings and news (default), 2 events, 3 debug
    log_format = "text"           # text | json: one JSON object a line (reaper/log.py)
    grace = 5.0
    no_drain = False
    pause = False
    exit_zero_on_stop = False
    # supervised services (reaper/services/)
    services_dir = None
    restart = "always"
    restart_delay = 1.0
    restart_max_delay = 30.0
    restart_limit = (5, 120.0)    # (starts, seconds)
    on_service_failure = "ignore"
    wait_ready = None
    service_specs: list = []      # [services.spec.ServiceSpec], resolved by parse()
    # CPU budgets for strays
    cpu_budget = None
    cpu_budget_total = None
    budget_window = 10.0
    budget_grace = 30.0
    budget_action = "nice"
    budget_kill_after = 60.0
    budget_interval = 1.0
    memory_budget = None          # bytes, per stray (resident memory)
    memory_budget_total = None    # bytes, all strays together
    stray_max_age = None          # seconds from a stray's first sighting to its SIGTERM
    ray_aware = True
    stray_cpus = None
    # leftovers of Ray workers and services (reaper/leftovers/)
    leftovers = None              # keep | report | end | stop; None: report with services, else keep
    leftover_grace = 5.0
    devices = None                # device globs; None: reaper/leftovers/devices.py's defaults
    gpu_memory = False            # read leftovers' GPU memory through NVML (reaper/leftovers/gpumem.py)
    # statistics
    metrics_port = None
    metrics_address = "0.0.0.0"
    metrics_file = None
    metrics_interval = 10.0
    node_metrics = "summary"      # summary | per-core | off: what of /proc/stat is exported
    summary_file = None

    def __init__(self) -> None:
        self.command: list = []
        self.rewrite: dict = {}
        self.stray_match: list = []
        self.protect: list = []
        self.services: list = []          # [(name, argv)] from --service / REAPER_SERVICES
        self.service_ready: list = []

    def __repr__(self) -> str:
        fields = {k: getattr(self, k) for k in dir(self) if not k.startswith("_") and
                  not callable(getattr(self, k)) and k not in ("budgets_enabled", "metrics_enabled",
                                                               "services_enabled")}
        return f"Config({fields})"

    @property
    def budgets_enabled(self) -> bool:
        return any(getattr(self, dest) is not None for dest in BUDGETS)

    def idle_budget_options(self) -> list:
        """The budget settings given (as a flag or a variable) that do nothing because no
        budget is: their flags, for one warning at start."""
        if self.budgets_enabled:
            return []
        return ["--" + o.long for o in OPTIONS if o.section == "budget" and o.dest not in BUDGETS and
                getattr(self, o.dest) != ([] if o.kind == "list" else getattr(Config, o.dest))]

    @property
    def services_enabled(self) -> bool:
        return bool(self.service_specs)

    @property
    def metrics_enabled(self) -> bool:
        return self.metrics_port is not None or self.metrics_file is not None


# --- value parsers: each raises ValueError with a message naming the problem ---

def _number(text: str, unit: str) -> float:
    """A decimal number in ASCII ('2', '0.5', '1e3'); not inf, nan, '1_000' or '٣'."""
    t = text.strip()
    if t and t.isascii() and any(c in "0123456789" for c in t) and \
            not t.strip("0123456789.eE+-"):
        try:
            v = float(t) + 0.0                # + 0.0: -0 is 0
        except ValueError:
            v = None
        if v is not None and abs(v) != float("inf"):      # 400 digits are a float, but infinite
            return v
    raise ValueError(f"expected a number of {unit}, not {quoted(text)}")


def seconds(text: str, allow_zero: bool = False, minimum: float = 0.0) -> float:
    """A time value: > 0 (>= 0 with allow_zero; >= minimum if given), at most MAX_SECONDS."""
    v = _number(text, "seconds")
    if not (v >= 0 if allow_zero else v > 0):
        raise ValueError(f"must be a number {'>=' if allow_zero else '>'} 0, not {quoted(text)}")
    if v < minimum:
        raise ValueError(f"must be at least {minimum:g} seconds (an interval: shorter keeps reaper busy), "
                         f"not {quoted(text)}")
    if v > MAX_SECONDS:
        raise ValueError(f"must be at most {MAX_SECONDS} seconds (one week), not {quoted(text)}")
    return v


def _seconds_positive(text: str) -> float:
    return seconds(text)


def _seconds_non_negative(text: str) -> float:
    return seconds(text, allow_zero=True)


def _interval(text: str) -> float:
    return seconds(text, minimum=MIN_INTERVAL)


MAX_CORES = 65536          # more cores than any machine has: a budget that large is a typo


def _cores(text: str) -> float:
    v = _number(text, "cores")
    if not v > 0:
        raise ValueError(f"must be a number > 0, not {quoted(text)}")
    if v > MAX_CORES:
        raise ValueError(f"must be at most {MAX_CORES} cores, not {quoted(text)}")
    return v


# Sizes: K, M, G, T are powers of 1024, as are Kubernetes' Ki, Mi, Gi, Ti.
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
               "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def size(text: str) -> int:
    """A size in bytes: '67108864', '64M', '1.5G', '512Mi'; > 0 and below 2**62."""
    t = text.strip()
    num = t.rstrip("KMGTi")
    unit = t[len(num):]
    if unit not in _SIZE_UNITS or not num or not num.isascii() or num.strip("0123456789.") or \
            num.count(".") > 1 or num == ".":
        raise ValueError(f"expected a size in bytes such as 512M, 2G or 1Gi, not {quoted(text)}")
    f = float(num) * _SIZE_UNITS[unit]
    if f >= 1 << 62:                  # 400 digits: infinite as a float, never an int
        raise ValueError(f"must be below 4 EiB, not {quoted(text)}")
    v = int(f)
    if v <= 0:
        raise ValueError(f"must be a size > 0, not {quoted(text)}")
    if v >= 1 << 62:
        raise ValueError(f"must be below 4 EiB, not {quoted(text)}")
    return v


def _exit_code(text: str) -> int:
    if not digits(text.strip()) or not 0 <= int(text) <= 255:
        raise ValueError(f"exit status must be 0-255, not {quoted(text)}")
    return int(text)


def _pdeath_signal(text: str) -> int:
    from reaper import signals     # imports the signal module (and enum): only when asked

    signo = signals.parse(text)
    why = signals.not_for_pdeath(signo)
    if why:
        raise ValueError(why)
    return signo


def _rewrite(text: str) -> tuple:
    from reaper import signals

    src, sep, dst = text.partition(":")
    if not sep:
        raise ValueError(f"rewrite must be FROM:TO, not {quoted(text)}")
    signo = signals.parse(src)
    why = signals.not_forwarded(signo)
    if why:
        raise ValueError(f"cannot rewrite {signals.name(signo)}: {why}")
    return signo, signals.parse(dst, allow_zero=True)


def _port(text: str) -> int:
    if not digits(text.strip()) or not 0 < int(text) < 65536:
        raise ValueError(f"port must be 1-65535, not {quoted(text)}")
    return int(text)


def _later(name: str):
    """A parser of reaper/values.py, imported when an option that needs it is given."""
    def parse(text: str):
        from reaper import values

        return getattr(values, name)(text)
    return parse


def _action(text: str) -> str:
    if text not in BUDGET_ACTIONS:
        raise ValueError(f"unknown action {quoted(text)} (choose from {', '.join(BUDGET_ACTIONS)})")
    return text


RESTART_POLICIES = ("always", "on-failure", "never")
NODE_METRICS_MODES = ("summary", "per-core", "off")
LOG_FORMATS = ("text", "json")
SERVICE_FAILURE_ACTIONS = ("ignore", "stop")
LEFTOVER_MODES = ("keep", "report", "end", "stop")
MAX_LEFTOVER_GRACE = 3600.0     # seconds: a leftover holding a GPU longer than an hour is no grace


def _leftover_grace(text: str) -> float:
    v = seconds(text, allow_zero=True)
    if v > MAX_LEFTOVER_GRACE:
        raise ValueError(f"must be at most {MAX_LEFTOVER_GRACE:g} seconds, not {quoted(text)}")
    return v


def _devices(text: str) -> tuple:
    from reaper.leftovers.devices import parse_globs      # only when devices are given

    return parse_globs(text)


def _choice(choices: tuple, what: str):
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"unknown {what} {quoted(text)} (choose from {', '.join(choices)})")
        return text
    return parse


def _restart_limit(text: str) -> tuple:
    """N/SECONDS: N starts within SECONDS give a service up (N >= 1)."""
    n, sep, secs = text.strip().partition("/")
    if not sep or not digits(n.strip()) or int(n) < 1:
        raise ValueError(f"expected N/SECONDS with N >= 1 (e.g. 5/120), not {quoted(text)}")
    return int(n), seconds(secs)


def _service(text: str) -> tuple:
    from reaper.services.spec import parse_service    # only when a service is given

    return parse_service(text)


def _service_name(text: str) -> str:
    from reaper.services.spec import check_name

    return check_name(text.strip())


def _cpus(text: str) -> str:
    if text != "auto":
        from reaper.values import parse_cpu_list

        parse_cpu_list(text)
    return text


class Option:
    """One option: its flags, the Config field it sets, how, and its variables."""

    __slots__ = ("long", "short", "dest", "kind", "help", "metavar", "parse", "env", "section")

    def __init__(self, long, short, dest, kind, help, metavar="", parse=str, env=(), section="core"):
        self.long = long          # --long
        self.short = short        # -s, or "" when there is none
        self.dest = dest          # Config attribute
        self.kind = kind          # flag | count | value | list | lines | off
        self.help = help          # for --help; "{default}" there shows the Config default
        self.metavar = metavar    # "" for options that take no value
        self.parse = parse        # str -> value; raises ValueError
        self.env = env            # environment variables, first match wins
        self.section = section


OPTIONS = (
    Option("subreaper", "s", "subreaper", "flag", "register as child subreaper (automatic when not PID 1)",
           env=("REAPER_SUBREAPER", "TINI_SUBREAPER")),
    Option("process-group", "g", "process_group", "flag",
           "forward signals to the child's process group, not only the child",
           env=("REAPER_PROCESS_GROUP", "TINI_KILL_PROCESS_GROUP")),
    Option("single-child", "c", "single_child", "flag",
           "forward signals to the child only (dumb-init's -c; overrides -g)", env=("REAPER_SINGLE_CHILD",)),
    Option("remap-exit", "e", "remap_exit", "list", "child exit status N becomes 0 (repeatable, e.g. 143)",
           "N", _exit_code, env=("REAPER_REMAP_EXIT",)),
    Option("pdeath-signal", "p", "pdeath_signal", "value", "signal reaper gets when its parent dies",
           "SIG", _pdeath_signal, env=("REAPER_PDEATH_SIGNAL",)),
    Option("warn-on-reap", "w", "warn_on_reap", "flag", "log a warning for every orphan reaped",
           env=("REAPER_WARN_ON_REAP",)),
    Option("verbose", "v", "verbosity", "count",
           "log more: -v adds a line per event (child exit, drain), -vv debug",
           env=("REAPER_VERBOSITY", "TINI_VERBOSITY")),
    Option("quiet", "q", "verbosity", "quiet",
           "log errors only: no warnings, no summary (as REAPER_VERBOSITY=0)", env=("REAPER_QUIET",)),
    Option("log-format", "", "log_format", "value",
           "text | json: each log line as text or as one JSON object (time, level, event, fields) ({default})",
           "FORMAT", _choice(LOG_FORMATS, "log format"), env=("REAPER_LOG_FORMAT",)),
    Option("rewrite", "r", "rewrite", "list", "forward signal S as R; R=0 drops it (repeatable)",
           "S:R", _rewrite, env=("REAPER_REWRITE",)),
    Option("grace", "", "grace", "value",
           "seconds remaining processes get between SIGTERM and SIGKILL after the child exits (0: none)",
           "SECONDS", _seconds_non_negative, env=("REAPER_GRACE",)),
    Option("no-drain", "", "no_drain", "flag",
           "when the child exits, leave the other processes alone (as PID 1 the kernel "
           "then kills them all)", env=("REAPER_NO_DRAIN",)),
    Option("pause", "P", "pause", "flag",
           "no COMMAND: reap (and serve metrics, budgets) until SIGTERM or SIGINT, then "
           "drain and exit 0", env=("REAPER_PAUSE",)),
    Option("exit-zero-on-stop", "", "exit_zero_on_stop", "flag",
           "exit 0 when the child ends after reaper forwarded it SIGTERM (a requested stop)",
           env=("REAPER_EXIT_ZERO_ON_STOP",)),
    Option("service", "", "services", "lines",
           "run COMMAND beside the main child as service NAME, restarted when it ends (repeatable; "
           "the variable takes one per line)", "NAME=COMMAND", _service, env=("REAPER_SERVICES",),
           section="services"),
    Option("services-dir", "", "services_dir", "value", "every executable file in DIR is a service",
           "DIR", str, env=("REAPER_SERVICES_DIR",), section="services"),
    Option("restart", "", "restart", "value", "always | on-failure | never: when a service is restarted ({default})",
           "POLICY", _choice(RESTART_POLICIES, "restart policy"), env=("REAPER_RESTART",), section="services"),
    Option("restart-delay", "", "restart_delay", "value",
           f"seconds before the first restart ({{default}}; at least {MIN_INTERVAL:g}), doubled each time",
           "SECONDS", _interval, env=("REAPER_RESTART_DELAY",), section="services"),
    Option("restart-max-delay", "", "restart_max_delay", "value",
           f"the longest delay between restarts ({{default}}; at least {MIN_INTERVAL:g})",
           "SECONDS", _interval, env=("REAPER_RESTART_MAX_DELAY",), section="services"),
    Option("restart-limit", "", "restart_limit", "value",
           "a service started N times within SECONDS is given up ({default})", "N/SECONDS", _restart_limit,
           env=("REAPER_RESTART_LIMIT",), section="services"),
    Option("on-service-failure", "", "on_service_failure", "value",
           "ignore | stop: stop the main child and exit non-zero when a service is given up ({default})",
           "ACTION", _choice(SERVICE_FAILURE_ACTIONS, "action"), env=("REAPER_ON_SERVICE_FAILURE",),
           section="services"),
    Option("service-ready", "", "service_ready", "list",
           "service NAME says when it is ready, on the fd in $REAPER_READY_FD (repeatable)", "NAME",
           _service_name, env=("REAPER_SERVICE_READY",), section="services"),
    Option("wait-ready", "", "wait_ready", "value",
           "start the main child once the --service-ready services are ready, or after SECONDS",
           "SECONDS", _seconds_positive, env=("REAPER_WAIT_READY",), section="services"),
    Option("cpu-budget", "", "cpu_budget", "value", "CPU budget of each stray process, in cores",
           "CORES", _cores, env=("REAPER_CPU_BUDGET",), section="budget"),
    Option("cpu-budget-total", "", "cpu_budget_total", "value", "CPU budget of all strays together, in cores",
           "CORES", _cores, env=("REAPER_CPU_BUDGET_TOTAL",), section="budget"),
    Option("memory-budget", "", "memory_budget", "value",
           "resident memory each stray process may hold (e.g. 512M, 2G, 1Gi)",
           "BYTES", size, env=("REAPER_MEMORY_BUDGET",), section="budget"),
    Option("memory-budget-total", "", "memory_budget_total", "value",
           "resident memory all strays together may hold", "BYTES", size,
           env=("REAPER_MEMORY_BUDGET_TOTAL",), section="budget"),
    Option("stray-max-age", "", "stray_max_age", "value",
           "SIGTERM a stray this many seconds after it was first seen, SIGKILL after --grace "
           "(observe only reports it)", "SECONDS", _seconds_positive,
           env=("REAPER_STRAY_MAX_AGE",), section="budget"),
    Option("budget-window", "", "budget_window", "value", "seconds CPU use is averaged over ({default})",
           "SECONDS", _seconds_positive, env=("REAPER_BUDGET_WINDOW",), section="budget"),
    Option("budget-grace", "", "budget_grace", "value", "seconds a new stray may use CPU freely ({default})",
           "SECONDS", _seconds_non_negative, env=("REAPER_BUDGET_GRACE",), section="budget"),
    Option("budget-action", "", "budget_action", "value", "observe | nice | throttle | terminate ({default})",
           "ACTION", _action, env=("REAPER_BUDGET_ACTION",), section="budget"),
    Option("budget-kill-after", "", "budget_kill_after", "value",
           "seconds over budget before terminate acts ({default})", "SECONDS", _seconds_non_negative,
           env=("REAPER_BUDGET_KILL_AFTER",), section="budget"),
    Option("budget-interval", "", "budget_interval", "value",
           f"seconds between CPU samples ({{default}}; at least {MIN_INTERVAL:g})",
           "SECONDS", _interval, env=("REAPER_BUDGET_INTERVAL",), section="budget"),
    Option("stray-match", "", "stray_match", "list", "a process whose command line matches is a stray (repeatable)",
           "REGEX", _later("regex"), env=("REAPER_STRAY_MATCH",), section="budget"),
    Option("protect", "", "protect", "list", "a process whose command line matches is never a stray (repeatable)",
           "REGEX", _later("regex"), env=("REAPER_PROTECT",), section="budget"),
    Option("no-ray-aware", "", "ray_aware", "off", "do not treat children of idle Ray workers as strays",
           env=("REAPER_NO_RAY_AWARE",), section="budget"),
    Option("stray-cpus", "", "stray_cpus", "value", "keep strays on these CPUs (e.g. 2-7), or auto",
           "LIST", _cpus, env=("REAPER_STRAY_CPUS",), section="budget"),
    Option("leftovers", "", "leftovers", "value",
           "keep | report | end | stop: what happens to what a Ray worker or a service leaves running "
           "when it ends (report with services, else keep)", "MODE", _choice(LEFTOVER_MODES, "leftovers mode"),
           env=("REAPER_LEFTOVERS",), section="leftovers"),
    Option("leftover-grace", "", "leftover_grace", "value",
           "seconds between a leftover's SIGTERM and its SIGKILL under --leftovers end ({default})",
           "SECONDS", _leftover_grace, env=("REAPER_LEFTOVER_GRACE",), section="leftovers"),
    Option("devices", "", "devices", "value",
           "device files that count as accelerators, comma-separated globs (default: NVIDIA, AMD, "
           "Neuron, accel)", "GLOB[,GLOB...]", _devices, env=("REAPER_DEVICES",), section="leftovers"),
    Option("gpu-memory", "", "gpu_memory", "flag",
           "tell the GPU memory leftovers held and freed, through NVML (pip install 'reaper-init[nvml]')",
           env=("REAPER_GPU_MEMORY",), section="leftovers"),
    Option("metrics", "", "metrics_port", "value",
           f"serve Prometheus metrics on the default port {DEFAULT_METRICS_PORT}",
           "", lambda _: DEFAULT_METRICS_PORT, env=("REAPER_METRICS",), section="metrics"),
    Option("metrics-port", "", "metrics_port", "value", "serve Prometheus metrics on PORT",
           "PORT", _port, env=("REAPER_METRICS_PORT",), section="metrics"),
    Option("metrics-address", "", "metrics_address", "value", "address the metrics endpoint binds ({default})",
           "ADDR", _later("address"), env=("REAPER_METRICS_ADDRESS",), section="metrics"),
    Option("metrics-file", "", "metrics_file", "value", "also write the metrics to PATH at an interval",
           "PATH", _later("writable_file"), env=("REAPER_METRICS_FILE",), section="metrics"),
    Option("metrics-interval", "", "metrics_interval", "value",
           f"seconds between metrics-file writes ({{default}}; at least {MIN_INTERVAL:g})",
           "SECONDS", _interval, env=("REAPER_METRICS_INTERVAL",), section="metrics"),
    Option("node-metrics", "", "node_metrics", "value",
           "summary | per-core | off: node CPU from /proc/stat as 10 series whatever the cores; per-core "
           "adds 7 a core; off reads nothing ({default})",
           "MODE", _choice(NODE_METRICS_MODES, "node metrics mode"), env=("REAPER_NODE_METRICS",),
           section="metrics"),
    Option("summary-file", "", "summary_file", "value", "write the exit summary (JSON) to PATH",
           "PATH", _later("writable_file"), env=("REAPER_SUMMARY_FILE",), section="metrics"),
)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def _env_flag(var: str, value: str) -> bool:
    # tini's variables are set-means-on, whatever the value (even empty).
    if var.startswith("TINI_"):
        return True
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise UsageError(f"{var}={quoted(value)}: expected 1/0, true/false, yes/no or on/off")


def split_list(text: str) -> list:
    """A variable's comma-separated list. A comma inside brackets, braces or
    parentheses, or after a backslash, belongs to the item (a regex such as
    `a{1,3}` or `[,;]`), and a backslash before a comma is dropped (`a\\,b` is 'a,b')."""
    items, cur, depth, i = [], [], 0, 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            if text[i + 1] == ",":
                cur.append(",")
            else:
                cur.append(text[i:i + 2])
            i += 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}" and depth:
            depth -= 1
        if c == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    items.append("".join(cur))
    return items


def _apply(cfg: Config, opt: Option, raw: "str | None", origin: str) -> None:
    if opt.kind in ("flag", "off"):
        on = True if raw is None else _env_flag(origin, raw)
        setattr(cfg, opt.dest, on if opt.kind == "flag" else not on)
        return
    if opt.kind == "quiet":
        if raw is None or _env_flag(origin, raw):
            setattr(cfg, opt.dest, 0)
        return
    if opt.kind == "count":
        if raw is None:
            setattr(cfg, opt.dest, getattr(cfg, opt.dest) + 1)
            return
        top = _MAX_VERBOSITY.get(origin, 3)
        if not digits(raw.strip()) or len(raw.strip()) > 2 or int(raw) > top:    # len: no 4,300-digit int()
            raise UsageError(f"{origin}={quoted(raw)}: expected a level from 0 (errors only) to {top} (debug)")
        # Both scales: 0 errors, 1 warnings (the default), 2 info, 3 debug; tini's 4 (trace) is debug.
        setattr(cfg, opt.dest, min(int(raw), 3))
        return
    if opt.metavar == "":     # --metrics: a flag that sets a value
        if raw is not None and origin.startswith("REAPER_") and not _env_flag(origin, raw):
            return
        raw = ""
    try:
        if opt.kind in ("list", "lines"):
            # A variable holds a comma-separated list, or ("lines") one item per line.
            items = [raw] if origin.startswith("-") else \
                [p for p in (raw.splitlines() if opt.kind == "lines" else split_list(raw)) if p.strip()]
            values = [opt.parse(p) for p in items]
            setattr(cfg, opt.dest, list(getattr(cfg, opt.dest)) + values)
        else:
            setattr(cfg, opt.dest, opt.parse(raw))
    except ValueError as e:
        raise UsageError(f"{origin}: {e}") from None


def _finish(cfg: Config) -> Config:
    cfg.remap_exit = frozenset(cfg.remap_exit)
    cfg.rewrite = dict(cfg.rewrite)
    if cfg.restart_max_delay < cfg.restart_delay:
        raise UsageError(f"--restart-max-delay ({cfg.restart_max_delay:g}) is shorter than --restart-delay "
                         f"({cfg.restart_delay:g})")
    if cfg.services or cfg.services_dir is not None or cfg.service_ready:
        from reaper.services import spec      # only when services are asked for

        try:
            cfg.service_specs = spec.resolve(cfg, {o.dest: o.parse for o in OPTIONS})
        except ValueError as e:
            raise UsageError(str(e)) from None
    if cfg.single_child:
        cfg.process_group = False
    return cfg


def parse(argv: list, environ: "dict | None" = None) -> Config:
    """Parse reaper's own arguments. Raises UsageError; returns a Config whose
    .command is empty only for --help/--version (handled by the caller)."""
    found, rest = scan(argv)
    cfg = configure(found, OPTIONS, os.environ if environ is None else environ)
    if cfg.pause:
        if rest:
            raise UsageError(f"--pause takes no command (got {quoted(rest[0])})")
        return _finish(cfg)
    if not rest:
        raise UsageError("no command given")
    cfg.command = rest
    return _finish(cfg)


def configure(found: list, table: tuple, environ) -> Config:
    """A Config from the variables of table's options in environ, then the flags
    found by scan(), which win: an option given as a flag has its variables not read
    (-q/-v given: neither; each -v adds one to the default). Raises UsageError."""
    cfg = Config()
    given: dict = {}
    for opt, flag, value in found:
        given.setdefault(opt.dest, []).append((opt, value, flag))
    for opt in table:
        if opt.dest in given:
            continue
        for var in opt.env:
            if var in environ:
                _apply(cfg, opt, environ[var], var)
                break
    for dest, uses in given.items():
        if uses[0][0].kind in ("list", "lines"):
            setattr(cfg, dest, [])
        for opt, value, flag in uses:
            _apply(cfg, opt, None if opt.kind in ("flag", "count", "off", "quiet") else value, flag)
    return cfg


def _takes_value(opt: Option) -> bool:
    return opt.kind in ("value", "list", "lines") and opt.metavar != ""


def _next_value(argv: list, i: int, flag: str) -> str:
    if i == len(argv):
        raise UsageError(f"option {flag} requires an argument")
    return argv[i]


class HelpRequested(Exception):
    pass


class VersionRequested(Exception):
    pass


class LicenseRequested(Exception):
    """tini's -l: print the license and exit."""


# The flags that ask for something else than a run, and what scan() raises for each.
REQUESTS = {"--help": HelpRequested, "-h": HelpRequested, "--version": VersionRequested,
            "-V": VersionRequested, "--license": LicenseRequested, "-l": LicenseRequested}


def scan(argv: list, table: tuple = OPTIONS, requests: "dict | None" = None) -> tuple:
    """Splits argv into [(Option, flag, value)] and the operands (the command), POSIX
    style: the first non-option, or --, ends the options. table: the options taken
    (reaper's, or a subcommand's rows of it); requests: the flags that raise their
    exception (REQUESTS by default). Raises UsageError."""
    requests = REQUESTS if requests is None else requests
    long = {"--" + o.long: o for o in table}
    short = {"-" + o.short: o for o in table if o.short}
    found, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return found, argv[i + 1:]
        if not arg.startswith("-") or arg == "-":
            break
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name in requests:
                raise requests[name]()
            opt = long.get(name)
            if opt is None:
                raise UsageError(f"unknown option {display(name)}")
            if not _takes_value(opt):
                if eq:
                    raise UsageError(f"option {name} takes no value")
                found.append((opt, name, None))
            else:
                if not eq:
                    i += 1
                    value = _next_value(argv, i, name)
                found.append((opt, name, value))
            i += 1
            continue
        j = 1                              # a cluster of short flags: -gw, -e143, -e 143
        while j < len(arg):
            flag = "-" + arg[j]
            if flag in requests:
                raise requests[flag]()
            opt = short.get(flag)
            if opt is None:
                raise UsageError(f"unknown option {display(flag)}")
            if not _takes_value(opt):
                found.append((opt, flag, None))
                j += 1
                continue
            value = arg[j + 1:]
            if not value:
                i += 1
                value = _next_value(argv, i, flag)
            found.append((opt, flag, value))
            break
        i += 1
    return found, argv[i:]


def write_stdout(text: str, prog: str = "reaper", closed: bool = False) -> int:
    from reaper import usage    # with --help and the clients only: not on the way to the exec

    return usage.write_stdout(text, prog, closed)


def help_text() -> str:
    from reaper import usage

    return usage.help_text(OPTIONS, Config, MAX_SECONDS)

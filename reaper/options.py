"""Command-line options and REAPER_* environment variables, from one table.

Parsing stops at the first non-option (POSIX, like dumb-init), so
``reaper sh -c 'x'`` works. The scanner is a few lines of our own rather than
getopt or argparse: both import gettext and re, milliseconds on the path from
start to the child's exec, which nothing may slow.
"""
from __future__ import annotations

import os

from reaper.log import display, quoted  # noqa: F401  (re-exported: signals, commands)

DEFAULT_METRICS_PORT = 9259
BUDGET_ACTIONS = ("observe", "nice", "throttle", "terminate")
# The upper bound of every time value (--grace, the budget and metrics intervals,
# `reaper stats --timeout`): one week. Anything longer is a typo, and would
# overflow the millisecond timeouts it ends up in.
MAX_SECONDS = 7 * 86400
# The highest level each verbosity variable takes (tini's scale goes to 4; 4 is debug here too).
_MAX_VERBOSITY = {"REAPER_VERBOSITY": 3, "TINI_VERBOSITY": 4}


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
    grace = 5.0
    no_drain = False
    pause = False
    exit_zero_on_stop = False
    # CPU budgets for strays
    cpu_budget = None
    cpu_budget_total = None
    budget_window = 10.0
    budget_grace = 30.0
    budget_action = "nice"
    budget_kill_after = 60.0
    budget_interval = 1.0
    ray_aware = True
    stray_cpus = None
    # statistics
    metrics_port = None
    metrics_address = "0.0.0.0"
    metrics_file = None
    metrics_interval = 10.0
    summary_file = None

    def __init__(self) -> None:
        self.command: list = []
        self.rewrite: dict = {}
        self.stray_match: list = []
        self.protect: list = []

    def __repr__(self) -> str:
        fields = {k: getattr(self, k) for k in dir(self) if not k.startswith("_") and
                  not callable(getattr(self, k)) and k not in ("budgets_enabled", "metrics_enabled")}
        return f"Config({fields})"

    @property
    def budgets_enabled(self) -> bool:
        return self.cpu_budget is not None or self.cpu_budget_total is not None

    @property
    def metrics_enabled(self) -> bool:
        return self.metrics_port is not None or self.metrics_file is not None


# --- value parsers: each raises ValueError with a message naming the problem ---

def digits(text: str) -> bool:
    """True for ASCII digits only: str.isdigit() and int() also take '٣' or '³'."""
    return text.isascii() and text.isdigit()


def _number(text: str, unit: str) -> float:
    """A decimal number in ASCII ('2', '0.5', '1e3'); not inf, nan, '1_000' or '٣'."""
    t = text.strip()
    if t and t.isascii() and any(c in "0123456789" for c in t) and \
            not t.strip("0123456789.eE+-"):
        try:
            return float(t) + 0.0             # + 0.0: -0 is 0
        except ValueError:
            pass
    raise ValueError(f"expected a number of {unit}, not {quoted(text)}")


def seconds(text: str, allow_zero: bool = False) -> float:
    """A time value: > 0 (>= 0 with allow_zero), at most MAX_SECONDS."""
    v = _number(text, "seconds")
    if not (v >= 0 if allow_zero else v > 0):
        raise ValueError(f"must be a number {'>=' if allow_zero else '>'} 0, not {quoted(text)}")
    if v > MAX_SECONDS:
        raise ValueError(f"must be at most {MAX_SECONDS} seconds (one week), not {quoted(text)}")
    return v


def _seconds_positive(text: str) -> float:
    return seconds(text)


def _seconds_non_negative(text: str) -> float:
    return seconds(text, allow_zero=True)


def _cores(text: str) -> float:
    v = _number(text, "cores")
    if not v > 0:
        raise ValueError(f"must be a number > 0, not {quoted(text)}")
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


def _address(text: str) -> str:
    """An IPv4 or IPv6 literal ('[::1]' too) or a host name; no name lookup here."""
    host = text.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    bad = ValueError(f"bad address {quoted(text)} (expected an IPv4 or IPv6 address or a host name)")
    if not host or not host.isascii() or not host.isprintable():
        raise bad
    import socket

    if ":" in host:                                      # IPv6, perhaps with a zone: fe80::1%eth0
        addr, pct, zone = host.partition("%")
        if pct and (not zone or zone.strip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")):
            raise bad
        try:
            socket.inet_pton(socket.AF_INET6, addr)
        except (OSError, ValueError):
            raise bad from None
        return text.strip()
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if digits(labels[-1]):                               # numeric: an IPv4 address or nothing
        try:
            socket.inet_pton(socket.AF_INET, host)
        except (OSError, ValueError):
            raise bad from None
        return text.strip()
    for label in labels:
        if not 0 < len(label) <= 63 or label[0] == "-" or label[-1] == "-" or \
                label.strip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-"):
            raise bad
    if len(host) > 253:
        raise bad
    return text.strip()


def check_writable(path: str) -> None:
    """Raises ValueError unless a file can be written at path: a directory is an
    error; a temporary file is created beside it and removed (as metrics.py does)."""
    if os.path.isdir(path):
        raise ValueError(f"{display(path)} is a directory")
    d, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(d, f".{base}.tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as e:
        raise ValueError(f"cannot write in {display(d)}: {e.strerror}") from None
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:
        pass


def _writable_file(text: str) -> str:
    """A file reaper writes: checked now, and made absolute (reaper's working
    directory is / once the child runs)."""
    if not text.strip():
        raise ValueError("expected a path, not an empty string")
    check_writable(text)
    return os.path.abspath(text)


def _regex(text: str) -> str:
    import re

    try:
        re.compile(text)
    except re.error as e:
        raise ValueError(f"invalid regular expression {quoted(text)}: {e}") from None
    return text


def _action(text: str) -> str:
    if text not in BUDGET_ACTIONS:
        raise ValueError(f"unknown action {quoted(text)} (choose from {', '.join(BUDGET_ACTIONS)})")
    return text


def parse_cpu_list(text: str, present_only: bool = True) -> frozenset:
    """'0-3,7' -> {0,1,2,3,7}; every CPU must exist on this machine (present_only)."""
    cpus = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not digits(lo) or (sep and not digits(hi)):
            raise ValueError(f"bad CPU list {quoted(text)} (expected e.g. 0-3,7 or auto)")
        lo_i, hi_i = int(lo), int(hi) if sep else int(lo)
        if hi_i < lo_i:
            raise ValueError(f"bad CPU range {quoted(part)}")
        cpus.update(range(lo_i, hi_i + 1))
    if not present_only:
        return frozenset(cpus)
    present = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
    unknown = sorted(cpus - present)
    if unknown:
        raise ValueError(f"unknown CPU {unknown[0]} in {quoted(text)}")
    return frozenset(cpus)


def _cpus(text: str) -> str:
    if text != "auto":
        parse_cpu_list(text)
    return text


class Option:
    """One option: its flags, the Config field it sets, how, and its variables."""

    __slots__ = ("long", "short", "dest", "kind", "help", "metavar", "parse", "env", "section")

    def __init__(self, long, short, dest, kind, help, metavar="", parse=str, env=(), section="core"):
        self.long = long          # --long
        self.short = short        # -s, or "" when there is none
        self.dest = dest          # Config attribute
        self.kind = kind          # flag | count | value | list | off
        self.help = help
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
    Option("cpu-budget", "", "cpu_budget", "value", "CPU budget of each stray process, in cores",
           "CORES", _cores, env=("REAPER_CPU_BUDGET",), section="budget"),
    Option("cpu-budget-total", "", "cpu_budget_total", "value", "CPU budget of all strays together, in cores",
           "CORES", _cores, env=("REAPER_CPU_BUDGET_TOTAL",), section="budget"),
    Option("budget-window", "", "budget_window", "value", "seconds CPU use is averaged over (10)",
           "SECONDS", _seconds_positive, env=("REAPER_BUDGET_WINDOW",), section="budget"),
    Option("budget-grace", "", "budget_grace", "value", "seconds a new stray may use CPU freely (30)",
           "SECONDS", _seconds_non_negative, env=("REAPER_BUDGET_GRACE",), section="budget"),
    Option("budget-action", "", "budget_action", "value", "observe | nice | throttle | terminate (nice)",
           "ACTION", _action, env=("REAPER_BUDGET_ACTION",), section="budget"),
    Option("budget-kill-after", "", "budget_kill_after", "value",
           "seconds over budget before terminate acts (60)", "SECONDS", _seconds_non_negative,
           env=("REAPER_BUDGET_KILL_AFTER",), section="budget"),
    Option("budget-interval", "", "budget_interval", "value", "seconds between CPU samples (1)",
           "SECONDS", _seconds_positive, env=("REAPER_BUDGET_INTERVAL",), section="budget"),
    Option("stray-match", "", "stray_match", "list", "a process whose command line matches is a stray (repeatable)",
           "REGEX", _regex, env=("REAPER_STRAY_MATCH",), section="budget"),
    Option("protect", "", "protect", "list", "a process whose command line matches is never a stray (repeatable)",
           "REGEX", _regex, env=("REAPER_PROTECT",), section="budget"),
    Option("no-ray-aware", "", "ray_aware", "off", "do not treat children of idle Ray workers as strays",
           env=("REAPER_NO_RAY_AWARE",), section="budget"),
    Option("stray-cpus", "", "stray_cpus", "value", "keep strays on these CPUs (e.g. 2-7), or auto",
           "LIST", _cpus, env=("REAPER_STRAY_CPUS",), section="budget"),
    Option("metrics", "", "metrics_port", "value",
           f"serve Prometheus metrics on the default port {DEFAULT_METRICS_PORT}",
           "", lambda _: DEFAULT_METRICS_PORT, env=("REAPER_METRICS",), section="metrics"),
    Option("metrics-port", "", "metrics_port", "value", "serve Prometheus metrics on PORT",
           "PORT", _port, env=("REAPER_METRICS_PORT",), section="metrics"),
    Option("metrics-address", "", "metrics_address", "value", "address the metrics endpoint binds (0.0.0.0)",
           "ADDR", _address, env=("REAPER_METRICS_ADDRESS",), section="metrics"),
    Option("metrics-file", "", "metrics_file", "value", "also write the metrics to PATH at an interval",
           "PATH", _writable_file, env=("REAPER_METRICS_FILE",), section="metrics"),
    Option("metrics-interval", "", "metrics_interval", "value", "seconds between metrics-file writes (10)",
           "SECONDS", _seconds_positive, env=("REAPER_METRICS_INTERVAL",), section="metrics"),
    Option("summary-file", "", "summary_file", "value", "write the exit summary (JSON) to PATH",
           "PATH", _writable_file, env=("REAPER_SUMMARY_FILE",), section="metrics"),
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
        if not digits(raw.strip()) or int(raw) > top:
            raise UsageError(f"{origin}={quoted(raw)}: expected a level from 0 (errors only) to {top} (debug)")
        # Both scales: 0 errors, 1 warnings (the default), 2 info, 3 debug; tini's 4 (trace) is debug.
        setattr(cfg, opt.dest, min(int(raw), 3))
        return
    if opt.metavar == "":     # --metrics: a flag that sets a value
        if raw is not None and origin.startswith("REAPER_") and not _env_flag(origin, raw):
            return
        raw = ""
    try:
        if opt.kind == "list":
            items = [raw] if origin.startswith("-") else [p for p in split_list(raw) if p.strip()]
            values = [opt.parse(p) for p in items]
            setattr(cfg, opt.dest, list(getattr(cfg, opt.dest)) + values)
        else:
            setattr(cfg, opt.dest, opt.parse(raw))
    except ValueError as e:
        raise UsageError(f"{origin}: {e}") from None


def _finish(cfg: Config) -> Config:
    cfg.remap_exit = frozenset(cfg.remap_exit)
    cfg.rewrite = dict(cfg.rewrite)
    if cfg.single_child:
        cfg.process_group = False
    return cfg


def parse(argv: list, environ: "dict | None" = None) -> Config:
    """Parse reaper's own arguments. Raises UsageError; returns a Config whose
    .command is empty only for --help/--version (handled by the caller)."""
    environ = os.environ if environ is None else environ
    cfg = Config()
    opts, rest = _scan(argv)
    given = {}
    for opt, flag, value in opts:
        given.setdefault(opt.dest, []).append((opt, value, flag))
    if "verbosity" in given:                       # -q/-v given: the variables are not read,
        cfg.verbosity = Config.verbosity           # each -v adds one to the default

    # Environment first, then flags override it.
    for opt in OPTIONS:
        if opt.dest in given:
            continue
        for var in opt.env:
            if var in environ:
                _apply(cfg, opt, environ[var], var)
                break
    for dest, uses in given.items():
        if uses[0][0].kind == "list":
            setattr(cfg, dest, [])
        for opt, value, flag in uses:
            _apply(cfg, opt, None if opt.kind in ("flag", "count", "off", "quiet") else value, flag)

    if cfg.pause:
        if rest:
            raise UsageError(f"--pause takes no command (got {quoted(rest[0])})")
        return _finish(cfg)
    if not rest:
        raise UsageError("no command given")
    cfg.command = rest
    return _finish(cfg)


def _takes_value(opt: Option) -> bool:
    return opt.kind in ("value", "list") and opt.metavar != ""


_LONG = {"--" + o.long: o for o in OPTIONS}
_SHORT = {"-" + o.short: o for o in OPTIONS if o.short}


def _next_value(argv: list, i: int, flag: str) -> str:
    if i == len(argv):
        raise UsageError(f"option {flag} requires an argument")
    return argv[i]


def _scan(argv: list) -> tuple:
    """Splits argv into [(Option, flag, value)] and the command, POSIX style."""
    found, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return found, argv[i + 1:]
        if not arg.startswith("-") or arg == "-":
            break
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name in ("--help", "--version", "--license"):
                raise {"--help": HelpRequested, "--version": VersionRequested,
                       "--license": LicenseRequested}[name]()
            opt = _LONG.get(name)
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
            if flag in ("-h", "-V", "-l"):
                raise {"-h": HelpRequested, "-V": VersionRequested, "-l": LicenseRequested}[flag]()
            opt = _SHORT.get(flag)
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
    """Writes text to fd 1 (not sys.stdout: it is None when fd 1 was closed) and
    returns the exit status: 0, or 1 after one line on stderr when standard output
    cannot be written (closed, full, a broken pipe), as coreutils does. closed: the
    caller knows fd 1 was closed when it started (its number may have been reused)."""
    import errno

    data = text.encode("utf-8", "backslashreplace")
    try:
        if closed or _is_signalfd(1):     # fd 1 was closed: reaper's signalfd took its number
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        while data:
            data = data[os.write(1, data):]
    except OSError as e:
        try:
            os.write(2, f"{prog}: cannot write to standard output: {e.strerror}\n".encode())
        except OSError:
            pass
        return 1
    return 0


def _is_signalfd(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[signalfd]"
    except OSError:
        return False


class HelpRequested(Exception):
    pass


class VersionRequested(Exception):
    pass


class LicenseRequested(Exception):
    """tini's -l: print the license and exit."""


_SECTIONS = (("core", "Options"), ("budget", "CPU budgets for stray processes"),
             ("metrics", "Statistics"))


def help_text() -> str:
    lines = [
        "usage: reaper [OPTIONS] [--] COMMAND [ARGS...]",
        "       reaper -P [OPTIONS]                  (pause mode: no command)",
        "       reaper stats [--url URL | --file PATH]",
        "       reaper watch [OPTIONS]",
        "",
        "Runs COMMAND as the main child, reaps every orphan, forwards signals and exits",
        "with COMMAND's status. Every option also reads a REAPER_* environment variable.",
        f"SECONDS are at most {MAX_SECONDS} (one week). Quiet by default: errors, warnings and,",
        "when reaper did something (reaped an orphan, drained, acted on a budget), one",
        "summary line at exit.",
    ]
    rows = []
    for section, title in _SECTIONS:
        rows.append(("", title + ":"))
        for o in OPTIONS:
            if o.section != section:
                continue
            flag = (f"-{o.short}, " if o.short else "    ") + f"--{o.long}" + (f" {o.metavar}" if o.metavar else "")
            rows.append((flag, o.help + (f"  [{o.env[0]}]" if o.env else "")))
    rows += [("", ""), ("-h, --help", "show this help and exit"), ("-V, --version", "show the version and exit"),
             ("-l, --license", "show the license and exit")]
    width = max(len(f) for f, _ in rows) + 2
    for flag, text in rows:
        if not flag:
            lines += ["", text] if text else [""]
        else:
            lines.append(f"  {flag:<{width}}{text}")
    return "\n".join(lines) + "\n"

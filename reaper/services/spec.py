"""Services as the options describe them, checked before anything starts: one
line and exit 2 for a bad name, an empty command, a program that cannot run, an
unreadable or empty directory, a bad setting.

A service's settings (restart policy, delays, start limit, readiness) are the
--restart* flags', unless its entry in --services-dir is a directory of its own
(s6's model): NAME/run is the program, and a file per setting overrides the flag
for that service alone (SETTINGS below; the file holds the value, as the flag's)."""
from __future__ import annotations

import os

from reaper.text import display, quoted

NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
MAX_SERVICES = 64          # the C core watches at most REAPER_MAX_EXTRA pids and pipes


# A service directory's setting files: file name -> the option (Config attribute) it overrides.
SETTINGS = {"restart": "restart", "restart-delay": "restart_delay", "restart-max-delay": "restart_max_delay",
            "restart-limit": "restart_limit"}
SETTING_MAX = 256          # bytes read of a setting file: a value, not a document


class ServiceSpec:
    __slots__ = ("name", "argv", "ready", "origin", "settings")

    def __init__(self, name: str, argv: list, origin: str, settings: "dict | None" = None) -> None:
        self.name = name
        self.argv = argv
        self.ready = False        # declared with --service-ready (or a `ready` file): gets REAPER_READY_FD
        self.origin = origin      # where it was given, for messages
        self.settings = settings or {}    # Config attribute -> value, overriding the flag for this one

    def setting(self, cfg, name: str):
        """This service's value of a --restart* setting: its own, else the flag's."""
        return self.settings.get(name, getattr(cfg, name))

    def __repr__(self) -> str:
        return f"ServiceSpec({self.name!r}, {self.argv!r}, ready={self.ready}, settings={self.settings})"


def check_name(name: str) -> str:
    if not name or not set(name) <= NAME_CHARS or name in (".", ".."):
        raise ValueError(f"bad service name {quoted(name)} (letters, digits, '_', '.' and '-')")
    return name


def parse_service(text: str) -> tuple:
    """NAME=COMMAND -> (name, argv); COMMAND split as a shell splits words (no shell)."""
    import shlex

    name, sep, command = text.partition("=")
    if not sep:
        raise ValueError(f"expected NAME=COMMAND, not {quoted(text)}")
    name = check_name(name.strip())
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise ValueError(f"service {name}: cannot split {quoted(command)}: {e}") from None
    if not argv:
        raise ValueError(f"service {name}: empty command")
    return name, argv


def scan_dir(path: str, parsers: dict) -> list:
    """(name, [program], settings) for every executable file in path, and every
    directory with an executable `run` (its settings from its files, SETTINGS), by
    name; links followed (a ConfigMap's entries link through ..data), dot names left out."""
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        raise ValueError(f"--services-dir: cannot read {display(path)}: {e.strerror}") from None
    found = []
    for name in names:
        if name.startswith("."):
            continue
        full = os.path.join(path, name)
        run = os.path.join(full, "run")
        if os.path.isdir(full) and os.path.isfile(run) and os.access(run, os.X_OK):
            program, settings = run, _settings(full, parsers)
        elif os.path.isfile(full) and os.access(full, os.X_OK):
            program, settings = full, {}
        else:
            continue
        try:
            check_name(name)
        except ValueError as e:
            raise ValueError(f"--services-dir: {display(full)}: {e}") from None
        found.append((name, [os.path.abspath(program)], settings))
    if not found:
        raise ValueError(f"--services-dir: no executable file in {display(path)}")
    return found


def _settings(d: str, parsers: dict) -> dict:
    """The settings of service directory d: each file of SETTINGS present, parsed as its
    flag's value by parsers (Config attribute -> the option's parser: the same values and
    errors), and `ready` (present: --service-ready)."""
    out = {}
    for file, dest in SETTINGS.items():
        text = _read_setting(os.path.join(d, file))
        if text is None:
            continue
        try:
            out[dest] = parsers[dest](text)
        except ValueError as e:
            raise ValueError(f"--services-dir: {display(os.path.join(d, file))}: {e}") from None
    if os.path.exists(os.path.join(d, "ready")):
        out["ready"] = True
    return out


def _read_setting(path: str) -> "str | None":
    """A setting file's value (surrounding space and a final newline left out); None if
    there is no such file. A regular file of at most SETTING_MAX bytes (procfs.files)."""
    from reaper.procfs.files import Refused, read_regular

    try:
        data = read_regular(path, SETTING_MAX)
    except FileNotFoundError:
        return None
    except Refused as e:
        raise ValueError(f"--services-dir: {display(str(e))}") from None
    except OSError as e:
        raise ValueError(f"--services-dir: cannot read {display(path)}: {e.strerror}") from None
    return data.decode(errors="replace").strip()


def program_error(program: str):
    """Why execvp could not run program now (None if it could), as the spawn would fail."""
    from reaper.spawn import lookup

    err = lookup(program)
    return None if err is None else os.strerror(err)


def resolve(cfg, parsers: dict) -> list:
    """The services to run, in start order: --service (or REAPER_SERVICES) in the
    order given, then --services-dir's files by name. parsers: Config attribute ->
    the option's parser (reaper.options, which calls this), for service directories'
    setting files. Raises ValueError."""
    entries = [(name, argv, "--service", {}) for name, argv in cfg.services]
    if cfg.services_dir is not None:
        if not cfg.services_dir.strip():
            raise ValueError("--services-dir: expected a directory, not an empty string")
        entries += [(name, argv, "--services-dir", settings) for name, argv, settings in scan_dir(cfg.services_dir, parsers)]
    specs, seen = [], {}
    for name, argv, origin, settings in entries:
        if name in seen:
            raise ValueError(f"service {name} given twice ({seen[name]} and {origin})")
        seen[name] = origin
        why = program_error(argv[0])
        if why:
            raise ValueError(f"service {name}: cannot run {quoted(argv[0])}: {why}")
        ready = settings.pop("ready", False)
        spec = ServiceSpec(name, argv, origin, settings)
        spec.ready = ready
        if spec.setting(cfg, "restart_max_delay") < spec.setting(cfg, "restart_delay"):
            raise ValueError(f"service {name}: restart-max-delay ({spec.setting(cfg, 'restart_max_delay'):g}) "
                             f"is shorter than restart-delay ({spec.setting(cfg, 'restart_delay'):g})")
        specs.append(spec)
    if len(specs) > MAX_SERVICES:
        raise ValueError(f"{len(specs)} services: at most {MAX_SERVICES}")
    by_name = {s.name: s for s in specs}
    for name in cfg.service_ready:
        if name not in by_name:
            raise ValueError(f"--service-ready: no service named {quoted(name)}")
        by_name[name].ready = True
    return specs

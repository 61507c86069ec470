"""Services as the options describe them, checked before anything starts: one
line and exit 2 for a bad name, an empty command, a program that cannot run, an
unreadable or empty directory."""
from __future__ import annotations

import os

from reaper.log import display, quoted

NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
MAX_SERVICES = 64          # the C core watches at most REAPER_MAX_EXTRA pids and pipes


class ServiceSpec:
    __slots__ = ("name", "argv", "ready", "origin")

    def __init__(self, name: str, argv: list, origin: str) -> None:
        self.name = name
        self.argv = argv
        self.ready = False        # declared with --service-ready: gets REAPER_READY_FD
        self.origin = origin      # where it was given, for messages

    def __repr__(self) -> str:
        return f"ServiceSpec({self.name!r}, {self.argv!r}, ready={self.ready})"


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


def scan_dir(path: str) -> list:
    """(name, [path]) for every executable file in path, by name; links followed
    (a ConfigMap's entries link through ..data), dot names left out."""
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        raise ValueError(f"--services-dir: cannot read {display(path)}: {e.strerror}") from None
    found = []
    for name in names:
        if name.startswith("."):
            continue
        full = os.path.join(path, name)
        if os.path.isfile(full) and os.access(full, os.X_OK):
            try:
                check_name(name)
            except ValueError as e:
                raise ValueError(f"--services-dir: {display(full)}: {e}") from None
            found.append((name, [os.path.abspath(full)]))
    if not found:
        raise ValueError(f"--services-dir: no executable file in {display(path)}")
    return found


def program_error(program: str):
    """Why execvp could not run program now (None if it could), as the C spawn would fail."""
    import errno

    if "/" in program:
        candidates = [program]
    else:
        candidates = [os.path.join(d or ".", program)
                      for d in os.environ.get("PATH", os.defpath).split(os.pathsep)]
    denied = None
    for path in candidates:
        if os.path.isdir(path):
            denied = denied or errno.EISDIR
        elif os.path.exists(path):
            if os.access(path, os.X_OK):
                return None
            denied = errno.EACCES
    return os.strerror(denied or errno.ENOENT)


def resolve(cfg) -> list:
    """The services to run, in start order: --service (or REAPER_SERVICES) in the
    order given, then --services-dir's files by name. Raises ValueError."""
    entries = [(name, argv, "--service") for name, argv in cfg.services]
    if cfg.services_dir is not None:
        if not cfg.services_dir.strip():
            raise ValueError("--services-dir: expected a directory, not an empty string")
        entries += [(name, argv, "--services-dir") for name, argv in scan_dir(cfg.services_dir)]
    specs, seen = [], {}
    for name, argv, origin in entries:
        if name in seen:
            raise ValueError(f"service {name} given twice ({seen[name]} and {origin})")
        seen[name] = origin
        why = program_error(argv[0])
        if why:
            raise ValueError(f"service {name}: cannot run {quoted(argv[0])}: {why}")
        specs.append(ServiceSpec(name, argv, origin))
    if len(specs) > MAX_SERVICES:
        raise ValueError(f"{len(specs)} services: at most {MAX_SERVICES}")
    by_name = {s.name: s for s in specs}
    for name in cfg.service_ready:
        if name not in by_name:
            raise ValueError(f"--service-ready: no service named {quoted(name)}")
        by_name[name].ready = True
    return specs

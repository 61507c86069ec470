"""The device holders and the stopped leftovers ``reaper top`` shows, with their owner,
from /proc in reaper's PID namespace (the endpoint only counts them: its labels never
carry a pid).

A device holder: a process with an open descriptor on a device file the --devices
globs match (REAPER_DEVICES as reaper reads it, else reaper/leftovers/devices.py's
defaults), read by that module's bounded reader. A stopped leftover: a process
re-parented to reaper (not one of its own children: the main child, the services) in
state T, as --leftovers stop leaves them.

The owner, as /proc tells it: the parent while it lives (name[pid]; reaper's own
children, the main child and the services, have none above); for a process
re-parented to reaper, its owner ended ("ended"), with the Ray job its environment
names (RAY_JOB_ID, read bounded). Which owner it was (a Ray worker's title, a
service's name) is reaper's log line's: /proc no longer has it.

At most MAX_SCANNED processes' descriptors are read, at most once every EVERY seconds
(Scan): a node of 20,000 processes is not a million readlinks a second.
"""
from __future__ import annotations

from reaper.text import display

MAX_SCANNED = 2000
EVERY = 5.0             # seconds a scan serves the refreshes (a Ray worker holds hundreds of descriptors)


def globs(environ) -> tuple:
    """The device globs as reaper reads them (REAPER_DEVICES), else the defaults; a bad
    REAPER_DEVICES is reaper's usage error, here the defaults."""
    from reaper import options
    from reaper.leftovers.devices import DEFAULT_GLOBS

    rows = tuple(o for o in options.OPTIONS if o.dest == "devices")
    try:
        cfg = options.configure([], rows, environ)
    except options.UsageError:
        return DEFAULT_GLOBS
    return cfg.devices or DEFAULT_GLOBS


def find(table: dict, me: int, kept: set, device_globs: tuple) -> tuple:
    """([dicts: pid name devices state owner], processes scanned, processes in all),
    the holders first, by pid."""
    from reaper.leftovers.devices import Devices

    devices = Devices(device_globs)
    others = sorted((p for p in table.values() if p.pid != me and p.state != "Z"), key=lambda p: p.pid)
    rows = []
    for i, p in enumerate(others):
        held = devices.held_by(p.pid) if i < MAX_SCANNED else []
        orphan = p.ppid == me and p.pid not in kept
        if not held and not (orphan and p.state in ("T", "t")):
            continue
        rows.append({"pid": p.pid, "name": p.comm, "devices": ", ".join(display(d) for d in held) or "-",
                     "state": p.state, "owner": _owner(p, table, orphan, me)})
    rows.sort(key=lambda d: (d["devices"] == "-", d["pid"]))
    return rows, min(len(others), MAX_SCANNED), len(others)


def _owner(p, table: dict, orphan: bool, me: int) -> str:
    if p.ppid == me and not orphan:
        return "reaper (its own child)"         # the main child or a service: no owner above
    if not orphan:
        parent = table.get(p.ppid)
        return f"{parent.comm}[{parent.pid}]" if parent is not None else f"[{p.ppid}]"
    from reaper.leftovers.jobs import from_environ

    ray, job = from_environ(p.pid)
    return "ended" + (f" (job {job})" if job else " (unknown job)" if ray else "")


class Scan:
    """find() at most once every EVERY seconds; the refreshes between show its result."""

    def __init__(self) -> None:
        self.at = None
        self.result = ([], 0, 0)

    def get(self, now: float, *args) -> tuple:
        if self.at is None or not 0 <= now - self.at < EVERY:
            self.result, self.at = find(*args), now
        return self.result

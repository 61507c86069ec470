"""The kernel log's NIC and watchdog lines: read-only from /dev/kmsg (or a file of its
records, --kmsg), followed. A record is `prio,seq,usec,flags;message` (usec: since
boot, the clock of time.monotonic()); the device returns one record a read and is read
from its end (what happens from now on), a file from its start; lines that begin with
a space are a record's key=value dictionary, skipped. Nothing is ever written to it.

Recognized (kind):
    tx_paused     ena: "TX q N is paused for too long (threshold T). Time since last napi U usec. ..."
    napi_starved  ena: "napi handler hasn't been called for a long time but is scheduled"
    reset         ena: "Trigger reset is on"
    tx_timeout    any driver: "NETDEV WATCHDOG: DEV (DRIVER): transmit queue N timed out" (and the
                  6.x form "DRIVER BUS DEV: NETDEV WATCHDOG: CPU: C: transmit queue N timed out");
                  mlx5: "TX timeout on queue: N, ..."
    soft_lockup   "watchdog: BUG: soft lockup - CPU#N stuck for Ns! [comm:pid]" (device: cpuN)

Only the kernel's own records count (facility 0: a process that writes to /dev/kmsg
gets the user facility), and a pattern must match from the message's start. A message
is kernel text but may carry a process's name (a soft lockup's comm) or a
device's: shown on one line, bounded, never matched against a pattern of its own.
"""
from __future__ import annotations

import errno
import os
import re
import stat
from typing import NamedTuple

from reaper.text import display

READ_MAX = 4096          # records read at most per poll (a flood is read over several)
FILE_CHUNK = 1 << 20     # bytes of a followed file read at most per poll
TEXT_MAX = 200
DEVICES_MAX = 32         # distinct devices labelled (metric cardinality); the rest: "other"

_NETDEV = r"(?P<driver>[\w-]+) (?P<bus>\S+) (?P<dev>[\w.@-]+): "       # netdev_err's prefix
PATTERNS = (
    ("tx_paused", re.compile(_NETDEV + r"TX q (?P<queue>\d+) is paused for too long")),
    ("napi_starved", re.compile(_NETDEV + r"napi handler hasn't been called for a long time but is scheduled")),
    ("reset", re.compile(_NETDEV + r"Trigger reset is on")),
    ("tx_timeout", re.compile(r"NETDEV WATCHDOG: (?P<dev>[\w.@-]+) \((?P<driver>[\w-]+)\): transmit queue "
                              r"(?P<queue>\d+) timed out")),
    ("tx_timeout", re.compile(_NETDEV + r"NETDEV WATCHDOG: CPU: (?P<cpu>\d+): transmit queue (?P<queue>\d+) "
                                        r"timed out")),
    ("tx_timeout", re.compile(_NETDEV + r"TX timeout on queue: (?P<queue>\d+),")),
    ("soft_lockup", re.compile(r"(?:watchdog: )?BUG: soft lockup - CPU#(?P<cpu>\d+) stuck for (?P<secs>\d+)s!")),
)
KINDS = tuple(dict.fromkeys(k for k, _ in PATTERNS)) + ("irq_stalled",)      # the last: queues.py's
WHAT = {"tx_paused": "TX q {queue} paused for too long", "napi_starved": "napi scheduled but not run",
        "reset": "device reset triggered", "tx_timeout": "transmit queue {queue} timed out",
        "soft_lockup": "soft lockup, cpu{cpu} stuck for {secs} s",
        "irq_stalled": "its interrupt count stood still on cpu{cpu}"}


class Event(NamedTuple):
    when: float          # seconds since boot (the record's usec)
    kind: str
    device: str          # the interface (cpuN for a soft lockup)
    driver: str
    queue: "int | None"
    cpu: "int | None"    # the core the line names (soft lockup; the 6.x watchdog's CPU)
    text: str            # the message, one line, bounded

    def what(self) -> str:
        """'ena: TX q 3 paused for too long'."""
        secs = re.search(r"stuck for (\d+)s", self.text)
        short = WHAT[self.kind].format(queue=self.queue, cpu=self.cpu, secs=secs.group(1) if secs else "?")
        return f"{self.driver}: {short}" if self.driver else short


def parse_record(line: str) -> "Event | None":
    """One /dev/kmsg record, or None if it is not one that matters (or not a record)."""
    head, sep, message = line.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 3 or not fields[0].isdigit() or not fields[2].isdigit() or int(fields[0]) >= 8:
        return None                  # not a record, or not the kernel's (facility 0): a process wrote it
    for kind, pattern in PATTERNS:
        m = pattern.match(message)
        if m is None:
            continue
        g = m.groupdict()
        cpu = int(g["cpu"]) if g.get("cpu") else None
        device = g.get("dev") or (f"cpu{cpu}" if cpu is not None and kind == "soft_lockup" else "")
        return Event(int(fields[2]) / 1e6, kind, display(device[:64]), display((g.get("driver") or "")[:32]),
                     int(g["queue"]) if g.get("queue") else None, cpu, display(message.rstrip("\n")[:TEXT_MAX]))
    return None


class KernelLog:
    """Follows PATH; poll() returns the new events. Raises OSError at open (the caller
    says it once)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self.device = not stat.S_ISREG(os.fstat(self.fd).st_mode)
        self.rest = b""
        self.missed = 0              # records the kernel overwrote before they were read (EPIPE)
        if self.device:
            try:
                os.lseek(self.fd, 0, os.SEEK_END)      # /dev/kmsg: from now on
            except OSError:
                pass

    def poll(self) -> list:
        return [e for e in map(parse_record, self._records()) if e is not None]

    def _records(self) -> list:
        if not self.device:
            data = self.rest + os.read(self.fd, FILE_CHUNK)
            lines = data.split(b"\n")
            self.rest = lines.pop()[-65536:]         # a record still being written
            return [ln.decode("utf-8", "replace") for ln in lines if ln and not ln.startswith(b" ")]
        out = []
        while len(out) < READ_MAX:
            try:
                rec = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:           # overwritten under us: the next read goes on
                    self.missed += 1
                    continue
                raise
            if not rec:
                break
            out.append(rec.split(b"\n", 1)[0].decode("utf-8", "replace"))
        return out

    def close(self) -> None:
        os.close(self.fd)


class Counts:
    """reaper_node_nic_events_total's series: (device, kind) -> events, the devices
    bounded (DEVICES_MAX, then "other")."""

    def __init__(self) -> None:
        self.counts: dict = {}
        self.devices: set = set()

    def add(self, e: Event) -> None:
        device = e.device
        if device not in self.devices:
            if len(self.devices) >= DEVICES_MAX:
                device = "other"
            else:
                self.devices.add(device)
        key = (device, e.kind)
        self.counts[key] = self.counts.get(key, 0) + 1

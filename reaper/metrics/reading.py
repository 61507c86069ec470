"""What a section of the collector reads (reaper/metrics/sections/): one Reading per
collector, built from the exporter and reaper's scope."""
from __future__ import annotations

import threading
import time

SCAN_MAX_AGE = 0.5          # a source read (a /proc scan) is reused by scrapes within this many seconds


class Reading:
    """stats: stats.Stats (the loop's counters); cfg: options.Config; mode: init, watch
    or node; scope: the Supervisor or watch's scope (pid, is_pid1, main_pid,
    supervised, watch); x: the Exporter, for what its sampler thread measured (cpu,
    memory_visible) and whether its port is served (listening)."""

    def __init__(self, exporter, scope) -> None:
        self.x = exporter
        self.stats = exporter.stats
        self.cfg = exporter.cfg
        self.mode = exporter.mode
        self.log = exporter.log
        self.scope = scope
        self._lock = threading.Lock()
        self._cache: dict = {}          # source -> (when read, value)

    @property
    def budgets(self) -> bool:
        return self.cfg.budgets_enabled

    def fresh(self, source: str, read):
        """read()'s value, reused by the scrapes within SCAN_MAX_AGE (one read at a time)."""
        with self._lock:
            now = time.monotonic()
            hit = self._cache.get(source)
            if hit is None or now - hit[0] > SCAN_MAX_AGE:
                hit = self._cache[source] = (now, read())
            return hit[1]

    def invalidate(self) -> None:
        self._cache = {}


def copy(counter) -> dict:
    """A snapshot of a counter the loop updates: dict(d) is one C call under the GIL,
    safe while the loop adds keys."""
    return dict(counter) if counter else {}

"""The pieces of reaper that may fail, and the guard they run under (reaper/boundary.py).

A piece is reached only through Policy.call() or Policy.start(): the first failure
switches it off for good with one ERROR line, counted in reaper_policy_errors_total,
and reaper goes on without it. The names below are the pieces', as the log and the
tests name them; the order is reaper's start order (reaper/pieces.py).
"""
from __future__ import annotations

SERVICES = "services"       # supervised services (reaper/services/)
STATISTICS = "statistics"   # the counters the metrics and the summary read (reaper/stats.py)
HYGIENE = "hygiene"         # cwd /, inherited fds closed after the spawn
TITLE = "title"             # reaper's process title
OOM = "oom"                 # reaper's own oom_score_adj
METRICS = "metrics"         # the Prometheus exporter (reaper/metrics.py)
BUDGETS = "budgets"         # budgets for strays (reaper/budgets/)
SUMMARY = "summary"         # the exit summary (reaper/summary.py)


class Policy:
    """The pieces that may fail. A piece that raised is in an unknown state: it is
    switched off for good (closed, so that, e.g., stopped strays are resumed)."""

    def __init__(self, log, stats) -> None:
        self.log = log
        self.stats = stats               # may be None until the boundary has made it
        self.plugins: list = []          # (piece, plugin): next_deadline(), tick(now), close()
        self.off: set = set()

    def call(self, piece: str, fn, *args):
        """fn(*args), or None once piece has failed."""
        if piece in self.off:
            return None
        try:
            return fn(*args)
        except Exception as e:
            self.switch_off(piece, e)
            return None

    def start(self, piece: str, factory, abort=None) -> None:
        """Starts a periodic piece: factory() returns a plugin or a list of them.
        If it fails, abort() releases what it had taken (a socket, threads)."""
        got = self.call(piece, factory)
        if got is None:
            if abort is not None and piece in self.off:
                try:
                    abort()
                except Exception:
                    pass
            return
        self.plugins.extend((piece, p) for p in (got if isinstance(got, list) else [got]))

    def switch_off(self, piece: str, e: BaseException) -> None:
        if piece in self.off:
            return
        self.off.add(piece)
        if self.stats is not None:
            self.stats.policy_errors += 1
        self.log.error(f"{piece} failed ({e!r}): {piece} switched off, reaper goes on")
        if self.log.enabled(3):
            import traceback

            for line in traceback.format_exception(type(e), e, e.__traceback__):
                self.log.debug(line.rstrip())
        for entry in [x for x in self.plugins if x[0] == piece]:
            self.plugins.remove(entry)
            try:
                entry[1].close()
            except Exception:
                pass

    def next_deadline(self):
        due = None
        for piece, p in list(self.plugins):
            d = self.call(piece, p.next_deadline)
            if d is not None and (due is None or d < due):
                due = d
        return due

    def tick(self, now: float) -> None:
        for piece, p in list(self.plugins):
            due = self.call(piece, p.next_deadline)
            if due is not None and due <= now:
                self.call(piece, p.tick, now)

    def close(self) -> None:
        plugins, self.plugins = self.plugins, []
        for piece, p in plugins:
            self.call(piece, p.close)

"""The pieces of reaper that may fail, and the guard they run under (reaper/boundary.py).

A piece is reached only through Policy.call() or Policy.start(): a failure switches
it off with one ERROR line, counted in reaper_policy_errors_total, and reaper goes on
without it. A failure is not an off switch a process could pull (a stray that makes
the budgets fail must not end them for the rest of the run): the piece starts again
after a backoff (RESTART_FIRST doubling to RESTART_MAX), counted in
reaper_policy_restarts_total. That is the statistics, the budgets and the leftovers (RESTARTED).
The others stay off: hygiene, title and oom run once; the services cannot be
rebuilt (a new runner would start every service twice; those up are still reaped
and drained), nor the exporter (its port and threads; its sampler restarts its own
parts the same way); the summary is written once, at the end. The names below are the
pieces', as the log and the tests name them; the order is reaper's start order
(reaper/pieces.py).
"""
from __future__ import annotations

import time

TYPE_CHECKING = False            # typing is not imported at run time (start-up time and memory)
if TYPE_CHECKING:
    from typing import Protocol

    class Plugin(Protocol):
        """What Policy.start()'s factory returns (one or a list) and the loop drives:
        the Supervisor waits until the earliest next_deadline() of all (None: nothing
        due), calls tick(now) once it has passed, and close() once, at the end or when
        the piece is switched off. Each call runs under Policy.call()."""

        def next_deadline(self) -> "float | None": ...

        def tick(self, now: float) -> None: ...

        def close(self) -> None: ...

SERVICES = "services"       # supervised services (reaper/services/)
STATISTICS = "statistics"   # the counters the metrics and the summary read (reaper/stats.py)
HYGIENE = "hygiene"         # cwd /, inherited fds closed after the spawn
TITLE = "title"             # reaper's process title
OOM = "oom"                 # reaper's own oom_score_adj
METRICS = "metrics"         # the Prometheus exporter (reaper/metrics/)
BUDGETS = "budgets"         # budgets for strays (reaper/budgets/)
LEFTOVERS = "leftovers"     # what ended Ray workers and services left running (reaper/leftovers/)
SUMMARY = "summary"         # the exit summary (reaper/summary.py)

RESTARTED = frozenset((STATISTICS, BUDGETS, LEFTOVERS))   # started again after a failure; the others stay off
RESTART_FIRST = 1.0         # seconds from a failure to the piece's first restart
RESTART_MAX = 300.0         # the backoff's ceiling; a piece that ran this long starts over at RESTART_FIRST


class Policy:
    """The pieces that may fail. A piece that raised is in an unknown state: it is
    switched off (closed, so that, e.g., stopped strays are resumed) and, unless it
    is one of RESTARTED, started afresh after its backoff."""

    def __init__(self, log, stats, restarted: frozenset = RESTARTED) -> None:
        self.log = log
        self.stats = stats               # may be None until the boundary has made it (None: not counted)
        self.restarted = restarted       # the pieces started again after a failure (the exporter's sampler has its own)
        self.plugins: list = []          # (piece, Plugin): next_deadline(), tick(now), close()
        self.off: dict = {}              # piece -> when it starts again (None: not before reaper ends)
        self._factories: dict = {}       # piece -> (factory, abort) of a periodic piece
        self._backoff: dict = {}         # piece -> its restart Backoff
        self._since: dict = {}           # piece -> when it last (re)started
        self._closed = False

    def call(self, piece: str, fn, *args):
        """fn(*args), or None while piece is off."""
        if piece in self.off:
            return None
        try:
            return fn(*args)
        except Exception as e:
            self.switch_off(piece, e)
            return None

    def start(self, piece: str, factory, abort=None) -> None:
        """Starts a periodic piece: factory() returns a plugin or a list of them.
        If it fails, abort() releases what it had taken (a socket, threads); a
        restart calls factory() again."""
        self._factories[piece] = (factory, abort)
        self._since[piece] = time.monotonic()
        self._make(piece)

    def _make(self, piece: str) -> bool:
        factory, abort = self._factories[piece]
        got = self.call(piece, factory)
        if got is None:
            if abort is not None and piece in self.off:
                try:
                    abort()
                except Exception:
                    pass
            return False
        self.plugins.extend((piece, p) for p in (got if isinstance(got, list) else [got]))
        return True

    def switch_off(self, piece: str, e: BaseException) -> None:
        if piece in self.off:
            return
        now = time.monotonic()
        backoff = self._backoff.get(piece)
        if backoff is None:
            backoff = self._backoff[piece] = Backoff(RESTART_FIRST, RESTART_MAX)
        wait = backoff.next(now - self._since.get(piece, now))
        again = None
        if piece in self.restarted and not self._closed:
            again = now + wait
        self.off[piece] = again
        if self.stats is not None:
            self.stats.policy_errors += 1
        then = "reaper goes on" if again is None else f"starting it again in {again - now:g} s"
        self.log.error(f"{piece} failed ({e!r}): {piece} switched off, {then}")
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

    def _restart_due(self, now: float) -> None:
        for piece, again in list(self.off.items()):
            if again is None or now < again:
                continue
            del self.off[piece]
            self._since[piece] = now
            if self.stats is not None:
                restarts = self.stats.policy_restarts
                restarts[piece] = restarts.get(piece, 0) + 1
            if piece in self._factories and not self._make(piece):
                continue                         # failed again: switch_off set the next try
            self.log.info(f"{piece} started again after a failure")

    def next_deadline(self):
        due = None
        for again in self.off.values():
            if again is not None and (due is None or again < due):
                due = again
        for piece, p in list(self.plugins):
            d = self.call(piece, p.next_deadline)
            if d is not None and (due is None or d < due):
                due = d
        return due

    def tick(self, now: float) -> None:
        if self.off:
            self._restart_due(now)
        for piece, p in list(self.plugins):
            due = self.call(piece, p.next_deadline)
            if due is not None and due <= now:
                self.call(piece, p.tick, now)

    def close(self) -> None:
        self._closed = True                      # nothing starts again on the way out
        for piece in self.off:
            self.off[piece] = None
        plugins, self.plugins = self.plugins, []
        for piece, p in plugins:
            self.call(piece, p.close)


class Backoff:
    """A doubling wait: `first`, then twice the last, up to `most`. The one backoff of
    reaper (the pieces' restarts above, the services' restarts, the drain's rescans,
    the metrics' binds and sampler parts)."""

    __slots__ = ("first", "most", "wait")

    def __init__(self, first: float, most: float) -> None:
        self.first = first
        self.most = most
        self.wait = first                # the next wait next() returns

    def next(self, ran: float = 0.0) -> float:
        """The wait now, doubling the next one. ran: how long what it spaces ran since
        the last wait; a run of at least `most` starts over from `first`."""
        if ran >= self.most:
            self.wait = self.first
        wait, self.wait = self.wait, min(self.most, self.wait * 2)
        return wait

    def reset(self) -> None:
        """The next wait is `first` again."""
        self.wait = self.first


class SayOnce:
    """"Catch, say once, go on", for the parts that fail alone inside a piece (one
    metrics section, one of reaper node's readers, the HTTP server's loop): run(name,
    fn, *args) is fn(*args), or `default` when it raises; the first failure of each
    name is one line, say(name, exception), and later ones are silent while it fails.
    A piece as a whole fails through Policy.call() instead, which switches it off."""

    __slots__ = ("say", "default", "failed")

    def __init__(self, say, default=None) -> None:
        self.say = say
        self.default = default
        self.failed: set = set()         # the names that failed (and were said)

    def run(self, name: str, fn, *args):
        try:
            return fn(*args)
        except Exception as e:
            if name not in self.failed:
                self.failed.add(name)
                self.say(name, e)
            return self.default

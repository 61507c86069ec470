"""The exporter's sampler thread: per-core CPU every SAMPLE_INTERVAL, the visible
memory cgroups every CGROUP_INTERVAL (a directory walk), the metrics file every
--metrics-interval, and the bind of a port that was taken (BindRetry).

Each is a part run under a Policy of its own (reaper/policy.py, the guard of PID 1's
pieces): a part that raises is switched off with one line and, but for the port
(whose retries have a backoff of their own: a failure there is for good), started
again after the policy's backoff; the others go on.
"""
from __future__ import annotations

import time

from reaper.policy import Backoff, Policy

SAMPLE_INTERVAL = 1.0       # seconds between per-core CPU samples
CGROUP_INTERVAL = 10.0      # seconds between counts of visible memory cgroups (walks a directory tree)
CPU = "per-core CPU"
CGROUP_COUNT = "memory cgroup count"
FILE = "metrics file"
PORT = "metrics port"
RESTARTED = frozenset((CPU, CGROUP_COUNT, FILE))


class Part:
    """A policy plugin: run() every interval (or after the seconds it returns; DONE:
    never again); close() when the policy switches it off."""

    DONE = object()

    def __init__(self, run, interval: float, due: float, close=None) -> None:
        self.run, self.interval, self.due, self._close = run, interval, due, close

    def next_deadline(self):
        return self.due

    def tick(self, now: float) -> None:
        started = time.monotonic()          # not the policy's now: the parts before this one took time
        after = self.run()
        self.due = None if after is Part.DONE else started + (self.interval if after is None else after)

    def close(self) -> None:
        if self._close is not None:
            self._close()


def run(x, stop) -> None:
    """The thread: x is the Exporter; ends when stop is set."""
    policy = Policy(x.log, None, restarted=RESTARTED)
    now = time.monotonic()
    cpu = CpuPart(x)
    if x.cpu is not None:
        policy.start(CPU, cpu.part)
    policy.start(CGROUP_COUNT, lambda: Part(lambda: _count_memory_cgroups(x), CGROUP_INTERVAL, time.monotonic(),
                                            close=lambda: setattr(x, "memory_visible", None)))
    if x.file_registry is not None:
        policy.start(FILE, lambda: Part(x.write_file, x.cfg.metrics_interval, time.monotonic()))
    if x.later is not None and x.sock is None:
        retry = BindRetry(x)
        policy.start(PORT, lambda: Part(retry.step, 0.0, now + retry.first))
    while True:
        now = time.monotonic()
        policy.tick(now)
        due = policy.next_deadline()
        if stop.wait(None if due is None else max(0.0, due - time.monotonic())):
            return


class CpuPart:
    """Per-core CPU: switched off, its sampler is parked (stale ratios would look like
    live ones; its counters are kept) and taken up again by the restart."""

    def __init__(self, x) -> None:
        self.x = x
        self.parked = None

    def part(self) -> Part:
        first = self.parked is None          # a restart samples at once
        return Part(self.sample, SAMPLE_INTERVAL, time.monotonic() + (SAMPLE_INTERVAL if first else 0.0),
                    close=self.park)

    def sample(self) -> None:
        sampler = self.x.cpu or self.parked
        sampler.sample()
        self.x.cpu = sampler

    def park(self) -> None:
        self.parked, self.x.cpu = self.x.cpu or self.parked, None


def _count_memory_cgroups(x) -> None:
    from reaper import nodestats

    x.memory_visible = nodestats.visible_memory_cgroups()


class BindRetry:
    """The bind of a port that was taken (or an address not up yet): one try per
    wake-up, BIND_RETRY_FIRST doubling up to BIND_RETRY_MAX apart. Raises on a failure
    no retry can mend, or when the server cannot start."""

    def __init__(self, x) -> None:
        self.x = x
        self.first, most = x.bind_backoff()   # the first try `first` after the start, then doubling
        self.backoff = Backoff(2 * self.first, most)
        self.tries = 0

    def once(self):
        """Seconds until the next try, or None once served (reaper node's loop)."""
        after = self.step()
        return None if after is Part.DONE else after

    def step(self):
        x, port = self.x, self.x.later
        self.tries += 1
        try:
            sock = port.listen()
        except OSError as e:
            if not port.for_now(e):
                raise
            wait = self.backoff.next()                   # 1 s after the start, then 2, 4 ... 30
            x.log.debug(f"metrics: {port.problem(e)}; next try in {wait:g} s")
            return wait
        x.sock = sock
        try:
            x.serve_http()
        except BaseException:
            x.release()
            x.server = x.sock = None
            if x.stopped:                # abort() closed the new socket under it: nothing to say
                return Part.DONE
            raise
        if x.stopped:                    # abort() ran meanwhile and may have missed the new server
            x.release()
            return Part.DONE
        x.log.info(f"metrics: serving on {port.where()} (bound at try {self.tries + 1})")
        return Part.DONE

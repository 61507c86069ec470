"""When a service that ended starts again: the restart policy, the backoff and the
start limit. Pure bookkeeping on monotonic times the caller passes in, so that it
holds no timer of its own (the runner's next_deadline() is the loop's timeout).

- policy: always restarts; on-failure after a non-zero exit or a death by signal
  (a start that failed counts as a failure); never does not, and a service that
  failed under never is given up at once (state failed, as at the limit);
- backoff: the first restart waits --restart-delay, each further one twice the
  last, up to --restart-max-delay; a run that lasted at least the maximum starts
  over from the first delay;
- limit: a service started N times within SECONDS (--restart-limit N/SECONDS) is
  given up instead of started again.
"""
from __future__ import annotations

import os
from collections import deque

from reaper.policy import Backoff

RESTART, DONE, GIVE_UP = "restart", "done", "give-up"


def failed(status) -> bool:
    """A wait status that is a failure: non-zero exit, a signal; None (no process) too."""
    return status is None or os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0


class Restarts:
    """One service's restart policy, backoff and start limit."""

    def __init__(self, policy: str, delay: float, max_delay: float, limit: tuple) -> None:
        self.policy = policy
        self.delay = Backoff(delay, max_delay)
        self.limit_starts, self.limit_window = limit
        self.starts: deque = deque()     # monotonic times of the starts within the window
        self.last_start = None

    def started(self, now: float) -> None:
        self.starts.append(now)
        self.last_start = now

    def ended(self, now: float, status) -> tuple:
        """(decision, delay): RESTART after delay seconds, DONE (the policy says no
        restart) or GIVE_UP (the limit is reached)."""
        if not failed(status) and self.policy != "always":
            return DONE, 0.0
        if self.policy == "never":
            return GIVE_UP, 0.0                   # a failure nothing will restart: failed

        while self.starts and self.starts[0] <= now - self.limit_window:
            self.starts.popleft()
        if len(self.starts) >= self.limit_starts:
            return GIVE_UP, 0.0
        # A run of at least the maximum delay stayed up: a fresh start.
        return RESTART, self.delay.next(0.0 if self.last_start is None else now - self.last_start)

"""What reaper counts. Plain Python numbers, updated by the loop without locks
or imports; the exporter reads them at scrape time (reaper/metrics/)."""
from __future__ import annotations

import os
import time

from reaper import signals
from reaper._native import REAP_LATENCY_BUCKETS  # the C core counts into the buckets too

TOP_STRAYS = 10      # the strays the metrics name: the busiest, and those holding most memory


class Counter(dict):
    """Counts by key; a missing key counts 0. collections.Counter's one feature used here,
    without importing collections on PID 1's path (milliseconds and memory at start)."""

    def __missing__(self, key) -> int:
        return 0


def outcome(status: int) -> str:
    """A bounded label for a wait status: exited_0, exited_nonzero or the signal name."""
    if os.WIFSIGNALED(status):
        return signals.name(os.WTERMSIG(status))
    return "exited_0" if os.WEXITSTATUS(status) == 0 else "exited_nonzero"


class BudgetStats:
    """Filled by the budget enforcer (reaper/budgets/enforcer.py)."""

    def __init__(self) -> None:
        self.strays = 0                      # strays alive at the last sample
        self.strays_seen = 0                 # distinct strays (pid, start time) ever tracked
        self.stray_cpu_seconds = 0.0         # CPU used by strays, summed over samples
        self.stray_cgroup_escapes = 0        # strays found outside the cgroup reaper holds them in (moved back)
        self.violations = Counter()          # action -> violations seen under that action
        self.actions = Counter()             # action taken -> count (nice, throttle, terminate, ...)
        # The same, by (action, reason): reason is cpu, memory, age, or any (not tied to one budget).
        self.violations_by_reason = Counter()
        self.actions_by_reason = Counter()
        self.mechanism = ""                  # throttle mechanism in use: cgroup_v2, cgroup_v1, sigstop
        # How memory budgets are held: cgroup_v2, cgroup_v1, terminate; empty before the first need.
        self.memory_mechanism = ""
        self.samples = 0
        self.stale_cgroups_removed = 0       # reaper-strays.* left by reapers that are gone
        # Strays over their budget at the last sample, by reason (cpu, memory, age).
        self.over_budget = {"cpu": 0, "memory": 0, "age": 0}
        # The cgroups reaper holds for strays: {"live": n} and, on cgroup v2, "dying": removed
        # below reaper's own, still held by the kernel.
        self.cgroups = {"live": 0}
        # Strays alive at the last sample, busiest first, for `reaper stats`:
        # dicts {pid, name, cpu_cores (averaged over the window), memory_bytes (resident),
        # action (strongest response applied: none, observe, nice, throttle, terminate,
        # kill), since (epoch s)}.
        self.stray_list: list = []


class Stats:
    def __init__(self) -> None:
        self.start_time = time.time()
        self.main_pid: "int | None" = None
        self.main_command = ""
        self.main_state = "starting"          # starting, running, exited, exec_failed
        self.main_status: "int | None" = None  # raw wait status
        self.main_exit_code: "int | None" = None  # N or 128+N, before -e remapping
        self.exit_status: "int | None" = None   # reaper's own, after remapping
        self.phase = "running"                # running, draining, killing, done
        # A stop signal from outside (SIGTERM, SIGINT, SIGQUIT) arrived before the main child
        # ended: its end was asked for, whatever status it ends with.
        self.stop_requested = False
        # Children reaped as events (the main child; every child with -w or debug):
        self._reaped = Counter()              # (kind, outcome) -> count; kind main|orphan|supervised
        self._cpu = 0.0
        self._orphan_cpu = 0.0                # of the orphans among them
        self._latency_buckets = [0] * (len(REAP_LATENCY_BUCKETS) + 1)
        self._latency_sum = 0.0
        # ...and the rest, counted by the C core as orphans (reaper._native.Waiter.totals).
        self.native = None
        self.signals_received = Counter()     # signal name -> count
        self.signals_forwarded = Counter()    # signal name (as sent) -> count
        self.drain = Counter()                # terminated, killed, survived, not_permitted
        self.drain_seconds: "float | None" = None
        self.policy_errors = 0                # exceptions caught in policy code
        self.policy_restarts: dict = {}       # piece -> times started again after a failure
        self.budget = BudgetStats()
        self.services: list = []              # services.runner.Service, in start order (when configured)
        self.leftovers = None                 # leftovers.publish.Published, once that piece runs

    def record_reap(self, kind: str, status: int, latency: float, cpu: float) -> None:
        self._reaped[(kind, outcome(status))] += 1
        self._cpu += cpu
        if kind == "orphan":
            self._orphan_cpu += cpu
        i = 0
        while i < len(REAP_LATENCY_BUCKETS) and latency > REAP_LATENCY_BUCKETS[i]:
            i += 1
        self._latency_buckets[i] += 1
        self._latency_sum += latency

    # Read side (exporter, summary): events and the C core's totals together.

    @property
    def reaped(self) -> Counter:
        out = Counter(self._reaped)
        t = self.native
        if t is not None:
            exited, signaled = t.exited(), t.signaled()
            out[("orphan", "exited_0")] += exited[0]
            out[("orphan", "exited_nonzero")] += sum(exited) - exited[0]
            for sig in range(1, len(signaled)):
                if signaled[sig]:
                    out[("orphan", signals.name(sig))] += signaled[sig]
        return Counter((k, n) for k, n in out.items() if n)   # drop zero counts

    def news(self, log_lines_dropped: int) -> bool:
        """True when reaper did something beyond passing the child through: reaped an
        orphan, drained a process, acted on a budget, switched a piece off, lost a
        line, restarted or gave up a service. What decides whether the summary line
        is shown by default; cheap, so the exit path asks it before building one."""
        t = self.native
        orphans = any(k == "orphan" for k, _ in self._reaped) or (t is not None and t.reaped)
        svc = self._service_counts()
        return bool(orphans or any(self.drain.values()) or any(self.budget.actions.values()) or
                    self.policy_errors or log_lines_dropped or svc.get("service_failures") or
                    svc.get("service_starts", 0) > svc.get("services", 0))

    @property
    def reaped_cpu_seconds(self) -> float:
        return self._cpu + (self.native.cpu_seconds if self.native is not None else 0.0)

    @property
    def orphan_cpu_seconds(self) -> float:
        """CPU of every orphan reaped (not the main child's, nor a service's): exact when
        the C core reaps with rusage (on with metrics or budgets)."""
        return self._orphan_cpu + (self.native.cpu_seconds if self.native is not None else 0.0)

    @property
    def latency_buckets(self) -> list:
        if self.native is None:
            return list(self._latency_buckets)
        return [a + b for a, b in zip(self._latency_buckets, self.native.latency())]

    @property
    def latency_sum(self) -> float:
        return self._latency_sum + (self.native.latency_seconds if self.native is not None else 0.0)

    @property
    def latency_count(self) -> int:
        return sum(self.latency_buckets)

    def reaped_total(self, kind: "str | None" = None) -> int:
        return sum(n for (k, _), n in self.reaped.items() if kind is None or k == kind)

    def summary(self) -> dict:
        """The exit summary: one JSON object with the totals."""
        reaped = self.reaped
        return {
            "reaped": sum(reaped.values()),
            "orphans": sum(n for (k, _), n in reaped.items() if k == "orphan"),
            "signals_received": sum(self.signals_received.values()),
            "signals_forwarded": sum(self.signals_forwarded.values()),
            "strays": self.budget.strays_seen,
            "stray_cpu_seconds": round(self.budget.stray_cpu_seconds, 3),
            "stray_cgroup_escapes": self.budget.stray_cgroup_escapes,
            "budget_actions": dict(self.budget.actions),
            "drain": {k: self.drain.get(k, 0) for k in ("terminated", "killed", "survived", "not_permitted")},
            "drain_seconds": None if self.drain_seconds is None else round(self.drain_seconds, 3),
            "main_pid": self.main_pid,
            "main_exit_code": self.main_exit_code,
            "exit_status": self.exit_status,
            "policy_errors": self.policy_errors,
            "policy_restarts": dict(self.policy_restarts),
            "uptime_seconds": round(time.time() - self.start_time, 3),
            **self._service_counts(),
        }

    def _service_counts(self) -> dict:
        """Only with services: how many, how many starts, how many given up."""
        if not self.services:
            return {}
        return {"services": len(self.services), "service_starts": sum(s.starts for s in self.services),
                "service_failures": sum(1 for s in self.services if s.failed)}

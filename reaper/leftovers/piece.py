"""The leftovers piece (policy name "leftovers"): a plugin of the failure
boundary (reaper/policy.py: next_deadline, tick, close) that samples the
process table every SAMPLE_EVERY seconds (reaper/leftovers/tracker.py), starts
an End for each owner found gone with leftovers (reaper/leftovers/ender.py),
sweeps the running ends every SWEEP_EVERY, and tells (publish.py).

A service's exit comes from the services piece (services/runner.py calls
service_ended, and waits for hold() before the next run starts), not a sample
later. From the drain on (the main child ended), the drain ends everything: no
new end starts.
"""
from __future__ import annotations

import os

from reaper.leftovers import publish
from reaper.leftovers.ender import SWEEP_EVERY, End
from reaper.leftovers.mechanisms import SWEEPS, choose, remove_stale
from reaper.log import WARN

SAMPLE_EVERY = 1.0       # seconds: an owner's end is acted on within this (and one sweep)
KEPT_MAX = 256           # reported or stopped ends whose device holders the metrics follow


class Leftovers:
    name = "leftovers"

    def __init__(self, cfg, log, stats, sup, mode: str) -> None:
        from reaper.budgets.ray import RayProcesses
        from reaper.leftovers.devices import DEFAULT_GLOBS, Devices
        from reaper.leftovers.jobs import Jobs
        from reaper.leftovers.tracker import Tracker

        self.cfg, self.log, self.sup = cfg, log, sup
        self.mode = mode
        self.grace = cfg.leftover_grace
        self.devices = Devices(cfg.devices or DEFAULT_GLOBS)
        self.tracker = Tracker(os.getpid(), RayProcesses(), Jobs())
        remove_stale(log)                # the ends' cgroups of reapers killed in an end
        self.cgroups = choose() if self.mode == "end" else None
        mechanism = "SIGSTOP" if self.mode == "stop" else (self.cgroups.name if self.cgroups else SWEEPS)
        # Kept across a restart of the piece: its counters never go back.
        self.pub = getattr(stats, "leftovers", None) or publish.Published(self.mode, mechanism)
        stats.leftovers = self.pub
        self.gpus = self._gpus() if cfg.gpu_memory else None
        if self.gpus is not None:
            self.pub.gpu = {}
        self.ends: list = []             # running ends
        self.kept: list = []             # reported or stopped ends, while any of theirs lives
        self.next_sample = 0.0
        self._sweep_at = 0.0
        what = {"end": f"SIGTERM, SIGKILL after {self.grace:g}s by {mechanism}",
                "stop": "SIGSTOP, kept", "report": "reported"}[self.mode]
        msg = f"leftovers of Ray workers and services: {what}"
        if self.mode in ("end", "stop"):
            log.summary(msg, True)
        else:
            log.info(msg)
        runner = getattr(sup, "services", None)
        if runner is not None:
            runner.leftovers = self

    # --- the plugin interface -----------------------------------------------------------

    def next_deadline(self):
        if self.ends:
            return min(self.next_sample, self._sweep_at)
        return self.next_sample

    def tick(self, now: float) -> None:
        if getattr(self.sup, "phase", "running") != "running":
            self.next_sample = now + SAMPLE_EVERY    # the drain's now
            return
        if now >= self.next_sample:
            self.next_sample = now + SAMPLE_EVERY
            self._sample(now)
        if self.ends:
            self._sweep(now)

    def close(self) -> None:
        for end in self.ends + self.kept:
            end.close()                  # its cgroup, if it is empty by now
        self.ends = []

    # --- the services' hooks -------------------------------------------------------------

    def service_ended(self, pid: int) -> None:
        """A service reaper reaped: its leftovers now."""
        import time

        e = self.tracker.gone(pid)
        if e is not None:
            now = time.monotonic()
            self._begin(e, now)
            if self.ends:
                self._sweep(now)

    def hold(self, name: str, now: float):
        """While the service's previous run's leftovers are being ended: when to look
        again before starting it; None: start it."""
        for end in self.ends:
            if end.owner.kind == "service" and end.owner.name == name:
                return now + SWEEP_EVERY
        return None

    # --- inside -----------------------------------------------------------------------

    def _services(self) -> tuple:
        runner = getattr(self.sup, "services", None)
        if runner is None:
            return {}, set()
        running = {pid: svc.name for pid, svc in runner.by_pid.items()}
        return running, set(running)

    def _sample(self, now: float) -> None:
        services, kept = self._services()
        main = getattr(self.sup, "main_pid", None)
        if main:
            kept.add(main)
        for e in self.tracker.sample(now, services, kept):
            self._begin(e, now)
        self.pub.tracked = sum(1 for v in self.tracker.owned.values() if v is not None)
        self._follow_kept()

    def _begin(self, ended, now: float) -> None:
        end = End(ended, self.mode, self.grace, self.devices, self.cgroups, now, self.gpus)
        if not end.members:
            return
        end.begin()
        if end.done:
            self._told(end)
        else:
            self.ends.append(end)
            self._sweep_at = now + SWEEP_EVERY

    def _sweep(self, now: float) -> None:
        for end in list(self.ends):
            end.tick(now)
            if end.done:
                self.ends.remove(end)
                self._told(end)
        self._sweep_at = now + SWEEP_EVERY

    def _gpus(self):
        from reaper.leftovers.gpumem import Gpus, Unavailable

        try:
            return Gpus()
        except Unavailable as e:
            self.log.warn(f"--gpu-memory: {e}; GPU memory is not read")
            return None

    def _told(self, end) -> None:
        if end.gpu:
            end.gpu_after()
        self.log.event(("leftovers", end.owner.key, end.owner.job), WARN, publish.line(end))
        pub = self.pub
        pub.count(pub.owners, end.owner.kind)
        n = len(end.members)
        if self.mode == "end":
            pub.count(pub.leftovers, "killed", end.killed)
            pub.count(pub.leftovers, "terminated", n - end.killed)
        else:
            pub.count(pub.leftovers, "stopped" if self.mode == "stop" else "reported", n)
        self.kept = [*self.kept[-(KEPT_MAX - 1):], end]
        self._follow_kept()

    def _follow_kept(self) -> None:
        """The device holders among the leftovers still alive, for the metrics."""
        holders: dict = {}
        for end in list(self.kept):
            if not end.alive():
                end.close()              # an end with survivors kept its cgroup: empty now
                self.kept.remove(end)
                continue
            if end.held:
                for dev, n in end.still_holding().items():
                    holders[dev] = holders.get(dev, 0) + n
        self.pub.holders = holders
        if self.gpus is not None:
            gpu: dict = {}
            for end in self.kept:
                for dev in end.held:
                    mine = self.gpus.by_pid(dev)
                    n = sum(mine.get(k[0], 0) for k in end.alive())
                    if n:
                        gpu[dev] = gpu.get(dev, 0) + n
            self.pub.gpu = gpu

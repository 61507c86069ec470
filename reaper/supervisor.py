"""reaper's loop: wait, forward signals, reap, and at the end drain what is left.

Lifecycle (catatonit's rule): setup may fail fast (cli.py); once run() is
entered, reaper never exits except after the main child has exited and the
drain is over. An exception in policy code is logged and the loop goes on.
"""
from __future__ import annotations

import os
import signal
import time
import traceback
from typing import Optional, Protocol

from reaper import signals
from reaper._native import EV_EXIT, Waiter
from reaper.log import Log
from reaper.options import Config
from reaper.stats import REAP_LATENCY_BUCKETS, Stats, exit_code

FOREVER = -1
KILL_WAIT = 5.0          # seconds to wait for SIGKILLed processes to be reaped
KILL_RESCAN = 0.1        # as subreaper, look for late descendants this often while killing
FORCE_AFTER = 3          # the third SIGTERM/SIGINT kills everything at once


class Plugin(Protocol):
    """Periodic policy run from the loop (budgets, metrics file)."""

    name: str

    def next_deadline(self) -> Optional[float]:
        """time.monotonic() at which tick() wants to run next; None: never."""

    def tick(self, now: float) -> None: ...

    def close(self) -> None:
        """Called once at exit, before reaper's own exit status is returned."""


class Supervisor:
    def __init__(self, cfg: Config, log: Log, stats: Stats, sfd: int) -> None:
        self.cfg = cfg
        self.log = log
        self.stats = stats
        self.waiter = Waiter(sfd, REAP_LATENCY_BUCKETS)
        stats.native = self.waiter.totals
        self.pid = os.getpid()
        self.is_pid1 = self.pid == 1
        self.debug = log.enabled(3)      # checked before building debug lines on hot paths
        self.main_pid: Optional[int] = None
        self.supervised: set = set()     # pids reaper started besides the main child
        self.plugins: list = []
        self.phase = "running"
        self.term_count = 0
        self.stop_forwarded = False      # a SIGTERM reached the main child: a requested stop
        self.deadline: Optional[float] = None
        self.drain_started = 0.0
        self.drain_targets: dict = {}    # pid -> start time, at drain start
        self.kill_targets: dict = {}     # pid -> start time, still alive at SIGKILL

    # --- the loop ---------------------------------------------------------

    def run(self, main_pid: int) -> int:
        self.main_pid = main_pid
        # Orphans are counted in C, unless each one must be seen (-w, debug log).
        self.waiter.watch(main_pid, self.cfg.warn_on_reap or self.debug)
        self.waiter.forward(main_pid, self.cfg.process_group, self._forward_table())
        more = False
        while True:
            events, no_children, more = self.waiter.wait(0 if more else self._timeout_ms())
            for ev in events:
                self._guarded("event", self._handle, ev)
            if more:
                continue
            now = time.monotonic()
            for plugin in self.plugins:
                self._guarded(plugin.name, self._tick_if_due, plugin, now)
            if self.phase != "running":
                try:
                    if self._drain_step(no_children, now):
                        return self._finish()
                except Exception as e:
                    # Never stay stuck: a failed step still ends at the deadline.
                    self._policy_error("drain", e)
                    if no_children or now >= (self.deadline or 0) + KILL_WAIT:
                        return self._finish()

    @staticmethod
    def _tick_if_due(plugin, now: float) -> None:
        due = plugin.next_deadline()
        if due is not None and due <= now:
            plugin.tick(now)

    def _timeout_ms(self) -> int:
        if not self.plugins and self.deadline is None:
            return FOREVER
        due = []
        for plugin in self.plugins:
            try:
                d = plugin.next_deadline()
            except Exception as e:
                self._policy_error(plugin.name, e)
                d = None
            if d is not None:
                due.append(d)
        if self.deadline is not None:
            due.append(self.deadline)
        if self.phase == "killing" and not self.is_pid1:
            due.append(time.monotonic() + KILL_RESCAN)
        if not due:
            return FOREVER
        return max(0, int((min(due) - time.monotonic()) * 1000) + 1)

    def _guarded(self, what: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:  # PID 1 must not die of a bug in policy code
            self._policy_error(what, e)

    def _policy_error(self, what: str, e: Exception) -> None:
        self.stats.policy_errors += 1
        self.log.error(f"error in {what} (reaper goes on): {e!r}")
        if self.log.enabled(3):
            for line in traceback.format_exc().splitlines():
                self.log.debug(line)

    def _handle(self, ev) -> None:
        if ev.kind == EV_EXIT:
            self._on_exit(ev)
        else:
            self._on_signal(ev)

    # --- reaping ----------------------------------------------------------

    def _on_exit(self, ev) -> None:
        latency = (ev.at_ns - ev.woke_ns) / 1e9
        cpu = (ev.utime_us + ev.stime_us) / 1e6
        if ev.pid == self.main_pid:
            self._main_exited(ev.code)          # control first: the drain must start
            self.stats.record_reap("main", ev.code, latency, cpu)
            return
        kind = "supervised" if ev.pid in self.supervised else "orphan"
        self.supervised.discard(ev.pid)
        self.stats.record_reap(kind, ev.code, latency, cpu)
        if self.cfg.warn_on_reap and kind == "orphan":
            self.log.warn(f"reaped orphan {ev.pid} ({self._describe(ev.code)})")

    @staticmethod
    def _describe(status: int) -> str:
        if os.WIFSIGNALED(status):
            return f"killed by {signals.name(os.WTERMSIG(status))}"
        return f"exit status {os.WEXITSTATUS(status)}"

    def _main_exited(self, status: int) -> None:
        self.waiter.stop_forwarding()     # before the next wait: the pid is free now
        pid, self.main_pid = self.main_pid, None
        self.stats.main_status = status
        self.stats.main_exit_code = exit_code(status)
        self.stats.main_state = "exited"
        self.log.info(f"main child {pid} ended: {self._describe(status)}")
        self._begin_drain()

    # --- signals ----------------------------------------------------------

    def _forward_table(self) -> dict:
        """For the C core: the signal to send for each one received, and whether
        only another process may have sent it (the fault signals)."""
        table = {}
        for signo in range(1, signals.SIGRTMAX + 1):
            if signo in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
                continue
            table[signo] = (self.cfg.rewrite.get(signo, signo), signo in signals.FAULT_SIGNALS)
        return table

    def _on_signal(self, ev) -> None:
        # The C core has already forwarded it (see _forward_table): bookkeeping only.
        signo = ev.signo
        if ev.pid == self.pid:       # raised by reaper itself (SIGPIPE from a closed pipe)
            return
        self.stats.signals_received[signals.name(signo)] += 1
        if ev.forwarded > 0:
            self.stats.signals_forwarded[signals.name(ev.forwarded)] += 1
            if ev.forwarded == signal.SIGTERM:
                self.stop_forwarded = True
            if self.debug:
                self.log.debug(f"forwarded {signals.name(signo)} as {signals.name(ev.forwarded)} to "
                               f"{'the group of ' if self.cfg.process_group else ''}{self.main_pid}")
        elif self.debug and self.phase == "running":
            why = os.strerror(-ev.forwarded) if ev.forwarded < 0 else \
                "raised by the kernel" if signo in signals.FAULT_SIGNALS else "dropped by --rewrite"
            self.log.debug(f"{signals.name(signo)} not forwarded: {why}")
        if signo == signal.SIGTERM or signo == signal.SIGINT:
            self.term_count += 1
        if self.phase != "running":
            self._signal_while_draining(signo, signals.name(signo))

    def _signal_while_draining(self, signo: int, sname: str) -> None:
        if signo in (signal.SIGTERM, signal.SIGINT) and self.term_count >= FORCE_AFTER \
                and self.phase == "draining":
            self.log.warn(f"{sname} received {self.term_count} times: killing everything now")
            self._kill_all()
        else:
            self.log.info(f"{sname} received while draining: not cutting the grace period short")

    # --- end of life --------------------------------------------------------

    def _scope(self) -> dict:
        """pid -> start time of every process reaper is responsible for now: the whole
        namespace as PID 1, else its descendants. One read of /proc/*/stat, no psutil."""
        from reaper import nodestats

        table = nodestats.scan()
        pids = set(table) - {self.pid} if self.is_pid1 else nodestats.descendants(table, self.pid)
        return {pid: table[pid].start for pid in pids if table[pid].state != "Z"}

    @staticmethod
    def _alive(targets: dict) -> dict:
        from reaper import nodestats

        alive = {}
        for pid, start in targets.items():
            p = nodestats.read_proc(pid)
            if p is not None and p.start == start and p.state != "Z":
                alive[pid] = start
        return alive

    def _signal_scope(self, signo: int) -> None:
        # Checked at the call, not from startup state: getpid() == 1 means PID 1 of
        # its own namespace, where -1 is exactly "everyone but me". Anywhere else
        # kill(-1) would reach every process the user owns.
        if os.getpid() == 1:
            try:
                os.kill(-1, signo)
            except ProcessLookupError:
                pass
            return
        for pid, start in self._scope().items():
            self._signal_one(pid, start, signo)

    @staticmethod
    def _signal_one(pid: int, start: float, signo: int) -> None:
        """Signal pid only if it is still the process that was found: the pidfd is
        taken first, so the start-time check after it cannot be outrun by pid reuse."""
        from reaper import nodestats

        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        except (AttributeError, OSError):
            fd = None                       # no pidfds on this kernel: check, then kill
        try:
            p = nodestats.read_proc(pid)
            if p is None or p.start != start:
                return
            if fd is not None:
                signal.pidfd_send_signal(fd, signo)
            else:
                os.kill(pid, signo)
        except ProcessLookupError:
            pass
        finally:
            if fd is not None:
                os.close(fd)

    def _begin_drain(self) -> None:
        # Phase and deadline first: whatever fails below, the loop still ends.
        self.phase = self.stats.phase = "draining"
        self.drain_started = time.monotonic()
        self.deadline = self.drain_started + self.cfg.grace
        self._guarded("drain", self._terminate_scope)

    def _terminate_scope(self) -> None:
        self.drain_targets = self._scope()
        if not self.drain_targets:
            return
        if self.cfg.grace <= 0:
            self._kill_all()
            return
        self.log.info(f"draining {len(self.drain_targets)} remaining process(es): "
                      f"SIGTERM, then SIGKILL after {self.cfg.grace:g}s")
        self._signal_scope(signal.SIGTERM)
        self._signal_scope(signal.SIGCONT)   # a stopped process must run to handle SIGTERM

    def _kill_all(self) -> None:
        self.phase = self.stats.phase = "killing"
        self.deadline = time.monotonic() + KILL_WAIT
        try:   # who is left, for the drain statistics; SIGKILL goes out whatever happens here
            alive = self._alive(self.drain_targets)
            late = {p: c for p, c in self._scope().items() if p not in alive}
            self.kill_targets = {**alive, **late}
            self.stats.drain["terminated"] += len(self.drain_targets) - len(alive)
        finally:
            self._signal_scope(signal.SIGKILL)
        if self.kill_targets:
            self.log.info(f"sent SIGKILL to {len(self.kill_targets)} process(es) left")

    def _drain_step(self, no_children: bool, now: float) -> bool:
        """Advances the drain; True when reaper may exit."""
        if no_children:
            if self.phase == "draining":
                self.stats.drain["terminated"] += len(self.drain_targets)
            else:
                self.stats.drain["killed"] += len(self.kill_targets)
            return True
        if self.phase == "draining" and now >= self.deadline:
            self._kill_all()
        elif self.phase == "killing":
            if now >= self.deadline:
                survivors = self._alive(self.kill_targets)
                self.stats.drain["killed"] += len(self.kill_targets) - len(survivors)
                self.stats.drain["survived"] += len(survivors)
                self.log.warn(f"{len(survivors)} process(es) survived SIGKILL: {sorted(survivors)[:10]}")
                return True
            if not self.is_pid1:
                self._signal_scope(signal.SIGKILL)   # descendants forked after the last look
        return False

    def _finish(self) -> int:
        self.phase = self.stats.phase = "done"
        self.stats.drain_seconds = time.monotonic() - self.drain_started
        for plugin in self.plugins:
            self._guarded(plugin.name, plugin.close)
        code = self.stats.main_exit_code
        stopped = self.cfg.exit_zero_on_stop and self.stop_forwarded
        status = 0 if code in self.cfg.remap_exit or stopped else code
        self.stats.exit_status = status
        return status

"""reaper's core loop: wait, reap, note forwarded signals, and at the end drain what is left.

This is the inside of the failure boundary (reaper/boundary.py): it reaches
policy (statistics, budgets, metrics) only through ``self.policy``, which
switches a failing piece off, and it treats every OS fault of its own (a wait
that fails, a process it may not signal, no /proc) as something to go on
from. Anything that still escapes run() lands in the boundary's minimal loop.
"""
from __future__ import annotations

import errno
import os
import time

# _signal: the numbers and pidfd_send_signal without the enum module (start-up time and memory).
import _signal as signal

from reaper import signals
from reaper._native import EV_EXIT, EV_SIGNAL, EV_STOP, exit_code, ms_until
from reaper.drain import Drain
from reaper.log import DEBUG, ERROR, INFO, Log
from reaper.options import Config
from reaper.policy import SERVICES, STATISTICS
from reaper.stats import Stats
from reaper.status import from_code

WAIT_RETRY = 0.01        # after a failed wait (ENOMEM), before the next one
FORCE_AFTER = 3          # the third SIGTERM/SIGINT kills everything at once
# Job control: received, forwarded, then reaper stops itself (not as PID 1); a
# main child stopped by one of them is followed (reaper stops too).
JOB_STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
# A stop asked from outside (Kubernetes, docker stop, Ctrl-C, Ctrl-\\): reaper_stop_requested.
STOP_REQUESTS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


class Supervisor:
    # The budgets' scope (commands/watch.py's WatchScope is the other): reaper watches no namespace.
    watch = False

    def __init__(self, cfg: Config, log: Log, stats: Stats, waiter, policy, forwarding: dict) -> None:
        self.cfg = cfg
        self.log = log
        self.stats = stats
        self.waiter = waiter             # the C core's wait, set up by the boundary
        self.policy = policy             # boundary.Policy: the pieces that may be switched off
        self.pid = os.getpid()
        self.is_pid1 = self.pid == 1
        self.watch = False               # reaper's scope (reaper/scope.py): never watch mode's whole namespace
        self.debug = log.enabled(DEBUG)  # checked before building debug lines on hot paths
        self.forwarding = forwarding     # _native.forward_table: armed again for a main child started late
        # The end of everything left (reaper/drain.py): its phase is the Supervisor's.
        self.drain = Drain(cfg, log, stats, policy, self)
        self.main_pid: "int | None" = None
        self.supervised: set = set()     # pids reaper started besides the main child
        self.term_count = 0
        self.stop_forwarded = False      # a SIGTERM reached the main child: a requested stop
        self.wait_errors = 0
        self.batch: list = []            # the events of the current wait, for look-ahead
        # Supervised services (reaper/services/): the runner (the services property), set
        # by the "services" piece; the main child is then started from the loop
        # (spawn_main, set by reaper/pieces.py).
        self.spawn_main = None           # () -> (pid, None) or (None, exit status)
        self.awaiting_main = False       # services run, the main child not yet
        self.fixed_status: "int | None" = None   # reaper's exit status, decided before any main child
        self.service_failure = False     # --on-service-failure stop: a service was given up
        # The C core's quiet end is armed (boundary.supervise): checked before each
        # wait, and switched off at the first thing the end would have to say.
        self.quiet_end = False

    # What the drain, the services runner, the metrics and the budgets read of the
    # Supervisor: reaper's scope (reaper/scope.py) and the drain's state.

    @property
    def phase(self) -> str:
        """running, draining, killing, done."""
        return self.drain.phase

    @property
    def deadline(self) -> "float | None":
        return self.drain.deadline

    @property
    def main_group(self) -> int:
        """The main child's process group (its pid), for forwarding with -g and the drain
        without /proc; 0 in pause mode."""
        return self.drain.main_group

    @main_group.setter
    def main_group(self, pid: int) -> None:
        self.drain.main_group = pid

    @property
    def services(self):
        return self.drain.services

    @services.setter
    def services(self, runner) -> None:
        self.drain.services = runner

    def request_stop(self) -> None:
        """--on-service-failure stop (the services runner): the main child is stopped as
        on a SIGTERM to reaper (forwarded as -r says), and reaper exits non-zero whatever
        -e and --exit-zero-on-stop say; before it started (--wait-ready), it never starts
        and reaper exits 1."""
        self.service_failure = True
        if self.awaiting_main:
            self.fixed_status = 1
            self._begin_drain()
            return
        if self.main_pid is None or self.waiter.main_reaped or self.phase != "running":
            return                             # it has ended already: the drain is on its way
        signo = self.forwarding[signal.SIGTERM][0] or signal.SIGTERM
        for target in ([-self.main_group] if self.cfg.process_group and self.main_group else []) + [self.main_pid]:
            try:
                os.kill(target, signo)
                break
            except OSError:
                continue

    # --- the loop ---------------------------------------------------------

    def run(self, main_pid: int, first=None) -> int:
        """The loop, to the end of the drain. first: a batch the boundary's first
        wait took before the policy was loaded, handled before anything else."""
        self.main_pid = main_pid or None
        self.main_group = main_pid or 0      # pause mode: no main child, no group
        self.awaiting_main = not main_pid and self.spawn_main is not None and self.phase == "running"
        more = False
        while True:
            if self.awaiting_main:
                self._maybe_start_main()
            try:
                if first is not None:
                    (events, no_children, more), first = first, None
                else:
                    if self.quiet_end and not self._nothing_to_say():
                        self.quiet_end = False       # for good: what there is to say stays to be said
                        self.waiter.quiet_end(False)
                    events, no_children, more = self.waiter.wait(0 if more else self._timeout_ms())
            except OSError as e:
                self.wait_failed(e)
                continue
            self.batch = events
            for i, ev in enumerate(events):
                self._handle(ev, i)
            if self.waiter.fds_ready and self.services is not None:    # a readiness pipe
                self.policy.call(SERVICES, self.services.read_ready)
            # The C core records the main child's status itself: decided from there,
            # not from an event, so nothing in Python can lose it.
            if self.main_pid is not None and self.waiter.main_reaped:
                self.drain.no_children = no_children
                self._main_exited(self.waiter.main_status)
            # Deadlines are looked at after every batch, even when more is queued:
            # a flood of signals must not hold the drain past its end.
            now = time.monotonic()
            self.policy.tick(now)
            if self.phase != "running" and self._may_exit(no_children, now):
                return self._finish()

    def _nothing_to_say(self) -> bool:
        """Whether the C core's quiet end may stay armed for the next wait: the
        main child runs, and nothing yet happened that the end would report (a
        policy error, a lost or pending log line, a stop that --exit-zero-on-stop
        turns into 0). Once False, the quiet end is off for the rest of the run."""
        return self.main_pid is not None and self.phase == "running" and self.services is None and \
            not self.stats.policy_errors and not self.log.pending() and \
            not (self.cfg.exit_zero_on_stop and self.stop_forwarded)

    def _may_exit(self, no_children: bool, now: float) -> bool:
        if not self.cfg.no_drain:
            return self.drain.step(no_children, now)
        if self.services is None:
            return True
        # --no-drain still stops the services, in order, within the grace.
        if now >= self.drain.deadline:
            self.policy.call(SERVICES, self.services.kill_left)
            return True
        return self.policy.call(SERVICES, self.services.drain_step, now) is not False

    def _maybe_start_main(self) -> None:
        """Services mode: the main child starts once the services piece lets it (at
        once, or when the --service-ready ones are ready), or when that piece is off."""
        if self.services is not None and SERVICES not in self.policy.off and \
                not self.policy.call(SERVICES, self.services.main_may_start) and SERVICES not in self.policy.off:
            return
        self.awaiting_main = False
        pid, status = self.spawn_main()
        if pid is None:                  # it could not be started: stop the services, exit with why
            self.fixed_status = status
            self._begin_drain()
            return
        self.main_pid = self.main_group = pid
        self.waiter.watch(pid, self.waiter.reports_all, not self.is_pid1)
        self.waiter.forward(pid, self.cfg.process_group, self.forwarding)

    def _timeout_ms(self) -> int:
        due = self.policy.next_deadline()
        d = self.drain.next_deadline()
        if d is not None and (due is None or d < due):
            due = d
        return ms_until(due)

    def wait_failed(self, e: OSError) -> None:
        # poll() can fail only for want of kernel memory: say it once, retry soon.
        # The reaping in the next wait does not depend on it.
        self.wait_errors += 1
        self.log.event("wait", INFO if e.errno == errno.EINTR else ERROR, f"wait failed: {e.strerror}; retrying")
        time.sleep(WAIT_RETRY)

    def _handle(self, ev, i: int = 0) -> None:
        if ev.kind == EV_EXIT:
            self.policy.call(STATISTICS, self._record_exit, ev)
            if self.services is not None and ev.pid != self.main_group:
                self.policy.call(SERVICES, self.services.on_exit, ev.pid, ev.code)
        elif ev.kind == EV_STOP:
            self._on_main_stopped(ev, i)
        else:
            self._on_signal(ev, i)

    # --- reaping ----------------------------------------------------------

    def _record_exit(self, ev) -> None:
        latency = (ev.at_ns - ev.woke_ns) / 1e9
        cpu = (ev.utime_us + ev.stime_us) / 1e6
        if ev.pid == self.main_group:
            kind = "main"
        elif ev.pid in self.supervised:
            kind = "supervised"
            self.supervised.discard(ev.pid)
        else:
            kind = "orphan"
        self.stats.record_reap(kind, ev.code, latency, cpu)
        if self.cfg.warn_on_reap and kind == "orphan":
            self.log.warn(f"reaped orphan {ev.pid} ({self._describe(ev.code)})")

    @staticmethod
    def _describe(status: int) -> str:
        if os.WIFSIGNALED(status):
            return f"killed by {signals.name(os.WTERMSIG(status))}"
        return f"exit status {os.WEXITSTATUS(status)}"

    def _main_exited(self, status: int) -> None:
        pid, self.main_pid = self.main_pid, None     # the C core stopped forwarding to it
        self.policy.call(STATISTICS, self._record_main, status)
        if self.log.enabled(INFO):   # not even formatted on the way out unless shown
            self.log.info(f"main child {pid} ended: {self._describe(status)}")
        self._begin_drain()

    def _record_main(self, status: int) -> None:
        self.stats.main_status = status
        self.stats.main_exit_code = exit_code(status)
        self.stats.main_state = "exited"

    # --- signals ----------------------------------------------------------

    def _on_signal(self, ev, i: int = 0) -> None:
        # The C core has already forwarded it (_native.forward_table): bookkeeping,
        # and job control.
        signo = ev.signo
        if ev.pid == self.pid:       # raised by reaper itself (SIGPIPE from a closed pipe)
            return
        if ev.forwarded == signal.SIGTERM:
            self.stop_forwarded = True
        if signo in STOP_REQUESTS and self.stats.main_state in ("starting", "running"):
            self.stats.stop_requested = True
        if signo == signal.SIGTERM or signo == signal.SIGINT:
            self.term_count += 1
        self.policy.call(STATISTICS, self._record_signal, ev)
        if self.phase != "running":
            self._signal_while_draining(signo)
        elif self.cfg.pause and signo in (signal.SIGTERM, signal.SIGINT):
            self.log.info(f"{signals.name(signo)} received: pause mode ends")
            self._begin_drain()
        elif self.awaiting_main and signo in (signal.SIGTERM, signal.SIGINT):
            # Services waiting for readiness: the main child never starts. The status
            # is the one it would have had, killed by the signal (-e, --exit-zero-on-stop apply).
            self.log.info(f"{signals.name(signo)} received before the main child started: not starting it")
            self.fixed_status = from_code(self.cfg, 128 + signo, signo == signal.SIGTERM)
            self._begin_drain()
        elif signo in JOB_STOPS and ev.forwarded != 0 and self.main_pid is not None and \
                not (signo == self.cfg.pdeath_signal and ev.code == signals.SI_USER and ev.pid == 0):
            # (-p TSTP: the parent died, nobody would continue reaper: forwarded only)
            # dumb-init's job control: forwarded (after --rewrite), then reaper stops
            # too, so that the shell that started it sees its job stopped.
            self._stop_self(f"{signals.name(signo)} received", i)

    # --- job control --------------------------------------------------------

    def _on_main_stopped(self, ev, i: int) -> None:
        """The main child was stopped (reported only when reaper is not PID 1). A
        terminal stop (Ctrl-Z reaches the child's group, the terminal's foreground,
        not reaper): reaper stops too, so that its shell takes the terminal back."""
        if ev.pid != self.main_pid or ev.signo not in JOB_STOPS or self.phase != "running":
            return
        from reaper.procfs.processes import read_proc

        p = read_proc(ev.pid)
        if p is not None and p.state not in ("T", "t"):
            return                   # already continued: nothing to follow
        self._stop_self(f"main child {ev.pid} stopped by {signals.name(ev.signo)}", i, group=True)

    def _stop_self(self, why: str, i: int, group: bool = False) -> None:
        """Stops reaper with SIGSTOP (not as PID 1: the kernel would ignore it), then,
        once continued, gives the terminal back to the child's group and continues it."""
        if self.is_pid1 or os.getpid() == 1:
            return
        # A SIGCONT already sent (later in this batch, or still queued) came after
        # the stop it answers: stopping now would wait for another one.
        later = any(e.kind == EV_SIGNAL and e.signo == signal.SIGCONT for e in self.batch[i + 1:])
        if later or signal.SIGCONT in signal.sigpending():
            return
        if not _job_control_shell():
            # Nobody would continue reaper (no terminal, or no job-control shell above
            # it): any process that may stop the child, or signal reaper, would freeze
            # reaper's reaping for good.
            self.log.event(("job-stop",), INFO, f"{why}: reaper goes on (no terminal and job-control shell "
                                                "to continue it)")
            return
        self.log.event(("job-stop",), INFO, f"{why}: reaper stops too (job control)")
        try:
            os.kill(self.pid, signal.SIGSTOP)    # takes effect before kill() returns
        except OSError:
            return
        self.log.event(("job-cont",), INFO, "continued: the main child gets the terminal back")
        self._resume_child(group)

    def _resume_child(self, group: bool) -> None:
        if self.main_pid is None:
            return
        try:
            # Only if reaper's group has the terminal (fg, not bg): never take it from the shell.
            if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
                os.tcsetpgrp(0, self.main_group)
        except OSError:
            pass
        # A terminal stop stopped the child's whole group; a forwarded one is
        # answered by the SIGCONT the C core forwards as it was received.
        if group and self.main_group:       # never kill(0): that would be reaper's own group
            try:
                os.kill(-self.main_group, signal.SIGCONT)
            except OSError:
                pass

    def _record_signal(self, ev) -> None:
        signo, sname = ev.signo, signals.name(ev.signo)
        self.stats.signals_received[sname] += 1
        if ev.forwarded > 0:
            self.stats.signals_forwarded[signals.name(ev.forwarded)] += 1
        if not self.debug:
            return
        if ev.forwarded > 0:
            self.log.event(("forwarded", signo), DEBUG,
                           f"forwarded {sname} as {signals.name(ev.forwarded)} to "
                           f"{'the group of ' if self.cfg.process_group else ''}{self.main_pid}")
        elif self.phase == "running":
            why = os.strerror(-ev.forwarded) if ev.forwarded < 0 else \
                "raised by the kernel" if signo in signals.FAULT_SIGNALS else "dropped by --rewrite"
            self.log.event(("dropped", signo), DEBUG, f"{sname} not forwarded: {why}")

    def _signal_while_draining(self, signo: int) -> None:
        sname = signals.name(signo)
        if signo in (signal.SIGTERM, signal.SIGINT) and self.term_count >= FORCE_AFTER \
                and self.phase == "draining":
            self.log.warn(f"{sname} received {self.term_count} times: killing everything now")
            self.drain.kill_now()
        else:
            # A flood must not become a flood of lines: one, then a count.
            self.log.event(("draining", signo), INFO,
                           f"{sname} received while draining: not cutting the grace period short")

    # --- end of life --------------------------------------------------------

    def _begin_drain(self) -> None:
        self.awaiting_main = False
        self.drain.begin()

    def _finish(self) -> int:
        self.drain.done()
        self.policy.close()
        code = 0 if self.cfg.pause else exit_code(self.waiter.main_status)
        status = from_code(self.cfg, code, self.stop_forwarded)
        if self.fixed_status is not None:          # the main child never ran
            status = self.fixed_status
        elif self.service_failure:                 # --on-service-failure stop: never 0
            status = code or 1
        self.stats.exit_status = status
        return status


def _job_control_shell() -> bool:
    """A stop of reaper would be answered: reaper has a controlling terminal and its
    parent, in the same session, put it in a process group of its own (a job of a
    job-control shell, whose fg or bg continues it). Otherwise (a container, a pod,
    `docker --init`, a shell without job control) nothing would: as the kernel does
    for an orphaned process group, the stop is not followed."""
    from reaper.procfs.processes import stat_fields

    st = stat_fields("self", maxsplit=6)
    try:
        ppid, pgrp, session, tty = (int(x) for x in st[1][1:5])   # after the state
        if tty == 0 or ppid <= 1:
            return False
        return os.getsid(ppid) == session and os.getpgid(ppid) != pgrp
    except (TypeError, ValueError, OSError):
        return False

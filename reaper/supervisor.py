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
from reaper._native import EV_EXIT, EV_SIGNAL, EV_STOP, ms_until, scope_is_empty
from reaper.boundary import own_children
from reaper.log import DEBUG, ERROR, INFO, Log
from reaper.options import Config
from reaper.stats import Stats, exit_code

KILL_WAIT = 5.0          # seconds to wait for SIGKILLed processes to be reaped
RESCAN_FIRST = 0.05      # as subreaper, look for late children this soon after SIGKILL,
RESCAN_MAX = 1.0         # then twice as long each time, up to this
WAIT_RETRY = 0.01        # after a failed wait (ENOMEM), before the next one
FORCE_AFTER = 3          # the third SIGTERM/SIGINT kills everything at once
# Job control: received, forwarded, then reaper stops itself (not as PID 1); a
# main child stopped by one of them is followed (reaper stops too).
JOB_STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
# A stop asked from outside (Kubernetes, docker stop, Ctrl-C, Ctrl-\\): reaper_stop_requested.
STOP_REQUESTS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


_STOPS = (1 << (signal.SIGSTOP - 1),
          sum(1 << (s - 1) for s in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)))


def _stop_pending(pid: int) -> bool:
    """True if pid has a stop signal pending that will stop it: SIGSTOP, or a
    job-control one it neither blocks nor ignores (its default action is to stop;
    a handler of its own is counted too, harmlessly)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f if line[:3] in (b"Sig", b"Shd"))
        pending = int(fields[b"SigPnd"], 16) | int(fields[b"ShdPnd"], 16)
        held = int(fields[b"SigBlk"], 16) | int(fields[b"SigIgn"], 16)
    except (OSError, ValueError, KeyError):
        return False
    return bool(pending & _STOPS[0] or pending & _STOPS[1] & ~held)


class Supervisor:
    def __init__(self, cfg: Config, log: Log, stats: Stats, waiter, policy) -> None:
        self.cfg = cfg
        self.log = log
        self.stats = stats
        self.waiter = waiter             # the C core's wait, set up by the boundary
        self.policy = policy             # boundary.Policy: the pieces that may be switched off
        self.pid = os.getpid()
        self.is_pid1 = self.pid == 1
        self.debug = log.enabled(DEBUG)  # checked before building debug lines on hot paths
        self.main_pid: "int | None" = None
        self.main_group = 0              # the main child's process group, for the drain without /proc
        self.supervised: set = set()     # pids reaper started besides the main child
        self.phase = "running"
        self.term_count = 0
        self.stop_forwarded = False      # a SIGTERM reached the main child: a requested stop
        self.deadline: "float | None" = None
        self.rescan_at: "float | None" = None
        self.rescan_every = RESCAN_FIRST
        self.drain_started = 0.0
        self.drain_targets: dict = {}    # pid -> start time, at drain start
        self.kill_targets: dict = {}     # pid -> start time, still alive at SIGKILL
        self.denied: dict = {}           # pid -> name: processes reaper may not signal
        self.wait_errors = 0
        self.stopped: set = set()        # pids seen stopped (state T or t) by the last scope scan
        self.batch: list = []            # the events of the current wait, for look-ahead
        self.no_children = False         # the last wait found no child left (ECHILD)
        # Supervised services (reaper/services/): the runner, set by the "services" piece;
        # the main child is then started from the loop (spawn_main, set by reaper/pieces.py).
        self.services = None
        self.spawn_main = None           # () -> (pid, None) or (None, exit status)
        self.awaiting_main = False       # services run, the main child not yet
        self.fixed_status: "int | None" = None   # reaper's exit status, decided before any main child
        self.service_failure = False     # --on-service-failure stop: a service was given up
        # The C core's quiet end is armed (boundary.supervise): checked before each
        # wait, and switched off at the first thing the end would have to say.
        self.quiet_end = False

    # --- the loop ---------------------------------------------------------

    def run(self, main_pid: int, first=None) -> int:
        """The loop, to the end of the drain. first: a batch the boundary's first
        wait took before the policy was loaded, handled before anything else."""
        self.main_pid = main_pid or None
        self.main_group = main_pid or 0      # pause mode: no main child, no group
        self.awaiting_main = not main_pid and self.spawn_main is not None and self.phase == "running"
        spec = self.waiter.spec
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
                self.policy.call("services", self.services.read_ready)
            # The C core records the main child's status itself: decided from there,
            # not from an event, so nothing in Python can lose it.
            if self.main_pid is not None and spec.watch_reaped:
                self.no_children = no_children
                self._main_exited(spec.watch_status)
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
            return self._drain_step(no_children, now)
        if self.services is None:
            return True
        # --no-drain still stops the services, in order, within the grace.
        if now >= self.deadline:
            self.policy.call("services", self.services.kill_left)
            return True
        return self.policy.call("services", self.services.drain_step, now) is not False

    def _maybe_start_main(self) -> None:
        """Services mode: the main child starts once the services piece lets it (at
        once, or when the --service-ready ones are ready), or when that piece is off."""
        if self.services is not None and "services" not in self.policy.off and \
                not self.policy.call("services", self.services.main_may_start) and "services" not in self.policy.off:
            return
        self.awaiting_main = False
        pid, status = self.spawn_main()
        if pid is None:                  # it could not be started: stop the services, exit with why
            self.fixed_status = status
            self._begin_drain()
            return
        self.main_pid = self.main_group = pid
        spec = self.waiter.spec
        self.waiter.watch(pid, bool(spec.report_all), not self.is_pid1)
        from reaper.boundary import forward_table

        self.waiter.forward(pid, self.cfg.process_group, forward_table(self.cfg.rewrite))

    def _timeout_ms(self) -> int:
        due = self.policy.next_deadline()
        for d in (self.deadline, self.rescan_at):
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
            self.policy.call("statistics", self._record_exit, ev)
            if self.services is not None and ev.pid != self.main_group:
                self.policy.call("services", self.services.on_exit, ev.pid, ev.code)
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
        self.policy.call("statistics", self._record_main, status)
        if self.log.enabled(INFO):   # not even formatted on the way out unless shown
            self.log.info(f"main child {pid} ended: {self._describe(status)}")
        self._begin_drain()

    def _record_main(self, status: int) -> None:
        self.stats.main_status = status
        self.stats.main_exit_code = exit_code(status)
        self.stats.main_state = "exited"

    # --- signals ----------------------------------------------------------

    def _on_signal(self, ev, i: int = 0) -> None:
        # The C core has already forwarded it (boundary.forward_table): bookkeeping,
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
        self.policy.call("statistics", self._record_signal, ev)
        if self.phase != "running":
            self._signal_while_draining(signo)
        elif self.cfg.pause and signo in (signal.SIGTERM, signal.SIGINT):
            self.log.info(f"{signals.name(signo)} received: pause mode ends")
            self._begin_drain()
        elif self.awaiting_main and signo in (signal.SIGTERM, signal.SIGINT):
            # Services waiting for readiness: the main child never starts. The status
            # is the one it would have had, killed by the signal (-e, --exit-zero-on-stop apply).
            self.log.info(f"{signals.name(signo)} received before the main child started: not starting it")
            code = 128 + signo
            stopped = self.cfg.exit_zero_on_stop and signo == signal.SIGTERM
            self.fixed_status = 0 if code in self.cfg.remap_exit or stopped else code
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
        from reaper import nodestats

        p = nodestats.read_proc(ev.pid)
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
            self._kill_all()
        else:
            # A flood must not become a flood of lines: one, then a count.
            self.log.event(("draining", signo), INFO,
                           f"{sname} received while draining: not cutting the grace period short")

    # --- end of life --------------------------------------------------------

    def _scope(self) -> dict:
        """pid -> start time of every process reaper is responsible for now: the whole
        namespace as PID 1, else its descendants. One read of /proc/*/stat, no psutil.
        Empty without /proc (then said once)."""
        from reaper import nodestats

        table = nodestats.scan()
        if not table and not os.path.exists("/proc/self/stat"):
            self._once_no_proc()
            return {}
        pids = set(table) - {self.pid} if self.is_pid1 else nodestats.descendants(table, self.pid)
        self.stopped = {pid for pid in pids if table[pid].state in ("T", "t")}
        return {pid: table[pid].start for pid in pids if table[pid].state != "Z"}

    def _once_no_proc(self) -> None:
        if self.is_pid1:
            return        # kill(-1) needs no /proc: the drain works, only its counts are unknown
        self.log.event("no-proc", 1, "no /proc: cannot see reaper's descendants; only the main "
                                     "child's process group is signalled at the end")

    @staticmethod
    def _alive(targets: dict) -> dict:
        from reaper import nodestats

        alive = {}
        for pid, start in targets.items():
            p = nodestats.read_proc(pid)
            if p is not None and p.start == start and p.state != "Z":
                alive[pid] = start
        return alive

    def _signal_scope(self, signo: int, targets: "dict | None" = None) -> None:
        # Checked at the call, not from startup state: getpid() == 1 means PID 1 of
        # its own namespace, where -1 is exactly "everyone but me". Anywhere else
        # kill(-1) would reach every process the user owns. (Not while services are
        # kept out of the round: they are stopped later, one at a time.)
        if os.getpid() == 1 and (signo == signal.SIGKILL or not self._services_kept()):
            try:
                os.kill(-1, signo)
            except OSError:   # ESRCH: nobody left; EPERM: none it may signal
                pass
            return
        targets = self._scope() if targets is None else targets
        if not targets and not os.path.exists("/proc/self/stat"):
            if not self.main_group:
                return          # pause mode: no group to fall back on (kill(0) would be reaper's own)
            # Blind without /proc: the main child's group at least (a group id
            # stays taken while the group has members, so it names no stranger).
            try:
                os.kill(-self.main_group, signo)
            except OSError:
                pass
            return
        denied = []
        for pid, start in targets.items():
            if not self._signal_one(pid, start, signo) and pid not in self.denied:
                denied.append(pid)
        if denied:
            self._note_denied(denied, signo)

    def _note_denied(self, pids: list, signo: int) -> None:
        """Names, once each, the processes reaper may not signal (EPERM)."""
        from reaper.proctable import read_comm

        for pid in pids:
            self.denied[pid] = read_comm(pid)
        self.policy.call("statistics", self._count_denied, len(pids))
        named = ", ".join(f"{pid} ({self.denied[pid]})" for pid in pids[:10])
        more = f" and {len(pids) - 10} more" if len(pids) > 10 else ""
        self.log.warn(f"not permitted to signal {len(pids)} process(es) ({signals.name(signo)}): "
                      f"{named}{more}; the drain goes on without them")

    def _count_denied(self, n: int) -> None:
        self.stats.drain["not_permitted"] += n

    @staticmethod
    def _signal_one(pid: int, start: float, signo: int) -> bool:
        """Signals pid only if it is still the process that was found: the pidfd is
        taken first, so the start-time check after it cannot be outrun by pid reuse.
        False only if reaper may not signal it (EPERM); a process gone is fine."""
        from reaper import nodestats

        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return True
        except (AttributeError, OSError):
            fd = None                       # no pidfds on this kernel: check, then kill
        try:
            p = nodestats.read_proc(pid)
            if p is None or p.start != start:
                return True
            if fd is not None:
                signal.pidfd_send_signal(fd, signo)
            else:
                os.kill(pid, signo)
        except ProcessLookupError:
            pass
        except PermissionError:
            return False
        finally:
            if fd is not None:
                os.close(fd)
        return True

    def _kill_children(self) -> None:
        for pid in own_children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            except PermissionError:
                if pid not in self.denied:
                    self._note_denied([pid], signal.SIGKILL)

    def _begin_drain(self) -> None:
        # Phase and deadline first: whatever fails below, the loop still ends.
        self.phase = self.stats.phase = "draining"
        self.drain_started = time.monotonic()
        self.deadline = self.drain_started + self.cfg.grace
        self.awaiting_main = False
        if self.services is not None:   # no more restarts; stopped after the rest (drain_step)
            self.policy.call("services", self.services.begin_drain)
        if self.cfg.no_drain:
            return                  # --no-drain: the rest is left alone (run() exits now)
        self._terminate_scope()

    def _services_kept(self) -> bool:
        return self.services is not None and "services" not in self.policy.off and \
            bool(self.policy.call("services", self.services.kept))

    def _terminate_scope(self) -> None:
        if scope_is_empty(self.no_children, self.main_group):
            self.drain_targets = {}                 # the common end: no /proc scan, no imports
            return
        self.drain_targets = self._scope()
        if self._services_kept():       # the services and their trees come later, in order
            self.drain_targets = self.policy.call("services", self.services.exclude, self.drain_targets) \
                or {}
        if not self.drain_targets and os.path.exists("/proc/self/stat"):
            return                                  # nothing left: the next wait says ECHILD
        if self.cfg.grace <= 0:
            self._kill_all()
            return
        if self.drain_targets:
            self.log.info(f"draining {len(self.drain_targets)} remaining process(es): "
                          f"SIGTERM, then SIGKILL after {self.cfg.grace:g}s")
        self._signal_scope(signal.SIGTERM, self.drain_targets)
        # A stopped process must run to handle SIGTERM: SIGCONT to those /proc shows
        # stopped, and only to them (without /proc, to all, as it cannot tell).
        if not os.path.exists("/proc/self/stat"):
            self._signal_scope(signal.SIGCONT, self.drain_targets)
            return
        # ...and to those about to stop (a stop signal pending, not yet acted on): they
        # would stop in their SIGTERM handler (the lower signal is taken first).
        for pid in sorted(self.drain_targets):
            if pid in self.stopped or _stop_pending(pid):
                self._signal_one(pid, self.drain_targets[pid], signal.SIGCONT)

    def _kill_all(self) -> None:
        self.phase = self.stats.phase = "killing"
        self.deadline = time.monotonic() + KILL_WAIT
        try:   # who is left, for the drain statistics; SIGKILL goes out whatever happens here
            alive = self._alive(self.drain_targets)
            scope = self._scope()
            late = {p: c for p, c in scope.items() if p not in alive}
            self.kill_targets = {**alive, **late}
            self.stats.drain["terminated"] += len(self.drain_targets) - len(alive)
        finally:
            self._signal_scope(signal.SIGKILL, None if self.is_pid1 else self.kill_targets or None)
        if not self.is_pid1:
            self.rescan_every = RESCAN_FIRST
            self.rescan_at = time.monotonic() + self.rescan_every
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
        elif self.phase == "draining" and self.services is not None:
            self.policy.call("services", self.services.drain_step, now)    # the ordered stop
        elif self.phase == "killing":
            if now >= self.deadline:
                survivors = self._alive(self.kill_targets)
                self.stats.drain["killed"] += len(self.kill_targets) - len(survivors)
                self.stats.drain["survived"] += len(survivors)
                if survivors:
                    self.log.warn(f"{len(survivors)} process(es) survived SIGKILL: {sorted(survivors)[:10]}")
                return True
            if self.rescan_at is not None and now >= self.rescan_at:
                # Children forked after the last look, or orphans of the killed.
                self._kill_children()
                self.rescan_every = min(RESCAN_MAX, self.rescan_every * 2)
                self.rescan_at = now + self.rescan_every
        return False

    def _finish(self) -> int:
        self.phase = self.stats.phase = "done"
        self.stats.drain_seconds = time.monotonic() - self.drain_started
        self.policy.close()
        code = 0 if self.cfg.pause else exit_code(self.waiter.spec.watch_status)
        stopped = self.cfg.exit_zero_on_stop and self.stop_forwarded
        status = 0 if code in self.cfg.remap_exit or stopped else code
        if self.fixed_status is not None:          # the main child never ran
            status = self.fixed_status
        elif self.service_failure:                 # --on-service-failure stop: never 0
            status = code or 1
        self.stats.exit_status = status
        return status

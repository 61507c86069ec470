"""The drain: the end of everything left once the main child has ended (or pause mode
ends). SIGTERM to reaper's scope (the whole PID namespace as its PID 1, else its
descendants) and SIGCONT to the stopped ones, SIGKILL to what is still there after
--grace, and a count of how each ended (reaper_drain_processes_total).

    running -> draining (SIGTERM) -> killing (SIGKILL; KILL_WAIT to be reaped) -> done

Three users, one interface each:

- the Supervisor (reaper/supervisor.py) drives it: begin(), step() after every
  wait, kill_now() on the third SIGTERM, next_deadline(), done();
- the services runner (reaper/services/runner.py) orders its stop: alive(),
  kill_stragglers() at half the grace, terminate_rest() once the services are down;
- the boundary's minimal loop (reaper/boundary.py), when the Supervisor's own
  Python failed: signal_rest(), continue_stopped(), own_children() below, which
  need os alone (they must work when no file can be opened).

Every process is signalled through a pidfd taken while its identity (pid and start
time) still held (reaper/procctl.py), so a recycled pid is never hit. At its top the module imports os,
time, _signal and the piece names alone: the boundary loads it with itself, so that its
minimal loop needs no file later.
"""
from __future__ import annotations

import os
import time

# _signal: the numbers without the enum module (start-up time and memory).
import _signal as signal

from reaper.policy import SERVICES, STATISTICS, Backoff

KILL_WAIT = 5.0          # seconds SIGKILLed processes get to be reaped
RESCAN_FIRST = 0.05      # as subreaper, look for late children this soon after SIGKILL,
RESCAN_MAX = 1.0         # then twice as long each time, up to this

_STOPS = (1 << (signal.SIGSTOP - 1),
          sum(1 << (s - 1) for s in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)))


class Drain:
    def __init__(self, cfg, log, stats, policy, scope) -> None:
        self.cfg = cfg
        self.log = log
        self.stats = stats
        self.policy = policy              # boundary.Policy: the services piece may be switched off
        self.scope = scope                # reaper/scope.py: the Supervisor
        self.pid = os.getpid()
        self.is_pid1 = self.pid == 1
        self.phase = "running"
        self.started = 0.0
        self.deadline: "float | None" = None
        self.rescan_at: "float | None" = None
        self.rescan = Backoff(RESCAN_FIRST, RESCAN_MAX)
        self.targets: dict = {}           # pid -> start time, at drain start
        self.kill_targets: dict = {}      # pid -> start time, still alive at SIGKILL
        self.denied: dict = {}            # pid -> name: processes reaper may not signal
        self.stopped: set = set()         # pids seen stopped (state T or t) by the last scope scan
        self.services = None              # the services runner, when there is one
        self.main_group = 0               # the main child's process group, for the drain without /proc
        self.no_children = False          # the last wait found no child left (ECHILD)

    # --- the Supervisor's interface -------------------------------------------------

    def begin(self) -> None:
        """SIGTERM to everything left (the services after the rest, in order)."""
        # Phase and deadline first: whatever fails below, the loop still ends.
        self._set_phase("draining")
        self.started = time.monotonic()
        self.deadline = self.started + self.cfg.grace
        if self.services is not None:   # no more restarts; stopped after the rest (step)
            self.policy.call(SERVICES, self.services.begin_drain)
        if self.cfg.no_drain:
            return                  # --no-drain: the rest is left alone (the Supervisor exits now)
        self.terminate_rest()

    def step(self, no_children: bool, now: float) -> bool:
        """Advances the drain; True when reaper may exit."""
        if no_children:
            if self.phase == "draining":
                self.stats.drain["terminated"] += len(self.targets)
            else:
                self.stats.drain["killed"] += len(self.kill_targets)
            return True
        if self.phase == "draining" and now >= self.deadline:
            self.kill_now()
        elif self.phase == "draining" and self.services is not None:
            self.policy.call(SERVICES, self.services.drain_step, now)    # the ordered stop
        elif self.phase == "killing":
            if now >= self.deadline:
                survivors = self.alive(self.kill_targets)
                self.stats.drain["killed"] += len(self.kill_targets) - len(survivors)
                self.stats.drain["survived"] += len(survivors)
                if survivors:
                    self.log.warn(f"{len(survivors)} process(es) survived SIGKILL: {sorted(survivors)[:10]}")
                return True
            if self.rescan_at is not None and now >= self.rescan_at:
                # Children forked after the last look, or orphans of the killed.
                self._kill_children()
                self.rescan_at = now + self.rescan.next()
        return False

    def kill_now(self) -> None:
        """SIGKILL to everything left; KILL_WAIT for it to be reaped."""
        self._set_phase("killing")
        self.deadline = time.monotonic() + KILL_WAIT
        try:   # who is left, for the drain statistics; SIGKILL goes out whatever happens here
            alive = self.alive(self.targets)
            scope = self._scope()
            late = {p: c for p, c in scope.items() if p not in alive}
            self.kill_targets = {**alive, **late}
            self.stats.drain["terminated"] += len(self.targets) - len(alive)
        finally:
            self._signal_scope(signal.SIGKILL, None if self.is_pid1 else self.kill_targets or None)
        if not self.is_pid1:
            self.rescan.reset()
            self.rescan_at = time.monotonic() + self.rescan.next()
        if self.kill_targets:
            self.log.info(f"sent SIGKILL to {len(self.kill_targets)} process(es) left")

    def next_deadline(self) -> "float | None":
        due = self.deadline
        if self.rescan_at is not None and (due is None or self.rescan_at < due):
            due = self.rescan_at
        return due

    def done(self) -> None:
        self._set_phase("done")
        self.stats.drain_seconds = time.monotonic() - self.started

    def _set_phase(self, phase: str) -> None:
        self.phase = self.stats.phase = phase

    # --- the services runner's interface -------------------------------------------

    def terminate_rest(self) -> None:
        """SIGTERM (and SIGCONT to the stopped) to reaper's scope, but the services
        while they are kept for the ordered stop."""
        from reaper._native import scope_is_empty

        if scope_is_empty(self.no_children, self.main_group):
            self.targets = {}                       # the common end: no /proc scan, no imports
            return
        from reaper.procfs.processes import visible

        self.targets = self._scope()
        if self._services_kept():       # the services and their trees come later, in order
            self.targets = self.policy.call(SERVICES, self.services.exclude, self.targets) or {}
        if not self.targets and visible():
            return                                  # nothing left: the next wait says ECHILD
        if self.cfg.grace <= 0:
            self.kill_now()
            return
        if self.targets:
            self.log.info(f"draining {len(self.targets)} remaining process(es): "
                          f"SIGTERM, then SIGKILL after {self.cfg.grace:g}s")
        self._signal_scope(signal.SIGTERM, self.targets)
        # A stopped process must run to handle SIGTERM: SIGCONT to those /proc shows
        # stopped, and only to them (without /proc, to all, as it cannot tell).
        if not visible():
            self._signal_scope(signal.SIGCONT, self.targets)
            return
        # ...and to those about to stop (a stop signal pending, not yet acted on): they
        # would stop in their SIGTERM handler (the lower signal is taken first).
        from reaper import procctl

        for pid in sorted(self.targets):
            if pid in self.stopped or stop_pending(pid):
                procctl.signal_one(pid, self.targets[pid], signal.SIGCONT)

    def left(self) -> dict:
        """The processes of the first SIGTERM round still alive (pid -> start time)."""
        return self.alive(self.targets) if self.targets else {}

    def kill_stragglers(self, left: dict) -> None:
        """Ends the first round: SIGKILL to left (what still ignores SIGTERM), each
        counted as killed, the rest as terminated."""
        from reaper import procctl

        for pid, start in left.items():
            procctl.signal_one(pid, start, signal.SIGKILL)
        self.stats.drain["killed"] += len(left)
        self.stats.drain["terminated"] += len(self.targets) - len(left)
        self.targets = {}

    @staticmethod
    def alive(targets: dict) -> dict:
        """The processes of targets (pid -> start time) still alive and still themselves."""
        from reaper.procfs import processes

        alive = {}
        for pid, start in targets.items():
            p = processes.read_proc(pid)
            if p is not None and p.start == start and p.state != "Z":
                alive[pid] = start
        return alive

    # --- inside -------------------------------------------------------------------

    def _services_kept(self) -> bool:
        return self.services is not None and SERVICES not in self.policy.off and \
            bool(self.policy.call(SERVICES, self.services.kept))

    def _scope(self) -> dict:
        """pid -> start time of every process reaper is responsible for now: the whole
        namespace as PID 1, else its descendants. One read of /proc/*/stat, no psutil.
        Empty without /proc (then said once)."""
        from reaper import scope
        from reaper.procfs import processes

        table = processes.scan()
        if not table and not processes.visible():
            self._once_no_proc()
            return {}
        pids = scope.members(self.scope, table)
        self.stopped = {pid for pid in pids if table[pid].state in ("T", "t")}
        return {pid: table[pid].start for pid in pids if table[pid].state != "Z"}

    def _once_no_proc(self) -> None:
        if self.is_pid1:
            return        # kill(-1) needs no /proc: the drain works, only its counts are unknown
        self.log.event("no-proc", 1, "no /proc: cannot see reaper's descendants; only the main "
                                     "child's process group is signalled at the end")

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
        from reaper.procfs.processes import visible

        targets = self._scope() if targets is None else targets
        if not targets and not visible():
            if not self.main_group:
                return          # pause mode: no group to fall back on (kill(0) would be reaper's own)
            # Blind without /proc: the main child's group at least (a group id
            # stays taken while the group has members, so it names no stranger).
            try:
                os.kill(-self.main_group, signo)
            except OSError:
                pass
            return
        from reaper import procctl

        denied = []
        for pid, start in targets.items():
            if not procctl.signal_one(pid, start, signo) and pid not in self.denied:
                denied.append(pid)
        if denied:
            self._note_denied(denied, signo)

    def _note_denied(self, pids: list, signo: int) -> None:
        """Names, once each, the processes reaper may not signal (EPERM)."""
        from reaper import signals
        from reaper.procfs.processes import read_comm

        for pid in pids:
            self.denied[pid] = read_comm(pid)
        self.policy.call(STATISTICS, self._count_denied, len(pids))
        named = ", ".join(f"{pid} ({self.denied[pid]})" for pid in pids[:10])
        more = f" and {len(pids) - 10} more" if len(pids) > 10 else ""
        self.log.warn(f"not permitted to signal {len(pids)} process(es) ({signals.name(signo)}): "
                      f"{named}{more}; the drain goes on without them")

    def _count_denied(self, n: int) -> None:
        self.stats.drain["not_permitted"] += n

    def _kill_children(self) -> None:
        for pid in own_children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            except PermissionError:
                if pid not in self.denied:
                    self._note_denied([pid], signal.SIGKILL)


def stop_pending(pid: int) -> bool:
    """True if pid has a stop signal pending that will stop it: SIGSTOP, or a
    job-control one it neither blocks nor ignores (its default action is to stop;
    a handler of its own is counted too, harmlessly)."""
    from reaper.procfs.processes import signal_masks

    masks = signal_masks(pid)
    if masks is None:
        return False
    pending, blocked, ignored = masks
    return bool(pending & _STOPS[0] or pending & _STOPS[1] & ~(blocked | ignored))


# --- the minimal loop's drain: os alone ---------------------------------------------
# These read /proc with os alone, not through reaper/procfs: the minimal loop must work
# when no file can be opened to import a module (the documented exception to procfs/).

def signal_rest(signo: int, main_group: int) -> None:
    """signo to everything left: the namespace as its PID 1, else reaper's children
    (its own cannot be recycled under it) and the main child's group."""
    if os.getpid() == 1:
        targets = [-1]       # PID 1 of its own namespace: "everyone but me"
    else:                    # (no group in pause mode: -0 would be reaper's own)
        targets = [-main_group] * bool(main_group) + own_children()
    for pid in targets:
        try:
            os.kill(pid, signo)
        except OSError:
            pass


def continue_stopped(sigcont: int, main_group: int) -> None:
    """SIGCONT to the stopped processes of the drain's scope (state T in /proc), so
    that they can act on SIGTERM; without /proc, to all of it."""
    me = os.getpid()
    try:
        names = os.listdir("/proc")
    except OSError:
        names = []
    if not names or not os.path.exists("/proc/self/stat"):
        signal_rest(sigcont, main_group)
        return
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
            try:
                fields = os.read(fd, 1024).rpartition(b")")[2].split()
            finally:
                os.close(fd)
            state, ppid, pgrp = fields[0], int(fields[1]), int(fields[2])
        except (OSError, ValueError, IndexError):
            continue
        in_scope = me == 1 or ppid == me or (main_group and pgrp == main_group)
        if in_scope and state in (b"T", b"t"):
            try:
                os.kill(int(name), sigcont)
            except OSError:
                pass


def own_children() -> list:
    """reaper's direct children, from one small file. Orphans re-parented to a
    subreaper join its main thread's list (the first live thread)."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []

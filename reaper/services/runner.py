"""The supervised services' processes: the "services" piece of the failure boundary.

The Supervisor (reaper/supervisor.py) calls in at a few points, always through
Policy.call, so that a failure here switches the piece off with one line and
reaper goes on (the main child is then started if it was waiting, and services
still running are drained with the rest at the end):

- its loop starts the main child once main_may_start() (at once, or with
  --wait-ready when every --service-ready service has said it is ready);
- an exit the C core reports for a service pid goes to on_exit();
- a readable readiness pipe (the C wait polls them: no timer while idle) to
  read_ready();
- the drain (reaper/drain.py): begin_drain(), then drain_step() after every
  wait; the services leave the first SIGTERM round (exclude()) and are stopped
  one at a time, in reverse start order, once the rest has ended. Each has a
  share of the grace left: one still up at the end of its share is left to the
  SIGKILL at the grace's end, and the next one gets its SIGTERM now.

What a service writes to its readiness pipe is hostile input: read_ready() reads
at most READY_MAX_BYTES of it, in at most READY_MAX_READS reads, before giving up.

It calls back through two public doors only: sup.request_stop() (--on-service-failure
stop) and sup.drain's interface for the ordered stop (left, kill_stragglers,
terminate_rest).

Restarts are timers: next_deadline() is the earliest one, which the loop's
wait uses as its timeout; tick() starts what is due.
"""
from __future__ import annotations

import errno
import os
import time

from reaper import _native
from reaper.log import INFO, WARN
from reaper.text import quoted
from reaper.policy import Backoff
from reaper.services.restart import DONE, GIVE_UP, Restarts, failed
from reaper._native import exit_code

RECHECK_FIRST = 0.01     # drain: look whether the others have ended this soon after SIGTERM,
RECHECK_MAX = 0.5        # then twice as long each time, up to this
# A readiness pipe is given up on (closed, never ready this run) after this much
# without a newline, or this many reads: a flood costs PID 1 a few reads, not a CPU.
READY_MAX_BYTES = 4096
READY_MAX_READS = 64
STATES = ("running", "backoff", "failed", "exited", "stopping", "stopped")


class Service:
    """One service's state, read by the exporter (another thread: plain attributes)."""

    def __init__(self, spec, restarts: Restarts) -> None:
        self.name = spec.name
        self.argv = spec.argv
        self.declares_ready = spec.ready
        self.restarts = restarts
        self.state = "backoff"           # until its first start
        self.pid = None
        self.starts = 0
        self.started_at = None           # time.time() of the current or last start
        self.last_status = None          # raw wait status of its last exit
        self.last_exit_code = None       # N or 128+N
        self.failed = False              # given up
        self.ready = False               # said so on its readiness pipe, this run
        self.ever_ready = False
        self.ready_fd = None             # our end of its readiness pipe, while it may still write
        self.ready_bytes = 0             # read from it this run, no newline yet
        self.ready_reads = 0
        self.ready_floods = 0            # runs whose pipe was given up on (too much without a newline)
        self.restart_at = None           # monotonic time of the next start

    @property
    def up(self) -> bool:
        return self.pid is not None


def _describe(status) -> str:
    if status is None:
        return "not started"
    if os.WIFSIGNALED(status):
        from reaper import signals

        return f"killed by {signals.name(os.WTERMSIG(status))}"
    return f"exit status {os.WEXITSTATUS(status)}"


def _invoker_oom_score_adj():
    from reaper import oom

    if oom.invoker_value is not None:
        return oom.invoker_value
    try:
        with open(oom.PATH, "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


class Runner:
    name = "services"

    def __init__(self, cfg, log, stats, sup) -> None:
        self.cfg, self.log, self.stats, self.sup = cfg, log, stats, sup
        self.services = [Service(spec, Restarts(*(spec.setting(cfg, k) for k in (
            "restart", "restart_delay", "restart_max_delay", "restart_limit")))) for spec in cfg.service_specs]
        self.by_pid: dict = {}
        self.leftovers = None            # the leftovers piece (reaper/leftovers/piece.py), once started
        # Read before the OOM piece lowers reaper's own value: every start gets this one.
        self.oom_score_adj = _invoker_oom_score_adj()
        try:
            self.cwd = os.getcwd()       # the start directory (reaper itself moves to /)
        except OSError:
            self.cwd = None
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.draining = False
        self.stage = None                # in the drain: others, services, rest
        self.others_until = 0.0          # in the drain: when the others' half of the grace ends
        self.stopping = None             # the service whose exit the drain waits for
        self.until = 0.0                 # in the drain: the end of the grace
        self.share_end = None            # ...and of the share of it the stopping service has
        self.recheck_at = None
        self.recheck = Backoff(RECHECK_FIRST, RECHECK_MAX)
        self.ready_due = None            # --wait-ready's deadline while the main child waits
        self.ready_waited = not (cfg.wait_ready and any(s.declares_ready for s in self.services))
        stats.services = self.services
        now = time.monotonic()
        if not self.ready_waited:
            self.ready_due = now + cfg.wait_ready
        for svc in self.services:
            self._start(svc, now)
        sup.services = self

    # --- the plugin interface (reaper/boundary.py Policy) ---------------------------

    def next_deadline(self):
        due = [s.restart_at for s in self.services if s.restart_at is not None]
        for d in (self.ready_due, self.recheck_at):
            if d is not None:
                due.append(d)
        return min(due) if due else None

    def tick(self, now: float) -> None:
        if self.ready_due is not None and now >= self.ready_due:
            self.ready_due = None
            self.ready_waited = True
            late = [s.name for s in self.services if s.declares_ready and not s.ever_ready]
            self.log.warn(f"services not ready after {self.cfg.wait_ready:g}s: {', '.join(late)}; "
                          "starting the main child")
        if self.recheck_at is not None and now >= self.recheck_at:
            self.recheck_at = None       # drain_step, right after this tick, looks again
        for svc in self.services:
            if svc.restart_at is not None and now >= svc.restart_at and not self.draining:
                if not self._leftovers_held(svc, now):
                    self._start(svc, now)

    def close(self) -> None:
        """At reaper's exit, or when this piece failed: no more restarts. A service
        still up is left to the drain (SIGTERM with the rest, or SIGKILL)."""
        for svc in self.services:
            svc.restart_at = None
            self._close_ready(svc)
        self.ready_due = self.recheck_at = None
        try:
            self.sup.waiter.report(())
            self.sup.waiter.poll_also(())
        finally:
            try:
                os.close(self.devnull)
            except OSError:
                pass

    # --- starting -------------------------------------------------------------------

    def main_may_start(self) -> bool:
        return self.ready_waited or all(s.ever_ready for s in self.services if s.declares_ready)

    def _start(self, svc: Service, now: float) -> None:
        svc.restart_at = None
        svc.starts += 1
        svc.restarts.started(now)
        svc.started_at = time.time()
        svc.ready = False
        svc.ready_bytes = svc.ready_reads = 0
        env = {k: v for k, v in os.environb.items() if k != b"REAPER_READY_FD"}
        r = w = -1
        try:
            if svc.declares_ready:
                r, w = os.pipe2(os.O_CLOEXEC)
                if w <= 2:                    # stdin is replaced in the child: keep it above
                    w2 = _dup_above(w)
                    os.close(w)
                    w = w2
                os.set_blocking(r, False)
                env[b"REAPER_READY_FD"] = str(w).encode()
            io = _native.ServiceIO(env, self.cwd, self.devnull, w, self.oom_score_adj)
            pid, exec_errno = _native.spawn(svc.argv, True, False, False, io)
        except OSError as e:                  # fork failed (EAGAIN: the pids limit), no pipe
            if r >= 0:
                os.close(r)
            self.log.event(("service-start", svc.name), WARN,
                           f"service {svc.name}: cannot start: {e.strerror}")
            self._ended(svc, now, None)
            return
        finally:
            if w >= 0:
                os.close(w)
        svc.pid = pid
        svc.state = "running"
        svc.ready_fd = r if r >= 0 else None
        self.by_pid[pid] = svc
        self.sup.supervised.add(pid)
        self._arm()
        if exec_errno:                         # the child exits 127/126: reaped as an exit
            self.log.event(("service-exec", svc.name), WARN,
                           f"service {svc.name}: cannot run {quoted(svc.argv[0])}: {os.strerror(exec_errno)}")
        elif svc.starts > 1:
            self.log.info(f"service {svc.name} restarted (pid {pid}, start {svc.starts})")

    def _leftovers_held(self, svc: Service, now: float) -> bool:
        """A restart waits while the last run's leftovers are being ended (--leftovers end)."""
        if self.leftovers is None:
            return False
        until = self.sup.policy.call("leftovers", self.leftovers.hold, svc.name, now)
        if until is None:
            return False
        svc.restart_at = until
        return True

    def _arm(self) -> None:
        """What the C wait watches: the services' pids, the readiness pipes still open."""
        self.sup.waiter.report(self.by_pid)
        self.sup.waiter.poll_also(s.ready_fd for s in self.services if s.ready_fd is not None)

    # --- readiness ------------------------------------------------------------------

    def read_ready(self) -> None:
        changed = False
        for svc in self.services:
            if svc.ready_fd is None:
                continue
            try:            # one byte past the bound tells a flood from a long line
                data = os.read(svc.ready_fd, READY_MAX_BYTES + 1 - svc.ready_bytes)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if b"\n" in data:
                svc.ready = svc.ever_ready = True
                self.log.info(f"service {svc.name} is ready")
            elif data:
                svc.ready_bytes += len(data)
                svc.ready_reads += 1
                if svc.ready_bytes <= READY_MAX_BYTES and svc.ready_reads < READY_MAX_READS:
                    continue                   # s6's rule: ready at the newline
                self._flooded(svc)
            self._close_ready(svc, arm=False)  # ready, closed or given up: nothing more to read
            changed = True
        if changed:
            self._arm()

    def _flooded(self, svc: Service) -> None:
        svc.ready_floods += 1
        what = f"more than {READY_MAX_BYTES} bytes on" if svc.ready_bytes > READY_MAX_BYTES else \
            f"{READY_MAX_READS} reads of"
        self.log.event(("ready-flood", svc.name), WARN,
                       f"service {svc.name}: {what} its readiness fd without a newline; "
                       "fd closed, not ready this run")

    def _close_ready(self, svc: Service, arm: bool = True) -> None:
        fd, svc.ready_fd = svc.ready_fd, None
        if fd is None:
            return
        if arm:
            self._arm()                        # out of the poll set before it is closed
        else:
            self.sup.waiter.poll_also(s.ready_fd for s in self.services if s.ready_fd is not None)
        os.close(fd)

    # --- exits ----------------------------------------------------------------------

    def owns(self, pid: int) -> bool:
        return pid in self.by_pid

    def on_exit(self, pid: int, status: int) -> None:
        svc = self.by_pid.pop(pid, None)
        if svc is None:
            return
        self.sup.supervised.discard(pid)
        svc.pid = None
        svc.ready = False
        svc.last_status = status
        svc.last_exit_code = exit_code(status)
        self._close_ready(svc, arm=False)
        self._arm()
        if self.leftovers is not None and not self.draining:     # its leftovers, before any restart
            self.sup.policy.call("leftovers", self.leftovers.service_ended, pid)
        if self.draining:
            # Not in the drain's counts: stopping the services is the expected end, not
            # news (an ordinary run stays silent); one still up at SIGKILL is counted.
            svc.state = "stopped"
            self.log.info(f"service {svc.name} ({pid}) stopped: {_describe(status)}")
            return
        self._ended(svc, time.monotonic(), status)

    def _ended(self, svc: Service, now: float, status) -> None:
        decision, delay = svc.restarts.ended(now, status)
        what = f"service {svc.name} ended: {_describe(status)}"
        if decision == DONE:
            svc.state = "exited"
            self.log.info(f"{what}; not restarted (--restart {svc.restarts.policy})")
        elif decision == GIVE_UP:
            self._give_up(svc, what)
        else:
            svc.state = "backoff"
            svc.restart_at = now + delay
            level = WARN if failed(status) else INFO
            # Not rate-limited: the start limit bounds these lines (N per window and service).
            (self.log.warn if level == WARN else self.log.info)(f"{what}; restarting in {delay:g}s")

    def _give_up(self, svc: Service, what: str) -> None:
        svc.state = "failed"
        svc.failed = True
        n, window = svc.restarts.limit_starts, svc.restarts.limit_window
        why = "--restart never" if svc.restarts.policy == "never" else \
            f"started {n} time{'s' if n != 1 else ''} within {window:g}s"
        stop = self.cfg.on_service_failure == "stop"
        self.log.error(f"{what}; {why}: given up, state failed" +
                       ("; stopping the main child (--on-service-failure stop)" if stop else ""))
        if stop:
            self.sup.request_stop()

    # --- the drain ------------------------------------------------------------------

    def begin_drain(self) -> None:
        """The main child has ended (or never starts): no more restarts."""
        self.draining = True
        self.ready_due = None
        for svc in self.services:
            svc.restart_at = None
            if svc.state == "backoff":
                svc.state = "stopped"
        self.stage = "services" if self.cfg.no_drain else "others"
        now = time.monotonic()
        self.until = now + self.cfg.grace
        self.others_until = now + self.cfg.grace / 2    # the rest's share of the grace
        self.recheck_at = now                # drain_step at the next turn of the loop, not at an event

    def kept(self) -> list:
        """The services' pids, which the first SIGTERM round leaves alone."""
        return list(self.by_pid)

    def exclude(self, targets: dict) -> dict:
        """targets without the services and what runs below them."""
        from reaper import scope
        from reaper.procfs import processes

        if not self.by_pid:
            return targets
        keep = set(self.by_pid) | scope.trees(processes.scan(), self.by_pid)
        return {pid: start for pid, start in targets.items() if pid not in keep}

    def drain_step(self, now: float) -> bool:
        """Advances the ordered stop; True once every service is stopped."""
        drain = self.sup.drain
        if self.stage == "others":
            left = drain.left()
            if left and now < self.others_until:
                if self.recheck_at is None:
                    self.recheck_at = min(now + self.recheck.next(), self.others_until)
                return False
            if left:
                # Half the grace is up and some ignore SIGTERM: they get SIGKILL now, so
                # that the services still get their SIGTERM, in order, in the other half
                # (a log shipper flushes what the others wrote before they were killed).
                self.log.info(f"sent SIGKILL to {len(left)} process(es) still up after half the grace; "
                              f"stopping the services")
            drain.kill_stragglers(left)
            self.recheck_at = None
            self.stage = "services"
        if self.stage == "services":
            if not self._stop_next(now):
                return False
            self.stage = "rest"
            if not self.cfg.no_drain:
                drain.terminate_rest()          # what the services left (a child outside their group)
        return True

    def _stop_next(self, now: float) -> bool:
        """The ordered stop: SIGTERM to the next service in reverse start order once
        the one before has ended or had its share of the grace (what is left of it over
        the services not yet asked): one that ignores SIGTERM costs the others a share
        of their time, never their SIGTERM. True once every service has ended."""
        last = self.stopping
        if last is not None and last.pid is not None and now < self.share_end:
            if self.recheck_at is None:
                self.recheck_at = self.share_end   # its exit comes as an event, its share's end as a timer
            return False
        asked = ("stopping", "stopped")
        waiting = [s for s in reversed(self.services) if s.pid is not None and s.state not in asked]
        if not waiting:
            self.stopping = self.share_end = self.recheck_at = None
            return all(s.pid is None for s in self.services)   # the stubborn ones: SIGKILL at the end
        nxt = waiting[0]
        if last is not None and last.pid is not None:
            self.log.info(f"service {last.name} ({last.pid}) still up after its share of the grace; "
                          f"left to the SIGKILL at its end")
        self.share_end = now + max(0.0, self.until - now) / len(waiting)
        self.recheck_at = self.share_end
        self._terminate(nxt)
        return False

    def _terminate(self, svc: Service) -> None:
        from reaper.procfs.processes import read_proc
        import signal

        self.stopping = svc
        svc.state = "stopping"
        self.log.info(f"stopping service {svc.name} ({svc.pid}): SIGTERM")
        _signal_group(svc.pid, signal.SIGTERM)
        p = read_proc(svc.pid)
        if p is not None and p.state in ("T", "t"):
            _signal_group(svc.pid, signal.SIGCONT)   # a stopped process must run to handle it

    def kill_left(self) -> None:
        """--no-drain at the end of the grace: SIGKILL to the services still up."""
        import signal

        for svc in self.services:
            if svc.pid is not None:
                _signal_group(svc.pid, signal.SIGKILL)


def _signal_group(pid: int, signo: int) -> None:
    """signo to the service's process group (pid is its leader, not yet reaped, so the
    group id names no stranger), or to the service alone if it left its group."""
    for target in (-pid, pid):
        try:
            os.kill(target, signo)
            return
        except ProcessLookupError:
            continue
        except OSError as e:
            if e.errno != errno.EPERM:
                continue
            return


def _dup_above(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


def start(cfg, log, stats, sup) -> Runner:
    return Runner(cfg, log, stats, sup)


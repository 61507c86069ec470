"""Thin typed layer over the C core (csrc/reaper_core.c): C errors become OSError.

The one module that touches the cffi extension, and fully typed (reaper/_core.pyi types the
extension; tests/test_typing.py runs mypy --strict on both). The types are for the checker
alone: typing is not imported at run time (PID 1's start-up), hence the quoted annotations."""
import os
import time

from reaper._core import ffi, lib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, Optional, Union

    from reaper._core import Event, SpawnExtra, Totals as _CTotals, WaiterStruct

EV_SIGNAL = lib.REAPER_EV_SIGNAL
EV_EXIT = lib.REAPER_EV_EXIT
EV_STOP = lib.REAPER_EV_STOP
BATCH = 512
MAX_WAIT_MS = 2**31 - 1      # poll() takes an int: a longer wait is cut to this and recomputed
# Reap latency, from the wake-up that found an exited child to its reap: bucket
# bounds in seconds (the C core counts orphans into them; reaper.stats the rest).
REAP_LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1.0)


def ms_until(deadline: "Optional[float]") -> int:
    """poll()'s timeout for a time.monotonic() deadline: -1 (forever) for None, else
    clamped to 0..MAX_WAIT_MS, whatever the deadline (huge, inf or nan)."""
    if deadline is None:
        return -1
    ms = (deadline - time.monotonic()) * 1000 + 1
    if not ms < MAX_WAIT_MS:         # also catches inf and nan
        return MAX_WAIT_MS
    return max(0, int(ms))


def _check(rc: int) -> int:
    if rc < 0:
        raise OSError(-rc, os.strerror(-rc))
    return rc


def setup(invoker_blocked: "Optional[Iterable[int]]" = None) -> int:
    """Block every handled signal and return the signalfd that receives them.
    invoker_blocked: the signals the invoker had blocked, when the launcher blocked
    the same set before (bin/reaper's first statement); None: the mask now is the
    invoker's. The child gets the invoker's mask back."""
    if invoker_blocked is None:
        return _check(lib.reaper_setup(ffi.NULL))
    bits = 0
    for signo in invoker_blocked:
        if 0 < signo <= 64:
            bits |= 1 << (signo - 1)
    return _check(lib.reaper_setup(ffi.new("uint64_t *", bits)))


def spawn(argv: "list[str]", own_group: bool, take_tty: bool, listen_pid: bool = False,
          service: "Optional[ServiceIO]" = None) -> "tuple[int, int]":
    """Fork and exec argv; returns (pid, exec_errno), exec_errno 0 on success.
    reaper's cwd is / from before the fork on (the child keeps the start directory),
    unless no fd was free to hold it; after a failed exec it is back where it was.
    listen_pid: the child's LISTEN_PID becomes the child's own pid.
    service: a ServiceIO for a supervised service (reaper/services/), else None."""
    keep = [ffi.new("char[]", os.fsencode(a)) for a in argv]
    c_argv = ffi.new("char *[]", keep + [ffi.NULL])
    exec_errno = ffi.new("int *")
    extra = ffi.NULL if service is None else service.c_struct(keep)
    pid = _check(lib.reaper_spawn(c_argv, int(own_group), int(take_tty), int(listen_pid), extra, exec_errno))
    return pid, exec_errno[0]


class ServiceIO:
    """What a service gets besides what the main child gets: its environment (a
    dict of bytes), a directory to start in, a stdin fd, the one fd it keeps (its
    readiness pipe, -1 for none), and the oom_score_adj to start with (None: inherited)."""

    def __init__(self, env: "dict[bytes, bytes]", cwd: "Union[str, bytes, os.PathLike[str], None]",
                 stdin_fd: int, keep_fd: int = -1, oom_score_adj: "Optional[int]" = None) -> None:
        self.env, self.cwd, self.stdin_fd, self.keep_fd = env, cwd, stdin_fd, keep_fd
        self.oom_score_adj = oom_score_adj

    def c_struct(self, keep: "list[Any]") -> "SpawnExtra":
        """The C struct; keep holds what it points to for as long as the call."""
        x: "SpawnExtra" = ffi.new("struct reaper_spawn_extra *")
        env = [ffi.new("char[]", k + b"=" + v) for k, v in self.env.items()]
        keep += env
        envp = ffi.new("char *[]", env + [ffi.NULL])
        keep.append(envp)
        x.envp = envp
        if self.cwd is not None:
            cwd = ffi.new("char[]", os.fsencode(self.cwd))
            keep.append(cwd)
            x.cwd = cwd
        x.stdin_fd = self.stdin_fd
        x.keep_fd = self.keep_fd
        x.oom_score_adj = b"" if self.oom_score_adj is None else str(int(self.oom_score_adj)).encode()[:7]
        return x


class Totals:
    """What the C core counted of the children it reaped without an event (orphans, in
    the common case), as Python values; a live view of the waiter's struct reaper_totals."""

    def __init__(self, c: "_CTotals") -> None:
        self._c = c

    @property
    def reaped(self) -> int:
        return self._c.reaped

    def exited(self) -> "list[int]":
        """Children that exited, by exit status (256 entries)."""
        return ffi.unpack(self._c.exited, 256)

    def signaled(self) -> "list[int]":
        """Children killed by a signal, by signal number (entry 0 unused)."""
        return ffi.unpack(self._c.signaled, len(self._c.signaled))

    def latency(self) -> "list[int]":
        """Wake-up to reap, per bucket of the waiter's bounds; the last is +Inf."""
        return ffi.unpack(self._c.latency, len(self._c.latency))

    @property
    def latency_seconds(self) -> float:
        return self._c.latency_sum_ns / 1e9

    @property
    def cpu_seconds(self) -> float:
        """User plus system CPU (0 where the waiter reaps without rusage)."""
        return self._c.cpu_us / 1e6


class Waiter:
    """One blocking wait on the signalfd, returning a batch of events. Children
    other than the watched pid are counted in C (.totals) unless report_all. The
    only Python that touches the C structures (struct reaper_waiter: its config,
    written here, its state and totals, written by the C core)."""

    def __init__(self, sfd: int, latency_bounds: "Iterable[float]" = ()) -> None:
        self.sfd = sfd
        self._buf = ffi.new("struct reaper_event[]", BATCH)
        self._state = ffi.new("int *")
        self._w: "WaiterStruct" = ffi.new("struct reaper_waiter *")
        self._cfg = self._w.config
        bounds = [int(b * 1e9) for b in latency_bounds]
        if len(bounds) > lib.REAPER_LATENCY_BOUNDS:
            raise ValueError(f"at most {lib.REAPER_LATENCY_BOUNDS} latency buckets")
        self._cfg.nbounds = len(bounds)
        for i, b in enumerate(bounds):
            self._cfg.bounds_ns[i] = b
        self.totals = Totals(self._w.totals)
        self._cfg.self_pid = os.getpid()
        self.fds_ready = False               # the last wait saw a poll_fds entry readable

    # --- what the C core found ---

    @property
    def main_reaped(self) -> bool:
        """The watched pid (the main child) was reaped; its status is main_status."""
        return bool(self._w.state.watch_reaped)

    @property
    def main_status(self) -> int:
        return self._w.state.watch_status

    def assume_main_ended(self, status: int) -> None:
        """The main child never started (services mode): the end goes on as if it had
        ended with status."""
        self._w.state.watch_status = status
        self._w.state.watch_reaped = 1

    # --- configuration ---

    @property
    def reports_all(self) -> bool:
        return bool(self._cfg.report_all)

    def without_rusage(self, off: bool = True) -> None:
        """Reap without rusage: no CPU times (only the metrics read them)."""
        self._cfg.no_rusage = int(off)

    def report(self, pids: "Iterable[int]") -> None:
        """These pids' exits are events too (the services), at most REAPER_MAX_EXTRA."""
        pids = list(pids)[:lib.REAPER_MAX_EXTRA]
        for i, pid in enumerate(pids):
            self._cfg.report_pids[i] = pid
        self._cfg.nreport = len(pids)

    def poll_also(self, fds: "Iterable[int]") -> None:
        """The wait also returns when one of these fds is readable (fds_ready). An fd
        must leave this list before it is closed, or every wait would return at once."""
        fds = list(fds)[:lib.REAPER_MAX_EXTRA]
        self._cfg.npoll = 0
        for i, fd in enumerate(fds):
            self._cfg.poll_fds[i] = fd
        self._cfg.npoll = len(fds)

    def watch(self, pid: int, report_all: bool, report_stops: bool = False) -> None:
        """pid's exit is always an event; report_all makes every exit one. Its wait
        status is also kept in C (main_status, once main_reaped). report_stops:
        pid's stops are events too (EV_STOP, signo the stop signal)."""
        self._w.state.watch_reaped = 0
        self._cfg.watch_pid = pid
        self._cfg.report_all = int(report_all)
        self._cfg.report_stops = int(report_stops)

    def forward(self, pid: int, group: bool, table: "dict[int, tuple[int, bool]]") -> None:
        """Forward signals to pid (or its group) from C: table maps each signal
        received to the one to send (0: none); user_only ones need a sender."""
        self._cfg.forward_group = int(group)
        for signo in range(len(self._cfg.forward)):
            target, user_only = table.get(signo, (0, False))
            self._cfg.forward[signo] = target | (lib.REAPER_FWD_USER_ONLY if user_only and target else 0)
        self._cfg.forward_pid = pid

    def stop_forwarding(self) -> None:
        self._cfg.forward_pid = 0

    def zero_codes(self, codes: "Iterable[int]") -> None:
        """The main child's exit codes that the quiet end turns into 0 (-e)."""
        for code in codes:
            if 0 <= code < 256:
                self._cfg.zero_codes[code] = 1

    def quiet_end(self, armed: bool, no_drain: bool = False) -> None:
        """Arms the quiet end for the next waits (reaper_config.quiet_end): the main
        child's exit alone, with no orphan ever reaped and (unless no_drain)
        nothing left to drain, makes the wait exit the process with its status."""
        self._cfg.quiet_end = 0 if not armed else lib.REAPER_END_NO_DRAIN if no_drain else lib.REAPER_END_IF_ALONE

    def wait(self, timeout_ms: int) -> "tuple[list[Event], bool, bool]":
        """Returns (events, no_children, more). timeout_ms -1 waits forever.

        The events are views of `struct reaper_event` (fields: kind, pid, signo,
        code, uid, forwarded, utime_us, stime_us, maxrss_kb, woke_ns, at_ns) into a buffer
        the next wait() overwrites: no Python object is built per event."""
        timeout_ms = -1 if timeout_ms < 0 else min(int(timeout_ms), MAX_WAIT_MS)
        n = _check(lib.reaper_wait(self.sfd, timeout_ms, self._w, self._buf, BATCH, self._state))
        buf = self._buf
        events: "list[Event]" = [buf[i] for i in range(n)]
        state = self._state[0]
        self.fds_ready = bool(state & lib.REAPER_WAIT_FDS)
        return events, bool(state & lib.REAPER_WAIT_NO_CHILDREN), bool(state & lib.REAPER_WAIT_MORE)


def scope_is_empty(no_children: bool, main_group: int) -> bool:
    """True only if the drain has nothing to stop, found without reading /proc (as
    PID 1: nobody else in the namespace; else no child and the main child's group
    gone). False when unsure."""
    return bool(lib.reaper_scope_is_empty(int(no_children), int(main_group)))


def exit_code(status: int) -> int:
    """The code a wait status stands for: its exit status, or 128+N if killed by signal N
    (the C core's rule, which its quiet end applies too)."""
    return lib.reaper_exit_code(status)


def exec_failure_code(err: int) -> int:
    """reaper's exit status when the main child cannot be run: 127 not found, 126 otherwise."""
    return lib.reaper_exec_failure_code(err)


def forward_table(rewrite: "dict[int, int]") -> "dict[int, tuple[int, bool]]":
    """For Waiter.forward: the signal to send for each one received (after --rewrite),
    and whether only another process may have sent it (the fault signals)."""
    if TYPE_CHECKING:
        import signal as sig        # the same constants; typeshed has no _signal
    else:
        import _signal as sig

    fault = (sig.SIGFPE, sig.SIGILL, sig.SIGSEGV, sig.SIGBUS, sig.SIGABRT, sig.SIGTRAP, sig.SIGSYS)
    return {s: (rewrite.get(s, s), s in fault) for s in range(1, sig.SIGRTMAX + 1)
            if s not in (sig.SIGKILL, sig.SIGSTOP, sig.SIGCHLD)}


def set_subreaper() -> None:
    _check(lib.reaper_set_subreaper())


def set_pdeathsig(signo: int) -> None:
    _check(lib.reaper_set_pdeathsig(signo))


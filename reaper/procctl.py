"""Acting on a process that was found earlier, never on a recycled pid: reaper's one
way to do it, for the drain (signal_one) and the budgets (Handle).

A process is pinned by (pid, start time). Signals go through a pidfd taken while the
identity still held (pidfd_of), so they can only reach that process; priority,
scheduling class, affinity and cgroup moves have no pidfd form, so the identity is
checked before and after each of them.
"""
from __future__ import annotations

import errno
import os
from collections.abc import Callable

# _signal: the numbers and pidfd_send_signal without the enum module (start-up time and memory).
import _signal as signal

from reaper import signals as _signals
from reaper.procfs.processes import CLK_TCK, PAGE, Counters, read_counters, read_stat

HAVE_PIDFD = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")


def pidfds_work() -> bool:
    """Whether signals can go through pidfds: Python has the calls (3.9+) and the
    kernel too (5.3+; an older one answers ENOSYS)."""
    if not HAVE_PIDFD:
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


class Gone(Exception):
    """The process exited, or its pid now names another process."""


class NotPermitted(PermissionError):
    """reaper may not do `what` to this process (EPERM, EACCES): typically another
    user's. A PermissionError, so a handler of OSError in general also stops it."""

    def __init__(self, pid: int, what: str, err: "OSError | None" = None) -> None:
        code = err.errno if err is not None and err.errno else errno.EPERM
        super().__init__(code, (err.strerror if err is not None else None) or os.strerror(code))
        self.pid = pid
        self.what = what


DENIED = (errno.EPERM, errno.EACCES)


def _mapped(e: OSError, pid: int, what: str) -> Exception:
    """The exception an OS error on pid means to the caller."""
    if e.errno == errno.ESRCH:
        return Gone(pid)
    if e.errno in DENIED:
        return NotPermitted(pid, what, e)
    return e


def _psutil_mapped(e: Exception, pid: int, what: str) -> Exception:
    import psutil

    if isinstance(e, psutil.AccessDenied):
        # Not Gone: a stray dropped for this would be found again, and pinned again,
        # every sample.
        return NotPermitted(pid, what)
    return Gone(pid)


def same(pid: int, start: int) -> bool:
    """pid is still the live process that started at start (clock ticks after boot)."""
    st = read_stat(pid)
    return st is not None and st[1] == start and st[3] not in ("Z", "X")


def pidfd_of(pid: int, start: int) -> int | None:
    """A pidfd for pid, if it is still the process that started at start: the fd is taken
    first and the identity checked after, so pid reuse cannot outrun the check. None on
    a kernel without pidfds (then check, then kill, at each signal). Raises Gone, or
    NotPermitted / OSError as pidfd_open says."""
    if not HAVE_PIDFD:
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EINVAL):
            return None                   # kernel without pidfds: the caller said so once
        raise _mapped(e, pid, "pidfd_open") from None
    if not same(pid, start):              # the pidfd names whoever holds the pid now
        os.close(fd)
        raise Gone(pid)
    return fd


def signal_one(pid: int, start: int, signo: int) -> bool:
    """signo to pid only if it is still the process found at start (pidfd_of). False
    only if reaper may not signal it (EPERM); a process gone is fine."""
    try:
        fd = pidfd_of(pid, start)
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, signo)
            elif same(pid, start):
                os.kill(pid, signo)
        finally:
            if fd is not None:
                os.close(fd)
    except (Gone, ProcessLookupError):
        pass
    except PermissionError:               # NotPermitted too
        return False
    return True


def _unreadable(pid: int) -> None:
    """Raises what an unreadable /proc/PID/stat means: NotPermitted (hidepid), else Gone."""
    try:
        os.close(os.open(f"/proc/{pid}/stat", os.O_RDONLY))
    except PermissionError as e:
        raise NotPermitted(pid, "read", e) from None
    except OSError:
        pass
    raise Gone(pid)


class Handle:
    """A process pinned by (pid, start): cheap to hold (no file descriptor, no psutil
    object until an action or an exact memory read needs one)."""

    __slots__ = ("pid", "start", "_proc", "_pidfd")

    def __init__(self, pid: int, start: int) -> None:
        self.pid = pid
        self.start = start
        self._proc = None
        self._pidfd: int | None = None
        st = read_stat(pid)
        if st is None:
            _unreadable(pid)
        if st[1] != start or st[3] in ("Z", "X"):
            raise Gone(pid)

    @classmethod
    def unchecked(cls, pid: int, start: int) -> "Handle":
        """A handle on (pid, start) without the read that checks it is there: for a
        process just read (or found gone); every use checks it all the same."""
        h = cls.__new__(cls)
        h.pid, h.start, h._proc, h._pidfd = pid, start, None, None
        return h

    @property
    def proc(self):
        """The psutil.Process, made on first use and checked against start then: psutil
        reads the start time of whatever holds the pid at that moment."""
        if self._proc is None:
            import psutil

            try:
                p = psutil.Process(self.pid)
            except psutil.Error as e:
                raise _psutil_mapped(e, self.pid, "read") from None
            if not self.same():
                raise Gone(self.pid)
            self._proc = p
        return self._proc

    def same(self) -> bool:
        return same(self.pid, self.start)

    def read(self) -> Counters:
        """Its counters (one read of /proc/PID/stat, checked against start); Gone if it
        exited or its pid was reused."""
        c = read_counters(self.pid, self.start)
        if c is None:
            _unreadable(self.pid)
        if c.state in ("Z", "X"):
            raise Gone(self.pid)
        return c

    def cpu_seconds(self) -> float:
        """User + system CPU, every thread's."""
        return self.read().cpu / CLK_TCK

    def private_memory(self, exact_above: int | None = None) -> int:
        """What this process alone holds, in bytes: the memory its end would free.

        Resident memory (RSS) counts pages shared with other processes: a helper
        forked from a job holding 120 MB shows 120 MB, and every Ray worker that
        reads the object store shows it too (Ray measures a worker's heap as RSS
        minus shared for this reason). First RSS minus its file-backed and shared
        pages (statm, one short read): Ray's rule. That still counts anonymous
        pages shared copy-on-write with a parent, so where it exceeds exact_above
        the exact unique set size is read (smaps_rollup: the kernel walks the
        process's page tables, about 1.4 ms for 130 MB against 15 us for statm)
        and the smaller of the two is taken: the unique set leaves out pages shared
        copy-on-write, RSS minus shared leaves out file pages only this process
        maps (page cache, not its own allocation). statm directly, the unique set
        through psutil."""
        return self.memory(exact_above)[0]

    def memory(self, exact_above: int | None = None) -> tuple[int, int]:
        """(private_memory, RSS less file-backed and shared pages): the second is what
        it would hold alone once every process it shares pages copy-on-write with
        freed them, without its RSS moving (budgets re-read those: issue 33.3)."""
        unshared = self._rss_unshared()
        private = unshared
        if exact_above is not None and private > exact_above:
            private = min(private, self._unique())
        return private, unshared

    def _unique(self) -> int:
        """The unique set size (smaps_rollup, through psutil); a huge number where
        reaper may not read it (it needs ptrace access; statm does not)."""
        import psutil

        try:
            return self.proc.memory_full_info().uss
        except psutil.AccessDenied:
            return 1 << 62
        except psutil.Error as e:
            raise _psutil_mapped(e, self.pid, "read") from None
        except OSError as e:
            raise _mapped(e, self.pid, "read") from None

    def _rss_unshared(self) -> int:
        """RSS less its file-backed and shared pages (/proc/PID/statm), checked against start."""
        try:
            fd = os.open(f"/proc/{self.pid}/statm", os.O_RDONLY)
        except OSError as e:
            raise _mapped(e, self.pid, "read") if e.errno in DENIED else Gone(self.pid) from None
        try:
            f = os.read(fd, 256).split()
        except OSError:
            raise Gone(self.pid) from None
        finally:
            os.close(fd)
        if not self.same():
            raise Gone(self.pid)
        try:
            return max(0, int(f[1]) - int(f[2])) * PAGE
        except (IndexError, ValueError):
            raise Gone(self.pid) from None

    # --- signals ------------------------------------------------------------

    def _fd(self) -> int | None:
        if self._pidfd is None:
            self._pidfd = pidfd_of(self.pid, self.start)    # kept: one open per stray
        return self._pidfd

    def signal(self, signo: int) -> bool:
        """Sends signo; True if sent through a pidfd, False through kill()."""
        fd = self._fd()
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, signo)
                return True
            if not self.same():
                raise Gone(self.pid)
            os.kill(self.pid, signo)
            return False
        except OSError as e:
            raise _mapped(e, self.pid, _signals.name(signo)) from None

    # --- priority, scheduling class, affinity --------------------------------

    def _each_thread(self, what: str, fn: Callable[[int], None]) -> None:
        """fn(tid) for every thread (nice, policy and affinity are per thread),
        with the identity checked before and after."""
        if not self.same():
            raise Gone(self.pid)
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{self.pid}/task")]
        except OSError as e:
            raise (NotPermitted(self.pid, what, e) if e.errno in DENIED else Gone(self.pid)) from None
        for tid in tids:
            try:
                fn(tid)
            except ProcessLookupError:
                pass                      # that thread ended
            except OSError as e:
                raise _mapped(e, self.pid, what) from None
        if not self.same():
            raise Gone(self.pid)

    def renice(self, value: int = 19) -> None:
        self._each_thread("nice", lambda tid: os.setpriority(os.PRIO_PROCESS, tid, value))

    def sched_idle(self) -> None:
        self._each_thread("sched_idle", lambda tid: os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0)))

    def autogroup_nice(self, value: int = 19) -> bool:
        """Renices the stray's autogroup, if it leads a session of its own. Outside any
        cpu cgroup (in the root one) the kernel shares CPU between autogroups, one per
        session, before it looks at nice or SCHED_IDLE: a setsid'd stray alone in its
        autogroup would keep a full share. Only a session leader's: any other session
        holds processes that are not strays. False if there was nothing to do."""
        if not self.same():
            raise Gone(self.pid)
        try:
            if os.getsid(self.pid) != self.pid:
                return False
            # No O_CREAT: a kernel without autogroups has no such file.
            fd = os.open(f"/proc/{self.pid}/autogroup", os.O_WRONLY)
            try:
                os.write(fd, str(value).encode())
            finally:
                os.close(fd)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise _mapped(e, self.pid, "autogroup_nice") from None
        if not self.same():
            raise Gone(self.pid)
        return True

    def set_affinity(self, cpus: frozenset) -> None:
        self._each_thread("affinity", lambda tid: os.sched_setaffinity(tid, cpus))

    def checked(self, fn: Callable[[], None], what: str = "cgroup move") -> None:
        """fn() between two identity checks (cgroup moves)."""
        if not self.same():
            raise Gone(self.pid)
        try:
            fn()
        except OSError as e:
            raise _mapped(e, self.pid, what) from None
        if not self.same():
            raise Gone(self.pid)

    def close(self) -> None:
        if self._pidfd is not None:
            try:
                os.close(self._pidfd)
            except OSError:
                pass
            self._pidfd = None


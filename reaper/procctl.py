"""Acting on one process that was found earlier, never on a recycled pid.

A Handle pins a process by (pid, start time). Signals go through a pidfd taken
while the identity still held, so they can only reach that process; priority,
scheduling class, affinity and cgroup moves have no pidfd form, so the identity
is checked before and after each of them.
"""
from __future__ import annotations

import errno
import os
import signal
from typing import Callable, Optional

from reaper.proctable import read_stat

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


class Handle:
    def __init__(self, pid: int, start: int) -> None:
        import psutil

        self.pid = pid
        self.start = start
        try:
            self.proc = psutil.Process(pid)
        except psutil.Error:
            raise Gone(pid) from None
        # psutil read the start time of whatever held the pid at that moment:
        # if it still matches the table, psutil pinned the process we found.
        if not self.same():
            raise Gone(pid)
        self._pidfd: Optional[int] = None

    def same(self) -> bool:
        st = read_stat(self.pid)
        return st is not None and st[1] == self.start and st[3] not in ("Z", "X")

    def cpu_seconds(self) -> float:
        """User + system CPU (psutil)."""
        import psutil

        try:
            t = self.proc.cpu_times()
        except psutil.Error:
            raise Gone(self.pid) from None
        return t.user + t.system

    # --- signals ------------------------------------------------------------

    def _fd(self) -> Optional[int]:
        if self._pidfd is None and HAVE_PIDFD:
            try:
                fd = os.pidfd_open(self.pid)
            except ProcessLookupError:
                raise Gone(self.pid) from None
            except OSError as e:
                if e.errno in (errno.ENOSYS, errno.EINVAL):
                    return None           # kernel without pidfds: the caller said so once
                raise
            if not self.same():           # the pidfd names whoever holds the pid now
                os.close(fd)
                raise Gone(self.pid)
            self._pidfd = fd
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
        except ProcessLookupError:
            raise Gone(self.pid) from None

    # --- priority, scheduling class, affinity --------------------------------

    def _each_thread(self, fn: Callable[[int], None]) -> None:
        """fn(tid) for every thread (nice, policy and affinity are per thread),
        with the identity checked before and after."""
        if not self.same():
            raise Gone(self.pid)
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{self.pid}/task")]
        except OSError:
            raise Gone(self.pid) from None
        for tid in tids:
            try:
                fn(tid)
            except ProcessLookupError:
                pass                      # that thread ended
        if not self.same():
            raise Gone(self.pid)

    def renice(self, value: int = 19) -> None:
        self._each_thread(lambda tid: os.setpriority(os.PRIO_PROCESS, tid, value))

    def sched_idle(self) -> None:
        self._each_thread(lambda tid: os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0)))

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
        except ProcessLookupError:
            raise Gone(self.pid) from None
        except FileNotFoundError:
            return False
        if not self.same():
            raise Gone(self.pid)
        return True

    def set_affinity(self, cpus: frozenset) -> None:
        self._each_thread(lambda tid: os.sched_setaffinity(tid, cpus))

    def checked(self, fn: Callable[[], None]) -> None:
        """fn() between two identity checks (cgroup moves)."""
        if not self.same():
            raise Gone(self.pid)
        fn()
        if not self.same():
            raise Gone(self.pid)

    def close(self) -> None:
        if self._pidfd is not None:
            try:
                os.close(self._pidfd)
            except OSError:
                pass
            self._pidfd = None

"""Which Ray job a process works for.

Ray puts RAY_JOB_ID in the environment of the workers it starts, and their
children inherit it. A worker Ray starts before any job uses it (a prestarted
worker, as every worker of a plain ray.init() is) carries the null id
ffffffff, which names no job: it is never shown as one. Such a worker learns its
job when it is given a task, and says so in its log: Ray's log routing writes a
line ``:job_id:<hex>`` to the worker's stdout and stderr (the files
worker-<id>-ffffffff-<pid>.out/.err under the session's logs) each time the
worker starts work for a job. Its children inherit those descriptors.

Both are files a process controls: /proc/PID/environ is read bounded (the
kernel makes it, so it never blocks), the log through the process's fd 1 only
if it is a regular file, its last LOG_TAIL bytes, off the loop under a deadline
(procfs/offloop.py: the descriptor may lead into a hung filesystem). Only hex
ids of a sane length are taken.
"""
from __future__ import annotations

import os
import stat

from reaper.procfs.offloop import Late, OffLoop

NULL_JOB = "ffffffff"
ENV_MAX = 1 << 17         # bytes of /proc/PID/environ read
LOG_TAIL = 1 << 16        # bytes of a worker's log read, from its end
LOG_TIMEOUT = 0.2         # seconds the loop waits for a log to answer
MAX_ID = 64
_HEX = frozenset("0123456789abcdefABCDEF")


def _job(raw: bytes) -> "str | None":
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    if not text or len(text) > MAX_ID or not set(text) <= _HEX:
        return None
    return text.lower()


def from_environ(pid: int, proc: str = "/proc") -> tuple:
    """(whether the environment has Ray's RAY_JOB_ID, the job id or None for the null
    id or a bad one)."""
    try:
        fd = os.open(f"{proc}/{pid}/environ", os.O_RDONLY)
    except OSError:
        return False, None
    try:
        data = os.read(fd, ENV_MAX)
    except OSError:
        return False, None
    finally:
        os.close(fd)
    for item in data.split(b"\0"):
        if item.startswith(b"RAY_JOB_ID="):
            job = _job(item[len(b"RAY_JOB_ID="):])
            return True, None if job == NULL_JOB else job
    return False, None


def _log_tail(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return b""
        return os.pread(fd, LOG_TAIL, max(0, st.st_size - LOG_TAIL))
    finally:
        os.close(fd)


def last_marker(data: bytes) -> "str | None":
    """The job of the last ``:job_id:`` line in a Ray worker's log, or None."""
    at = data.rfind(b":job_id:")
    while at >= 0:
        if at == 0 or data[at - 1:at] == b"\n":
            line = data[at + len(b":job_id:"):].split(b"\n", 1)[0].strip()
            job = _job(line)
            if job is not None and job != NULL_JOB:
                return job
        at = data.rfind(b":job_id:", 0, at)
    return None


class Jobs:
    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.files = OffLoop(LOG_TIMEOUT, name="reaper-leftovers")

    def of(self, pid: int) -> tuple:
        """(Ray's variable is there, the job id or None): the environment's id, else
        the last one the process's stdout log names."""
        ray, job = from_environ(pid, self.proc)
        if ray and job is None:
            job = self.from_log(pid)
        return ray, job

    def stdout(self, pid: int) -> str:
        """Where pid's stdout points (a readlink: nothing of the target is touched); "" if unknown."""
        try:
            return os.readlink(f"{self.proc}/{pid}/fd/1")
        except OSError:
            return ""

    def from_log(self, pid: int) -> "str | None":
        try:
            return last_marker(self.files.run(_log_tail, f"{self.proc}/{pid}/fd/1"))
        except (Late, OSError, ValueError):
            return None

"""Reading a file a process controls (its scripts, a dist-info RECORD beside them, a
service's setting files): never a FIFO that would block the open or the read, never a
device or /proc file that reads without end, never more than a bound.

The file is opened with O_NONBLOCK (a FIFO's open returns at once instead of waiting
for a writer) and O_NOCTTY, checked with fstat to be a regular file, and read to at
most `limit` bytes: anything else is Refused, with a reason fit for one log line.

Where reaper reads what a process controls (the audit of issue 20; each site says so):
- budgets/ray.py: a process's exe, cwd, root, script, package and dist-info RECORD,
  through read_regular, off the loop under a deadline (procfs/offloop.py);
- services/spec.py: a service directory's setting files, through read_regular;
- commands/stats.py: --file, through read_regular;
- procfs/processes.py: /proc/PID/stat, cmdline and comm, made by the kernel (a
  process sets only its name and argv), read bounded (_read_small) and parsed
  from the last ')' (a name may hold anything, parentheses and newlines included);
- procctl.py: /proc/PID/statm and smaps_rollup (kernel-made, bounded);
- procfs/processes.py: /proc/PID/status (kernel-made); budgets/strays.py: readlink of
  /proc/PID/exe (a kernel thread has none);
- budgets/ (throttle): /proc/PID/cgroup of a stray reaper moved (kernel-made;
  the path in it is the cgroup's, which reaper compares, never opens).
"""
from __future__ import annotations

import os
import stat


class Refused(OSError):
    """Not a regular file, or larger than allowed: not read."""


def read_regular(path: str, limit: int) -> bytes:
    """The content of regular file path, at most limit bytes. Raises Refused for any
    other kind of file or a larger one, OSError (FileNotFoundError...) as open says."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path} is not a regular file")
        if st.st_size > limit:
            raise Refused(f"{path}: more than {limit} bytes")
        chunks, left = [], limit + 1          # a file that grows while read: still bounded
        while left > 0:
            data = os.read(fd, min(left, 1 << 16))
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        data = b"".join(chunks)
        if len(data) > limit:
            raise Refused(f"{path}: more than {limit} bytes")
        return data
    finally:
        os.close(fd)

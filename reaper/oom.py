"""reaper's standing with the OOM killer.

In a small memory cgroup whose processes are smaller than reaper (6 to 13 MB
resident), reaper at the invoker's oom_score_adj would be the OOM killer's
first choice, and its death ends the namespace and loses the child's status.
So where it may (CAP_SYS_RESOURCE), reaper lowers its own value to the minimum
after the spawn: the main child forked before that and keeps the invoker's
value, as must every child reaper starts (``invoker_value``).

Where it may not, no process may lower its own value, but any may raise one: the
C core's spawn raises each child's by REAPER_CHILD_OOM_RAISE (csrc/reaper_core.h)
before its exec, so that reaper is not the OOM killer's choice while a child could
be (docs/reaper.md, Notes).
"""
from __future__ import annotations

import os

PROTECTED = -1000        # OOM_SCORE_ADJ_MIN: never chosen
PATH = "/proc/self/oom_score_adj"

invoker_value = None     # what reaper was started with, for children started later


def protect(log) -> bool:
    """Lowers reaper's oom_score_adj; False (said at debug level) where it may not."""
    global invoker_value
    try:
        with open(PATH, "rb") as f:
            invoker_value = int(f.read())
    except (OSError, ValueError) as e:
        log.debug(f"oom_score_adj: cannot read {PATH} ({getattr(e, 'strerror', e)}); left alone")
        return False
    if invoker_value == PROTECTED:
        return True
    try:
        fd = os.open(PATH, os.O_WRONLY)
        try:
            os.write(fd, str(PROTECTED).encode())
        finally:
            os.close(fd)
    except OSError as e:
        log.debug(f"oom_score_adj: cannot lower reaper's own below {invoker_value} ({e.strerror}: "
                  "needs CAP_SYS_RESOURCE); its children start higher instead")
        return False
    log.debug(f"oom_score_adj: reaper's own lowered to {PROTECTED}; its children keep {invoker_value}")
    return True

"""A main child whose strays write page cache from inside reaper's memory cgroups: the
churn that leaves dying memory cgroups behind where a leaf is removed while charged.

    stray_churn.py COUNT WAVE MIB DIR

Starts COUNT orphans (strays of reaper as PID 1) in waves of WAVE. Each one waits until
reaper has moved it into one of its memory cgroups (reaper-strays.*), writes MIB MiB to
a file of its own in DIR (kept), and exits; a wave ends when all its strays have. Exits
0 when all did, 1 if a stray was never moved (within MOVE_WAIT seconds) or a wave did
not end (within WAVE_WAIT seconds). Used by tests/test_budget_cgroups.py and
bench/bench_cgroup_churn.py.
"""
import os
import sys
import time

MOVE_WAIT = 20.0
WAVE_WAIT = 60.0


def moved() -> bool:
    with open("/proc/self/cgroup") as f:
        return "reaper-strays." in f.read()


def stray(path: str, mib: int) -> int:
    deadline = time.monotonic() + MOVE_WAIT
    while not moved():
        if time.monotonic() > deadline:
            open(path + ".lost", "w").close()
            return 1
        time.sleep(0.02)
    with open(path, "wb") as f:        # page cache charged to the stray's memory cgroup
        for _ in range(mib):
            f.write(b"\1" * (1 << 20))
    os.rename(path, path + ".done")
    return 0


def orphan(path: str, mib: int) -> None:
    """Forks a grandchild running stray() and lets its parent exit: an orphan."""
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            os._exit(stray(path, mib))
        os._exit(0)
    os.waitpid(pid, 0)


def main() -> int:
    count, wave, mib, where = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    for first in range(0, count, wave):
        paths = [os.path.join(where, f"s{n}") for n in range(first, min(count, first + wave))]
        for path in paths:
            orphan(path, mib)
        deadline = time.monotonic() + WAVE_WAIT
        while not all(os.path.exists(p + ".done") for p in paths):
            if any(os.path.exists(p + ".lost") for p in paths):
                print(f"stray_churn: a stray of the wave at {first} was never moved", file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                print(f"stray_churn: wave at {first} did not end", file=sys.stderr)
                return 1
            time.sleep(0.02)
    return 0


if __name__ == "__main__":
    sys.exit(main())

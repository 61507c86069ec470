#!/usr/bin/env python3
"""reaper's own CPU and memory as strays pile up (issue 25).

Each row runs reaper as PID 1 of a fresh PID namespace (unshare), in a cpuacct cgroup
of its own as in a container (made here, removed after), with a main child that parks
N sleeping orphans (`sleep 3600` spawned by a process that exits: re-parented to
reaper) and, in the mixed rows, BUSY strays that burn about a quarter of a core each;
then the main child sleeps. In the distinct rows each sleeping stray has a command line
of its own, about 8 KB (as much as reaper reads: `sleep 3600 0.000...0<n>`): what reaper
keeps per stray must not depend on it (issue 33.6).
After --settle seconds, reaper's utime+stime is read from /proc over --seconds, and its
RSS at the end (and its anonymous part). Every count is run with budgets off and with `--cpu-budget 0.5`
(--budget-interval 1, action observe), side by side.

Run as root (unshare, cgroups): python bench/bench_budget_scale.py [--counts 0,1000,4000,10000]
The namespace ends with each row (SIGKILL to unshare: --kill-child ends reaper, and
the namespace with it); the cgroup is removed once empty. At most MAX_PROCS strays.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

from bench_budget import children, cpu   # this directory: run as a script

REAPER = shutil.which("reaper") or os.path.join(os.path.dirname(sys.executable), "reaper")
MAX_PROCS = 12000
BUSY = 2
# About 25 % of a core: busy 25 ms, sleep 75 ms.
BUSY_CODE = ("import time\nwhile True:\n    t = time.monotonic() + 0.025\n"
             "    while time.monotonic() < t: pass\n    time.sleep(0.075)\n")


def rss_mb(pid: int) -> tuple:
    """(resident, of it anonymous) in MB. The rest is file pages (the interpreter's and
    its libraries'), shared with every Python on the node: how many of them a process has
    mapped varies with the page cache (fault-around maps the neighbours that are
    cached), by a MB or two from one run to the next, budgets or not."""
    got = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "RssAnon:")):
                got[line.split(":")[0]] = int(line.split()[1]) / 1024
    return got.get("VmRSS", 0.0), got.get("RssAnon", 0.0)


def make_cgroup() -> "str | None":
    """A cpuacct (v1) or v2 cgroup of the bench's own; None if neither can be made."""
    for base in ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        d = os.path.join(base, f"reaper-bench-{os.getpid()}")
        if not os.path.isdir(base) or not (os.path.exists(os.path.join(base, "cpuacct.usage"))
                                           or os.path.exists(os.path.join(base, "cgroup.procs"))):
            continue
        try:
            os.mkdir(d)
            return d
        except OSError:
            continue
    return None


def remove_cgroup(d: "str | None") -> None:
    if d is None:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.rmdir(d)
            return
        except OSError:
            time.sleep(0.2)
    print(f"warning: could not remove {d}", file=sys.stderr)


SPAWN = """
import os, sys
n, busy, code, distinct = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
middle = os.fork()
if middle == 0:
    # posix_spawn: fast enough for 10,000; the middle process exits, its children are orphans.
    for i in range(n):
        # distinct: sleep adds its arguments; this one is about 0 s, 8 KB long, one of its own.
        extra = ["0." + "0" * (8150 - len(str(i))) + str(i)] if distinct else []
        os.posix_spawn("/bin/sleep", ["sleep", "3600", *extra], os.environ)
    for _ in range(busy):
        os.posix_spawn(sys.executable, [sys.executable, "-c", code], os.environ)
    os._exit(0)
os.waitpid(middle, 0)
os.execv("/bin/sleep", ["sleep", "3600"])
"""


def spawn_argv(n: int, busy: int, distinct: bool = False) -> list:
    return [sys.executable, "-c", SPAWN, str(n), str(busy), BUSY_CODE, "1" if distinct else "0"]


def run(n: int, busy: int, budgets: bool, a, distinct: bool = False) -> dict:
    cg = make_cgroup()
    args = ["--budget-interval", "1", "--cpu-budget", "0.5", "--budget-action", "observe"] if budgets else []
    inner = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", REAPER, *args, "--",
             *spawn_argv(n, busy, distinct)]
    join = f'echo $$ > {cg}/cgroup.procs && ' if cg else ""
    p = subprocess.Popen(["sh", "-c", join + 'exec "$@"', "sh", *inner],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + a.spawn_timeout
        reaper = None
        while reaper is None and time.monotonic() < deadline:
            kids = children(p.pid)
            reaper = kids[0] if kids else None
            time.sleep(0.05)
        if reaper is None:
            raise RuntimeError("reaper did not start")
        while len(children(reaper)) < n + busy + 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        strays = len(children(reaper)) - 1
        time.sleep(a.settle if budgets else 3)
        c0, t0 = cpu(reaper), time.monotonic()
        time.sleep(a.seconds if budgets else a.off_seconds)
        used, wall = cpu(reaper) - c0, time.monotonic() - t0
        rss, anon = rss_mb(reaper)
    finally:
        os.killpg(p.pid, signal.SIGKILL)         # unshare's group: --kill-child ends the namespace
        p.wait()
        remove_cgroup(cg)
    return {"n": n, "busy": busy, "budgets": budgets, "strays": strays, "pct": 100.0 * used / wall,
            "rss": rss, "anon": anon, "cgroup": cg is not None}


def compiled() -> None:
    """reaper's bytecode written, as an install does: a module without a current .pyc is
    compiled at every start (under PYTHONDONTWRITEBYTECODE, as on a development tree), and
    that leaves about 2 MB behind that is no budget's."""
    import compileall

    import reaper

    if not compileall.compile_dir(os.path.dirname(reaper.__file__), quiet=1):
        print("warning: reaper's bytecode could not all be written: RSS includes compiling it", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="0,1000,4000,10000")
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="measurement window with budgets on (60 s: one read of every sleeping stray)")
    ap.add_argument("--settle", type=float, default=12.0, help="seconds after the strays are up")
    ap.add_argument("--off-seconds", type=float, default=15.0, help="measurement window with budgets off")
    ap.add_argument("--spawn-timeout", type=float, default=180.0)
    ap.add_argument("--modes", default="sleeping,mixed",
                    help="sleeping, mixed (and 2 busy strays), distinct (sleeping, 8 KB command lines of their own)")
    a = ap.parse_args()
    counts = [int(x) for x in a.counts.split(",")]
    if max(counts) > MAX_PROCS:
        print(f"at most {MAX_PROCS} strays", file=sys.stderr)
        return 2
    compiled()
    print(f"reaper with strays: interval 1s, settle {a.settle:g}s, window {a.seconds:g}s, "
          f"{os.cpu_count()} CPUs, kernel {os.uname().release}", flush=True)
    print(f"{'strays':>7} {'busy':>5} {'off: CPU':>9} {'off: RSS':>9} {'on: CPU':>9} {'on: RSS':>9} "
          f"{'RSS over off':>13} {'anon over off':>14}", flush=True)
    for mode in a.modes.split(","):
        busy = BUSY if mode == "mixed" else 0
        distinct = mode == "distinct"
        for n in counts:
            off = run(n, busy, False, a, distinct)
            on = run(n, busy, True, a, distinct)
            print(f"{on['strays']:>7} {busy:>5} {off['pct']:>8.2f}% {off['rss']:>6.1f} MB {on['pct']:>8.2f}% "
                  f"{on['rss']:>6.1f} MB {on['rss'] - off['rss']:>+10.1f} MB {on['anon'] - off['anon']:>+11.1f} MB"
                  + ("  distinct command lines" if distinct else "")
                  + ("" if on["cgroup"] else "  (no cgroup of its own)"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

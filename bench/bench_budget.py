#!/usr/bin/env python3
"""reaper's own CPU cost of CPU-budget sampling, with N live processes.

Each row runs reaper as PID 1 of a fresh PID namespace (unshare) with a main
child that starts N sleeping processes, waits for them to be up, then measures
reaper's utime+stime (from /proc) over --seconds. Rows:

    budgets off                         the baseline: no sampling at all
    on, N in the main tree              the common case: strays are rare
    on, N in the main tree, --stray-match   every command line read every sample
    on, N strays (orphans)              the worst case: every process tracked

Run as root (unshare): python bench/bench_budget.py [--procs 1000] [--seconds 30]
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
REAPER = shutil.which("reaper") or os.path.join(os.path.dirname(sys.executable), "reaper")


def children(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def count_below(pid: int) -> int:
    n, todo = 0, [pid]
    while todo:
        p = todo.pop()
        kids = children(p)
        n += len(kids)
        todo += kids
    return n


def run(label: str, args: list, procs: int, orphans: bool, seconds: float, interval: float) -> dict:
    if orphans:
        spawn = f"i=0; while [ $i -lt {procs} ]; do (sleep 3600 &); i=$((i+1)); done; exec sleep 3600"
    else:
        spawn = f"i=0; while [ $i -lt {procs} ]; do sleep 3600 & i=$((i+1)); done; wait"
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", REAPER,
           "--budget-interval", str(interval), *args, "--", "sh", "-c", spawn]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        reaper = None
        while reaper is None and time.monotonic() < deadline:
            kids = children(p.pid)
            reaper = kids[0] if kids else None
            time.sleep(0.01)
        while count_below(reaper) < procs + 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2 * interval + 1)             # the first samples read every process once
        c0, t0 = cpu(reaper), time.monotonic()
        time.sleep(seconds)
        used = cpu(reaper) - c0
        wall = time.monotonic() - t0
        live = count_below(reaper)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    return {"label": label, "procs": live, "cpu_s": used, "wall_s": wall,
            "pct": 100.0 * used / wall, "per_sample_ms": 1000.0 * used / (wall / interval)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=30.0,
                    help="measurement window (30 s includes one full /proc read)")
    ap.add_argument("--interval", type=float, default=1.0)
    a = ap.parse_args()
    budget = ["--cpu-budget", "0.5", "--budget-action", "observe"]
    rows = [
        run("budgets off", [], a.procs, False, a.seconds, a.interval),
        run(f"on, {a.procs} in the main tree", budget, a.procs, False, a.seconds, a.interval),
        run(f"on, {a.procs} in main tree, --stray-match", budget + ["--stray-match", "^nomatch$"],
            a.procs, False, a.seconds, a.interval),
        run(f"on, {a.procs} strays (orphans)", budget, a.procs, True, a.seconds, a.interval),
    ]
    print(f"reaper CPU-budget sampling cost, interval {a.interval:g}s, window {a.seconds:g}s, "
          f"{os.cpu_count()} CPUs, kernel {os.uname().release}")
    print(f"{'case':<40} {'procs':>6} {'reaper CPU s':>13} {'% of 1 core':>12} {'ms/sample':>10}")
    for r in rows:
        print(f"{r['label']:<40} {r['procs']:>6} {r['cpu_s']:>13.2f} {r['pct']:>11.2f}% "
              f"{r['per_sample_ms']:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

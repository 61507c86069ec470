#!/usr/bin/env python3
"""reaper's own cost of tracking owners (--leftovers), with 2,000 processes below
owners and 100 leftovers.

Each row runs reaper as PID 1 of a fresh PID namespace (unshare) with 20 services of
100 sleeping children each (2,000 processes whose owner reaper notes every sample)
and a 21st service that starts 100 setsid'd sleepers and exits (--restart never):
100 leftovers, reported and then followed while they live. Once all are up, reaper's
utime+stime (from /proc) is measured over --seconds, and its resident memory.

    --leftovers keep      the baseline: the piece is not started
    --leftovers report    sampling every second, the 100 leftovers followed

Run as root (unshare): python bench/bench_leftovers.py [--seconds 30]
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
REAPER = os.path.join(os.path.dirname(sys.executable), "reaper")
REAPER = REAPER if os.path.exists(REAPER) else shutil.which("reaper")
SERVICES, CHILDREN, LEFTOVERS = 20, 100, 100


def below(pid: int) -> int:
    n, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except OSError:
            kids = []
        n += len(kids)
        todo.extend(kids)
    return n


def reaper_pid(unshare: int) -> int:
    for _ in range(500):
        try:
            with open(f"/proc/{unshare}/task/{unshare}/children") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
        except OSError:
            pass
        time.sleep(0.01)
    raise SystemExit("reaper did not start")


def usage(pid: int) -> tuple:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return (int(fields[11]) + int(fields[12])) / TICK, rss * 1024


def row(mode: str, seconds: float) -> tuple:
    args = ["--leftovers", mode, "--restart", "never"]
    for i in range(SERVICES):
        args += ["--service", f"w{i}=sh -c 'for i in $(seq {CHILDREN}); do sleep 3600 & done; wait'"]
    args += ["--service", f"leaky=sh -c 'for i in $(seq {LEFTOVERS}); do setsid sleep 3600 & done; sleep 3; exit 0'"]
    p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", REAPER, *args,
                          "--", "sleep", "3600"], stderr=subprocess.PIPE)
    try:
        r = reaper_pid(p.pid)
        want = SERVICES * (CHILDREN + 1) + LEFTOVERS + 1
        deadline = time.monotonic() + 120
        while below(r) < want and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(5)                          # the leaky service has ended, its leftovers reported
        c0, _ = usage(r)
        t0 = time.monotonic()
        time.sleep(seconds)
        c1, rss = usage(r)
        return (c1 - c0) / (time.monotonic() - t0), rss, below(r)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30)
    a = ap.parse_args()
    base = None
    print(f"{'mode':8} {'processes':>9} {'CPU % of a core':>16} {'RSS MB':>8} {'RSS +MB':>8}")
    for mode in ("keep", "report"):
        cpu, rss, n = row(mode, a.seconds)
        base = rss if base is None else base
        print(f"{mode:8} {n:9d} {100 * cpu:16.2f} {rss / 1e6:8.1f} {(rss - base) / 1e6:8.1f}")


if __name__ == "__main__":
    main()

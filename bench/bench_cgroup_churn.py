#!/usr/bin/env python3
"""What leaving no dying memory cgroup behind costs (docs/benchmarks-budget.md).

    bench_cgroup_churn.py [--strays 150] [--wave 10] [--mib 2] [--reaper PATH]

Needs root and a writable cgroup v1 memory hierarchy (or v2 with the memory controller).
Three rows:

- churn: reaper as PID 1 with --memory-budget 64M --budget-action throttle while
  bench/helpers/stray_churn.py starts STRAYS strays in waves of WAVE, each writing MIB MiB
  of page cache inside its memory cap: memory cgroups on the host after reaper exited
  (once the kernel has freed what it can) against before, the most cgroups reaper held at
  once (reaper_budget_cgroups, from its metrics file), its CPU time, the run's length.
- reclaim: what one leaf's reclaim before its removal takes (cgroupfs.remove), for a leaf
  holding MIB MiB of dirty page cache and 64 MiB, and what stays charged after it.
- pool: kernel memory one live, empty memory cgroup costs (a pooled leaf waiting for the
  next stray): Slab + Percpu in /proc/meminfo over 100 of them.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CHURN = os.path.join(HERE, "helpers", "stray_churn.py")
sys.path.insert(0, os.path.dirname(HERE))

from reaper.budgets import cgroupfs  # noqa: E402


def memory_cgroups() -> int:
    with open("/proc/cgroups") as f:
        for line in f:
            if line.split()[:1] == ["memory"]:
                return int(line.split()[2])
    return -1


def own_memory_dir() -> str:
    where = cgroupfs.own_dir("memory") or cgroupfs.own_dir("")
    if where is None:
        sys.exit("no memory cgroup hierarchy reaper could use here")
    return where[1]


def settle(before: int, timeout: float = 20.0) -> int:
    """The count once the kernel has freed what it will (RCU after each rmdir)."""
    deadline, last = time.monotonic() + timeout, memory_cgroups()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = memory_cgroups()
        if now == last and now - before <= 5:
            break
        last = now
    return last


def churn(args) -> None:
    work = tempfile.mkdtemp(prefix="reaper-churn.")
    prom = os.path.join(work, "metrics.prom")
    files = os.path.join(work, "files")
    os.mkdir(files)
    before = memory_cgroups()
    t0 = time.monotonic()
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", args.reaper,
                        "--memory-budget", "64M", "--budget-action", "throttle", "--budget-interval", "0.1",
                        "--budget-grace", "0", "--metrics-file", prom, "--metrics-interval", "0.2", "--",
                        sys.executable, CHURN, str(args.strays), str(args.wave), str(args.mib), files],
                       capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    after = settle(before)
    text = open(prom).read() if os.path.exists(prom) else ""
    cpu = sum(float(v) for v in re.findall(r'^reaper_cpu_seconds_total\{mode="\w+"\} (\S+)', text, re.M))
    shutil.rmtree(work)
    print(f"churn: {args.strays} strays ({args.wave} at a time, {args.mib} MiB of page cache each): "
          f"exit {r.returncode}, {after - before:+d} memory cgroups after reaper exited "
          f"({before} before), reaper CPU {cpu:.2f} s over {took:.1f} s")


def fill(d: str, mib: int, path: str) -> None:
    """A process in d writes mib MiB to path (dirty page cache charged to d), then exits."""
    code = (f"import os\nopen({os.path.join(d, 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
            f"f = open({path!r}, 'wb')\nfor _ in range({mib}): f.write(b'\\1' * (1 << 20))\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def reclaim_row(parent: str, mib: int, n: int = 5) -> None:
    work = tempfile.mkdtemp(prefix="reaper-reclaim.")
    times, left = [], []
    for i in range(n):
        d = os.path.join(parent, f"bench-reclaim-{os.getpid()}-{i}")
        os.mkdir(d)
        fill(d, mib, os.path.join(work, f"f{i}"))
        t0 = time.perf_counter()
        cgroupfs.reclaim(d)
        times.append(time.perf_counter() - t0)
        left.append(cgroupfs.memory_charged(d))
        cgroupfs.rmdir(d)
    shutil.rmtree(work)
    times.sort()
    print(f"reclaim: a leaf with {mib} MiB of dirty page cache: median {times[n // 2] * 1e3:.1f} ms "
          f"(max {times[-1] * 1e3:.1f} ms), {max(left) / 1024:.0f} KiB left charged")


def meminfo(keys=("Slab", "Percpu")) -> int:
    out = 0
    with open("/proc/meminfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in keys:
                out += int(v.split()[0]) * 1024
    return out


def pool_row(parent: str, n: int = 100) -> None:
    dirs = [os.path.join(parent, f"bench-pool-{os.getpid()}-{i}") for i in range(n)]
    m0 = meminfo()
    for d in dirs:
        os.mkdir(d)
    m1 = meminfo()
    for d in dirs:
        cgroupfs.rmdir(d)
    print(f"pool: one live, empty memory cgroup costs about {(m1 - m0) / n / 1024:.0f} KiB of kernel memory "
          f"(Slab + Percpu over {n}, {os.cpu_count()} CPUs)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strays", type=int, default=150)
    p.add_argument("--wave", type=int, default=10)
    p.add_argument("--mib", type=int, default=2)
    p.add_argument("--reaper", default=shutil.which("reaper") or "reaper")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (PID namespaces, cgroups)")
    parent = own_memory_dir()
    churn(args)
    reclaim_row(parent, args.mib)
    reclaim_row(parent, 64)
    pool_row(parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())

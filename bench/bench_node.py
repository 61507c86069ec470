#!/usr/bin/env python3
"""The cost of reaper node's sampler (issue 21): CPU per one-second sample on a node of
10,000 processes and 96 cores, while no core is saturated (the per-process scan does
not run) and while one is (it runs, within its time budget), plus one scrape.

The node is synthetic: a /proc and a /sys written to a temporary directory (tmpfs when
/dev/shm is one): /proc/stat with 96 cores, advanced before every sample (all cores at
30 % busy, or one at 100 % system time), 10,000 proc/PID/stat and cgroup files (one
process's system time grows by a core's worth each sample: the culprit, the last
pid, so the scan reaches it last), /proc/cgroups,
pressure, softnet_stat, interrupts, and a v1 memory hierarchy of 240 directories. The
sampler (reaper/node/monitor.py) runs in this process, as in reaper node, on a clock of
its own (one second a sample, so the 10 s and 30 s reads come at their rate); its CPU
is this thread's CPU time. A synthetic file reads faster than the kernel's proc/PID/stat
(about 12 µs each on the machine of the results): the scan's cost is held by its time
budget, not by the number of processes, so the saturated figure holds for a real node;
the "real /proc" row measures this machine's own /proc for comparison.

Run:
    python3 bench/bench_node.py             # about a minute
    python3 bench/bench_node.py --quick     # smoke run (1,000 processes, a few samples)
Results: docs/benchmarks-node.md. Needs reaper importable (pip install -e .).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reaper.node.collector import NodeCollector  # noqa: E402
from reaper.node.monitor import Monitor  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


class _Quiet:
    """A log that shows only failures (the culprit lines are the sampler's normal work)."""

    def warn(self, msg: str) -> None:
        if "failed" in msg:
            print("warning:", msg, file=sys.stderr)

    info = debug = error = warn


class Node:
    """The synthetic /proc and /sys, and their clock."""

    def __init__(self, root: Path, procs: int, cores: int, cgroups: int) -> None:
        self.proc, self.sys = root / "proc", root / "sys"
        self.cores = cores
        self.jiffies = {c: [0] * 8 for c in range(cores)}
        self.culprit = 1000 + procs - 1     # the last pid: the pass reaches it last (the worst case)
        self.culprit_stime = 0
        self.proc.mkdir()
        for n in range(procs):
            pid = 1000 + n
            d = self.proc / str(pid)
            d.mkdir()
            self._stat(pid, 0)
            (d / "cgroup").write_text(f"4:memory:/kubepods/burstable/pod{n % 300:04x}/c{n}\n0::/\n")
        (self.proc / "cgroups").write_text("#subsys_name\thierarchy\tnum_cgroups\tenabled\n"
                                           f"memory\t4\t{cgroups + 68000}\t1\n")
        (self.proc / "pressure").mkdir()
        for res in ("cpu", "memory", "io"):
            (self.proc / "pressure" / res).write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"
                                                      "full avg10=0.00 avg60=0.00 avg300=0.00 total=1\n")
        (self.proc / "net").mkdir()
        (self.proc / "net" / "softnet_stat").write_text(
            "".join(" ".join(["00000000"] * 12 + [f"{c:08x}", "00000000", "00000000"]) + "\n" for c in range(cores)))
        head = " " * 11 + "".join(f"CPU{c:<8}" for c in range(cores))
        rows = [f"{i:>4}: " + " ".join(f"{i * c:>10}" for c in range(cores)) + "  PCI-MSI  eth-q" for i in range(200)]
        (self.proc / "interrupts").write_text(head + "\n" + "\n".join(rows) + "\n")
        top = self.sys / "fs" / "cgroup" / "memory"
        top.mkdir(parents=True)
        (top / "memory.usage_in_bytes").write_text("0\n")
        for n in range(cgroups - 1):
            (top / f"pod{n:04x}").mkdir()
        self.advance(saturated=False)

    def _stat(self, pid: int, stime: int) -> None:
        f = (["R" if pid == self.culprit else "S", "1"] + ["0"] * 10 + [str(stime)] + ["0"] * 6 + ["500"]
             + ["0"] * 16 + [str(pid % self.cores)] + ["0"] * 5)          # stime, starttime, processor
        (self.proc / str(pid) / "stat").write_text(f"{pid} (worker-{pid}) " + " ".join(f) + "\n")

    def advance(self, saturated: bool) -> None:
        """One second of every core: 30 % busy, or core 0 at 100 % system time (and the culprit's
        system time grows by a second)."""
        for c, j in self.jiffies.items():
            if saturated and c == 0:
                j[2] += TICK
            else:
                j[0] += TICK * 3 // 10
                j[3] += TICK - TICK * 3 // 10
        total = [sum(j[i] for j in self.jiffies.values()) for i in range(8)]
        lines = ["cpu  " + " ".join(map(str, total)) + " 0 0"]
        lines += [f"cpu{c} " + " ".join(map(str, j)) + " 0 0" for c, j in self.jiffies.items()]
        (self.proc / "stat").write_text("\n".join(lines) + "\nintr 0\n")
        if saturated:
            self.culprit_stime += TICK
            self._stat(self.culprit, self.culprit_stime)


def run(node: Node, samples: int, saturated: bool) -> dict:
    clock = [0.0]
    # The scan's budget runs on real time; its shares on the samples' one-second steps.
    m = Monitor(str(node.proc), str(node.sys), 0.95, 600.0, _Quiet(), clock=lambda: clock[0] + time.monotonic())
    cpu, first = [], None
    for i in range(samples):
        node.advance(saturated)
        clock[0] += 1.0
        t = time.thread_time()
        m.sample(clock[0])
        cpu.append(time.thread_time() - t)
        if first is None and node.culprit in [c.pid for c in m.top]:
            first = i + 1
    steady = cpu[2:] or cpu          # the first samples take baselines
    named = [c.pid for c in m.top]
    return {"cpu_ms_mean": 1000 * sum(steady) / len(steady), "cpu_ms_max": 1000 * max(steady),
            "percent_core": 100 * sum(steady) / len(steady) / 1.0, "scans": m.kernel.scans,
            "reads_per_scan": m.kernel.reads / max(m.kernel.scans, 1), "passes": m.kernel.passes,
            "culprit_named": node.culprit in named, "named_at_sample": first, "monitor": m}


def scrape_cost(m, rounds: int) -> float:
    import threading

    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry()
    reg.register(NodeCollector(m, threading.Lock()))
    t = time.thread_time()
    for _ in range(rounds):
        generate_latest(reg)
    return 1000 * (time.thread_time() - t) / rounds


def real_proc(samples: int) -> dict:
    """This machine's /proc: no core forced, the scan forced on every sample."""
    m = Monitor("/proc", "/sys", 0.95, 600.0, _Quiet())
    m.sample(0.0)
    cpu = []
    for i in range(samples):
        time.sleep(0.2)
        t = time.thread_time()
        m.kernel.scan()
        cpu.append(time.thread_time() - t)
    procs = sum(1 for n in os.listdir("/proc") if n.isdigit())
    per = sum(cpu) / max(m.kernel.reads, 1)
    return {"processes": procs, "us_per_read": 1e6 * per, "scan_ms": 1000 * sum(cpu) / len(cpu)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--processes", type=int, default=None)
    ap.add_argument("--cores", type=int, default=96)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    procs = a.processes or (1000 if a.quick else 10_000)
    samples = 8 if a.quick else 60
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = Path(tempfile.mkdtemp(prefix="bench-node-", dir=base))
    try:
        t = time.monotonic()
        node = Node(root, procs, a.cores, 240)
        built = time.monotonic() - t
        idle = run(node, samples, saturated=False)
        hot = run(node, samples, saturated=True)
        scrape = scrape_cost(hot["monitor"], 5 if a.quick else 50)
        real = real_proc(3 if a.quick else 10)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"reaper node sampler, {procs} processes, {a.cores} cores, {samples} one-second samples "
          f"(synthetic node built in {built:.1f} s); {platform.node()} {platform.release()}, nproc {os.cpu_count()}")
    print(f"{'case':<34}{'CPU ms/sample':>14}{'max ms':>9}{'% of a core':>13}{'reads/scan':>12}")
    for name, r in (("no core saturated", idle), ("one core saturated (attributing)", hot)):
        print(f"{name:<34}{r['cpu_ms_mean']:>14.2f}{r['cpu_ms_max']:>9.2f}{r['percent_core']:>13.2f}"
              f"{r['reads_per_scan']:>12.0f}")
    named = f"yes, from sample {hot['named_at_sample']} of the saturation" if hot["culprit_named"] else "NO"
    print(f"culprit named while attributing: {named}; full passes over the processes: {hot['passes']} "
          f"in {hot['scans']} scans")
    print(f"one scrape (collect + encode): {scrape:.2f} ms CPU")
    print(f"real /proc of this machine: {real['processes']} processes, {real['us_per_read']:.1f} µs CPU per "
          f"stat read, {real['scan_ms']:.2f} ms per scan")
    if a.json:
        out = {"processes": procs, "cores": a.cores, "samples": samples, "scrape_ms": scrape, "real": real}
        for name, r in (("idle", idle), ("attributing", hot)):
            out[name] = {k: v for k, v in r.items() if k != "monitor"}
        a.json.write_text(json.dumps(out, indent=2))
    return 0 if hot["culprit_named"] else 1


if __name__ == "__main__":
    sys.exit(main())

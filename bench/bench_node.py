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

With --real (root): the real command, `reaper node`, on real processes. The bench
re-runs itself as PID 1 of a PID namespace of its own (unshare --pid --fork --mount-proc
--kill-child: everything in it dies with it), starts N sleeping processes there (1,000
and 20,000; `sleep`, at most 10 minutes each) and runs `reaper node --proc /proc` in it,
for each N: idle; with a renamed dd burning one core in the kernel, sampled
(perf_event_open, as root); and the same burn as root without capabilities, so that
sampling is refused and the per-process scan walks the N processes instead. Its CPU is
reaper node's own (utime + stime of its /proc/PID/stat over the measured seconds: 30
idle, so that the 30-second zombie pass falls in it, and 15 burning), and the time to
name the kernel function is the streak's length when the function first shows in its
metrics file (written every second).

Run:
    python3 bench/bench_node.py             # about a minute
    python3 bench/bench_node.py --quick     # smoke run (1,000 processes, a few samples)
    python3 bench/bench_node.py --real      # real processes, root: about 3 minutes
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


REAL_SIZES = (1000, 20_000)
REAL_SECONDS = 15.0          # measured per case with a core burnt, after a warm-up
IDLE_SECONDS = 30.0          # measured idle: the 30-second zombie pass falls in it once
SLEEP_MAX = "600"            # a sleeper's life at most, whatever happens to the bench


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _metric(path: Path, name: str) -> list:
    """[(labels text, value)] of a family's samples in a metrics file."""
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            out.append((head[len(name):], float(value)))
    return out


def _real_case(tmp: Path, burn: "int | None", without_caps: bool) -> dict:
    """reaper node in this namespace for REAL_SECONDS (after 3 s of warm-up), a core burnt
    in the kernel if burn is a core."""
    import signal
    import subprocess

    out = tmp / f"metrics-{burn}-{without_caps}.prom"
    reaper = [str(Path(sys.executable).with_name("reaper"))]
    pre = ["setpriv", "--inh-caps=-all", "--bounding-set=-all"] if without_caps else []
    # The file every second while burning (to see when the function is named); idle, every
    # 15 s, a scrape's usual interval (a file written every second is 0.5 % of a core alone).
    interval = "1" if burn is not None else "15"
    node = subprocess.Popen(pre + reaper + ["node", "--kmsg", "", "--metrics-file", str(out),
                                            "--metrics-interval", interval],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dd = None
    try:
        time.sleep(3.0)
        if burn is not None:
            exe = tmp / "kburnbench"
            shutil.copy("/bin/dd", exe)
            dd = subprocess.Popen([str(exe), "if=/dev/zero", "of=/dev/null", "bs=1M"], stderr=subprocess.DEVNULL,
                                  preexec_fn=lambda: os.sched_setaffinity(0, {burn}))
        c0, t0, named_at = _cpu_seconds(node.pid), time.monotonic(), None
        while time.monotonic() - t0 < (REAL_SECONDS if burn is not None else IDLE_SECONDS):
            time.sleep(0.25)
            functions = _metric(out, "reaper_node_kernel_function_top_ratio") if named_at is None else []
            if burn is not None and any(f'cpu="{burn}"' in labels for labels, _ in functions):
                streak = [v for labels, v in _metric(out, "reaper_node_cpu_saturation_streak_seconds")
                          if f'cpu="{burn}"' in labels]
                named_at = streak[0] if streak else None
        c1, t1 = _cpu_seconds(node.pid), time.monotonic()
        culprit = [labels for labels, _ in _metric(out, "reaper_node_kernel_time_top_ratio") if "kburnbench" in labels]
    finally:
        if dd is not None:
            dd.kill()
            dd.wait()
        node.send_signal(signal.SIGTERM)
        _, err = node.communicate(timeout=30)
    return {"percent_core": 100 * (c1 - c0) / (t1 - t0), "function_named_at_streak_seconds": named_at,
            "culprit_named": bool(culprit), "sampling_refused": "not sampled" in err}


def real(sizes, quick: bool) -> dict:
    """In this PID namespace (PID 1 here): for each size, the sleepers, then the cases."""
    import subprocess

    global REAL_SECONDS, IDLE_SECONDS
    if quick:
        REAL_SECONDS = IDLE_SECONDS = 4.0
    tmp = Path(tempfile.mkdtemp(prefix="bench-node-real-"))
    burn = max(os.sched_getaffinity(0))
    sleepers: list = []
    results = {}
    try:
        for n in sizes:
            while len(sleepers) < n:
                sleepers.append(subprocess.Popen(["sleep", SLEEP_MAX], stdin=subprocess.DEVNULL,
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            procs = sum(1 for d in os.listdir("/proc") if d.isdigit())
            results[n] = {"processes": procs,
                          "idle": _real_case(tmp, None, False),
                          "sampling": _real_case(tmp, burn, False),
                          "scan (no sampling)": _real_case(tmp, burn, True)}
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def main_real(a) -> int:
    import subprocess

    if os.getpid() != 1:                 # into a PID namespace of our own, where we are PID 1
        argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable,
                str(Path(__file__).resolve()), *sys.argv[1:]]
        return subprocess.run(argv).returncode
    sizes = (a.processes,) if a.processes else ((1000,) if a.quick else REAL_SIZES)
    res = real(sizes, a.quick)
    load = open("/proc/loadavg").read().split()[:3]
    print(f"reaper node on real processes in a PID namespace, {IDLE_SECONDS:.0f} s idle, {REAL_SECONDS:.0f} s a "
          f"burning case; "
          f"{platform.node()} {platform.release()}, nproc {os.cpu_count()}, load average {' '.join(load)}")
    print(f"{'processes':>10}  {'case':<22}{'% of a core':>12}  {'function named at':>18}  culprit named")
    for n, r in res.items():
        for case in ("idle", "sampling", "scan (no sampling)"):
            c = r[case]
            at = c["function_named_at_streak_seconds"]
            at = "-" if case == "idle" else ("never" if at is None else f"{at:.0f} s into the streak")
            named = "-" if case == "idle" else ("yes" if c["culprit_named"] else "no")
            print(f"{r['processes']:>10}  {case:<22}{c['percent_core']:>12.2f}  {at:>18}  {named}")
    if a.json:
        a.json.write_text(json.dumps({str(k): v for k, v in res.items()}, indent=2))
    ok = all(r["sampling"]["culprit_named"] for r in res.values())
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--real", action="store_true", help="reaper node itself on real processes (root)")
    ap.add_argument("--processes", type=int, default=None)
    ap.add_argument("--cores", type=int, default=96)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.real:
        return main_real(a)
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

#!/usr/bin/env python3
"""Reap latency with the metrics exporter: off, on and quiet, on and abused (issue 4).

Each configuration runs as PID 1 of its own namespace a main child that, on
request, makes N orphans blocked on a pipe, releases them at once and times how
long until PID 1 has reaped them all (from /proc/1/task/1/children). "abused"
runs every storm during a slow-loris client (4 connections that never finish
their request head), 4 threads of back-to-back scrapes and garbage requests.
Debian's tini (no metrics) is the reference.

Run as root:
    python3 bench/bench_metrics.py              # about 1 minute
    python3 bench/bench_metrics.py --quick      # smoke run
Results: docs/benchmarks-metrics.md. Stdlib only.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from abuse import STORM_CHILD, Abuse

UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
REAPER = shutil.which("reaper") or str(Path(sys.executable).with_name("reaper"))

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_file(path: Path, timeout: float = 120.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            text = path.read_text()
            if text:
                return text
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    raise TimeoutError(f"no {path} after {timeout}s")


def run_config(name: str, n: int, rounds: int) -> dict:
    d = Path(tempfile.mkdtemp(prefix="bench-metrics-"))
    port = free_port()
    script = d / "storm.py"
    script.write_text(STORM_CHILD)
    child = [sys.executable, str(script), str(d), str(n)]
    if name == "tini":
        cmd = ["tini", "-s", "--", *child]
    elif name == "reaper, metrics off":
        cmd = [REAPER, "--", *child]
    else:
        cmd = [REAPER, "--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--", *child]
    proc = subprocess.Popen([*UNSHARE, *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times, abuse = [], None
    try:
        wait_file(d / "ready")
        for k in range(1, rounds + 1):
            if name.endswith("abused"):
                with Abuse(port) as abuse_now:
                    while len(abuse_now.latencies) < 50:      # in full swing first
                        time.sleep(0.01)
                    (d / f"go-{k}").touch()
                    times.append(float(wait_file(d / f"result-{k}")))
                abuse = abuse_now if abuse is None else _merge(abuse, abuse_now)
            else:
                (d / f"go-{k}").touch()
                times.append(float(wait_file(d / f"result-{k}")))
        (d / "exit").touch()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(d, ignore_errors=True)
    out = {"name": name, "times": times}
    if abuse is not None:
        lat = sorted(abuse.latencies)
        out["scrapes"] = len(lat)
        out["scrape_p50"] = lat[len(lat) // 2]
        out["scrape_p99"] = lat[int(len(lat) * 0.99)]
        out["status"] = abuse.statuses
    return out


def _merge(a: Abuse, b: Abuse) -> Abuse:
    a.latencies += b.latencies
    for k, v in b.statuses.items():
        a.statuses[k] = a.statuses.get(k, 0) + v
    return a


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--orphans", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    n, rounds = (200, 2) if args.quick else (args.orphans, args.rounds)
    configs = ["reaper, metrics off", "reaper, metrics on, quiet", "reaper, metrics on, abused"]
    if shutil.which("tini"):
        configs.append("tini")
    results = [run_config(c, n, rounds) for c in configs]
    print(f"# bench_metrics: storm of {n} orphans, {rounds} rounds each; {platform.node()}, "
          f"{os.cpu_count()} CPUs, {platform.release()}")
    print()
    print("| init | median storm reap (ms) | min (ms) | max (ms) | µs per orphan (median) |")
    print("|------|-----------------------:|---------:|---------:|-----------------------:|")
    for r in results:
        t = r["times"]
        med = statistics.median(t)
        print(f"| {r['name']} | {med * 1e3:.1f} | {min(t) * 1e3:.1f} | {max(t) * 1e3:.1f} | {med / n * 1e6:.1f} |")
    for r in results:
        if "scrapes" in r:
            print()
            print(f"Under abuse: {r['scrapes']} scrapes during the storms, latency p50 "
                  f"{r['scrape_p50'] * 1e3:.1f} ms, p99 {r['scrape_p99'] * 1e3:.1f} ms, statuses {r['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

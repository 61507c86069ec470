#!/usr/bin/env python3
"""Reap latency with the metrics exporter: off, on and quiet, on and abused (issue 4),
and the endpoint under a connection flood.

Each configuration runs as PID 1 of its own namespace a main child that, on
request, makes N orphans blocked on a pipe, releases them at once and times how
long until PID 1 has reaped them all (from /proc/1/task/1/children). "abused"
runs every storm during a slow-loris client (4 connections that never finish
their request head), 4 threads of back-to-back scrapes and garbage requests.
"flooded" runs them while 1,000 idle and 300 slow-loris connections are held
open (each opened again as soon as reaper cuts it) and a well-behaved client
probes /healthz and /metrics back to back: its answers, latencies, and reaper's
RSS and thread count under the flood make the second table.
Debian's tini (no metrics) is the reference.

Run as root:
    python3 bench/bench_metrics.py              # about 1.5 minutes
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

import http.client
import threading

from abuse import STORM_CHILD, Abuse, Flooding

FLOOD_IDLE, FLOOD_SLOW = 1000, 300

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


class Probe:
    """A well-behaved client in a thread: GET /healthz and /metrics back to back,
    and reaper's RSS and thread count every PROBE_SAMPLE seconds."""

    SAMPLE = 0.5

    def __init__(self, port: int, pid: int) -> None:
        self.port, self.pid = port, pid
        self.latencies, self.statuses = [], {}
        self.rss, self.threads = [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)

    def _run(self) -> None:
        next_sample, paths = 0.0, ("/healthz", "/metrics")
        while not self.stop.is_set():
            for path in paths:
                t = time.monotonic()
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                    conn.request("GET", path)
                    r = conn.getresponse()
                    r.read()
                    status = r.status
                    conn.close()
                except OSError as e:
                    status = type(e).__name__
                self.latencies.append(time.monotonic() - t)
                self.statuses[status] = self.statuses.get(status, 0) + 1
            if time.monotonic() >= next_sample:
                st = proc_status(self.pid)
                self.rss.append(int(st["VmRSS"].split()[0]) / 1024)
                self.threads.append(int(st["Threads"]))
                next_sample = time.monotonic() + self.SAMPLE


def proc_status(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def reaper_pid(unshare_pid: int) -> int:
    """reaper's host pid: the child unshare forked (blocks until it is there)."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            with open(f"/proc/{unshare_pid}/task/{unshare_pid}/children") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
        except OSError:
            pass
        time.sleep(0.005)
    raise TimeoutError("no reaper under unshare")


def wait_healthy(port: int, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.02)
    raise TimeoutError(f"no /healthz on port {port}")


def run_config(name: str, n: int, rounds: int, flood_seconds: float = 10.0) -> dict:
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
    times, abuse, probe = [], None, None
    try:
        wait_file(d / "ready")
        if name.endswith("flooded"):
            pid = reaper_pid(proc.pid)
            wait_healthy(port)
            before = proc_status(pid)
            with Flooding(port, FLOOD_IDLE, FLOOD_SLOW) as flood, Probe(port, pid) as probe:
                while flood.stats()["cuts"] < 2 * FLOOD_SLOW:        # in full swing first
                    time.sleep(0.01)
                end = time.monotonic() + flood_seconds
                for k in range(1, rounds + 1):
                    (d / f"go-{k}").touch()
                    times.append(float(wait_file(d / f"result-{k}")))
                while time.monotonic() < end:                        # the probe goes on for flood_seconds
                    time.sleep(0.05)
                flooded = flood.stats()
            probe.before = (int(before["VmRSS"].split()[0]) / 1024, int(before["Threads"]))
            probe.flood = flooded
        for k in range(1, rounds + 1) if probe is None else ():
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
    if probe is not None:
        lat = sorted(probe.latencies)
        out["probe"] = {"requests": len(lat), "statuses": probe.statuses, "p50": lat[len(lat) // 2],
                        "p99": lat[int(len(lat) * 0.99)], "max": lat[-1], "rss_before": probe.before[0],
                        "rss_max": max(probe.rss), "threads_before": probe.before[1],
                        "threads": sorted(set(probe.threads)), "flood": probe.flood}
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
    configs = ["reaper, metrics off", "reaper, metrics on, quiet", "reaper, metrics on, abused",
               "reaper, metrics on, flooded"]
    if shutil.which("tini"):
        configs.append("tini")
    results = [run_config(c, n, rounds, 2.0 if args.quick else 10.0) for c in configs]
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
    for r in results:
        if "probe" in r:
            p = r["probe"]
            print()
            print(f"Under the flood ({FLOOD_IDLE} idle + {FLOOD_SLOW} slow-loris connections held open; "
                  f"reaper cut {p['flood']['cuts']} of them, each opened again at once), a client probing "
                  "/healthz and /metrics back to back:")
            print()
            print("| requests | answers | p50 (ms) | p99 (ms) | max (ms) | reaper RSS (MiB) | reaper threads |")
            print("|---------:|---------|---------:|---------:|---------:|-----------------:|---------------:|")
            print(f"| {p['requests']} | {p['statuses']} | {p['p50'] * 1e3:.1f} | {p['p99'] * 1e3:.1f} | "
                  f"{p['max'] * 1e3:.1f} | {p['rss_before']:.1f} before, {p['rss_max']:.1f} max | "
                  f"{p['threads_before']} before, {'/'.join(map(str, p['threads']))} during |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench/bench_core.py runs end to end and prints its table (no timing assertions:
speed is the benchmark's business, docs/benchmarks.md records it)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REAPER, require

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_core.py"



@pytest.fixture(autouse=True)
def _needs_root_and_gcc():
    if os.geteuid() != 0:
        pytest.skip("the benchmark needs root (PID namespaces)")
    require("gcc", shutil.which("gcc") is not None, "apt-get install gcc")


@pytest.mark.xdist_group("cpu-heavy")     # storms and timings: not beside the other heavy tests
def test_quick_run_prints_every_row(tmp_path):
    out_json = tmp_path / "results.json"
    # Reaper only and a small storm: proves the script and its helper work, in a few seconds.
    r = subprocess.run([sys.executable, str(BENCH), "--quick", "--no-tini", "--orphans", "300",
                        "--reaper", REAPER, "--json", str(out_json)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert "note (reaper)" not in r.stdout, r.stdout     # every measurement was taken
    for metric in ("child runs, median", "reap throughput", "orphan storm", "drain: SIGTERM handlers that ran",
                   "signal forwarding latency p50", "RSS as PID 1", "idle context switches"):
        assert metric in r.stdout, r.stdout
    results = json.loads(out_json.read_text())["reaper"]
    assert results["storm_n"] == 300
    assert results["drain_handled"] == results["drain_handlers"]    # reaper drains: every handler ran
    assert results["rss_mb"] > 0 and results["sig_us_p50"] > 0 and results["child_ms_p50"] > 0


def test_refuses_a_missing_reaper(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), "--quick", "--reaper", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "reaper not found" in r.stderr


LEAN = BENCH.with_name("bench_lean.py")


@pytest.mark.xdist_group("cpu-heavy")     # timings: not beside the other heavy tests
def test_lean_bench_prints_its_rows_beside_tini_and_the_floor():
    """bench_lean.py (issue 10) in its quick form, the sections that take seconds."""
    require("tini", shutil.which("tini") is not None, "apt-get install tini")
    if not Path(sys.executable).with_name("reaper").exists():
        pytest.skip("reaper is not installed beside this interpreter")
    r = subprocess.run([sys.executable, str(LEAN), "--quick", "--only", "startup,exit,rss"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "note:" not in r.stdout, r.stdout + r.stderr
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]]
            for ln in r.stdout.splitlines() if ln.startswith("| ")}
    for metric in ("the init's share of `INIT -- true`", "the child is exec'd after",
                   "main child's exit -> init's exit, nothing left", "VmRSS as PID 1, child asleep"):
        tini, floor, reaper = rows[metric][:3]
        assert tini.endswith(("ms", "MB")) and reaper.endswith(("ms", "MB")), (metric, rows[metric])
        assert floor != "-" or metric.startswith("main"), (metric, rows[metric])

#!/usr/bin/env python3
"""Core benchmark of reaper, side by side with Debian's tini (issue 2, "Benchmark").

Prints one table: time until the child runs and total time for ``INIT true``;
orphan-storm reap throughput and drain time; signal-forwarding latency;
the init's RSS as PID 1; idle context switches.

Run as root (PID namespaces) on a machine with gcc:
    python3 bench/bench_core.py            # full run, about 2 minutes
    python3 bench/bench_core.py --quick    # smoke run, about 15 s

Every namespace is created with ``unshare --pid --fork --mount-proc
--kill-child``: killing our own unshare child kills its whole namespace.
Nothing else is ever signalled. Stdlib only.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
HELPER_SRC = HERE / "helpers" / "bench_helper.c"
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]

# Targets from issue 2 (2-core machine).
TARGET_CHILD_EXEC_MS = 15.0
TARGET_REAP_RATIO = 0.95
TARGET_SIGNAL_RATIO = 2.0
TARGET_RSS_MB = 16.0
TARGET_IDLE_CSW = 0


@dataclass
class Settings:
    startup_reps: int = 200
    storm_orphans: int = 10_000
    storm_reps: int = 3
    drain_left: int = 20
    drain_reps: int = 5
    signal_samples: int = 500
    signal_warmup: int = 20
    idle_seconds: float = 10.0
    timeout: float = 60.0     # bound on any single wait

    @classmethod
    def quick(cls) -> "Settings":
        return cls(startup_reps=20, storm_orphans=2_000, storm_reps=1, drain_left=10, drain_reps=2,
                   signal_samples=60, signal_warmup=10, idle_seconds=2.0, timeout=30.0)


@dataclass
class Init:
    name: str
    argv: list            # the init and its options, up to and including "--" when it needs one
    results: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


class BenchError(Exception):
    """A measurement could not be taken (printed as one line; the others go on)."""


# --- small utilities ----------------------------------------------------------

def pct(values, q: float) -> float:
    """q-th percentile (0..100), nearest rank on sorted values."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


def proc_status(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def ctxt_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of pid."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            st = proc_status_task(pid, tid)
        except FileNotFoundError:
            continue
        total += int(st["voluntary_ctxt_switches"]) + int(st["nonvoluntary_ctxt_switches"])
    return total


def proc_status_task(pid: int, tid: str) -> dict:
    out = {}
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def children_of(pid: int) -> list:
    """Children of every thread of pid, zombies included (they stay listed until reaped)."""
    kids = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(x) for x in f.read().split())
        except FileNotFoundError:
            pass
    return kids


def wait_for(pred, timeout: float, what: str, interval: float = 0.001):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class LineReader:
    """Bounded line reads from a pipe (several processes write whole lines to it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.eof = False

    def line(self, timeout: float) -> Optional[str]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"no output within {timeout:g}s")
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    self.eof = True
                self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    def expect(self, prefix: str, timeout: float) -> list:
        """The fields of the next line starting with prefix (other lines are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.line(max(0.0, deadline - time.monotonic()))
            if line is None:
                raise BenchError(f"output ended before a {prefix!r} line")
            fields = line.split()
            if fields and fields[0] == prefix:
                return fields[1:]


class Namespace:
    """INIT ... as PID 1 of a fresh PID namespace, with pipes on stdin/stdout.

    Closing it kills our own unshare child (SIGKILL), and --kill-child makes the
    kernel kill the init and with it the whole namespace."""

    def __init__(self, init: Init, helper_args: list, timeout: float) -> None:
        self.timeout = timeout
        self.proc = subprocess.Popen([*UNSHARE, *init.argv, *helper_args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out = LineReader(self.proc.stdout.fileno())
        unshare_exe = os.readlink(f"/proc/{self.proc.pid}/exe")

        def exec_d():
            for c in children_of(self.proc.pid):
                try:
                    if os.readlink(f"/proc/{c}/exe") != unshare_exe:
                        return c
                except OSError:
                    pass
            if self.proc.poll() is not None:
                raise BenchError(f"{init.name} exited at once: {self.proc.stderr.read().decode()[-300:]}")
            return None
        try:
            self.pid = wait_for(exec_d, timeout, f"{init.name} to start under unshare")   # host pid
            self.pidfd = os.pidfd_open(self.pid)
        except BaseException:
            self.close()
            raise

    def write(self, text: str) -> None:
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def init_exited(self, timeout: float) -> bool:
        r, _, _ = select.select([self.pidfd], [], [], timeout)
        return bool(r)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()          # our own child; --kill-child takes the namespace down
        try:
            self.proc.wait(self.timeout)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass
        if getattr(self, "pidfd", None) is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def finish(self) -> str:
        """Lets the run end by itself (stdin EOF) and returns the init's stderr."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(self.timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise BenchError("did not exit after its stdin closed")
        err = self.proc.stderr.read().decode(errors="replace")
        self.close()
        return err


# --- the helper program ---------------------------------------------------------

def build_helper(tmp: Path) -> str:
    out = tmp / "bench_helper"
    base = ["gcc", "-O2", "-Wall", "-Wextra", "-o", str(out), str(HELPER_SRC)]
    # Static when libc.a is there: no dynamic loading in the measured exec.
    for cmd in ([*base, "-static"], base):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 0:
            return str(out)
    raise SystemExit(f"bench_core: cannot compile {HELPER_SRC}: {r.stderr.strip()[-500:]}")


# --- 1. startup ------------------------------------------------------------------

def bench_startup(init: Init, helper: str, s: Settings) -> None:
    """INIT stamp, launched by the helper: t0 just before posix_spawn of the init,
    t1 when the child runs (its first instruction reads the clock), t2 after the wait."""
    to_child, total = [], []
    for _ in range(s.startup_reps):
        r = subprocess.run([helper, "launch", *init.argv, helper, "stamp"], capture_output=True,
                           text=True, timeout=s.timeout)
        fields = dict((ln.split()[0], ln.split()[1:]) for ln in r.stdout.splitlines() if ln.strip())
        if "child" not in fields or "launch" not in fields:
            raise BenchError(f"unexpected output {r.stdout!r} {r.stderr[-200:]!r}")
        t0, t2, status = (int(x) for x in fields["launch"])
        if status != 0:
            raise BenchError(f"{init.name} stamp: wait status {status}: {r.stderr[-200:]}")
        t1 = int(fields["child"][0])
        to_child.append((t1 - t0) / 1e6)
        total.append((t2 - t0) / 1e6)
    init.results.update(child_p50=statistics.median(to_child), child_p90=pct(to_child, 90),
                        total_p50=statistics.median(total), total_p90=pct(total, 90))


# --- 2. orphan storm and drain -----------------------------------------------------

def bench_storm(init: Init, helper: str, s: Settings) -> None:
    """N orphans parked on the init (PID 1) exit in the same instant; reap
    throughput = N / time from the release until the init has no child left but
    the storm program (zombies stay in /proc/PID/task/TID/children until reaped)."""
    rates, times = [], []
    for _ in range(s.storm_reps):
        ns = Namespace(init, [helper, "storm", str(s.storm_orphans)], s.timeout)
        try:
            parked = int(ns.out.expect("ready", s.timeout)[0])
            if parked < s.storm_orphans:
                init.notes.append(f"storm: only {parked} of {s.storm_orphans} orphans could be forked")
            if parked == 0:
                raise BenchError("storm: no orphan could be forked")
            wait_for(lambda: len(children_of(ns.pid)) >= parked + 1, s.timeout,
                     "the orphans to be re-parented to the init")
            ns.write("go\n")
            t_go = int(ns.out.expect("go", s.timeout)[0])
            wait_for(lambda: len(children_of(ns.pid)) <= 1, s.timeout, "the storm to be reaped",
                     interval=0.0005)
            t_done = time.monotonic_ns()
            secs = (t_done - t_go) / 1e9
            rates.append(parked / secs)
            times.append(secs * 1e3)
            ns.finish()
        finally:
            ns.close()
    init.results.update(storm_rate=statistics.median(rates), storm_ms=statistics.median(times),
                        storm_n=parked)


def bench_drain(init: Init, helper: str, s: Settings) -> None:
    """The main child exits leaving K processes (half with a SIGTERM handler):
    time from its exit until the init has exited (the namespace is then empty)."""
    times, handled = [], []
    for _ in range(s.drain_reps):
        ns = Namespace(init, [helper, "drain", str(s.drain_left)], s.timeout)
        try:
            t_exit = int(ns.out.expect("exit", s.timeout)[0])
            if not ns.init_exited(s.timeout):
                raise BenchError(f"{init.name} did not exit within {s.timeout:g}s of the drain")
            t_end = time.monotonic_ns()
            times.append((t_end - t_exit) / 1e6)
            ns.proc.wait(s.timeout)
            rest = ns.proc.stdout.read().decode()   # EOF: the whole namespace is gone
            handled.append(ns.out.buf.decode().count("term") + rest.count("term"))
        finally:
            ns.close()
    init.results.update(drain_ms=statistics.median(times), drain_handled=min(handled),
                        drain_handlers=(s.drain_left + 1) // 2)


# --- 3. signal forwarding -----------------------------------------------------------

def bench_signals(init: Init, helper: str, s: Settings) -> None:
    """SIGUSR1 to the init (its host pid); the child waits in sigwaitinfo and
    prints the clock at receipt. One signal in flight at a time."""
    total = s.signal_warmup + s.signal_samples
    ns = Namespace(init, [helper, "sigwait", str(total)], s.timeout)
    try:
        ns.out.expect("ready", s.timeout)
        settle(ns.pid, s.timeout)
        lat = []
        for i in range(total):
            t_send = time.monotonic_ns()
            os.kill(ns.pid, signal.SIGUSR1)    # the init we started, by its host pid
            t_recv = int(ns.out.expect("sig", 10.0)[0])
            if i >= s.signal_warmup:
                lat.append((t_recv - t_send) / 1e3)
        ns.finish()
    finally:
        ns.close()
    init.results.update(sig_p50=statistics.median(lat), sig_p99=pct(lat, 99))


def settle(pid: int, timeout: float, quiet: float = 0.3) -> None:
    """Waits until pid's context-switch count stops moving for `quiet` seconds
    (reaper imports its loop after the child runs)."""
    deadline = time.monotonic() + timeout
    last = ctxt_switches(pid)
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = ctxt_switches(pid)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
    # tini never settles (it wakes every second): that is what the idle row shows.


# --- 4 and 5. RSS and idle wake-ups (every init at the same time) -------------------

def bench_idle(inits: list, helper: str, s: Settings) -> None:
    running = []
    try:
        for init in inits:
            ns = Namespace(init, [helper, "idle"], s.timeout)
            running.append((init, ns))
            ns.out.expect("ready", s.timeout)
        for init, ns in running:
            settle(ns.pid, 5.0)
        before = {init.name: ctxt_switches(ns.pid) for init, ns in running}
        time.sleep(s.idle_seconds)
        for init, ns in running:
            st = proc_status(ns.pid)
            init.results.update(rss_mb=int(st["VmRSS"].split()[0]) / 1024,
                                idle_csw=ctxt_switches(ns.pid) - before[init.name],
                                threads=int(st["Threads"]))
        for init, ns in running:
            ns.finish()
    finally:
        for _, ns in running:
            ns.close()


# --- the table --------------------------------------------------------------------------

def fmt(v, unit: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if unit == "/s":
        return f"{v:,.0f}/s"
    if unit == "us":
        return f"{v:,.0f} us"
    if unit == "ms":
        return f"{v:.1f} ms"
    if unit == "MB":
        return f"{v:.1f} MB"
    return f"{v:g}"


def rows(reaper: Init, tini: Optional[Init], s: Settings) -> list:
    r = reaper.results
    t = tini.results if tini else {}
    out = []

    def row(metric, key, unit, target=None, ok=None, ratio=None):
        rv = r.get(key)
        tv = t.get(key) if tini else None
        if ratio is not None and rv is not None and tv:
            target = f"{rv / tv:.2f}x ({target})"
        verdict = "-" if ok is None or rv is None else ("PASS" if ok(rv, tv) else "FAIL")
        if ok is not None and rv is not None and ratio is not None and not tv:
            verdict = "n/a (no tini)"
        out.append([metric, fmt(rv, unit), fmt(tv, unit) if tini else "-", target or "-", verdict])

    row("`INIT true`: child runs, median", "child_p50", "ms", f"<= {TARGET_CHILD_EXEC_MS:g} ms",
        lambda rv, tv: rv <= TARGET_CHILD_EXEC_MS)
    row("`INIT true`: child runs, p90", "child_p90", "ms", f"<= {TARGET_CHILD_EXEC_MS:g} ms",
        lambda rv, tv: rv <= TARGET_CHILD_EXEC_MS)
    row("`INIT true`: total, median", "total_p50", "ms")
    row("`INIT true`: total, p90", "total_p90", "ms")
    row(f"orphan storm: reap rate ({r.get('storm_n', s.storm_orphans):,} at once)", "storm_rate", "/s",
        f">= {TARGET_REAP_RATIO:g}x", lambda rv, tv: tv is not None and rv >= TARGET_REAP_RATIO * tv, ratio=True)
    row("orphan storm: all reaped after", "storm_ms", "ms")
    row(f"drain: main child exits, {s.drain_left} left: init gone after", "drain_ms", "ms")
    for init in (reaper, tini):
        if init and "drain_handled" in init.results:
            init.results["drain_handled_s"] = f"{init.results['drain_handled']}/{init.results['drain_handlers']}"
    row("drain: SIGTERM handlers that ran", "drain_handled_s", "")
    row("signal forwarding latency p50", "sig_p50", "us", f"<= {TARGET_SIGNAL_RATIO:g}x",
        lambda rv, tv: tv is not None and rv <= TARGET_SIGNAL_RATIO * tv, ratio=True)
    row("signal forwarding latency p99", "sig_p99", "us", ratio=True, target="info")
    row("RSS as PID 1 (VmRSS)", "rss_mb", "MB", f"<= {TARGET_RSS_MB:g} MB", lambda rv, tv: rv <= TARGET_RSS_MB)
    row(f"idle context switches over {s.idle_seconds:g} s", "idle_csw", "", f"= {TARGET_IDLE_CSW}",
        lambda rv, tv: rv == TARGET_IDLE_CSW)
    return out


def render(table: list) -> str:
    head = ["metric", "reaper", "tini", "ratio / target", "pass/fail"]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(r) for r in table)])


def machine_facts() -> str:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    return (f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {os.cpu_count()} cores ({cpu}); "
            f"kernel {platform.release()}; Python {platform.python_version()}; "
            f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def find_reaper() -> Optional[str]:
    beside = Path(sys.executable).with_name("reaper")
    return shutil.which("reaper") or (str(beside) if beside.exists() else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, 2 s idle window")
    ap.add_argument("--reaper", default=find_reaper(), help="reaper executable (default: on PATH)")
    ap.add_argument("--tini", default=shutil.which("tini"), help="tini executable (default: on PATH)")
    ap.add_argument("--no-tini", action="store_true", help="measure reaper only")
    ap.add_argument("--orphans", type=int, help="orphans in the storm (default 10000, --quick 2000)")
    ap.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    args = ap.parse_args(argv)

    if os.geteuid() != 0:
        print("bench_core: must run as root (it creates PID namespaces)", file=sys.stderr)
        return 2
    if not args.reaper or not os.access(args.reaper, os.X_OK):
        print("bench_core: reaper not found (use --reaper PATH)", file=sys.stderr)
        return 2
    s = Settings.quick() if args.quick else Settings()
    if args.orphans:
        s.storm_orphans = max(1, min(args.orphans, 20_000))   # pid_max is often 32768

    reaper = Init("reaper", [args.reaper])
    tini = None
    if args.no_tini:
        pass
    elif args.tini and os.access(args.tini, os.X_OK):
        tini = Init("tini", [args.tini, "-s", "--"])   # -s: a subreaper when not PID 1, as reaper is
    else:
        print("note: tini is not installed (apt-get install tini): reaper only, no ratios", file=sys.stderr)
    inits = [i for i in (reaper, tini) if i]

    facts = machine_facts()
    print(f"# bench_core {'--quick ' if args.quick else ''}{facts}", flush=True)
    with tempfile.TemporaryDirectory(prefix="reaper-bench-") as tmp:
        helper = build_helper(Path(tmp))
        steps = [("startup", bench_startup), ("storm", bench_storm), ("drain", bench_drain),
                 ("signals", bench_signals)]
        for what, fn in steps:
            for init in inits:
                print(f"  {what}: {init.name} ...", file=sys.stderr, flush=True)
                try:
                    fn(init, helper, s)
                except (BenchError, subprocess.TimeoutExpired, OSError) as e:
                    init.notes.append(f"{what}: {e}")
        print(f"  idle: {'+'.join(i.name for i in inits)} for {s.idle_seconds:g}s ...", file=sys.stderr, flush=True)
        try:
            bench_idle(inits, helper, s)
        except (BenchError, subprocess.TimeoutExpired, OSError) as e:
            for init in inits:
                init.notes.append(f"idle: {e}")

    print(render(rows(reaper, tini, s)))
    if tini is None:
        print("\n(tini column skipped: tini not installed or --no-tini)")
    else:
        print("\ntini: run as `tini -s --` (subreaper when not PID 1); in the drain it exits at once "
              "and the kernel SIGKILLs the namespace.")
    for init in inits:
        for n in init.notes:
            print(f"note ({init.name}): {n}")
    if args.json:
        Path(args.json).write_text(json.dumps({"facts": facts, "quick": args.quick,
                                               **{i.name: i.results for i in inits}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

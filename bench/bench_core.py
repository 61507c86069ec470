#!/usr/bin/env python3
"""Core benchmark of reaper, side by side with Debian's tini (issue 2, "Benchmark").

Prints one table: time until the child runs and total time for ``INIT true``;
orphan-storm reap throughput and drain time; signal-forwarding latency;
the init's RSS as PID 1; idle context switches.

Run as root (PID namespaces) on a machine with gcc:
    python3 bench/bench_core.py            # full run, about 1 minute on 2 cores
    python3 bench/bench_core.py --quick    # smoke run, about 10 s

Every namespace is created with ``unshare --pid --fork --mount-proc
--kill-child``: killing our own unshare child kills its whole namespace.
Only processes the bench started are ever signalled (the inits, and signal 0
through pidfds to the orphans it forked). Stdlib only.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
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

SECTIONS = ("startup", "storm", "drain", "signals", "idle")   # idle also measures RSS


@dataclass
class Settings:
    startup_reps: int = 200
    storm_orphans: int = 10_000
    storm_reps: int = 3
    reap_reps: int = 1        # reap phases per storm round (each on a fresh namespace)
    drain_left: int = 20
    drain_reps: int = 5
    signal_samples: int = 500
    signal_warmup: int = 20
    idle_seconds: float = 10.0
    rounds: int = 5           # startup and signal samples are taken in this many interleaved rounds
    timeout: float = 60.0     # bound on any single wait

    @classmethod
    def quick(cls) -> "Settings":
        return cls(startup_reps=20, storm_orphans=2_000, storm_reps=1, drain_left=10, drain_reps=2,
                   signal_samples=60, signal_warmup=10, idle_seconds=2.0, rounds=2, timeout=30.0)


@dataclass
class Init:
    name: str
    argv: list            # the init and its options, up to and including "--" when it needs one
    samples: dict = field(default_factory=dict)    # metric -> list of samples
    results: dict = field(default_factory=dict)    # the table's numbers
    notes: list = field(default_factory=list)

    def add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


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


def cpu_ns(pid: int) -> int:
    """CPU time every thread of pid has run so far, in ns (schedstat: finer than clock ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass
    return total


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

    def main_child(self) -> int:
        """Host pid of the init's main child: pid 2 in the namespace (host pids may wrap)."""
        def find():
            for c in children_of(self.pid):
                try:
                    if proc_status(c)["NSpid"].split()[-1] == "2":
                        return c
                except (FileNotFoundError, KeyError):
                    pass
            return None
        return wait_for(find, self.timeout, "the main child")

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


# --- the measurements ----------------------------------------------------------------
#
# Each bench_* function takes one round of samples for one init and appends them
# to init.samples; main() interleaves the inits round by round, so a burst of
# load on this shared machine hits both alike. summarize() turns the samples
# into the table's numbers.

def bench_startup(init: Init, helper: str, s: Settings) -> None:
    """INIT stamp, launched by the helper: t0 just before posix_spawn of the init,
    t1 when the child runs (its first instruction reads the clock), t2 after the wait."""
    for _ in range(max(1, s.startup_reps // s.rounds)):
        r = subprocess.run([helper, "launch", *init.argv, helper, "stamp"], capture_output=True,
                           text=True, timeout=s.timeout)
        fields = dict((ln.split()[0], ln.split()[1:]) for ln in r.stdout.splitlines() if ln.strip())
        if "child" not in fields or "launch" not in fields:
            raise BenchError(f"unexpected output {r.stdout!r} {r.stderr[-200:]!r}")
        t0, t2, status = (int(x) for x in fields["launch"])
        if status != 0:
            raise BenchError(f"wait status {status}: {r.stderr[-200:]}")
        init.add("child_ms", (int(fields["child"][0]) - t0) / 1e6)
        init.add("total_ms", (t2 - t0) / 1e6)


def _park_orphans(init: Init, helper: str, s: Settings) -> tuple:
    """A namespace whose init has s.storm_orphans live orphans parked on it, and
    a pidfd for each orphan. pidfds watch them without the cost of /proc scans
    (reading the init's children list takes the tasklist lock the reaping needs)
    and can never point to a reused pid."""
    ns = Namespace(init, [helper, "storm", str(s.storm_orphans)], s.timeout)
    fds = []
    try:
        parked = int(ns.out.expect("ready", s.timeout)[0])
        if parked == 0:
            raise BenchError("no orphan could be forked")
        if parked < s.storm_orphans:
            init.note(f"storm: only {parked} of {s.storm_orphans} orphans could be forked (pid_max?)")
        # "ready" comes after the storm program reaped every intermediate parent:
        # the orphans are re-parented to the init already.
        main = ns.main_child()
        for pid in children_of(ns.pid):
            if pid != main:
                try:
                    fds.append(os.pidfd_open(pid))
                except ProcessLookupError:
                    pass
        if len(fds) != parked:
            raise BenchError(f"{parked} orphans forked but {len(fds)} found on the init")
    except BaseException:
        close_all(fds)
        ns.close()
        raise
    init.results["storm_n"] = parked
    return ns, fds


def close_all(fds: list) -> None:
    for fd in fds:
        os.close(fd)
    fds.clear()


def all_exited(fds: list) -> bool:
    """Every process exited (zombie or reaped): its pidfd polls readable."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return len(poller.poll(0)) == len(fds)


def runnable_settle(timeout: float, most: int = 2, quiet: float = 0.02) -> None:
    """Waits until at most `most` tasks are runnable machine-wide (/proc/loadavg's
    nr_running, this process included) for `quiet` seconds, or timeout."""
    deadline = time.monotonic() + timeout
    since = None
    while time.monotonic() < deadline:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
        now = time.monotonic()
        if running > most:
            since = None
        elif since is None:
            since = now
        elif now - since >= quiet:
            return
        time.sleep(0.002)


class ReapWatch:
    """Knows when every orphan is reaped: signal 0 through a pidfd fails with
    ESRCH only once the process is gone, zombie included. The scan resumes where
    it stopped (the init reaps in roughly list order), so it costs O(N) in all."""

    def __init__(self, fds: list) -> None:
        self.fds, self.next = fds, 0

    def done(self) -> bool:
        while self.next < len(self.fds):
            try:
                signal.pidfd_send_signal(self.fds[self.next], 0)   # existence check, nothing is sent
                return False
            except ProcessLookupError:
                self.next += 1
        return True


def bench_storm(init: Init, helper: str, s: Settings) -> None:
    """Two storms of N orphans parked on the init (PID 1).

    storm: all N exit in the same instant; time from the release until the last
    is reaped. Includes the N exits themselves, which cost the kernel more than
    the reaps.
    reap: the init is stopped (SIGSTOP from the parent namespace) while the N
    exit, so N zombies wait for it; time from SIGCONT until the last is reaped:
    the init's own reap throughput."""
    ns, fds = _park_orphans(init, helper, s)
    try:
        watch = ReapWatch(fds)
        run_before = cpu_ns(ns.pid)
        ns.write("go\n")
        t_go = int(ns.out.expect("go", s.timeout)[0])
        wait_for(watch.done, s.timeout, "the storm to be reaped", interval=0.0002)
        t_done = time.monotonic_ns()
        init.add("storm_ms", (t_done - t_go) / 1e6)
        init.add("storm_rate", len(fds) / ((t_done - t_go) / 1e9))
        init.add("storm_cpu_ms", (cpu_ns(ns.pid) - run_before) / 1e6)
        ns.finish()
    finally:
        close_all(fds)
        ns.close()

    for _ in range(s.reap_reps):
        bench_reap(init, helper, s)


def bench_reap(init: Init, helper: str, s: Settings) -> None:
    """N zombies wait for the stopped init; time from SIGCONT until the last is
    reaped. With two CPUs or more the init runs alone on the last one and the
    bench's watch on the others: a watch that wakes every 0.2 ms on the init's
    CPU preempts it, which made this row swing by 2x between runs."""
    ns, fds = _park_orphans(init, helper, s)
    cpus = sorted(os.sched_getaffinity(0))
    try:
        watch = ReapWatch(fds)
        os.kill(ns.pid, signal.SIGSTOP)     # the init we started; SIGCONT below
        try:
            wait_for(lambda: proc_status(ns.pid)["State"].startswith("T"), s.timeout, "the init to stop")
            ns.write("go\n")
            ns.out.expect("go", s.timeout)
            wait_for(lambda: all_exited(fds), s.timeout, "the orphans to exit", interval=0.01)
            # A pidfd is readable from exit_notify() on: thousands of exits may still be
            # finishing on the CPUs, and would run in the init's time.
            runnable_settle(s.timeout)
            if len(cpus) > 1:
                os.sched_setaffinity(ns.pid, cpus[-1:])
                os.sched_setaffinity(0, cpus[:-1])
            run_before = cpu_ns(ns.pid)
            t0 = time.monotonic_ns()
        finally:
            os.kill(ns.pid, signal.SIGCONT)
        wait_for(watch.done, s.timeout, "the zombies to be reaped", interval=0.0002)
        t1 = time.monotonic_ns()
        init.add("reap_rate", len(fds) / ((t1 - t0) / 1e9))
        init.add("reap_ms", (t1 - t0) / 1e6)
        init.add("reap_cpu_ms", (cpu_ns(ns.pid) - run_before) / 1e6)
        ns.finish()
    finally:
        os.sched_setaffinity(0, cpus)
        close_all(fds)
        ns.close()


def bench_drain(init: Init, helper: str, s: Settings) -> None:
    """The main child exits leaving K processes (half with a SIGTERM handler that
    reports itself): time from its exit until the init has exited (the namespace
    is then empty)."""
    ns = Namespace(init, [helper, "drain", str(s.drain_left)], s.timeout)
    try:
        t_exit = int(ns.out.expect("exit", s.timeout)[0])
        if not ns.init_exited(s.timeout):
            raise BenchError(f"the init did not exit within {s.timeout:g}s")
        t_end = time.monotonic_ns()
        init.add("drain_ms", (t_end - t_exit) / 1e6)
        ns.proc.wait(s.timeout)
        rest = ns.proc.stdout.read().decode()   # EOF: the whole namespace is gone
        init.add("drain_handled", ns.out.buf.decode().count("term") + rest.count("term"))
        init.results["drain_handlers"] = (s.drain_left + 1) // 2
    finally:
        ns.close()


def bench_signals(init: Init, helper: str, s: Settings) -> None:
    """SIGUSR1 to the init (its host pid); the child waits in sigwaitinfo and
    prints the clock at receipt. One signal in flight at a time."""
    n = max(1, s.signal_samples // s.rounds)
    ns = Namespace(init, [helper, "sigwait", str(s.signal_warmup + n)], s.timeout)
    try:
        ns.out.expect("ready", s.timeout)
        settle(ns.pid, s.timeout)
        for i in range(s.signal_warmup + n):
            t_send = time.monotonic_ns()
            os.kill(ns.pid, signal.SIGUSR1)    # the init we started, by its host pid
            t_recv = int(ns.out.expect("sig", 10.0)[0])
            if i >= s.signal_warmup:
                init.add("sig_us", (t_recv - t_send) / 1e3)
        ns.finish()
    finally:
        ns.close()


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


def bench_idle(inits: list, helper: str, s: Settings) -> None:
    """RSS and context switches of every init at once, each PID 1 of its own
    namespace with a child blocked on read()."""
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


def summarize(init: Init) -> None:
    r, smp = init.results, init.samples
    for key, stat in (("child_ms", "p50"), ("child_ms", "p90"), ("total_ms", "p50"), ("total_ms", "p90"),
                      ("storm_rate", "p50"), ("storm_ms", "p50"), ("storm_cpu_ms", "p50"),
                      ("reap_rate", "p50"), ("reap_ms", "p50"), ("reap_cpu_ms", "p50"),
                      ("drain_ms", "p50"), ("sig_us", "p50"), ("sig_us", "p99")):
        if smp.get(key):
            r[f"{key}_{stat}"] = statistics.median(smp[key]) if stat == "p50" else pct(smp[key], int(stat[1:]))
    if smp.get("drain_handled"):
        r["drain_handled"] = min(smp["drain_handled"])
        r["drain_handled_s"] = f"{r['drain_handled']}/{r['drain_handlers']}"


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
        if rv is None and tv is None:
            return                      # section not run (--only) or failed (see the notes)
        if ratio is not None and rv is not None and tv:
            target = f"{rv / tv:.2f}x ({target})"
        verdict = "-" if ok is None or rv is None else ("PASS" if ok(rv, tv) else "FAIL")
        if ok is not None and rv is not None and ratio is not None and not tv:
            verdict = "n/a (no tini)"
        out.append([metric, fmt(rv, unit), fmt(tv, unit) if tini else "-", target or "-", verdict])

    n = r.get("storm_n", s.storm_orphans)
    row("`INIT true`: child runs, median", "child_ms_p50", "ms", f"<= {TARGET_CHILD_EXEC_MS:g} ms",
        lambda rv, tv: rv <= TARGET_CHILD_EXEC_MS)
    row("`INIT true`: child runs, p90", "child_ms_p90", "ms", f"<= {TARGET_CHILD_EXEC_MS:g} ms",
        lambda rv, tv: rv <= TARGET_CHILD_EXEC_MS)
    row("`INIT true`: total, median", "total_ms_p50", "ms")
    row("`INIT true`: total, p90", "total_ms_p90", "ms")
    row(f"reap throughput: {n:,} zombies waiting", "reap_rate_p50", "/s",
        f">= {TARGET_REAP_RATIO:g}x", lambda rv, tv: tv is not None and rv >= TARGET_REAP_RATIO * tv, ratio=True)
    row("reap: all reaped after", "reap_ms_p50", "ms")
    row("reap: CPU the init used", "reap_cpu_ms_p50", "ms")
    row(f"orphan storm: {n:,} exit at once, rate", "storm_rate_p50", "/s", "info", ratio=True)
    row("orphan storm: all reaped after", "storm_ms_p50", "ms")
    row("orphan storm: CPU the init used", "storm_cpu_ms_p50", "ms")
    row(f"drain: main child exits, {s.drain_left} left: init gone after", "drain_ms_p50", "ms")
    row("drain: SIGTERM handlers that ran", "drain_handled_s", "")
    row("signal forwarding latency p50", "sig_us_p50", "us", f"<= {TARGET_SIGNAL_RATIO:g}x",
        lambda rv, tv: tv is not None and rv <= TARGET_SIGNAL_RATIO * tv, ratio=True)
    row("signal forwarding latency p99", "sig_us_p99", "us", ratio=True, target="info")
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
    ap.add_argument("--only", metavar="LIST", default=",".join(SECTIONS),
                    help=f"comma-separated sections to run ({','.join(SECTIONS)})")
    ap.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    args = ap.parse_args(argv)

    if os.geteuid() != 0:
        print("bench_core: must run as root (it creates PID namespaces)", file=sys.stderr)
        return 2
    if not args.reaper or not os.access(args.reaper, os.X_OK):
        print("bench_core: reaper not found (use --reaper PATH)", file=sys.stderr)
        return 2
    only = [x for x in args.only.split(",") if x]
    unknown = [x for x in only if x not in SECTIONS]
    if unknown:
        print(f"bench_core: unknown section {unknown[0]!r} (choose from {','.join(SECTIONS)})", file=sys.stderr)
        return 2
    s = Settings.quick() if args.quick else Settings()
    if args.orphans:
        s.storm_orphans = max(1, min(args.orphans, 20_000))   # pid_max is often 32768
    # One pidfd per orphan (bench_storm): raise the soft fd limit as far as needed and allowed.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = s.storm_orphans + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        s.storm_orphans = min(s.storm_orphans, new - 256)

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
        steps = [("startup", bench_startup, s.rounds), ("storm", bench_storm, s.storm_reps),
                 ("drain", bench_drain, s.drain_reps), ("signals", bench_signals, s.rounds)]
        for what, fn, rounds in steps:
            if what not in only:
                continue
            print(f"  {what}: {rounds} round(s) ...", file=sys.stderr, flush=True)
            failed = set()
            for _ in range(rounds):
                for init in inits:          # interleaved: load bursts hit every init alike
                    if init.name in failed:
                        continue
                    try:
                        fn(init, helper, s)
                    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
                        init.note(f"{what}: {e}")
                        failed.add(init.name)
        if "idle" in only:
            print(f"  idle: {'+'.join(i.name for i in inits)} for {s.idle_seconds:g}s ...", file=sys.stderr, flush=True)
            try:
                bench_idle(inits, helper, s)
            except (BenchError, subprocess.TimeoutExpired, OSError) as e:
                for init in inits:
                    init.note(f"idle: {e}")

    for init in inits:
        summarize(init)
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
        Path(args.json).write_text(json.dumps({"facts": facts, "quick": args.quick, "settings": vars(s),
                                               **{i.name: {**i.results, "samples": i.samples, "notes": i.notes}
                                                  for i in inits}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Lean PID 1 benchmark (issue 10): reaper beside tini and beside the floor, in one run.

The floor is the limit for a Python init: the same interpreter importing
reaper's C core and exec'ing the command
(``python -I -c 'import os, sys, reaper._core; os.execvp(...)'``).
Every init runs as PID 1 of a fresh namespace
(``unshare --pid --fork --mount-proc --kill-child INIT -- ...``).

Rows: the init's share of the wall time of ``INIT -- true``; the time until the
child is exec'd; from the main child's exit to the init's exit; the sampled peak
of zombies while 20,000 orphans exit at once; VmRSS as PID 1 (reaper with
metrics and budgets off, and with both on); and, kept from bench_core.py, reap
throughput, signal-forwarding latency and idle wake-ups.

Run as root on a quiet machine, with the interpreter of a clean virtualenv
where reaper is installed (a global interpreter's .pth files would distort
every row)::

    python -m venv /tmp/v && /tmp/v/bin/pip install . && /tmp/v/bin/python bench/bench_lean.py
    /tmp/v/bin/python bench/bench_lean.py --quick      # smoke run, about 20 s

Stdlib only. Only processes the bench started are ever signalled.
"""
from __future__ import annotations

import argparse
import copy
import os
import resource
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_core as core   # noqa: E402  (the namespaces, the helper program, the kept rows)
from bench_core import UNSHARE, BenchError, Init, Namespace   # noqa: E402

FLOOR_CODE = "import os, sys, reaper._core; os.execvp(sys.argv[1], sys.argv[1:])"
FLOOR_IDLE_CODE = "import os, reaper._core; os.read(0, 1)"     # the floor's RSS: the same, waiting
# The floor's exit: the interpreter as PID 1 ends on a line, as the main child does in
# bench_exit; its own exit (mostly the kernel freeing its memory) is the limit.
FLOOR_EXIT_CODE = ("import os, time, reaper._core; os.write(1, b'ready\\n'); os.read(0, 1); "
                   "os.write(1, b'exit %d\\n' % time.monotonic_ns()); os._exit(0)")

# Targets of issue 10.
SHARE_RATIO = 1.3          # reaper's share of `INIT -- true` <= 1.3x the floor's
EXEC_RATIO = 1.1           # the child is exec'd within 1.1x the floor's time
EXIT_MS = 1.0              # main child's exit -> reaper's exit, nothing else in scope
ZOMBIE_RATIO = 3.0         # sampled peak zombies <= 3x tini's
RSS_RATIO = 1.15           # VmRSS, metrics and budgets off, <= 1.15x the floor's
RSS_ALL_ON_MB = 28.0       # ... with both on
SECTIONS = ("startup", "exit", "zombies", "stream", "kept", "rss", "idle")
REAP_RATIO = 0.95
SIGNAL_RATIO = 2.0


def settings(quick: bool) -> core.Settings:
    s = core.Settings.quick() if quick else core.Settings()
    s.startup_reps = 60 if quick else 300
    s.storm_orphans = 4_000 if quick else 20_000
    s.exit_reps = 10 if quick else 60
    return s


# --- the init's share of `INIT -- true`, and the child's exec --------------------------

def launch(helper: str, argv: list, timeout: float) -> dict:
    """helper launch ARGV: t0 before posix_spawn, t1 when the helper's `stamp` ran (if it
    is in ARGV), t2 after the wait; all relative to t0, in ms."""
    r = subprocess.run([helper, "launch", *argv], capture_output=True, text=True, timeout=timeout)
    fields = dict((ln.split()[0], ln.split()[1:]) for ln in r.stdout.splitlines() if ln.strip())
    if "launch" not in fields:
        raise BenchError(f"unexpected output {r.stdout!r} {r.stderr[-200:]!r}")
    t0, t2, status = (int(x) for x in fields["launch"])
    if status != 0:
        raise BenchError(f"wait status {status}: {r.stderr[-300:]}")
    out = {"total": (t2 - t0) / 1e6}
    if "child" in fields:
        out["child"] = (int(fields["child"][0]) - t0) / 1e6
    return out


def bench_share(inits: list, baseline: Init, helper: str, s) -> None:
    """Each init as PID 1 of a fresh namespace running `true` (its share: the wall
    time minus that of the namespace running `true` alone), and running the
    helper's `stamp` (when the child runs, minus the same without an init)."""
    everyone = [baseline, *inits]
    for _ in range(max(1, s.startup_reps // s.rounds)):
        for _round in range(s.rounds):
            for init in everyone:     # interleaved: load bursts hit every init alike
                t = launch(helper, [*UNSHARE, *init.argv, "true"], s.timeout)
                init.add("true_ms", t["total"])
                t = launch(helper, [*UNSHARE, *init.argv, helper, "stamp"], s.timeout)
                init.add("exec_ms", t["child"])
    base_true = statistics.median(baseline.samples["true_ms"])
    base_exec = statistics.median(baseline.samples["exec_ms"])
    for init in inits:
        init.results["share_ms"] = statistics.median(init.samples["true_ms"]) - base_true
        init.results["exec_ms"] = statistics.median(init.samples["exec_ms"]) - base_exec


# --- from the main child's exit to the init's exit -------------------------------------

def bench_exit(init: Init, helper: str, s) -> None:
    """The main child (the helper's `linger`) exits on a line from the bench, long after
    the init settled, leaving nothing: from its last instruction to the init's exit."""
    ns = Namespace(*((Init(init.name, init.extra["exit_argv"]), []) if init.name == "floor"
                     else (init, [helper, "linger"])), s.timeout)
    try:
        ns.out.expect("ready", s.timeout)
        core.settle(ns.pid, s.timeout, quiet=0.1)
        ns.write("\n")
        t_exit = int(ns.out.expect("exit", s.timeout)[0])
        if not ns.init_exited(s.timeout):
            raise BenchError(f"the init did not exit within {s.timeout:g}s")
        init.add("exit_ms", (time.monotonic_ns() - t_exit) / 1e6)
    finally:
        ns.close()


# --- peak zombies in an orphan storm ----------------------------------------------------

class PidsCgroup:
    """A pids cgroup of the bench's own (v1 or v2): pids.current counts every task
    of the namespace not yet reaped, zombies included (a task is uncharged only
    when its parent reaps it)."""

    def __init__(self) -> None:
        self.path = None
        for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
            ctrl = os.path.join(root, "cgroup.controllers")
            is_v1 = os.path.exists(os.path.join(root, "pids.max")) or root.endswith("/pids")
            if not os.path.isdir(root) or (not is_v1 and not _has_pids(ctrl)):
                continue
            path = os.path.join(root, f"reaper-bench-{os.getpid()}")
            try:
                os.mkdir(path)
                if os.path.exists(os.path.join(path, "pids.current")):
                    self.path = path
                    break
                os.rmdir(path)
            except OSError:
                continue
        if self.path is None:
            raise BenchError("no pids cgroup to count zombies with (cgroup v1 pids, or v2 with +pids)")
        self.fd = os.open(os.path.join(self.path, "pids.current"), os.O_RDONLY)

    def enter(self) -> None:
        """In the child before exec (preexec_fn): the namespace starts inside."""
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write("0")

    def current(self) -> int:
        return int(os.pread(self.fd, 32, 0))

    def close(self) -> None:
        os.close(self.fd)
        deadline = time.monotonic() + 5
        while True:
            try:
                os.rmdir(self.path)
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)


def _has_pids(controllers: str) -> bool:
    try:
        with open(controllers) as f:
            return "pids" in f.read().split()
    except OSError:
        return False


def bench_zombies(init: Init, helper: str, s, cg: PidsCgroup) -> None:
    """N orphans parked on the init exit at once. Each writes a byte to a pipe as it
    exits; a sample is live tasks (from pids.current) against exits (bytes read):
    zombies = pids.current - (tasks that are not orphans) - (orphans not yet exited)."""
    rd, wr = os.pipe2(os.O_NONBLOCK)
    ns = None
    try:
        proc = subprocess.Popen([*UNSHARE, *init.argv, helper, "storm", str(s.storm_orphans), str(wr)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(wr,), preexec_fn=cg.enter)
        os.close(wr)
        wr = None
        ns = _adopt(proc, init, s.timeout)
        parked = int(ns.out.expect("ready", s.timeout)[0])
        others = cg.current() - parked          # unshare, the init, the storm program
        exited, peak, samples = 0, 0, 0
        ns.write("go\n")
        deadline = time.monotonic() + s.timeout
        while True:
            try:
                exited += len(os.read(rd, 65536))
            except BlockingIOError:
                pass
            left = cg.current() - others        # orphans alive or zombie
            samples += 1
            peak = max(peak, left - (parked - exited))
            if exited >= parked and left <= 0:
                break
            if time.monotonic() > deadline:
                raise BenchError("the storm was not reaped in time")
            time.sleep(0.0002)
        init.add("zombies_peak", peak)
        init.add("zombie_samples", samples)
        ns.finish()
    finally:
        if wr is not None:
            os.close(wr)
        os.close(rd)
        if ns is not None:
            ns.close()


def bench_stream(init: Init, helper: str, s) -> None:
    """N orphans made one after another as fast as the machine can fork (a double
    fork each; the grandchild exits at once): the init must keep up with a stream of
    deaths. A sample counts the init's zombie children (state Z in /proc); the peak
    over the stream is the row. Also the stream's rate (same for a init that keeps up)."""
    ns = Namespace(init, [helper, "stream", str(s.storm_orphans)], s.timeout)
    try:
        ns.out.expect("ready", s.timeout)
        core.settle(ns.pid, s.timeout, quiet=0.1)
        main = ns.main_child()
        children = f"/proc/{ns.pid}/task/{ns.pid}/children"
        ns.write("go\n")
        t0 = time.monotonic_ns()
        peak = samples = 0
        deadline = time.monotonic() + s.timeout
        while b"done" not in ns.out.buf:
            with open(children, "rb") as f:
                pids = [p for p in f.read().split() if int(p) != main]
            zombies = 0
            for p in pids:
                try:
                    with open(b"/proc/%s/stat" % p, "rb") as f:
                        zombies += f.read().rpartition(b")")[2].split()[0] == b"Z"
                except OSError:
                    pass                            # reaped since the list was read
            peak, samples = max(peak, zombies), samples + 1
            if time.monotonic() > deadline:
                raise BenchError("the stream did not end in time")
            r, _, _ = select.select([ns.out.fd], [], [], 0.001)
            if r:
                ns.out.buf += os.read(ns.out.fd, 65536)
        t_done = int(ns.out.expect("done", s.timeout)[0])
        init.add("stream_peak", peak)
        init.add("stream_rate", s.storm_orphans / ((t_done - t0) / 1e9))
        ns.finish()
    finally:
        ns.close()


def _adopt(proc, init: Init, timeout: float) -> Namespace:
    """A Namespace around a Popen the bench made itself (it needs pass_fds and a cgroup)."""
    ns = Namespace.__new__(Namespace)
    ns.timeout, ns.proc = timeout, proc
    ns.out = core.LineReader(proc.stdout.fileno())
    unshare_exe = os.readlink(f"/proc/{proc.pid}/exe")

    def exec_d():
        for c in core.children_of(proc.pid):
            try:
                if os.readlink(f"/proc/{c}/exe") != unshare_exe:
                    return c
            except OSError:
                pass
        return None
    ns.pid = core.wait_for(exec_d, timeout, f"{init.name} to start under unshare")
    ns.pidfd = os.pidfd_open(ns.pid)
    return ns


# --- memory as PID 1 ---------------------------------------------------------------------

def bench_rss(inits: list, helper: str, s) -> None:
    """VmRSS of each init as PID 1 while its child sleeps in read(), all at once."""
    running = []
    try:
        for init in inits:
            argv = init.argv if init.name != "floor" else init.extra["idle_argv"]
            child = [] if init.name == "floor" else [helper, "idle"]
            ns = Namespace(Init(init.name, argv), child, s.timeout)
            running.append((init, ns))
            if child:
                ns.out.expect("ready", s.timeout)
        for init, ns in running:
            core.settle(ns.pid, 5.0, quiet=0.5)
        for init, ns in running:
            init.results["rss_mb"] = int(core.proc_status(ns.pid)["VmRSS"].split()[0]) / 1024
    finally:
        for _, ns in running:
            ns.close()


# --- the table -------------------------------------------------------------------------------

def ratio(a, b):
    return a / b if a is not None and b else None


def table(by: dict, s, kept) -> list:
    tini, floor, reaper, full = (by.get(k, Init(k, [])).results for k in ("tini", "floor", "reaper", "reaper+"))
    rows = []

    def row(name, unit, t, f, r, target, ok):
        cells = [name, fmt(t, unit), fmt(f, unit), fmt(r, unit)]
        verdict = "-" if ok is None else ("PASS" if ok else "FAIL")
        rows.append([*cells, target, verdict])

    def check(value, limit, cmp=lambda v, lim: v <= lim):
        return None if value is None or limit is None else cmp(value, limit)

    def x(value, against):
        q = ratio(value, against)
        return f"{q:.2f}x" if q is not None else "?"

    r, f = reaper.get("share_ms"), floor.get("share_ms")
    row("the init's share of `INIT -- true`", "ms2", tini.get("share_ms"), f, r,
        f"{x(r, f)} floor (<= {SHARE_RATIO:g}x)", check(ratio(r, f), SHARE_RATIO))
    r, f = reaper.get("exec_ms"), floor.get("exec_ms")
    row("the child is exec'd after", "ms2", tini.get("exec_ms"), f, r,
        f"{x(r, f)} floor (<= {EXEC_RATIO:g}x)", check(ratio(r, f), EXEC_RATIO))
    r = reaper.get("exit_ms_p50")
    row("main child's exit -> init's exit, nothing left", "ms2", tini.get("exit_ms_p50"), floor.get("exit_ms_p50"), r,
        f"<= {EXIT_MS:g} ms", check(r, EXIT_MS))
    r, t = reaper.get("zombies_peak_p50"), tini.get("zombies_peak_p50")
    row(f"sampled peak zombies, {s.storm_orphans:,} orphans exit at once", "n", t, None, r,
        f"{x(r, t)} tini (<= {ZOMBIE_RATIO:g}x)", check(r, None if t is None else ZOMBIE_RATIO * max(t, 1)))
    r, t = reaper.get("stream_peak_p50"), tini.get("stream_peak_p50")
    row(f"sampled peak zombies, {s.storm_orphans:,} orphans one after another", "n", t, None, r,
        f"{x(r, t)} tini (<= {ZOMBIE_RATIO:g}x)", check(r, None if t is None else ZOMBIE_RATIO * max(t, 1)))
    r, t = reaper.get("stream_rate_p50"), tini.get("stream_rate_p50")
    row("  ... the stream's rate", "/s", t, None, r, f"{x(r, t)} tini", None)
    r, f = reaper.get("rss_mb"), floor.get("rss_mb")
    row("VmRSS as PID 1, child asleep", "MB", tini.get("rss_mb"), f, r,
        f"{x(r, f)} floor (<= {RSS_RATIO:g}x)", check(ratio(r, f), RSS_RATIO))
    r = full.get("rss_mb")
    row("VmRSS, metrics and budgets on", "MB", None, None, r, f"<= {RSS_ALL_ON_MB:g} MB", check(r, RSS_ALL_ON_MB))
    r, t = reaper.get("reap_rate_p50"), tini.get("reap_rate_p50")
    row(f"reap throughput, {kept.storm_orphans:,} zombies waiting", "/s", t, None, r,
        f"{x(r, t)} tini (>= {REAP_RATIO:g}x)", check(ratio(r, t), REAP_RATIO, lambda v, lim: v >= lim))
    r, t = reaper.get("sig_us_p50"), tini.get("sig_us_p50")
    row("signal forwarding latency p50", "us", t, None, r,
        f"{x(r, t)} tini (<= {SIGNAL_RATIO:g}x)", check(ratio(r, t), SIGNAL_RATIO))
    r = reaper.get("idle_csw")
    row(f"idle wake-ups over {s.idle_seconds:g} s", "n", tini.get("idle_csw"), None, r, "= 0", check(r, 0))
    return rows


def render(rows: list) -> str:
    head = ["metric", "tini", "floor", "reaper", "ratio (target)", "pass/fail"]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(r) for r in rows)])


def fmt(v, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "ms2":
        return f"{v:.2f} ms"
    if unit == "n":
        return f"{v:g}"
    return core.fmt(v, unit)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, a smaller storm")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter reaper is installed in (default: this one)")
    ap.add_argument("--tini", default=shutil.which("tini"), help="tini executable (default: on PATH)")
    ap.add_argument("--metrics-port", type=int, default=19109, help="port of the metrics-on RSS run")
    ap.add_argument("--only", metavar="LIST", default=",".join(SECTIONS),
                    help=f"comma-separated sections to run ({','.join(SECTIONS)})")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_lean: must run as root (it creates PID namespaces)", file=sys.stderr)
        return 2
    if not args.tini or not os.access(args.tini, os.X_OK):
        print("bench_lean: tini not found (apt-get install tini, or --tini PATH)", file=sys.stderr)
        return 2
    if subprocess.run([args.python, "-I", "-c", "import reaper._core"], capture_output=True).returncode or \
            not Path(args.python).with_name("reaper").exists():
        print(f"bench_lean: reaper is not installed beside {args.python} (use --python)", file=sys.stderr)
        return 2
    only = [x for x in args.only.split(",") if x]
    if any(x not in SECTIONS for x in only):
        print(f"bench_lean: unknown section in {args.only!r} (choose from {','.join(SECTIONS)})", file=sys.stderr)
        return 2
    s = settings(args.quick)
    # bench_core's reap throughput watches every orphan through a pidfd: as many as
    # the fd limit allows (the zombie rows need no fd per orphan).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = s.storm_orphans + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    kept = copy.copy(s)
    kept.reap_reps = 1 if args.quick else 3   # the reap row swings most: 3 x storm_reps samples
    kept.storm_orphans = min(s.storm_orphans, soft - 256) if soft != resource.RLIM_INFINITY else s.storm_orphans

    py = [args.python, "-I"]        # the same flags for the floor and reaper
    launcher = Path(args.python).with_name("reaper")     # the installed command, run by the same flags
    reaper_entry = [*py, str(launcher), "--"]
    tini = Init("tini", [args.tini, "-s", "--"])
    floor = Init("floor", [*py, "-c", FLOOR_CODE])
    floor.extra = {"idle_argv": [*py, "-c", FLOOR_IDLE_CODE], "exit_argv": [*py, "-c", FLOOR_EXIT_CODE]}
    reaper = Init("reaper", reaper_entry)
    full = Init("reaper+", [*py, str(launcher), "--metrics-port", str(args.metrics_port),
                            "--cpu-budget", "0.5", "--"])
    baseline = Init("none", [])

    print(f"# bench_lean {'--quick ' if args.quick else ''}{core.machine_facts()}", flush=True)
    print(f"# interpreter {args.python}", flush=True)
    notes = []
    with tempfile.TemporaryDirectory(prefix="reaper-bench-") as tmp:
        helper = core.build_helper(Path(tmp))

        def step(what, fn):
            if what not in only:
                return
            print(f"  {what} ...", file=sys.stderr, flush=True)
            try:
                fn()
            except (BenchError, subprocess.TimeoutExpired, OSError) as e:
                notes.append(f"{what}: {e}")

        step("startup", lambda: bench_share([tini, floor, reaper], baseline, helper, s))

        def exits():
            for _ in range(s.exit_reps):
                for init in (tini, floor, reaper):
                    bench_exit(init, helper, s)
        step("exit", exits)

        def zombies():
            cg = PidsCgroup()
            try:
                for _ in range(s.storm_reps):
                    for init in (tini, reaper):
                        bench_zombies(init, helper, s, cg)
            finally:
                cg.close()
        step("zombies", zombies)

        def streams():
            for _ in range(s.storm_reps):
                for init in (tini, reaper):
                    bench_stream(init, helper, s)
        step("stream", streams)

        def kept_rows():
            for _ in range(s.storm_reps):
                for init in (tini, reaper):
                    core.bench_storm(init, helper, kept)
            for _ in range(s.rounds):
                for init in (tini, reaper):
                    core.bench_signals(init, helper, kept)
        step("kept", kept_rows)
        step("rss", lambda: bench_rss([floor, reaper, full, tini], helper, s))
        # bench_idle fills fresh Inits (its RSS is bench_rss's row): the wake-ups are copied over.
        idle_inits = [Init("tini", tini.argv), Init("reaper", reaper.argv)]
        step("idle", lambda: core.bench_idle(idle_inits, helper, s))
        for i, init in zip(idle_inits, (tini, reaper)):
            if "idle_csw" in i.results:
                init.results["idle_csw"] = i.results["idle_csw"]

    for init in (tini, floor, reaper):
        core.summarize(init)
        for key in ("exit_ms", "zombies_peak", "stream_peak", "stream_rate"):
            if init.samples.get(key):
                init.results[f"{key}_p50"] = statistics.median(init.samples[key])
    print(render(table({"tini": tini, "floor": floor, "reaper": reaper, "reaper+": full}, s, kept)))
    print("\nfloor: `python -I -c 'import os, sys, reaper._core; os.execvp(...)'`; reaper: "
          "`python -I BIN/reaper --` (the installed command); tini: `tini -s --`. Shares are medians minus the same "
          "namespace without an init; zombies are medians of each run's sampled peak.")
    for init in (tini, floor, reaper, full):
        notes.extend(f"{init.name}: {n}" for n in init.notes)
    for n in notes:
        print(f"note: {n}")
    return 1 if notes else 0


if __name__ == "__main__":
    sys.exit(main())

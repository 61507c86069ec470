"""PID 1 never dies: the faults that killed, hung or cut short the old reaper, each
reproduced for real (see docs/reaper.md, "Failure behaviour").

Where no real fault can be had on demand (a bug in the loop, poll() failing with
ENOMEM), tests/helpers/faulty_reaper.py injects it into reaper's own main().
Metrics faults: test_faults_metrics.py; budget faults: test_faults_budget.py; bad
input: test_bad_input.py.
"""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (PYTHON, REAPER, START_NICE, UNSHARE, child_oom_score, free_port, in_poll, proc_status, py,
                      remove_cgroup, run_reaper, summary, wait_for, wait_for_file)

FAULTY = [PYTHON, str(Path(__file__).with_name("helpers") / "faulty_reaper.py")]
NONROOT = 1000


def faulty(faults: str) -> list:
    return [*FAULTY, faults]


def error_lines(stderr: str) -> list:
    return [l for l in stderr.splitlines() if ": ERROR " in l]


# A main child that leaves an orphan with a SIGTERM handler (it records "term"),
# waits until the orphan is ready, then exits with argv[2].
LEAVE_ORPHAN = r'''
import os, signal, sys, time
log, code = sys.argv[1], int(sys.argv[2])
if os.fork() == 0:
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, lambda *_: (open(log, "a").write("term\n"), os._exit(0)))
        open(log, "a").write("ready\n")
        time.sleep(60)
        os._exit(1)
    os._exit(0)
while not (os.path.exists(log) and "ready" in open(log).read()):
    time.sleep(0.005)
sys.exit(code)
'''


# --- 1. time values: bounded at parse time, every wait clamped ---------------------

def test_waits_are_clamped_whatever_the_deadline():
    from reaper._native import MAX_WAIT_MS, ms_until

    now = time.monotonic()
    assert ms_until(None) == -1
    assert ms_until(now + 1e12) == MAX_WAIT_MS
    assert ms_until(float("inf")) == MAX_WAIT_MS
    assert ms_until(float("nan")) == MAX_WAIT_MS
    assert ms_until(now - 5) == 0


def test_the_longest_grace_allowed_still_drains_and_passes_the_status(tmp_path):
    log = tmp_path / "log"
    r = run_reaper(["--grace", "604800", "--", *py(LEAVE_ORPHAN), str(log), "5"])
    assert r.proc.returncode == 5, r.stderr
    assert log.read_text().split() == ["ready", "term"]


def test_the_longest_budget_interval_allowed_runs(tmp_path):
    r = run_reaper(["--cpu-budget", "0.5", "--", "sh", "-c", "exit 4"],
                   env={"REAPER_BUDGET_INTERVAL": "604800"})
    assert r.proc.returncode == 4 and "Traceback" not in r.stderr and not error_lines(r.stderr)


def test_watch_with_the_longest_budget_interval_allowed_runs(reaper, tmp_path):
    metrics = tmp_path / "metrics.prom"
    r = reaper(["watch", "--metrics-file", str(metrics), "--budget-interval", "604800",
                "--cpu-budget", "1"], pid1=False)
    wait_for_file(metrics, contains="reaper_build_info")
    r.send(signal.SIGTERM)
    assert r.wait() == 0 and "Traceback" not in r.stderr


# --- 2. non-UTF-8 arguments ---------------------------------------------------------

@pytest.mark.parametrize("pid1", [True, False], ids=["pid1", "subreaper"])
def test_a_non_utf8_argument_is_passed_and_shown_escaped(reaper, pid1):
    r = reaper(["--", "sh", "-c", "echo started; read x; exit 5", b"\xff".decode(errors="surrogateescape")],
               pid1=pid1, stdin=subprocess.PIPE)
    assert r.readline() == "started"
    child = r.main_child()
    assert open(f"/proc/{child}/cmdline", "rb").read().split(b"\0")[3] == b"\xff"
    wait_for(lambda: b"\\xff" in open(f"/proc/{r.pid}/cmdline", "rb").read(), what="reaper's title")
    assert r.wait(input=b"\n") == 5
    assert "Traceback" not in r.stderr and not error_lines(r.stderr)


# --- 3. no room for a process, no free file descriptor -----------------------------

def test_a_failed_fork_of_the_main_child_is_one_line_and_exit_1(tmp_path):
    from metrics_helpers import in_pids_cgroup

    cg = in_pids_cgroup(2)            # unshare and reaper fit, the main child does not
    if cg is None:
        pytest.skip("needs root and a cgroup-v1 pids hierarchy")
    marker = tmp_path / "ran"
    try:
        r = run_reaper(["--", "touch", str(marker)], preexec_fn=cg[1])
    finally:
        remove_cgroup(cg[0])
    assert r.proc.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot start 'touch': Resource temporarily unavailable" in lines[0], lines
    assert not marker.exists()


def _ulimit_files(n: int):
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def test_five_file_descriptors_are_enough_to_run_the_command():
    r = run_reaper(["--", "sh", "-c", "exit 6"], preexec_fn=_ulimit_files(5))
    assert r.proc.returncode == 6, r.stderr
    assert "Traceback" not in r.stderr


def test_five_file_descriptors_still_say_why_the_command_cannot_run():
    r = run_reaper(["--", "/nonexistent/command"], preexec_fn=_ulimit_files(5))
    assert r.proc.returncode == 127, r.stderr
    assert "cannot run /nonexistent/command: No such file or directory" in r.stderr
    assert "Traceback" not in r.stderr


# --- 4. a signal flood does not hold the drain past its deadline ------------------

FLOOD = r'''
import os, signal, sys, time
signal.signal(signal.SIGRTMIN, signal.SIG_IGN)      # the forwarded flood must not end us
ready = sys.argv[1]
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # only the drain's SIGKILL ends the flood
    end = time.monotonic() + 60
    open(ready, "w").write("1")
    while time.monotonic() < end:
        for _ in range(1000):
            try:
                os.kill(1, signal.SIGRTMIN)
            except OSError:
                pass
    os._exit(0)
while not os.path.exists(ready):
    time.sleep(0.005)
time.sleep(0.2)                                      # the flood is in full swing
sys.exit(3)
'''


@pytest.mark.xdist_group("cpu-heavy")
def test_a_signal_flood_neither_holds_the_drain_nor_floods_the_log(tmp_path):
    start = time.monotonic()
    r = run_reaper(["-v", "--grace", "1", "--", *py(FLOOD), str(tmp_path / "ready")], timeout=50)
    took = time.monotonic() - start
    assert r.proc.returncode == 3, r.stderr
    # The flood would go on for 60 s: the drain ended by its own deadline (1 s of
    # grace, then SIGKILL) long before, whatever the machine's speed.
    assert took < 40, took
    lines = r.stderr.splitlines()
    assert len(lines) < 20, lines[:30]
    assert any("SIGRTMIN received while draining" in l and "repeated" in l for l in lines), lines
    assert summary(r.stderr)["drain"]["killed"] == 1


# --- 5. a stderr nobody reads -------------------------------------------------------

MANY_ORPHANS = r'''
import os, sys
for _ in range(int(sys.argv[1])):
    if os.fork() == 0:
        if os.fork() == 0:
            os._exit(0)
        os._exit(0)
    os.wait()
sys.exit(7)
'''


def test_a_stderr_nobody_reads_never_stops_reaper(tmp_path):
    result = tmp_path / "summary.json"
    # -w: a line per orphan, far more than the pipe holds; nobody reads it until the end.
    proc = subprocess.Popen([*UNSHARE, REAPER, "-w", "--summary-file", str(result), "--",
                             *py(MANY_ORPHANS), "3000"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.wait(120) == 7
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.read()
        proc.stderr.close()
    s = json.loads(result.read_text())
    assert s["orphans"] == 3000 and s["exit_status"] == 7
    assert s["log_lines_dropped"] > 0


def test_the_child_keeps_a_blocking_stderr(reaper):
    # reaper's writes are non-blocking without changing the open file the child shares.
    r = reaper(["--", "sh", "-c", "grep flags /proc/self/fdinfo/2; read x"], stdin=subprocess.PIPE)
    flags = int(r.readline().split()[1], 8)
    assert not flags & os.O_NONBLOCK
    assert r.wait(input=b"\n") == 0


# --- 6. EPERM does not stop the drain ---------------------------------------------

@pytest.fixture
def root_helper(shared_dir):
    """A setuid-root program that makes itself unsignallable by its unprivileged invoker."""
    d = shared_dir
    exe = d / "become_root"
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-o", str(exe),
                    str(Path(__file__).with_name("helpers") / "become_root.c")], check=True)
    os.chown(exe, 0, 0)
    exe.chmod(0o4755)
    yield d, exe
    for pidfile in d.glob("root-*.pid"):       # it outlives reaper: ours to end
        try:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


# As uid 1000: three orphans with TERM handlers, the unsignallable one, three more.
MIXED_ORPHANS = r'''
import os, signal, subprocess, sys, time
d, exe = sys.argv[1], sys.argv[2]
def orphan(i):
    if os.fork() == 0:
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, lambda *_: (open(f"{d}/term-{i}", "w").write("1"), os._exit(0)))
            open(f"{d}/ready-{i}", "w").write("1")
            time.sleep(60)
            os._exit(1)
        os._exit(0)
    os.wait()
for i in range(3):
    orphan(i)
subprocess.Popen([exe, f"{d}/root-{os.getpid()}.pid", "30"])
for i in range(3, 6):
    orphan(i)
while len([n for n in os.listdir(d) if n.startswith(("ready-", "root-"))]) < 7:
    time.sleep(0.005)
sys.exit(9)
'''


def test_one_process_reaper_may_not_signal_does_not_stop_the_drain(root_helper):
    d, exe = root_helper
    r = run_reaper(["--grace", "2", "--", *py(MIXED_ORPHANS), str(d), str(exe)],
                   pid1=False, user=NONROOT, timeout=60)
    assert r.proc.returncode == 9, r.stderr
    assert sorted(p.name for p in d.glob("term-*")) == [f"term-{i}" for i in range(6)]
    root_pid = int(next(d.glob("root-*.pid")).read_text())
    named = [l for l in r.stderr.splitlines() if "not permitted to signal" in l]
    assert len(named) == 1 and f"{root_pid} (become_root)" in named[0], r.stderr
    assert summary(r.stderr)["drain"]["not_permitted"] == 1


def test_the_kill_phase_does_not_rescan_all_of_proc(root_helper):
    d, exe = root_helper
    scans = d / "scans"
    # The unsignallable process holds the kill phase open for its whole wait (5 s).
    r = run_reaper(["--grace", "0.5", "--", *py(MIXED_ORPHANS), str(d), str(exe)], pid1=False,
                   user=NONROOT, exe=faulty("count-scans"), env={"FAULTY_SCANS": str(scans)}, timeout=60)
    assert r.proc.returncode == 9, r.stderr
    assert "survived SIGKILL" in r.stderr
    assert summary(r.stderr)["drain"]["survived"] == 1       # the one it may not signal
    assert int(scans.read_text()) <= 2        # the old loop read all of /proc every 0.1 s: ~50


# --- 8. no /proc -----------------------------------------------------------------

def _without_proc(args: list) -> list:
    # An empty tmpfs over /proc in a mount namespace of its own, as some sandboxes have.
    return ["sh", "-c", 'mount -t tmpfs none /proc && exec "$0" "$@"', REAPER, *args]


def test_without_proc_pid1_still_terminates_gracefully(tmp_path):
    log = tmp_path / "log"
    cmd = [*UNSHARE, *_without_proc(["--grace", "30", "--", *py(LEAVE_ORPHAN), str(log), "4"])]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 4, p.stderr
    assert log.read_text().split() == ["ready", "term"]     # SIGTERM, not the deadline's SIGKILL
    assert "Traceback" not in p.stderr


def test_without_proc_a_subreaper_says_once_that_it_is_blind(tmp_path):
    log = tmp_path / "log"
    cmd = ["unshare", "--mount", *_without_proc(["--grace", "30", "--", *py(LEAVE_ORPHAN), str(log), "4"])]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 4, p.stderr
    blind = [l for l in p.stderr.splitlines() if "no /proc" in l]
    assert len(blind) == 1, p.stderr
    assert log.read_text().split() == ["ready", "term"]     # the main child's group was signalled
    assert "Traceback" not in p.stderr


# --- 10. the OOM killer ------------------------------------------------------------

def _has_cap_sys_resource() -> bool:
    return bool(int(proc_status(os.getpid())["CapEff"], 16) & (1 << 24))


@pytest.mark.skipif(_has_cap_sys_resource(), reason="CAP_SYS_RESOURCE present: the privileged test applies")
def test_without_cap_sys_resource_reaper_says_why_it_keeps_its_oom_score():
    r = run_reaper(["-vv", "--", "cat", "/proc/self/oom_score_adj"])
    assert r.proc.returncode == 0
    assert int(r.stdout) == child_oom_score()
    assert any("oom_score_adj: cannot lower" in l and "CAP_SYS_RESOURCE" in l and ": DEBUG " in l
               for l in r.stderr.splitlines()), r.stderr
    assert "oom" not in run_reaper(["--", "true"]).stderr      # debug level only


@pytest.mark.skipif(not _has_cap_sys_resource(),
                    reason="root lacks CAP_SYS_RESOURCE on this machine (CapEff bit 24)")
def test_with_cap_sys_resource_reaper_is_never_chosen_before_its_children(reaper):
    def invoker():
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("300")
    r = reaper(["--", "sh", "-c", "cat /proc/self/oom_score_adj; read x"], preexec_fn=invoker,
               stdin=subprocess.PIPE)
    assert r.readline() == "300"
    wait_for(lambda: open(f"/proc/{r.pid}/oom_score_adj").read().strip() == "-1000", what="reaper protected")
    assert r.wait(input=b"\n") == 0


@pytest.mark.parametrize("invoker,child", [(0, 300), (800, 1000), pytest.param(-1000, -1000, marks=pytest.mark.skipif(
    not _has_cap_sys_resource(), reason="setting -1000 needs CAP_SYS_RESOURCE, which root lacks here"))])
def test_without_cap_sys_resource_children_score_higher_never_lower(invoker, child):
    """Issue 33 point 8: reaper cannot lower its own score, so its children start with
    theirs raised (capped at 1000; -1000, never chosen, stays). Raising needs no privilege."""
    def setup():
        with open("/proc/self/oom_score_adj", "w") as f:     # as root, before the caps go
            f.write(str(invoker))
    r = subprocess.run([*UNSHARE, "setpriv", "--bounding-set", "-sys_resource", "--inh-caps", "-sys_resource",
                        REAPER, "--", "sh", "-c", "cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'"],
                       preexec_fn=setup, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(child)] * 2             # and so every descendant


# Fills its memory cgroup with copies of itself, each 8 MB more (about 16 MB resident,
# smaller than reaper with metrics and budgets, about 29 MB), until the OOM killer kills
# one: then ends the others and exits 7. 3 if no copy was ever killed.
FILL = py("""
import os, sys, time
kids, killed = [], False
for n in range(400):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        b = bytearray(8 << 20)
        for i in range(0, len(b), 4096):
            b[i] = 1
        os.write(w, b"x")
        while True:
            time.sleep(60)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    kids.append(pid)
    for k in list(kids):
        p, status = os.waitpid(k, os.WNOHANG)
        if p:
            kids.remove(k)
            killed = killed or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9)
    if killed:
        break
for k in kids:
    os.kill(k, 9)
    os.waitpid(k, 0)
sys.exit(7 if killed else 3)
""")


V1_MEMORY = "/sys/fs/cgroup/memory"


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(V1_MEMORY, os.W_OK) or
                    not os.path.exists(os.path.join(V1_MEMORY, "memory.oom_control")),
                    reason="needs root and a writable cgroup v1 memory hierarchy")
@pytest.mark.xdist_group("cpu-heavy")           # 250 MB at once: one such test at a time
def test_pid1_without_cap_sys_resource_is_not_the_oom_killers_choice(reaper):
    """Issue 33 point 8: reaper as PID 1 (metrics and budgets on: its largest footprint)
    without CAP_SYS_RESOURCE, in a 250 MB memory cgroup its main child fills with copies
    of itself smaller than reaper. Before, reaper was killed and the namespace with it
    (the status lost); now a copy is, and the status is the main child's."""
    import tempfile

    d = tempfile.mkdtemp(prefix="reaper-oom.", dir=V1_MEMORY)
    try:
        Path(d, "memory.limit_in_bytes").write_text(str(250 << 20))
        if os.path.exists(os.path.join(d, "memory.memsw.limit_in_bytes")):
            Path(d, "memory.memsw.limit_in_bytes").write_text(str(250 << 20))

        def enter():
            Path(d, "cgroup.procs").write_text(str(os.getpid()))
        r = reaper(["--metrics-port", str(free_port()), "--metrics-address", "127.0.0.1", "--cpu-budget", "1",
                    "--memory-budget", "1G", "--", *FILL],
                   exe=["setpriv", "--bounding-set", "-sys_resource", "--inh-caps", "-sys_resource", REAPER],
                   preexec_fn=enter)
        assert not int(proc_status(r.pid)["CapEff"], 16) & (1 << 24)
        status = r.wait(60)
        kills = [l for l in Path(d, "memory.oom_control").read_text().splitlines() if l.startswith("oom_kill ")]
        assert kills and int(kills[0].split()[1]) >= 1, "the OOM killer never ran"
        assert status == 7, f"exit {status}: reaper was chosen ({r.stderr[-500:]})"
    finally:
        remove_cgroup(d)


# --- 12. every piece after the spawn is inside the boundary --------------------------

WAIT_FOR_USR1 = ["sh", "-c", "trap 'exit 6' USR1; echo ready; while :; do sleep 1 & wait; done"]


def test_when_the_supervisor_fails_the_minimal_loop_reaps_forwards_and_drains(reaper, tmp_path):
    log = tmp_path / "log"
    child = ["sh", "-c", f"trap 'exit 6' USR1; {PYTHON} -c '{LEAVE_ORPHAN}' {log} 0; echo ready; "
                         "while :; do sleep 1 & wait; done"]
    r = reaper(["--grace", "10", "--", *child], exe=faulty("supervisor"))
    assert r.readline() == "ready"
    r.send(signal.SIGUSR1)                 # its event is the Supervisor's first: that fails
    assert r.wait() == 6, r.stderr
    assert log.read_text().split() == ["ready", "term"]
    assert len([l for l in r.stderr.splitlines() if "minimal loop" in l]) == 1, r.stderr


def test_a_supervisor_that_cannot_be_built_still_forwards(reaper):
    r = reaper(["--", *WAIT_FOR_USR1], exe=faulty("supervisor-init"))
    assert r.readline() == "ready"
    r.send(signal.SIGUSR1)
    assert r.wait() == 6, r.stderr
    assert "minimal loop" in r.stderr


def test_when_not_even_the_boundary_loads_the_core_takes_the_child_to_its_end(reaper):
    """The one step after the spawn outside the boundary, its own import: if it fails
    (EMFILE), the C core reaps and forwards until the main child ends, with one line."""
    r = reaper(["-e", "7", "--", *WAIT_FOR_USR1], exe=faulty("no-import-boundary"))
    assert r.readline() == "ready"
    r.send(signal.SIGUSR1)                   # forwarded by the C core alone
    assert r.wait() == 6, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "cannot load its loop" in lines[0] and "Too many open files" in lines[0], r.stderr
    r = reaper(["-e", "3", "--", "sh", "-c", "exit 3"], exe=faulty("no-import-boundary"))
    assert r.wait() == 0, r.stderr           # -e applies


def test_when_the_pieces_cannot_load_the_minimal_loop_takes_over(reaper, tmp_path):
    """After the spawn, the pieces load inside the boundary: an import that fails there
    ends in the minimal loop (reap, forward, drain), not in the end of PID 1."""
    log = tmp_path / "log"
    r = reaper(["--", PYTHON, "-c", LEAVE_ORPHAN, str(log), "5"], exe=faulty("no-import-pieces"))
    assert r.wait() == 5, r.stderr
    assert log.read_text().split() == ["ready", "term"]      # the orphan drained
    assert len([l for l in r.stderr.splitlines() if "minimal loop" in l]) == 1, r.stderr


def test_poll_failures_are_retried(reaper):
    r = reaper(["--", *WAIT_FOR_USR1], exe=faulty("wait-enomem"))
    assert r.readline() == "ready"
    r.send(signal.SIGUSR1)
    assert r.wait() == 6, r.stderr
    lines = [l for l in r.stderr.splitlines() if "wait failed" in l]
    assert len(lines) == 2 and "repeated 2 more times" in lines[1], r.stderr


@pytest.mark.parametrize("fault, piece, args", [
    ("budgets", "budgets", ["--cpu-budget", "0.5"]),
    ("budget-tick", "budgets", ["--cpu-budget", "0.5", "--budget-interval", "0.1"]),
    ("summary", "summary", ["-v"]),     # by default an uneventful run builds no summary
    ("title", "title", []),
])
def test_a_failing_piece_is_switched_off_with_one_line(reaper, fault, piece, args):
    child = ["sh", "-c", "echo ready; read x; exit 5"]
    r = reaper([*args, "--", *child], exe=faulty(fault), stdin=subprocess.PIPE)
    assert r.readline() == "ready"
    # Every piece has started once reaper idles (a child done within the first wait
    # would end reaper before any piece is loaded).
    wait_for(lambda: in_poll(r.pid, forever=fault not in ("budgets", "budget-tick")) or r.proc.poll() is not None,
             what="reaper past its start-up")
    if fault == "budget-tick":
        time.sleep(0.5)    # the measurement window itself: five ticks would be due in it, still one line
    assert r.wait(input=b"\n") == 5, r.stderr
    errors = error_lines(r.stderr)
    then = "starting it again in 1 s" if piece == "budgets" else "reaper goes on"
    # The window is shorter than the budgets' first backoff (1 s): one failure.
    assert len(errors) == 1 and f"{piece} switched off, {then}" in errors[0], r.stderr
    assert "Traceback" not in r.stderr
    if fault != "summary":
        assert summary(r.stderr)["policy_errors"] == 1


def test_a_piece_a_failure_switched_off_starts_again_with_backoff(reaper):
    """Issue 20: a failure is no off switch. The budgets' first two samples fail (as a
    stray's endless file once made them, with a MemoryError): they start again after
    1 s, then 2 s, and then hold the busy stray to its budget."""
    import budget_helpers as bh

    tag = bh.marker()
    r = reaper(["--cpu-budget", "0.1", "--budget-grace", "0", "--budget-interval", "0.2",
                "--", *bh.orphans_then_sleep(bh.busy_argv(tag, share=0.5))], exe=faulty("budget-twice"))
    pid = bh.wait_tagged(tag)[0]
    start = time.monotonic()
    wait_for(lambda: bh.stat(pid)["nice"] > START_NICE, 30, what="the budgets to nice the stray after two restarts")
    assert time.monotonic() - start >= 2.5        # not before the second restart (1 s + 2 s)
    r.send(signal.SIGTERM)
    r.wait()
    errors = error_lines(r.stderr)
    assert len(errors) == 2, r.stderr
    assert "budgets failed (MemoryError()): budgets switched off, starting it again in 1 s" in errors[0], r.stderr
    assert "budgets switched off, starting it again in 2 s" in errors[1], r.stderr
    s = summary(r.stderr)
    assert s["policy_errors"] == 2 and s["policy_restarts"] == {"budgets": 2}, s
    assert "Traceback" not in r.stderr

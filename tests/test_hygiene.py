"""Points 7-9: cwd, fds, stdio, log lines, title; zero idle wake-ups; PID 1 survives policy
errors; and the whole thing as a non-root user (Ray images run as uid 1000)."""
import os
import re
import signal
import subprocess
import time

from conftest import Reaper, in_poll, proc_status, py, run_reaper, summary, wait_for, zombies_of

LOG_LINE = re.compile(r"^reaper\[\d+\]: (ERROR|WARN|INFO|DEBUG) \S")


def _idle_child(r):
    child = r.main_child()
    wait_for(lambda: proc_status(child)["Name"] == "sleep", what="child exec")
    # reaper has finished its post-spawn work once it sits in poll().
    wait_for(lambda: in_poll(r.pid), what="reaper idle in poll")
    return child


def test_reaper_cwd_is_root_and_the_child_keeps_its_own(reaper, tmp_path):
    r = reaper(["--", "sleep", "30"], cwd=tmp_path)
    child = _idle_child(r)
    assert os.readlink(f"/proc/{r.pid}/cwd") == "/"
    assert os.readlink(f"/proc/{child}/cwd") == str(tmp_path)


def test_inherited_fds_are_closed_in_reaper_and_kept_by_the_child(reaper, tmp_path):
    rfd, wfd = os.pipe()
    try:
        r = reaper(["--", "sleep", "30"], pass_fds=(rfd,), pid1=False)
        child = _idle_child(r)
        target = os.readlink(f"/proc/self/fd/{rfd}")
        assert os.readlink(f"/proc/{child}/fd/{rfd}") == target
        reaper_fds = {os.readlink(f"/proc/{r.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{r.pid}/fd")}
        assert target not in reaper_fds
        extra = [fd for fd in os.listdir(f"/proc/{r.pid}/fd") if int(fd) > 2]
        assert len(extra) == 1 and "signalfd" in os.readlink(f"/proc/{r.pid}/fd/{extra[0]}")
    finally:
        os.close(rfd)
        os.close(wfd)


def test_stdio_passes_straight_through():
    child = ["sh", "-c", "read line; echo \"out:$line\"; echo err-line >&2"]
    r = Reaper(["--", *child], stdin=subprocess.PIPE)
    assert r.wait(input=b"hello\n") == 0
    assert r.stdout == "out:hello\n"
    assert "err-line" in r.stderr


def test_reaper_writes_only_log_lines_to_stderr_and_nothing_to_stdout():
    r = run_reaper(["-v", "-w", "--", "sh", "-c", "(true &); sleep 0.2; exit 0"])
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines and all(LOG_LINE.match(l) for l in lines), r.stderr


def test_process_title(reaper):
    r = reaper(["--", "sleep", "30"])
    _idle_child(r)
    cmdline = open(f"/proc/{r.pid}/cmdline", "rb").read().replace(b"\0", b" ").strip()
    assert cmdline.startswith(b"reaper: sleep 30")


def test_zero_wakeups_when_idle(reaper):
    r = reaper(["--", "sleep", "60"])
    _idle_child(r)

    def switches():
        """{thread id: context switches}: every thread's, not the leader's alone (a busy
        second thread would show only in its own /proc/PID/task/TID/status)."""
        out = {}
        for tid in os.listdir(f"/proc/{r.pid}/task"):
            st = proc_status(f"{r.pid}/task/{tid}")
            out[tid] = int(st["voluntary_ctxt_switches"]) + int(st["nonvoluntary_ctxt_switches"])
        return out

    before = switches()
    time.sleep(3)          # the measurement window itself: no event to await
    assert switches() == before


def test_a_fault_in_the_statistics_switches_them_off_and_reaper_goes_on(reaper, tmp_path):
    # Inject a fault into the bookkeeping of every reap reported as an event. The other
    # pieces of the failure boundary are tested in test_faults.py.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import reaper.stats, reaper.supervisor\n"
        "def boom(*a, **k): raise RuntimeError('injected fault')\n"
        "reaper.stats.Stats.record_reap = boom\n"
    )
    # -w: every orphan is an event, so its bookkeeping runs in Python (and fails).
    r = reaper(["-w", "--", "sh", "-c", "trap 'exit 6' USR1; for i in 1 2 3 4 5; do (true &); done; "
                "echo made; while :; do sleep 1 & wait; done"],
               env={"PYTHONPATH": str(site)})
    assert r.readline() == "made"
    wait_for(lambda: not zombies_of(r.pid), 10, what="orphans reaped despite the fault")
    r.send(signal.SIGUSR1)
    assert r.wait() == 6
    errors = [l for l in r.stderr.splitlines() if ": ERROR " in l]
    assert len(errors) == 1 and "injected fault" in errors[0] and "statistics switched off" in errors[0]
    assert summary(r.stderr)["policy_errors"] == 1


NONROOT = 1000


def test_as_non_root_pid1_reaps_forwards_and_drains(reaper, shared_dir):
    log = shared_dir / "log"
    child = py(f"""
import os, signal, sys, time
log = {str(log)!r}
if os.fork() == 0:
    if os.fork() == 0:                       # an orphan with a SIGTERM handler
        signal.signal(signal.SIGTERM, lambda *_: (open(log, "a").write("term\\n"), os._exit(0)))
        open(log, "a").write("ready\\n")
        time.sleep(60)
    os._exit(0)
kids = []
for _ in range(20):
    pid = os.fork()
    if pid == 0: os._exit(0)                # zombies to reap (re-parented when we exit)
    kids.append(pid)
for k in kids:   # zombies by now, not processes still on their way out (a loaded machine)
    while open(f"/proc/{{k}}/stat").read().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.001)
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(5))
print(os.getuid(), flush=True)
signal.pause()
""")
    r = reaper(["--", *child], user=NONROOT)
    assert r.readline() == str(NONROOT)
    assert proc_status(r.pid)["Uid"].split()[0] == str(NONROOT)
    wait_for(lambda: log.exists() and "ready" in log.read_text(), what="orphan ready")
    r.send(signal.SIGUSR1)
    assert r.wait() == 5
    assert log.read_text().split() == ["ready", "term"]
    assert summary(r.stderr)["drain"]["terminated"] == 1


def test_as_non_root_subreaper(tmp_path):
    r = run_reaper(["--", "sh", "-c", "(sleep 0.2 &); id -u"], pid1=False, user=NONROOT)
    assert r.proc.returncode == 0 and r.stdout.strip() == str(NONROOT)
    assert summary(r.stderr)["orphans"] == 1

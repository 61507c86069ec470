"""Point 3: signal forwarding, the early-signal race, rewrite, pdeath, mask inheritance, tty."""
import concurrent.futures
import os
import pty
import signal
import subprocess

import pytest

from conftest import (PYTHON, REAPER, UNSHARE, Reaper, host_pid_below, invoker_signals, line_with,
                      proc_status, py, read_until, run_reaper, summary, take_tty, wait_for, signal_set)

RTMAX = signal.SIGRTMAX
# Everything a process can catch, less SIGCHLD (never forwarded) and glibc's two reserved
# real-time signals (32, 33). As PID 1, the job-control ones (TSTP, TTIN, TTOU) are only forwarded.
FORWARDED = sorted(set(range(1, RTMAX + 1)) - {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, 32, 33})

# A child that blocks every signal and prints each one it receives.
ECHO = py(f"""
import signal, sys
sigs = set(range(1, {RTMAX} + 1)) - {{9, 19, 32, 33}}
signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
print("ready", flush=True)
while True:
    info = signal.sigwaitinfo(sigs)
    print(info.si_signo, info.si_pid, flush=True)
    if info.si_signo == signal.SIGTERM:
        sys.exit(0)
""")


@pytest.mark.parametrize("mode", [[], ["-g"]], ids=["child", "group"])
def test_every_catchable_signal_is_forwarded(reaper, mode):
    r = reaper(["-v", *mode, "--", *ECHO])
    assert r.readline() == "ready"
    for sig in FORWARDED:
        if sig == signal.SIGTERM:
            continue
        r.send(sig)
        got, sender = r.readline().split()
        assert int(got) == sig
        assert int(sender) == 1, "forwarded by reaper (PID 1 of the namespace)"
    r.send(signal.SIGTERM)
    assert r.readline().split()[0] == str(int(signal.SIGTERM))
    assert r.wait() == 0
    s = summary(r.stderr)
    assert s["signals_forwarded"] == len(FORWARDED)


def test_sigchld_is_not_forwarded_and_pid1_forwards_ttin_ttou_without_stopping(reaper):
    r = reaper(["-v", "--", *ECHO])
    assert r.readline() == "ready"
    r.send(signal.SIGCHLD)
    r.send(signal.SIGUSR1)            # a marker: everything before it was handled
    assert r.readline().split()[0] == str(int(signal.SIGUSR1))
    for sig in (signal.SIGTTIN, signal.SIGTTOU):
        r.send(sig)
        assert r.readline().split()[0] == str(int(sig))
    assert not proc_status(r.pid)["State"].startswith("T"), "PID 1 only forwards"
    r.send(signal.SIGTERM)
    assert r.readline().split()[0] == str(int(signal.SIGTERM))
    assert r.wait() == 0
    assert summary(r.stderr)["signals_forwarded"] == 4


# Each way another process can send a signal: kill (SI_USER), sigqueue (SI_QUEUE),
# tgkill (SI_TKILL). The kernel's own fault signals carry a positive si_code, which
# no other process can send (rt_sigqueueinfo refuses si_code >= 0 to another
# process): reaper never forwards those, and no test can make one arrive from outside.
SEND = {
    "kill": "import os, sys; os.kill(int(sys.argv[1]), int(sys.argv[2]))",
    # Python has neither call: libc's, through ctypes.
    "sigqueue": "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
                "sys.exit(libc.sigqueue(int(sys.argv[1]), int(sys.argv[2]), 0) and ctypes.get_errno())",
    "tgkill": "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); pid = int(sys.argv[1]); "
              "sys.exit(libc.tgkill(pid, pid, int(sys.argv[2])) and ctypes.get_errno())",
}


@pytest.mark.parametrize("how", sorted(SEND))
def test_fault_signals_sent_by_a_process_are_forwarded(reaper, how):
    r = reaper(["--", *ECHO])
    assert r.readline() == "ready"
    for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
        subprocess.run([PYTHON, "-c", SEND[how], str(r.pid), str(int(sig))], check=True)
        assert r.readline().split()[0] == str(int(sig))
    r.send(signal.SIGTERM)
    r.readline()
    assert r.wait() == 0


def test_sigtstp_stops_the_child_and_reaper_keeps_running(reaper):
    r = reaper(["--", "sleep", "30"])
    child = r.main_child()
    wait_for(lambda: proc_status(child)["Name"] == "sleep", what="child exec")
    r.send(signal.SIGTSTP)
    wait_for(lambda: proc_status(child)["State"].startswith("T"), what="child stopped")
    assert not proc_status(r.pid)["State"].startswith("T")
    r.send(signal.SIGCONT)
    wait_for(lambda: not proc_status(child)["State"].startswith("T"), what="child continued")
    r.send(signal.SIGTERM)
    assert r.wait() == 143


def _race_trial(args):
    r = Reaper(args)
    try:
        r.wait_ready(10)
        os.kill(r.pid, signal.SIGTERM)   # as soon as reaper can hold it
        return r.wait(20)
    finally:
        r.kill()


@pytest.mark.xdist_group("cpu-heavy")
@pytest.mark.parametrize("mode", [[], ["-g"]], ids=["child", "group"])
def test_signal_right_after_start_is_never_lost(mode):
    trials = 200
    args = [*mode, "--", "sleep", "60"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(_race_trial, [args] * trials))
    lost = [c for c in codes if c != 143]
    assert not lost, f"{len(lost)}/{trials} lost or wrong: {lost[:5]}"


def test_rewrite_and_drop(reaper):
    r = reaper(["-r", "TERM:USR1", "-r", "HUP:0", "--", *ECHO])
    assert r.readline() == "ready"
    r.send(signal.SIGHUP)             # dropped
    r.send(signal.SIGTERM)            # arrives as USR1
    assert r.readline().split()[0] == str(int(signal.SIGUSR1))
    r.send(signal.SIGUSR2)
    assert r.readline().split()[0] == str(int(signal.SIGUSR2))
    r.send(signal.SIGINT)
    assert r.readline().split()[0] == str(int(signal.SIGINT))


def test_group_mode_reaches_the_whole_group_and_child_mode_only_the_child(reaper, tmp_path):
    for mode, expect_bg in (([], False), (["-g"], True)):
        log = tmp_path / f"log{len(mode)}"
        child = py(f"""
import os, signal, sys, time
log = {str(log)!r}
def note(who):
    def h(*_):
        # With -g the helper got USR1 too: let it write before this exit starts the
        # drain, whose SIGTERM would otherwise end a helper not yet scheduled.
        end = time.monotonic() + (10 if {expect_bg} and who == "main" else 0)
        while time.monotonic() < end and "bg" not in (open(log).read() if os.path.exists(log) else ""):
            time.sleep(0.01)
        with open(log, "a") as f: f.write(who + "\\n")
        os._exit(0)
    return h
signal.signal(signal.SIGUSR1, note("main"))    # before the fork: no window without it
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGUSR1, note("bg"))
    print("bg-ready", flush=True)
    time.sleep(30); os._exit(1)
time.sleep(30)
""")
        r = reaper([*mode, "--", *child])
        assert r.readline() == "bg-ready"
        r.send(signal.SIGUSR1)
        wait_for(lambda: log.exists() and "main" in log.read_text(), what="main got USR1")
        r.wait()
        # Without -g the helper in the child's group never sees USR1 (the drain ends it with TERM).
        assert sorted(log.read_text().split()) == (["bg", "main"] if expect_bg else ["main"])


def test_sigterm_goes_to_the_main_child_only(reaper, tmp_path):
    log = tmp_path / "log"
    child = py(f"""
import os, signal, time
log = {str(log)!r}
def note(who, code):
    def h(*_):
        with open(log, "a") as f: f.write(who + "\\n")
        os._exit(code)
    return h
signal.signal(signal.SIGTERM, note("main", 0))   # before the fork: no window without it
if os.fork() == 0:               # same process group as the main child
    signal.signal(signal.SIGTERM, note("helper", 0))
    print("ready", flush=True)
    time.sleep(30); os._exit(1)
time.sleep(30)
""")
    r = reaper(["--", *child])
    assert r.readline() == "ready"
    r.send(signal.SIGTERM)
    assert r.wait() == 0
    # The helper got SIGTERM only from the drain, after the main child had exited.
    assert log.read_text().split() == ["main", "helper"]


def test_pdeath_signal_is_forwarded_when_reapers_parent_dies(tmp_path, namespace):
    marker = tmp_path / "got"
    child = py(f"""
import signal, sys, time
def h(*_):
    open({str(marker)!r}, "w").write("usr1"); sys.exit(0)
signal.signal(signal.SIGUSR1, h)
open({str(marker)!r} + ".ready", "w").close()
time.sleep(30)
""")
    # An intermediate parent starts reaper, waits until the child runs, then exits.
    parent = py(f"""
import os, subprocess, sys, time
p = subprocess.Popen([{REAPER!r}, "-p", "USR1", "--", *{child!r}])
deadline = time.monotonic() + 10
while not os.path.exists({str(marker)!r} + ".ready") and time.monotonic() < deadline:
    time.sleep(0.01)
print(p.pid, flush=True)
os._exit(0)
""")
    # All in a PID namespace whose PID 1 (adopting the orphaned reaper) lives until the
    # test ends: whatever happens, the namespace fixture takes reaper and child down.
    holder = py(f"""
import subprocess, sys
print(subprocess.run({parent!r}, capture_output=True, text=True).stdout.strip(), flush=True)
sys.stdin.read()
""")
    ns = subprocess.Popen([*UNSHARE, *holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    namespace(ns)
    reaper_ns_pid = int(read_until(ns.stdout.fileno(), lambda b: b.endswith(b"\n"), 30))
    reaper_pid = host_pid_below(ns.pid, ns_pid=reaper_ns_pid)
    wait_for(lambda: marker.exists() and marker.read_text() == "usr1", 10, what="child got USR1")
    wait_for(lambda: not os.path.exists(f"/proc/{reaper_pid}") or
             proc_status(reaper_pid)["State"].startswith("Z"), 10, what="reaper exited")


def test_child_gets_the_invokers_mask_and_ignored_signals(tmp_path):
    blocked = {signal.SIGUSR2, signal.SIGRTMIN + 3}
    ignored = {signal.SIGHUP, signal.SIGUSR1}
    invoker = invoker_signals(ignored, blocked)

    for pid1 in (True, False):
        r = Reaper(["--", "grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"], pid1=pid1, preexec_fn=invoker)
        assert r.wait() == 0
        fields = dict(l.split(":\t") for l in r.stdout.strip().splitlines())
        assert signal_set(fields["SigBlk"]) == {int(s) for s in blocked}
        # Exactly the invoker's: CPython's own SIG_IGN for PIPE/XFSZ and its SIGINT handler are undone.
        assert signal_set(fields["SigIgn"]) == {int(s) for s in ignored}


def test_child_gets_default_signals_when_the_invoker_set_none():
    r = run_reaper(["--", "grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"], preexec_fn=invoker_signals())
    fields = dict(l.split(":\t") for l in r.stdout.strip().splitlines())
    assert int(fields["SigBlk"], 16) == 0 and int(fields["SigIgn"], 16) == 0


def test_child_takes_the_terminal_foreground(tmp_path):
    master, slave = pty.openpty()
    probe = py("""
import os, sys
print("fg", os.tcgetpgrp(0) == os.getpgrp(), flush=True)
line = sys.stdin.readline()          # would stop with SIGTTIN if not in the foreground
print("read", line.strip(), flush=True)
""")

    p = subprocess.Popen([REAPER, "--", *probe], stdin=slave, stdout=slave, stderr=subprocess.PIPE,
                         preexec_fn=take_tty)
    os.close(slave)
    try:
        assert b"fg True" in read_until(master, line_with(b"fg "))
        os.write(master, b"hello\n")
        assert b"read hello" in read_until(master, line_with(b"read "))
        assert p.wait(10) == 0
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()


def test_group_mode_follows_a_main_child_that_moved_to_another_group(reaper, tmp_path):
    """Issue 20, point 9: with -g a signal goes to the group the main child is in now.
    The main child leaves a helper in its first group and joins a group of its own
    making; USR1 must reach it there (and the new group's member), not the old group."""
    log = tmp_path / "log"
    child = py(f"""
import os, signal, sys, time
log = {str(log)!r}
def note(who):
    def h(*_):
        with open(log, "a") as f: f.write(who + "\\n")
        if who == "main":
            time.sleep(0.3)                 # the new group's member writes too
            os._exit(0)
    return h
signal.signal(signal.SIGUSR1, note("main"))
left = os.fork()
if left == 0:                               # stays in the first group
    signal.signal(signal.SIGUSR1, note("left-behind"))
    time.sleep(30); os._exit(1)
r, w = os.pipe()
joined = os.fork()
if joined == 0:                             # leads the new group
    signal.signal(signal.SIGUSR1, note("new-group"))
    os.setpgid(0, 0)
    os.write(w, b"x")
    time.sleep(30); os._exit(1)
os.read(r, 1)
os.setpgid(0, joined)                       # the main child moves into it
print("moved", os.getpgrp() == joined, flush=True)
time.sleep(30)
""")
    r = reaper(["-g", "--", *child])
    assert r.readline() == "moved True"
    r.send(signal.SIGUSR1)
    assert r.wait() == 0, r.stderr
    written = sorted(log.read_text().split())
    assert written == ["main", "new-group"], written       # not the group it left

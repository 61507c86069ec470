"""Issue 9: a drop-in for tini, dumb-init and catatonit, as their users expect it.

Quiet by default (and the levels), the working-directory race, job control (signals and
a real interactive bash under a pty), SIGCONT in the drain, --no-drain, pause mode,
LISTEN_PID, tini's -l. Every case through real processes, signals and terminals.
"""
import os
import pty
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (PYTHON, REAPER, UNSHARE, check_user_can_run, children_of, clean_env, descendants, importable,
                      proc_status, py, read_until, refused, require, run_reaper, summary, take_tty, wait_for,
                      wait_for_file, zombies_of)
from metrics_helpers import get, start_with_metrics

# A main child that leaves an orphan behind (news: the drain ends it).
LEAVES_ORPHAN = ["sh", "-c", "sleep 30 & exit 0"]
# A main child whose child has exited before it: reaped by reaper as an orphan, nothing to drain.
REAPS_ORPHAN = ["sh", "-c", "(sh -c 'exit 4' &); sleep 1"]


def _run(args, env=None, pid1=True, cwd=None, timeout=30):
    cmd = [*(UNSHARE if pid1 else []), REAPER, *args]
    return subprocess.run(cmd, env=clean_env(**(env or {})), cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


# --- 1. quiet by default -----------------------------------------------------------------

@pytest.mark.parametrize("pid1", [True, False], ids=["pid1", "subreaper"])
def test_a_pass_through_run_prints_nothing(pid1):
    p = _run(["--", "sh", "-c", "echo out; echo err >&2; exit 3"], pid1=pid1)
    assert p.returncode == 3
    assert p.stdout == "out\n"
    assert p.stderr == "err\n", "reaper itself said nothing"


def test_news_is_one_summary_line_at_exit():
    p = _run(["--grace", "5", "--", *LEAVES_ORPHAN])
    assert p.returncode == 0
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and ": INFO summary {" in lines[0], p.stderr
    assert summary(p.stderr)["drain"]["terminated"] == 1


def test_an_orphan_reaped_is_news_too():
    p = _run(["--", *REAPS_ORPHAN])
    assert p.returncode == 0
    assert len(p.stderr.splitlines()) == 1
    s = summary(p.stderr)
    assert s["orphans"] == 1 and s["drain"]["terminated"] == 0


@pytest.mark.parametrize("args,env", [(["-q"], {}), (["--quiet"], {}), ([], {"REAPER_VERBOSITY": "0"}),
                                      ([], {"REAPER_QUIET": "1"}), ([], {"TINI_VERBOSITY": "0"})],
                         ids=["-q", "--quiet", "REAPER_VERBOSITY=0", "REAPER_QUIET", "TINI_VERBOSITY=0"])
def test_quiet_prints_no_summary_even_with_news(args, env):
    p = _run([*args, "--", *LEAVES_ORPHAN], env=env)
    assert p.returncode == 0 and p.stderr == ""


def test_quiet_still_prints_errors():
    p = _run(["-q", "--", "/nonexistent/command"])
    assert p.returncode == 127
    assert len(p.stderr.splitlines()) == 1 and ": ERROR cannot run '/nonexistent/command'" in p.stderr


@pytest.mark.parametrize("args,env,levels", [
    (["-v"], {}, {"INFO"}),
    (["-vv"], {}, {"INFO", "DEBUG"}),
    ([], {"REAPER_VERBOSITY": "2"}, {"INFO"}),
    ([], {"REAPER_VERBOSITY": "3"}, {"INFO", "DEBUG"}),
    ([], {"TINI_VERBOSITY": "1"}, set()),          # tini's default: like ours
    ([], {"TINI_VERBOSITY": "2"}, {"INFO"}),
    ([], {"TINI_VERBOSITY": "3"}, {"INFO", "DEBUG"}),
    ([], {"TINI_VERBOSITY": "4"}, {"INFO", "DEBUG"}),   # tini's trace is debug here
])
def test_levels_add_event_and_debug_lines(args, env, levels):
    # Subreaper: debug says it registered; no news, so the summary needs -v.
    p = _run([*args, "--", "true"], env=env, pid1=False)
    assert p.returncode == 0
    seen = {line.split()[1] for line in p.stderr.splitlines()}
    assert seen == levels, p.stderr
    if levels:
        assert "main child" in p.stderr and "ended: exit status 0" in p.stderr
        assert summary(p.stderr)["main_exit_code"] == 0
    else:
        assert p.stderr == ""


def test_warn_on_reap_warns_for_every_orphan_at_the_default_level():
    p = _run(["-w", "--", *REAPS_ORPHAN])
    lines = p.stderr.splitlines()
    assert [l.split()[1] for l in lines] == ["WARN", "INFO"], p.stderr
    assert "reaped orphan" in lines[0] and "exit status 4" in lines[0]
    assert ": INFO summary " in lines[1]


def _pty_session(argv, steps, timeout=20.0):
    """Runs argv on a new pty (its controlling terminal); steps: [(bytes to type, bytes
    to await)]; returns all the pty printed until it closed, and the exit status."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, preexec_fn=take_tty,
                         env=clean_env(TERM="dumb"))
    os.close(slave)
    out = b""
    try:
        for typed, awaited in steps:
            if typed:
                os.write(master, typed)
            out += read_until(master, lambda b: awaited in b if awaited else True, timeout)
        out += read_until(master, None, timeout)
        return out, p.wait(timeout)
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()


def test_on_a_terminal_the_user_sees_exactly_the_childs_output():
    # `reaper -- tac`: type three lines and ^D; what the terminal shows is the echo
    # of the input and tac's output, and nothing of reaper's.
    out, code = _pty_session([REAPER, "--", "tac"], [(b"1\n2\n3\n", b"3\r\n"), (b"\x04", b"")])
    assert code == 0
    assert out == b"1\r\n2\r\n3\r\n3\r\n2\r\n1\r\n", out


# --- 2. the working-directory race ---------------------------------------------------------

@pytest.mark.parametrize("pid1", [True, False], ids=["pid1", "subreaper"])
def test_reapers_cwd_is_root_before_the_child_runs_and_the_child_keeps_its_own(tmp_path, pid1):
    start = tmp_path / "start dir"
    start.mkdir()
    # The child's very first act: read its parent's cwd.
    p = _run(["--", "sh", "-c", 'readlink /proc/$PPID/cwd; pwd'], pid1=pid1, cwd=start)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["/", str(start)]


def test_a_relative_command_still_runs_and_fails_relative_to_the_start_directory(tmp_path):
    (tmp_path / "script").write_text("#!/bin/sh\npwd\n")
    (tmp_path / "script").chmod(0o755)
    (tmp_path / "adir").mkdir()
    p = _run(["./script"], cwd=tmp_path)
    assert p.returncode == 0 and p.stdout == f"{tmp_path}\n"
    p = _run(["./adir"], cwd=tmp_path)
    assert p.returncode == 126 and "Is a directory" in p.stderr, p.stderr


# --- 3. job control -------------------------------------------------------------------------

# Blocks every signal and prints each one it gets; exits 0 on SIGUSR2.
SIG_ECHO = py(f"""
import signal, sys
sigs = set(range(1, {int(signal.SIGRTMAX)} + 1)) - {{9, 19, 32, 33}}
signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
print("ready", flush=True)
while True:
    n = signal.sigwaitinfo(sigs).si_signo
    print(n, flush=True)
    if n == signal.SIGUSR2:
        sys.exit(0)
""")


def _state(pid: int) -> str:
    return proc_status(pid)["State"][0]


@pytest.mark.parametrize("args,sig,delivered", [
    ([], signal.SIGTSTP, signal.SIGTSTP),
    ([], signal.SIGTTIN, signal.SIGTTIN),
    ([], signal.SIGTTOU, signal.SIGTTOU),
    (["-r", "21:15"], signal.SIGTTIN, signal.SIGTERM),     # dumb-init's rewrite, then the stop
], ids=["TSTP", "TTIN", "TTOU", "TTIN-as-TERM"])
def test_without_a_terminal_a_job_control_signal_is_forwarded_only(reaper, args, sig, delivered):
    """docs/reaper.md: reaper stops itself only where a job-control shell on a terminal
    would continue it (the next test); here nobody would, and anybody allowed to signal
    reaper could freeze its reaping for good."""
    r = reaper([*args, "-v", "--", *SIG_ECHO], pid1=False)
    assert r.readline() == "ready"
    r.send(sig)
    assert r.readline() == str(int(delivered))
    r.send(signal.SIGUSR1)                      # a marker: the stop signal was handled before it
    assert r.readline() == str(int(signal.SIGUSR1))
    assert _state(r.pid) != "T"
    r.send(signal.SIGUSR2)
    assert r.readline() == str(int(signal.SIGUSR2))
    assert r.wait() == 0
    assert "reaper goes on (no terminal and job-control shell to continue it)" in r.stderr


class InteractiveBash:
    """A real interactive bash on a pty, job control on (the Ctrl-Z tests): expect() reads
    until a needle comes (count times) after what was read; everything is killed at exit."""

    def __init__(self, prompt: bytes) -> None:
        self.prompt, self.out = prompt, b""
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile", "-i"], stdin=slave, stdout=slave,
                                     stderr=slave, preexec_fn=take_tty,
                                     env=clean_env(TERM="dumb", PS1=prompt.decode(), HISTFILE="/dev/null"))
        os.close(slave)

    def expect(self, needle: bytes, count: int = 1) -> None:
        mark = len(self.out)
        self.out += read_until(self.master, lambda b: b[mark:].count(needle) >= count, 20, have=self.out)

    def write(self, data: bytes) -> None:
        os.write(self.master, data)

    def named(self, name: str):
        """The pid of the first process below bash named name, or None."""
        for pid in descendants(self.proc.pid):
            try:
                if proc_status(pid)["Name"] == name:
                    return pid
            except OSError:
                pass
        return None

    def __enter__(self) -> "InteractiveBash":
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.master)
        if self.proc.poll() is None:
            for pid in descendants(self.proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            self.proc.kill()
            self.proc.wait()


def test_job_control_signal_in_an_interactive_bash_stops_reaper_until_fg(tmp_path):
    """dumb-init's rule where a shell can answer it: SIGTSTP sent to reaper is forwarded,
    reaper stops, bash sees its job stopped; `fg` continues it, and SIGCONT is forwarded."""
    import shlex

    script = tmp_path / "sig_echo.py"
    script.write_text(SIG_ECHO[-1])
    with InteractiveBash(b"PROMPT-5> ") as bash:
        bash.expect(bash.prompt)
        bash.write(f"{REAPER} -- {shlex.join([PYTHON, str(script)])}\n".encode())
        bash.expect(b"ready\r\n")
        (reaper_pid,) = wait_for(lambda: children_of(bash.proc.pid) or None, what="reaper under bash")
        os.kill(reaper_pid, signal.SIGTSTP)
        bash.expect(bash.prompt)
        assert b"%d" % signal.SIGTSTP in bash.out and b"Stopped" in bash.out, bash.out
        assert _state(reaper_pid) == "T"
        bash.write(b"fg\n")
        bash.expect(b"%d\r\n" % signal.SIGCONT)      # forwarded once reaper runs again
        assert _state(reaper_pid) != "T"
        os.kill(reaper_pid, signal.SIGUSR2)
        bash.expect(bash.prompt)
        bash.write(b"echo status=$?\n")
        bash.expect(b"status=0\r\n")
        bash.write(b"exit\n")
        assert bash.proc.wait(20) == 0


def test_a_dropped_job_control_signal_does_not_stop_reaper(reaper):
    r = reaper(["-r", "TSTP:0", "--", *SIG_ECHO], pid1=False)
    assert r.readline() == "ready"
    r.send(signal.SIGTSTP)
    r.send(signal.SIGUSR1)                      # a marker: TSTP was handled before it
    assert r.readline() == str(int(signal.SIGUSR1))
    assert _state(r.pid) != "T"
    r.send(signal.SIGUSR2)
    assert r.wait() == 0


# Stops itself with SIGTSTP (as Ctrl-Z would), then says it was continued.
SELF_STOP = ["sh", "-c", "echo ready; kill -TSTP $$; echo resumed"]


def test_without_a_terminal_reaper_does_not_follow_its_stopped_child(reaper):
    """docs/reaper.md: reaper follows its main child's stop only where a job-control shell
    on a terminal would continue it (tests below: a real bash under a pty); here nothing
    would, so it goes on, and a SIGCONT it gets is forwarded."""
    r = reaper(["-v", "--", *SELF_STOP], pid1=False)
    assert r.readline() == "ready"
    child = r.main_child()
    wait_for(lambda: _state(child) == "T", what="the child to stop itself")
    time.sleep(0.2)                              # reaper would have followed by now
    assert _state(r.pid) != "T"
    r.send(signal.SIGCONT)                       # forwarded: the child goes on
    assert r.readline() == "resumed"
    assert r.wait() == 0
    assert "reaper goes on (no terminal and job-control shell to continue it)" in r.stderr


# A main child (run as uid 1000) that leaves a short-lived orphan every 20 ms, for ever.
ORPHANS_FOREVER = ["sh", "-c", "echo ready; while :; do (sleep 0.01 &); sleep 0.02; done"]


def test_a_user_stopping_the_main_child_never_freezes_a_subreaper(reaper):
    """Issue 33 point 11: reaper (root, a subreaper, no terminal) and its main child of uid
    1000; a uid-1000 process sends the child SIGTSTP, then SIGCONT. reaper must not stop
    with it (nobody could continue it): it keeps reaping the child's orphans."""
    r = reaper(["--", "setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", *ORPHANS_FOREVER], pid1=False)
    assert r.readline() == "ready"
    child = r.main_child()
    wait_for(lambda: proc_status(child)["Uid"].split()[0] == "1000", what="the child as uid 1000")
    user = ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "kill"]
    subprocess.run([*user, "-TSTP", str(child)], check=True)
    wait_for(lambda: _state(child) == "T", what="the child stopped")
    states = set()
    end = time.monotonic() + 0.5                 # long enough for reaper to follow it
    while time.monotonic() < end:
        states.add(_state(r.pid))
        time.sleep(0.005)
    subprocess.run([*user, "-CONT", str(child)], check=True)
    wait_for(lambda: _state(child) != "T", what="the child continued")
    end = time.monotonic() + 1.5                 # some 50 orphans made and reaped meanwhile
    while time.monotonic() < end:
        states.add(_state(r.pid))
        time.sleep(0.005)
    assert "T" not in states, f"reaper stopped with its child (states seen: {states})"
    wait_for(lambda: not zombies_of(r.pid), 2, what="every orphan reaped")
    r.send(signal.SIGTERM)
    r.wait()


def test_as_pid1_reaper_only_forwards(reaper):
    r = reaper(["--", *SELF_STOP])
    assert r.readline() == "ready"
    child = r.main_child()
    wait_for(lambda: _state(child) == "T", what="the child to stop")
    r.send(signal.SIGTSTP)                      # forwarded; PID 1 cannot be stopped
    r.send(signal.SIGCONT)                      # forwarded: the child goes on
    assert r.readline() == "resumed"
    assert r.wait() == 0


def test_ctrl_z_and_fg_in_an_interactive_bash(tmp_path):
    # reaper -- cat, run from a real interactive bash: ^Z brings the prompt back,
    # fg resumes cat in the foreground, reading the terminal.
    with InteractiveBash(b"PROMPT-9> ") as bash:
        master = bash.master
        bash.expect(bash.prompt)
        bash.write(f"{REAPER} -- cat\n".encode())
        cat = wait_for(lambda: bash.named("cat"), 20, what="cat to run")
        wait_for(lambda: os.tcgetpgrp(master) == os.getpgid(cat), what="cat in the foreground")
        mark = len(bash.out)
        bash.write(b"ping-one\n")
        bash.expect(b"ping-one", 2)             # the terminal's echo, then cat's copy
        bash.write(b"\x1a")                     # ^Z
        bash.expect(bash.prompt)
        assert b"Stopped" in bash.out[mark:], bash.out[mark:]
        assert _state(cat) == "T"
        reaper_pid = int(proc_status(cat)["PPid"])
        assert _state(reaper_pid) == "T"
        assert os.tcgetpgrp(master) == os.getpgid(bash.proc.pid), "the shell has the terminal back"
        bash.write(b"fg\n")
        wait_for(lambda: os.tcgetpgrp(master) == os.getpgid(cat), what="cat back in the foreground")
        wait_for(lambda: _state(cat) != "T", what="cat continued")
        bash.write(b"ping-two\n")
        bash.expect(b"ping-two", 2)
        bash.write(b"\x04")                     # ^D: cat ends, reaper exits with it
        bash.expect(bash.prompt)
        bash.write(b"echo status=$?\n")
        bash.expect(b"status=0\r\n")
        assert b"reaper[" not in bash.out, bash.out
        bash.write(b"exit\n")
        assert bash.proc.wait(20) == 0


def test_ctrl_z_and_bg_leaves_the_terminal_to_the_shell(tmp_path):
    """docs/reaper.md: continued by `bg`, reaper continues its child's group and leaves
    the terminal to the shell (it gives it back only on `fg`)."""
    ticks = tmp_path / "ticks"
    # The ticker never forks: a shell loop's `sleep` is started by vfork (dash), and a
    # ^Z that stops the vforked child before its exec leaves the shell waiting in the
    # kernel for it, never stopped: no parent, bash or reaper, would see the job stop.
    ticker = tmp_path / "ticker"         # its process name (comm): "ticker"
    ticker.write_text(f"#!{PYTHON}\nimport time\nwhile True:\n    open({str(ticks)!r}, 'a').write('x')\n"
                      "    time.sleep(0.05)\n")
    ticker.chmod(0o755)

    def count() -> int:
        return len(ticks.read_text()) if ticks.exists() else 0

    with InteractiveBash(b"PROMPT-7> ") as bash:
        master = bash.master
        bash.expect(bash.prompt)
        bash.write(f"{REAPER} -- {ticker}\n".encode())
        child = wait_for(lambda: bash.named("ticker"), 20, what="the ticker to run")
        wait_for(lambda: os.tcgetpgrp(master) == os.getpgid(child), what="the ticker in the foreground")
        bash.write(b"\x1a")                     # ^Z
        bash.expect(bash.prompt)
        wait_for(lambda: _state(child) == "T", what="the ticker stopped")
        bash.write(b"bg\n")
        bash.expect(bash.prompt)
        wait_for(lambda: _state(child) != "T", what="the ticker continued")
        seen = count()
        wait_for(lambda: count() > seen + 2, 20, what="the ticker ticking in the background")
        assert os.tcgetpgrp(master) == os.getpgid(bash.proc.pid), "bg took the terminal from the shell"
        reaper_pid = int(proc_status(child)["PPid"])
        assert _state(reaper_pid) != "T"
        bash.write(b"set -b; kill %1\n")       # -b: the shell reports the job's end at once
        bash.expect(b"Exit 143")
        bash.write(b"exit\n")
        assert bash.proc.wait(20) == 0


# --- 4. SIGCONT in the drain only to stopped processes --------------------------------------

def _recorder(log: Path) -> list:
    """A main child whose helper blocks every signal and records each one it gets (exits on
    SIGTERM); the main child exits 0 once the helper is ready."""
    return py(f"""
import os, signal, sys, time
log = {str(log)!r}
if os.fork() == 0:
    sigs = set(range(1, 32)) - {{9, 19}}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    open(log, "a").write("ready\\n")
    while True:
        n = signal.sigwaitinfo(sigs).si_signo
        open(log, "a").write(f"{{n}}\\n")
        if n == signal.SIGTERM:
            os._exit(0)
while not (os.path.exists(log) and "ready" in open(log).read()):
    time.sleep(0.005)
""")


@pytest.mark.parametrize("pid1", [True, False], ids=["pid1", "subreaper"])
def test_the_drain_sends_only_sigterm_to_a_running_process(tmp_path, pid1):
    log = tmp_path / "log"
    r = run_reaper(["--grace", "20", "--", *_recorder(log)], pid1=pid1)
    assert r.proc.returncode == 0, r.stderr
    assert log.read_text().split() == ["ready", str(int(signal.SIGTERM))]
    assert summary(r.stderr)["drain"]["terminated"] == 1


# --- 5. --no-drain ---------------------------------------------------------------------------

def _daemon_left(pidfile: Path) -> list:
    return ["sh", "-c", f"sleep 60 >/dev/null 2>&1 & echo $! > {pidfile}; exit 5"]


@pytest.mark.parametrize("args,env", [(["--no-drain"], {}), ([], {"REAPER_NO_DRAIN": "1"})],
                         ids=["flag", "variable"])
def test_no_drain_leaves_the_rest_alone_as_a_subreaper(tmp_path, args, env):
    pidfile = tmp_path / "pid"
    start = time.monotonic()
    p = _run([*args, "--grace", "30", "--", *_daemon_left(pidfile)], env=env, pid1=False)
    assert p.returncode == 5 and p.stderr == "", p.stderr
    pid = int(pidfile.read_text())
    try:
        assert _state(pid) in "SR", "left alone: not stopped, not signalled"
        assert proc_status(pid)["Name"] == "sleep"
        assert time.monotonic() - start < 20
    finally:
        os.kill(pid, signal.SIGKILL)             # ours: the sleep the test's command started


def test_no_drain_as_pid1_exits_at_once_without_sigterm(tmp_path):
    log = tmp_path / "log"
    start = time.monotonic()
    r = run_reaper(["--no-drain", "--grace", "30", "--", *_recorder(log)])
    assert r.proc.returncode == 0
    assert time.monotonic() - start < 20
    assert log.read_text().split() == ["ready"], "no SIGTERM: the kernel's SIGKILL ends it"


# --- 6. pause mode ---------------------------------------------------------------------------

def _ns_run(reaper_pid: int, cmd: list) -> None:
    """Runs cmd in reaper's PID namespace (as another container of the pod would)."""
    subprocess.run(["nsenter", "-t", str(reaper_pid), "-p", "--", *cmd], check=True, timeout=20)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_pause_reaps_ignores_other_signals_and_drains_on_sigterm(reaper, tmp_path, stop):
    log = tmp_path / "log"
    r = reaper(["-P", "--grace", "20"])
    r.wait_ready()
    # Another "container" joins the namespace: an orphan that exits, and a process that stays.
    _ns_run(r.pid, ["sh", "-c", "(exit 3) & (sleep 0.1; exit 4) &"])
    _ns_run(r.pid, [*_recorder(log)])          # its helper stays, orphaned to reaper
    wait_for(lambda: log.exists() and "ready" in log.read_text(), what="helper ready")
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
        r.send(sig)
    wait_for(lambda: len(children_of(r.pid)) == 1, what="the orphans reaped, the helper left")
    assert r.proc.poll() is None and _state(r.pid) != "T"
    assert log.read_text().split() == ["ready"], "nothing forwarded"
    r.send(stop)
    assert r.wait(20) == 0
    assert log.read_text().split() == ["ready", str(int(signal.SIGTERM))]
    s = summary(r.stderr)
    assert s["drain"]["terminated"] == 1 and s["orphans"] >= 3 and s["main_pid"] is None


def test_pause_with_no_drain_leaves_the_rest_to_the_kernel(reaper, tmp_path):
    log = tmp_path / "log"
    r = reaper(["-P", "--no-drain", "--grace", "20"])
    r.wait_ready()
    _ns_run(r.pid, [*_recorder(log)])
    wait_for(lambda: log.exists() and "ready" in log.read_text(), what="helper ready")
    r.send(signal.SIGTERM)
    assert r.wait(20) == 0
    assert log.read_text().split() == ["ready"]


def test_pause_as_a_subreaper_exits_0_on_sigint(reaper):
    r = reaper(["--pause"], pid1=False)
    r.wait_ready()
    r.send(signal.SIGHUP)
    r.send(signal.SIGINT)
    assert r.wait(20) == 0
    assert r.stderr == ""


def test_pause_serves_metrics_and_budgets(reaper):
    r, port = start_with_metrics(reaper, [], flags=["-P", "--cpu-budget", "0.5", "--budget-action", "observe"])
    _ns_run(r.pid, ["sh", "-c", "(exit 3) &"])

    def scrape():
        try:
            text = get(port, timeout=2)[2]
        except OSError:
            return ""
        return text if 'reaper_reaped_total{kind="orphan"' in text.replace(", ", ",") else ""
    text = wait_for(scrape, 20, 0.05, "metrics with the orphan reaped")
    assert "reaper_build_info" in text and "reaper_budget_info" in text
    out = subprocess.run([REAPER, "stats", "--url", f"http://127.0.0.1:{port}/metrics"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "(init, pause mode), pid 1" in out.stdout, out
    assert "main child" not in out.stdout and "passed on to the main child" not in out.stdout, out.stdout
    assert "ends pause mode" in out.stdout
    r.send(signal.SIGTERM)
    assert r.wait(20) == 0


def test_pause_survives_a_supervisor_fault_in_the_minimal_loop(reaper, tmp_path):
    # The same failure boundary: the Supervisor fails at its first event, the minimal
    # loop takes over, and SIGTERM still ends pause mode with the drain and exit 0.
    log, err = tmp_path / "log", tmp_path / "stderr"
    faulty = [PYTHON, str(Path(__file__).with_name("helpers") / "faulty_reaper.py"), "supervisor"]
    with open(err, "w") as stderr:
        r = reaper(["-P", "--grace", "20"], exe=faulty, stderr=stderr)
    r.wait_ready()
    _ns_run(r.pid, [*_recorder(log)])
    wait_for(lambda: log.exists() and "ready" in log.read_text(), what="helper ready")
    r.send(signal.SIGHUP)                      # the first event: the supervisor fails
    wait_for_file(err, contains="going on with the minimal loop")
    r.send(signal.SIGTERM)
    assert r.wait(20) == 0
    assert log.read_text().split() == ["ready", str(int(signal.SIGTERM))]


def test_pause_takes_no_command(tmp_path):
    refused(tmp_path, ["-P"], "--pause takes no command", pid1=True)


# --- 7. LISTEN_PID (socket activation through an init) ---------------------------------------

@pytest.mark.parametrize("pid1", [True, False], ids=["pid1", "subreaper"])
def test_listen_pid_naming_reaper_is_rewritten_to_the_childs_pid(pid1):
    # sh sets LISTEN_PID to its own pid and execs reaper in its place, as systemd does.
    script = f'LISTEN_PID=$$ LISTEN_FDS=1 exec {REAPER} -- sh -c \'echo "$LISTEN_PID $$ $LISTEN_FDS"\''
    p = subprocess.run([*(UNSHARE if pid1 else []), "sh", "-c", script], env=clean_env(),
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    listen, own, fds = p.stdout.split()
    assert listen == own and fds == "1"


def test_listen_pid_naming_another_process_is_left_alone():
    p = _run(["--", "sh", "-c", 'echo "$LISTEN_PID"'], env={"LISTEN_PID": "4242"})
    assert p.stdout == "4242\n"


# --- 8. tini's -l ----------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["-l", "--license"])
def test_license_flag_prints_the_license(flag):
    p = subprocess.run([REAPER, flag], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout == (Path(__file__).parents[1] / "LICENSE").read_text()


# --- also found: the KubeRay example's ulimit never fails noisily -----------------------------

@pytest.mark.yaml
def test_kuberay_ulimit_falls_back_to_the_hard_limit_quietly():
    import resource

    require("pyyaml", importable("yaml"), "pip install -e '.[test]'")
    check_user_can_run(1000)
    import yaml

    manifest = Path(__file__).parents[1] / "docker" / "k8s" / "raycluster.yaml"
    (cluster,) = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    script = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["command"][-1]

    def low_hard_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))
    # Not root (root could raise the hard limit): uid 1000 with a hard limit of 4096.
    p = subprocess.run(["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "bash", "-c", script],
                       env=clean_env(KUBERAY_GEN_RAY_START_CMD="ulimit -n"), preexec_fn=low_hard_limit,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout == "4096\n"


# --- also found: `reaper stats` says what its numbers are ------------------------------------

def test_stats_of_a_subreaper_in_words(tmp_path):
    mfile = tmp_path / "m.prom"
    p = _run(["--metrics-file", str(mfile), "--grace", "5", "--", *LEAVES_ORPHAN], pid1=False)
    assert p.returncode == 0, p.stderr
    out = subprocess.run([REAPER, "stats", "--file", str(mfile)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    head = text.splitlines()[0]
    assert " (subreaper), pid " in head and "(init)" not in head, head
    rows = {ln.split()[0]: ln for ln in text.splitlines()[1:] if ln.strip()}
    assert "1 ended after SIGTERM; took " in rows["drain"], rows["drain"]
    assert "none" not in rows["drain"]
    assert rows["reap"].lstrip().startswith("reap latency exit to reap: mean "), rows["reap"]
    n = int(rows["reap"].rsplit("(", 1)[1].split()[0])
    assert rows["reap"].endswith(f"({n} reap" + ("s)" if n != 1 else ")"))
    if "cgroups" in rows:
        assert "memory cgroups on the node (/proc/cgroups" in rows["cgroups"], rows["cgroups"]
    assert "self" in rows, "the file has reaper's own CPU too"


# --- also found: `reaper watch --grace` --------------------------------------------------------

# The namespace's PID 1 (a pod's pause): a busy stray that notes SIGTERM and goes on, and
# `reaper watch` beside it; it records how the stray ended.
WATCH_INIT = r'''
import os, signal, subprocess, sys, time
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
d, python, reaper, grace = sys.argv[1:5]
stray = subprocess.Popen([python, "-c", f"""
import signal, time
def term(*_):
    open({d!r} + "/term", "w").write(str(time.monotonic()))
signal.signal(signal.SIGTERM, term)
while True:
    pass
"""])
watch = subprocess.Popen([reaper, "watch", "--metrics-file", d + "/m.prom", "--cpu-budget", "0.05",
                          "--budget-action", "terminate", "--budget-kill-after", "0", "--budget-grace", "0",
                          "--budget-window", "1", "--budget-interval", "0.2", "--grace", grace],
                         stderr=open(d + "/watch.err", "w"))
rc = stray.wait()
open(d + "/stray-end", "w").write(f"{rc} {time.monotonic()}")
watch.send_signal(signal.SIGTERM)
watch.wait()
'''


@pytest.mark.xdist_group("cpu-heavy")        # a busy stray: not beside the CPU-share measurements
def test_watch_grace_sets_the_delay_between_terminates_sigterm_and_sigkill(tmp_path):
    init = tmp_path / "init.py"
    init.write_text(WATCH_INIT)
    ns = subprocess.Popen([*UNSHARE, PYTHON, str(init), str(tmp_path), PYTHON, REAPER, "1.5"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = wait_for_file(tmp_path / "stray-end", 60)
        rc, ended = end.split()
        assert int(rc) == -signal.SIGKILL, "it ignored SIGTERM: SIGKILL after the grace"
        took = float(ended) - float((tmp_path / "term").read_text())
        assert 1.5 <= took < 10, took
        assert "still alive 1.5s after SIGTERM: SIGKILL" in (tmp_path / "watch.err").read_text()
        assert ns.wait(30) == 0
    finally:
        if ns.poll() is None:
            ns.kill()            # unshare --kill-child takes the namespace down
            ns.wait()


# --- also found: --help lines -----------------------------------------------------------------

def test_help_keeps_every_flag_apart_from_its_text():
    p = subprocess.run([REAPER, "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0
    lines = p.stdout.splitlines()
    rows = [l for l in lines if l.startswith("  ") and l.lstrip().startswith("-")]
    assert len(rows) > 30
    for row in rows:
        flag, sep, text = row.strip().partition("  ")
        if not sep:                  # a flag too wide for its column: its text starts on the next line
            after = lines[lines.index(row) + 1]
            assert after.startswith(" " * 20) and after.strip() and not after.lstrip().startswith("-"), row
            continue
        assert text.strip() and not text.startswith(" " * 40), row
    assert any(r.strip() == "--budget-kill-after SECONDS" for r in rows)
    verbose = p.stdout.split("--verbose", 1)[1].split("\n  -", 1)[0]
    assert "-vv debug" in verbose and "is the default" not in verbose
    assert any(r.strip().startswith("-q, --quiet") for r in rows)
    assert any(r.strip().startswith("-l, --license") for r in rows)


def test_the_minimal_loops_drain_sends_only_sigterm_to_a_running_process(tmp_path):
    # The Supervisor fails at its first event (the main child's exit): the minimal loop
    # drains, with SIGCONT only for stopped processes there too.
    log = tmp_path / "log"
    faulty = [PYTHON, str(Path(__file__).with_name("helpers") / "faulty_reaper.py"), "supervisor"]
    r = run_reaper(["--grace", "20", "--", *_recorder(log)], exe=faulty)
    assert r.proc.returncode == 0, r.stderr
    assert "going on with the minimal loop" in r.stderr
    assert log.read_text().split() == ["ready", str(int(signal.SIGTERM))]

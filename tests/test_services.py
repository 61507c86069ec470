"""Supervised services (--service, --services-dir): real processes under reaper as PID 1
of a fresh PID namespace (and as a subreaper), restart timing read from the services'
own start stamps, the ordered stop read from their SIGTERM handlers, metrics from a
real scrape, and every bad input."""
from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from conftest import (PYTHON, START_NICE, REAPER, Reaper, alive, child_oom_score, clean_env, invoker_signals, py,
                      refused, run_reaper, summary, wait_for, wait_for_file, signal_set, lines_of)
import budget_helpers as bh
from metrics_helpers import start_with_metrics, wait_scrape

# Restart delays are small so the suite stays fast. A timer never fires early, so the
# lower bounds are tight; the upper ones leave a loaded machine LATE seconds.
EARLY = 0.95
LATE = 1.0


def stamper(log: Path, behaviour: str = "(exit 1)") -> str:
    """A service (sh) that appends 'start PID TIME' to log, runs behaviour, then appends
    'end PID TIME' and exits with behaviour's status (if it returns: an `exit` would not).
    TIME is CLOCK_REALTIME from date(1)."""
    return (f"sh -c 'echo start $$ $(date +%s.%N) >> {log}; {behaviour}; "
            f"rc=$?; echo end $$ $(date +%s.%N) >> {log}; exit $rc'")


def stamps(log: Path, kind: str = "start") -> list:
    if not log.exists():
        return []
    return [float(line.split()[2]) for line in log.read_text().splitlines() if line.startswith(kind + " ")]


def wait_lines(log: Path, n: int, kind: str = "start", timeout: float = 20.0) -> list:
    return wait_for(lambda: (lambda s: s if len(s) >= n else None)(stamps(log, kind)), timeout,
                    what=f"{n} '{kind}' stamps in {log.name}")


def until_stamps(log: Path, n: int, kind: str = "start") -> list:
    """A main child that exits 0 once log holds n '{kind}' stamps."""
    return py(textwrap.dedent(f"""
        import os, time
        def count():
            if not os.path.exists({str(log)!r}):
                return 0
            return sum(line.startswith("{kind} ") for line in open({str(log)!r}).read().splitlines())
        while count() < {n}:
            time.sleep(0.02)
    """))


def forever(body: str = "") -> list:
    """A main child that runs until SIGTERM (default action), after body."""
    return py(f"import time\n{body}\nwhile True: time.sleep(1)")


# --- restarts: backoff, the limit, the policies --------------------------------------

def test_a_crashing_service_backs_off_1x_2x_4x_and_is_given_up_at_the_limit(reaper, tmp_path):
    log = tmp_path / "svc"
    delay = 0.25
    # stop mode ends the run when the service is given up: no fixed wait needed to see
    # that nothing starts after the limit (the drain never restarts anything).
    r = reaper(["--service", f"crash={stamper(log)}", "--restart-delay", str(delay), "--restart-max-delay", "10",
                "--restart-limit", "4/60", "--on-service-failure", "stop", "--", *forever()])
    assert r.wait(40) == 143                   # the main child, stopped by SIGTERM
    starts, ends = stamps(log), stamps(log, "end")
    assert len(starts) == len(ends) == 4, lines_of(log)
    for k, (end, nxt) in enumerate(zip(ends, starts[1:])):
        want = delay * 2 ** k
        assert want * EARLY <= nxt - end <= want + LATE, (k, nxt - end, want)
    assert "service crash ended: exit status 1; started 4 times within 60s: given up, state failed" in r.stderr
    assert r.stderr.count("given up") == 1


def test_a_service_killed_by_sigkill_comes_back_after_the_first_delay(reaper, tmp_path):
    log = tmp_path / "svc"
    delay, tag = 0.3, bh.marker()
    sleeper = f"exec {PYTHON} -c \"import time; time.sleep(600)\" {tag}"
    r = reaper(["--service", f"agent={stamper(log, sleeper)}", "--restart-delay", str(delay),
                "--", *forever()])
    wait_lines(log, 1)
    (pid,) = bh.wait_tagged(tag)
    import time
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    second = wait_lines(log, 2)[1]
    assert delay * EARLY <= second - killed <= delay + LATE, second - killed
    assert bh.wait_tagged(tag) != [pid]
    r.send(signal.SIGTERM)
    assert r.wait(20) == 143
    assert "service agent ended: killed by SIGKILL; restarting in 0.3s" in r.stderr


def test_a_service_that_stayed_up_the_maximum_delay_starts_over_from_the_first(reaper, tmp_path):
    log = tmp_path / "svc"
    # Runs 1-3 crash at once (delays 0.2, 0.4, 0.8); run 4 lasts 2 s, longer than the
    # maximum (1.6): the next delay is 0.2 again, not 1.6. Run 5 stays up.
    behaviour = (f"n=$(grep -c ^start {log}); if [ $n -eq 4 ]; then sleep 2; "
                 "elif [ $n -ge 5 ]; then exec sleep 600; fi; false")
    r = reaper(["--service", f"flappy={stamper(log, behaviour)}", "--restart-delay", "0.2",
                "--restart-max-delay", "1.6", "--restart-limit", "10/60", "--", *forever()])
    starts = wait_lines(log, 5, timeout=30)
    ends = stamps(log, "end")
    gaps = [s - e for e, s in zip(ends, starts[1:])]
    for want, gap in zip((0.2, 0.4, 0.8), gaps):
        assert want * EARLY <= gap <= want + LATE, gaps
    assert starts[4] - starts[3] >= 2.0                 # run 4 really lasted the 2 s
    assert 0.2 * EARLY <= gaps[3] < 1.6 * EARLY, gaps   # from the first delay again
    r.send(signal.SIGTERM)
    assert r.wait(20) == 143


def test_on_failure_restarts_failures_only(reaper, tmp_path):
    ok, bad = tmp_path / "ok", tmp_path / "bad"
    # The main child ends once 'bad' has ended three times (given up at 3/60); 'ok',
    # which exited 0 long before, would have been restarted after 0.1 s.
    main = until_stamps(bad, 3, "end")
    r = run_reaper(["-v", "--restart", "on-failure", "--restart-delay", "0.1", "--restart-limit", "3/60",
                    "--service", f"ok={stamper(ok, 'true')}", "--service", f"bad={stamper(bad, '(exit 2)')}",
                    "--", *main], timeout=30)
    assert r.proc.returncode == 0, r.stderr
    assert len(stamps(ok)) == 1 and len(stamps(bad)) == 3
    s = summary(r.stderr)
    assert (s["services"], s["service_starts"], s["service_failures"]) == (2, 4, 1)
    assert "service ok ended: exit status 0; not restarted (--restart on-failure)" in r.stderr


def test_on_failure_restarts_a_service_killed_by_a_signal(tmp_path):
    log = tmp_path / "sig"
    main = until_stamps(log, 2)
    r = run_reaper(["--restart", "on-failure", "--restart-delay", "0.1",
                    "--service", f"sig={stamper(log, 'kill -KILL $$')}", "--", *main], timeout=30)
    assert r.proc.returncode == 0, r.stderr
    assert len(stamps(log)) >= 2 and not stamps(log, "end"), lines_of(log)
    assert "service sig ended: killed by SIGKILL; restarting in 0.1s" in r.stderr


def test_restart_delays_double_up_to_the_maximum(reaper, tmp_path):
    log = tmp_path / "svc"
    r = reaper(["--service", f"crash={stamper(log)}", "--restart-delay", "0.2", "--restart-max-delay", "0.4",
                "--restart-limit", "7/60", "--on-service-failure", "stop", "--", *forever()])
    assert r.wait(40) == 143
    starts, ends = stamps(log), stamps(log, "end")
    assert len(starts) == len(ends) == 7, lines_of(log)
    want = [0.2, 0.4, 0.4, 0.4, 0.4, 0.4]
    gaps = [s - e for e, s in zip(ends, starts[1:])]
    for w, gap in zip(want, gaps):
        assert w * EARLY <= gap, gaps
    # Capped at 0.4: doubling on would take 0.2 * (2**6 - 1) = 12.6 s over these six.
    assert sum(gaps) <= sum(want) + 2 * LATE, gaps


def test_never_gives_a_failed_service_up_at_once(tmp_path):
    log = tmp_path / "svc"
    r = run_reaper(["--restart", "never", "--on-service-failure", "stop", "--service", f"once={stamper(log)}",
                    "--", *forever()], timeout=30)
    assert r.proc.returncode == 143
    assert len(stamps(log)) == 1
    assert "--restart never: given up, state failed" in r.stderr


@pytest.mark.parametrize("exits_0, flags, expected", [
    (True, [], 1),                                          # the main child's 0 becomes 1
    (False, ["-e", "143", "--exit-zero-on-stop"], 143),     # neither -e nor the stop flag applies
])
def test_stop_mode_ends_the_container_non_zero(tmp_path, exits_0, flags, expected):
    log, ready = tmp_path / "svc", tmp_path / "main-ready"
    handler = "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))" if exits_0 else ""
    # The service crashes only once the main child has set its handler: the stop must
    # not race its start-up.
    crash = stamper(log, f"while [ ! -e {ready} ]; do sleep 0.01; done; (exit 1)")
    r = run_reaper([*flags, "--on-service-failure", "stop", "--restart-delay", "0.1", "--restart-limit", "2/60",
                    "--service", f"crash={crash}", "--", *forever(f"{handler}\nopen({str(ready)!r}, 'w')")],
                   timeout=30)
    assert r.proc.returncode == expected, r.stderr
    assert len(stamps(log)) == 2
    assert "stopping the main child (--on-service-failure stop)" in r.stderr


def test_a_service_that_disappears_fails_its_starts_with_127(tmp_path):
    prog = tmp_path / "agent"
    prog.write_text(f"#!/bin/sh\necho start $$ $(date +%s.%N) >> {tmp_path}/log\nrm -f {prog}\nexit 1\n")
    prog.chmod(0o755)
    r = run_reaper(["--restart-delay", "0.1", "--restart-limit", "3/60", "--on-service-failure", "stop",
                    "--service", f"agent={prog}", "--", *forever()], timeout=30)
    assert r.proc.returncode == 143
    assert len(stamps(tmp_path / "log")) == 1            # starts 2 and 3 could not exec
    assert f"service agent: cannot run '{prog}': No such file or directory" in r.stderr
    assert "service agent ended: exit status 127; started 3 times within 60s: given up" in r.stderr


# --- readiness ------------------------------------------------------------------------

def test_readiness_holds_the_main_child_back_until_the_line_is_written(tmp_path):
    log = tmp_path / "log"
    service = (f"sh -c 'echo fd $REAPER_READY_FD >> {log}; sleep 0.4; echo ready >> {log}; "
               f"echo >&$REAPER_READY_FD; exec sleep 600'")
    other = f"sh -c 'echo other-fd ${{REAPER_READY_FD:-none}} >> {log}.other; exec sleep 600'"
    r = run_reaper(["--service", f"db={service}", "--service", f"other={other}", "--service-ready", "db",
                    "--wait-ready", "60", "--", "sh", "-c", f"echo main >> {log}"], timeout=60)
    assert r.proc.returncode == 0, r.stderr
    got = lines_of(log)
    assert got[0].startswith("fd ") and int(got[0].split()[1]) >= 3, got
    assert got[1:] == ["ready", "main"], got
    assert (tmp_path / "log.other").read_text() == "other-fd none\n"   # only declared services get one
    assert "WARN" not in r.stderr


def test_the_wait_ready_timeout_lets_the_main_child_go(tmp_path):
    marker = tmp_path / "main-ran"
    r = run_reaper(["--service", "slow=sleep 600", "--service-ready", "slow", "--wait-ready", "0.5",
                    "--", "touch", str(marker)], timeout=30)
    assert r.proc.returncode == 0, r.stderr
    assert marker.exists()
    assert "WARN services not ready after 0.5s: slow; starting the main child" in r.stderr


def test_given_up_while_waiting_for_readiness_the_main_child_never_starts(tmp_path):
    marker = tmp_path / "main-ran"
    r = run_reaper(["--service", "db=false", "--service-ready", "db", "--wait-ready", "60",
                    "--restart-delay", "0.1", "--restart-limit", "2/60", "--on-service-failure", "stop",
                    "--", "touch", str(marker)], timeout=30)
    assert r.proc.returncode == 1, r.stderr
    assert not marker.exists()


def test_sigterm_while_waiting_for_readiness_stops_the_services(tmp_path, reaper):
    log = tmp_path / "log"
    svc = py(f"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: (open({str(log)!r}, "a").write("term\\n"), sys.exit(0)))
open({str(log)!r}, "a").write("up\\n")
while True: time.sleep(1)
""")
    import shlex
    r = reaper(["--service", f"db={shlex.join(svc)}", "--service-ready", "db", "--wait-ready", "60",
                "--", "touch", str(tmp_path / "main-ran")])
    wait_for_file(log, contains="up")
    r.send(signal.SIGTERM)
    assert r.wait(20) == 143
    assert lines_of(log) == ["up", "term"]
    assert not (tmp_path / "main-ran").exists()


# --- the end: the rest first, then the services in reverse order ------------------------

def _handler_service(log: Path, name: str) -> str:
    import shlex

    return shlex.join(py(f"""
import os, signal, sys, time
def term(*_):
    open({str(log)!r}, "a").write("{name} term\\n"); time.sleep(0.1)
    open({str(log)!r}, "a").write("{name} done\\n"); sys.exit(0)
signal.signal(signal.SIGTERM, term)
open({str(log)!r}, "a").write("{name} ready\\n")
if "REAPER_READY_FD" in os.environ:               # --service-ready: say so, s6's way
    os.write(int(os.environ["REAPER_READY_FD"]), b"\\n"); os.close(int(os.environ["REAPER_READY_FD"]))
while True: time.sleep(1)
"""))


@pytest.mark.parametrize("pid1", [True, False], ids=["pid1", "subreaper"])
def test_services_are_stopped_in_reverse_order_after_the_rest(tmp_path, pid1):
    log = tmp_path / "log"
    # The main child leaves an orphan with a SIGTERM handler, and exits once everyone is ready.
    main = py(f"""
import os, signal, sys, time
log = {str(log)!r}
if os.fork() == 0:
    os.setsid()
    if os.fork(): os._exit(0)
    def term(*_):
        open(log, "a").write("other term\\n"); time.sleep(0.3)
        open(log, "a").write("other done\\n"); os._exit(0)
    signal.signal(signal.SIGTERM, term)
    open(log, "a").write("other ready\\n")
    while True: time.sleep(1)
def ready():
    return sum(line.endswith(" ready") for line in open(log).read().splitlines()) if os.path.exists(log) else 0
while ready() < 4:
    time.sleep(0.02)
sys.exit(5)
""")
    args = ["-v", "--grace", "30"]
    for name in ("a", "b", "c"):
        args += ["--service", f"{name}={_handler_service(log, name)}"]
    r = run_reaper([*args, "--", *main], pid1=pid1, timeout=60)
    assert r.proc.returncode == 5, r.stderr
    ended = [line for line in lines_of(log) if not line.endswith(" ready")]
    assert ended == ["other term", "other done", "c term", "c done", "b term", "b done", "a term", "a done"]
    s = summary(r.stderr)
    # The orphan counts in the drain; the services stopped in order do not (the expected end).
    assert s["drain"] == {"terminated": 1, "killed": 0, "survived": 0, "not_permitted": 0}, s


def test_no_drain_still_stops_the_services(tmp_path):
    log, pidfile = tmp_path / "log", tmp_path / "orphan.pid"
    main = py(f"""
import os, signal, time
if os.fork() == 0:
    os.setsid()
    if os.fork(): os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2): os.dup2(null, fd)        # it outlives reaper: it must not hold the test's pipes
    signal.signal(signal.SIGTERM, lambda *a: open({str(log)!r}, "a").write("other term\\n"))
    open({str(pidfile)!r}, "w").write(str(os.getpid()))
    while True: time.sleep(1)
while not (os.path.exists({str(pidfile)!r}) and os.path.exists({str(log)!r})): time.sleep(0.02)
""")
    r = run_reaper(["--no-drain", "--service", f"a={_handler_service(log, 'a')}", "--", *main], pid1=False,
                   timeout=30)
    orphan = int(pidfile.read_text())
    try:
        assert r.proc.returncode == 0, r.stderr
        assert [line for line in lines_of(log) if "ready" not in line] == ["a term", "a done"]
        assert alive(orphan)              # --no-drain: the rest is left alone
    finally:
        os.kill(orphan, signal.SIGKILL)


# --- services are not strays -------------------------------------------------------------

@pytest.mark.xdist_group("cpu-heavy")
def test_services_are_never_budgeted_as_strays(reaper, tmp_path):
    svc_tag, stray_tag = bh.marker(), bh.marker()
    # The service's busy loop runs below the service's shell: its tree is kept too.
    service = f"sh -c \"{bh.busy_argv(svc_tag, share=0.3)} & wait\""
    r = reaper(["--cpu-budget", "0.05", "--budget-action", "nice", "--budget-grace", "0", "--budget-window", "1",
                "--budget-interval", "0.2", "--service", f"busy={service}", "--",
                *bh.orphans_then_sleep(bh.busy_argv(stray_tag, share=0.3))])
    (svc,) = bh.wait_tagged(svc_tag)
    (stray,) = bh.wait_tagged(stray_tag)
    wait_for(lambda: bh.stat(stray)["nice"] == 19, 30, what="the orphan stray reniced")
    assert bh.stat(svc)["nice"] == START_NICE
    r.send(signal.SIGTERM)
    assert r.wait(30) == 143


# --- metrics, reaper stats, the summary ----------------------------------------------------

def test_metrics_and_reaper_stats_show_the_services(reaper, tmp_path):
    r, port = start_with_metrics(reaper, forever(), ["--service", "web=sleep 600", "--service",
                                                     "flap=sh -c 'exit 3'", "--restart-delay", "0.1",
                                                     "--restart-limit", "2/60"])
    s = wait_scrape(port, lambda s: s.value("reaper_service_failed", service="flap") == 1, "flap given up")
    assert s.value("reaper_service_starts_total", service="flap") == 2
    assert s.value("reaper_service_last_exit_code", service="flap") == 3
    assert s.value("reaper_service_up", service="flap") == 0
    assert s.value("reaper_service_state", service="flap", state="failed") == 1
    assert s.value("reaper_service_up", service="web") == 1
    assert s.value("reaper_service_starts_total", service="web") == 1
    assert s.value("reaper_service_failed", service="web") == 0
    assert s.value("reaper_service_last_exit_code", service="web") is None
    assert s.value("reaper_service_start_time_seconds", service="web") > 0
    assert s.total("reaper_reaped_total", kind="supervised") == 2
    out = subprocess.run([REAPER, "stats", "--url", f"http://127.0.0.1:{port}/metrics"], capture_output=True,
                         text=True, timeout=30, env=clean_env())
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    web = next(line for line in lines if "web: " in line)
    flap = next(line for line in lines if "flap: " in line)
    assert web.split()[0] == "service" and "running, 1 start, up " in web, web
    assert flap.strip() == "flap: failed, 2 starts, last exit 3", flap
    r.send(signal.SIGTERM)
    assert r.wait(20) == 143


# --- where services come from ----------------------------------------------------------------

def test_services_start_before_the_main_child_in_the_order_given(tmp_path):
    log = tmp_path / "log"
    args = []
    for name in ("b", "a", "c"):             # the order given, not the names'
        args += ["--service", f"{name}=sh -c 'echo {name} $$ >> {log}; exec sleep 600'"]
    main = py(textwrap.dedent(f"""
        import os, time
        while not os.path.exists({str(log)!r}) or len(open({str(log)!r}).read().splitlines()) < 3:
            time.sleep(0.02)
        open({str(log)!r}, "a").write(f"main {{os.getpid()}}\\n")
    """))
    r = run_reaper([*args, "--", *main], timeout=30)
    assert r.proc.returncode == 0, r.stderr
    # PID 1 of a fresh namespace hands out pids in fork order.
    pids = {name: int(pid) for name, pid in (line.split() for line in lines_of(log))}
    assert pids["b"] < pids["a"] < pids["c"] < pids["main"], pids


def test_a_service_gets_reapers_stdout_and_the_invokers_signals(tmp_path):
    blocked, ignored = {signal.SIGUSR2}, {signal.SIGHUP, signal.SIGUSR1}
    out = tmp_path / "sig"
    import shlex
    # sh execs grep: grep reads the mask and dispositions the service was started with.
    svc = shlex.join(["sh", "-c", f"echo service-says-hello; exec grep -E '^Sig(Blk|Ign)' /proc/self/status > {out}"])
    main = py(f"import os, time\nwhile not (os.path.exists({str(out)!r}) and os.path.getsize({str(out)!r})): "
              "time.sleep(0.02)")
    r = Reaper(["--restart", "never", "--service", f"probe={svc}", "--", *main],
               preexec_fn=invoker_signals(ignored, blocked))
    assert r.wait(30) == 0, r.stderr
    assert "service-says-hello" in r.stdout

    fields = dict(line.split(":\t") for line in out.read_text().strip().splitlines())
    assert signal_set(fields["SigBlk"]) == {int(x) for x in blocked}
    assert signal_set(fields["SigIgn"]) == {int(x) for x in ignored}


def test_a_service_that_ignores_sigterm_is_killed_at_the_end_of_the_grace(tmp_path):
    log, pidfile = tmp_path / "log", tmp_path / "svc.pid"
    import shlex
    svc = shlex.join(py(textwrap.dedent(f"""
        import os, signal, time
        signal.signal(signal.SIGTERM, lambda *a: open({str(log)!r}, "a").write("term\\n"))
        open({str(pidfile)!r} + ".tmp", "w").write(str(os.getpid()))
        os.rename({str(pidfile)!r} + ".tmp", {str(pidfile)!r})
        while True: time.sleep(1)
    """)))
    main = py(f"import os, time\nwhile not os.path.exists({str(pidfile)!r}): time.sleep(0.02)")
    r = run_reaper(["--grace", "1", "--service", f"stubborn={svc}", "--", *main], pid1=False, timeout=30)
    pid = int(pidfile.read_text())
    try:
        assert r.proc.returncode == 0, r.stderr
        assert lines_of(log) == ["term"]             # asked first, then SIGKILL at the grace's end
        wait_for(lambda: not alive(pid), 10, what="the service gone")
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_process_that_ignores_sigterm_leaves_the_services_half_the_grace(tmp_path):
    """The rest is drained first, but for half the grace only: an orphan that ignores
    SIGTERM is killed then, and the service still gets its SIGTERM, not a bare SIGKILL."""
    log, pidfile = tmp_path / "log", tmp_path / "orphan.pid"
    main = py(textwrap.dedent(f"""
        import os, signal, time
        if os.fork() == 0:
            os.setsid()
            if os.fork(): os._exit(0)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            open({str(pidfile)!r} + ".tmp", "w").write(str(os.getpid()))
            os.rename({str(pidfile)!r} + ".tmp", {str(pidfile)!r})
            while True: time.sleep(1)
        while not (os.path.exists({str(pidfile)!r}) and os.path.exists({str(log)!r})): time.sleep(0.02)
    """))
    r = run_reaper(["-v", "--grace", "4", "--service", f"a={_handler_service(log, 'a')}", "--", *main],
                   pid1=False, timeout=30)
    orphan = int(pidfile.read_text())
    try:
        assert r.proc.returncode == 0, r.stderr
        assert [line for line in lines_of(log) if "ready" not in line] == ["a term", "a done"], r.stderr
        assert "still up after half the grace" in r.stderr
        wait_for(lambda: not alive(orphan), 10, what="the orphan gone")
        s = summary(r.stderr)
        assert s["drain"]["killed"] == 1, s
    finally:
        if alive(orphan):
            os.kill(orphan, signal.SIGKILL)


def test_services_dir_like_a_configmap(tmp_path):
    d, out = tmp_path / "services", tmp_path / "out"
    data = d / "..2024_01_01"
    data.mkdir(parents=True)
    out.mkdir()
    for name in ("b-agent", "a.proxy", ".hidden"):
        (data / name).write_text(f"#!/bin/sh\ntouch {out}/{name}\nexec sleep 600\n")
        (data / name).chmod(0o755)
    (data / "notes.txt").write_text("not a service\n")
    os.symlink(data.name, d / "..data")
    for name in ("b-agent", "a.proxy", ".hidden", "notes.txt"):
        os.symlink(f"..data/{name}", d / name)
    main = ["sh", "-c", f"while [ ! -e {out}/a.proxy ] || [ ! -e {out}/b-agent ]; do sleep 0.02; done"]
    r = run_reaper(["-v", "--", *main], env={"REAPER_SERVICES_DIR": str(d)}, timeout=30)
    assert r.proc.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == ["a.proxy", "b-agent"]
    assert summary(r.stderr)["services"] == 2
    # Stopped in reverse name order: b-agent first.
    assert r.stderr.index("stopping service b-agent") < r.stderr.index("stopping service a.proxy")


def test_an_ordinary_run_with_services_prints_nothing(tmp_path):
    r = run_reaper(["--service", "agent=sleep 600", "--", "true"], timeout=30)
    assert (r.proc.returncode, r.stderr) == (0, "")


def test_reaper_services_variable_one_per_line_with_commas(tmp_path):
    out = tmp_path / "out"
    services = f"one=sh -c 'echo a,b > {out}.1; exec sleep 600'\n\ntwo=sh -c 'echo c > {out}.2; exec sleep 600'\n"
    main = ["sh", "-c", f"while [ ! -s {out}.1 ] || [ ! -s {out}.2 ]; do sleep 0.02; done"]
    r = run_reaper(["--", *main], env={"REAPER_SERVICES": services}, timeout=30)
    assert r.proc.returncode == 0, r.stderr
    assert (Path(f"{out}.1").read_text(), Path(f"{out}.2").read_text()) == ("a,b\n", "c\n")


def test_a_service_gets_devnull_stdin_its_own_group_the_start_dir_and_no_inherited_fds(tmp_path):
    out = tmp_path / "out"
    probe = py(f"""
import os
fds = sorted(int(f) for f in os.listdir("/proc/self/fd") if int(f) > 2)
info = [os.readlink("/proc/self/fd/0"), str(os.getpgrp() == os.getpid()), os.getcwd(),
        str(len(fds) <= 1), open("/proc/self/oom_score_adj").read().strip()]
open({str(out)!r}, "w").write("\\n".join(info))
""")
    import shlex
    inherited = os.open(tmp_path / "inherited", os.O_WRONLY | os.O_CREAT)   # the main child's, not the service's
    try:
        r = subprocess.run([REAPER, "--restart", "on-failure", "--service", f"probe={shlex.join(probe)}", "--",
                            "sh", "-c", f"while [ ! -s {out} ]; do sleep 0.02; done; [ -e /proc/self/fd/{inherited} ]"],
                           cwd=tmp_path, pass_fds=(inherited,), stdin=subprocess.PIPE, capture_output=True,
                           timeout=30, env=clean_env())
    finally:
        os.close(inherited)
    assert r.returncode == 0, r.stderr
    devnull, own_group, cwd, few_fds, oom = out.read_text().split("\n")
    assert (devnull, own_group, cwd, few_fds) == ("/dev/null", "True", str(tmp_path), "True")
    assert int(oom) == child_oom_score()                   # the main child's (docs/reaper.md)


# --- bad input ------------------------------------------------------------------------------

def _dir(tmp_path, files: dict) -> str:
    d = tmp_path / "svcdir"
    d.mkdir()
    for name, mode in files.items():
        (d / name).write_text("#!/bin/sh\nexit 0\n")
        (d / name).chmod(mode)
    return str(d)


@pytest.mark.parametrize("args, needle", [
    (["--service", "a=sleep 1", "--service", "a=sleep 2"], "service a given twice"),
    (["--service", "bad name=sleep 1"], "bad service name 'bad name'"),
    (["--service", "=sleep 1"], "bad service name ''"),
    (["--service", "a/b=sleep 1"], "bad service name 'a/b'"),
    (["--service", "sleep 1"], "expected NAME=COMMAND, not 'sleep 1'"),
    (["--service", "a="], "service a: empty command"),
    (["--service", "a=  "], "service a: empty command"),
    (["--service", "a=sh -c 'x"], "service a: cannot split"),
    (["--service", "a=no-such-program-xyz"], "service a: cannot run 'no-such-program-xyz': No such file"),
    (["--service", "a=/etc/passwd"], "service a: cannot run '/etc/passwd': Permission denied"),
    (["--service", "a=/etc"], "service a: cannot run '/etc': Is a directory"),
    (["--services-dir", "/no/such/dir"], "--services-dir: cannot read /no/such/dir: No such file"),
    (["--services-dir", ""], "--services-dir: expected a directory"),
    (["--restart", "sometimes"], "--restart: unknown restart policy 'sometimes'"),
    (["--restart-delay", "0"], "--restart-delay: must be a number > 0"),
    (["--restart-delay", "1e9"], "--restart-delay: must be at most 604800 seconds"),
    (["--restart-max-delay", "abc"], "--restart-max-delay: expected a number of seconds"),
    (["--restart-delay", "5", "--restart-max-delay", "2"], "--restart-max-delay (2) is shorter than --restart-delay (5)"),
    (["--restart-limit", "5"], "--restart-limit: expected N/SECONDS"),
    (["--restart-limit", "0/10"], "--restart-limit: expected N/SECONDS with N >= 1"),
    (["--restart-limit", "5/0"], "--restart-limit: must be a number > 0"),
    (["--restart-limit", "x/10"], "--restart-limit: expected N/SECONDS"),
    (["--on-service-failure", "panic"], "--on-service-failure: unknown action 'panic'"),
    (["--service", "a=sleep 1", "--service-ready", "b"], "--service-ready: no service named 'b'"),
    (["--service-ready", "a b"], "bad service name 'a b'"),
    (["--service", "a=sleep 1", "--wait-ready", "0"], "--wait-ready: must be a number > 0"),
])
def test_bad_input(tmp_path, args, needle):
    refused(tmp_path, args, needle)


def test_bad_services_dir(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(tmp_path, ["--services-dir", str(empty)], "--services-dir: no executable file in")
    d = _dir(tmp_path, {"config.yaml": 0o644, ".hidden": 0o755})
    refused(tmp_path, ["--services-dir", d], "--services-dir: no executable file in")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a b").write_text("#!/bin/sh\n")
    (bad / "a b").chmod(0o755)
    refused(tmp_path, ["--services-dir", str(bad)], "bad service name 'a b'")
    refused(tmp_path, [], "service a given twice", env={"REAPER_SERVICES": "a=sleep 1\na=sleep 2"})
    refused(tmp_path, [], "REAPER_RESTART_LIMIT: expected N/SECONDS", env={"REAPER_RESTART_LIMIT": "7"})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory root cannot read as another user")
def test_an_unreadable_services_dir(tmp_path):
    d = tmp_path / "locked"
    d.mkdir()
    (d / "a").write_text("#!/bin/sh\n")
    (d / "a").chmod(0o755)
    d.chmod(0o300)          # no read bit: listdir fails for uid 1000
    os.chmod(tmp_path, 0o755)
    refused(tmp_path, ["--services-dir", str(d)], "--services-dir: cannot read", "Permission denied", user=1000)


@pytest.mark.parametrize("args, imported", [(["true"], False), (["--service", "a=true", "true"], True)],
                         ids=["without", "with"])
def test_services_code_is_not_imported_without_services(args, imported):
    """Without --service no reaper.services module is loaded; with one they are (the
    control: the modules exist under that name and parse() is where they come in)."""
    code = (f"import sys; from reaper import options; options.parse({args!r}, environ={{}}); "
            "print(sorted(m for m in sys.modules if m.startswith('reaper.services')))")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=30, env=clean_env())
    assert out.returncode == 0, out.stderr
    assert (out.stdout.strip() != "[]") == imported, out.stdout + out.stderr


# --- the failure boundary ---------------------------------------------------------------------

FAULTY = [PYTHON, str(Path(__file__).with_name("helpers") / "faulty_reaper.py")]


def test_a_failing_services_piece_is_switched_off_and_the_main_child_still_runs(tmp_path):
    marker = tmp_path / "main-ran"
    r = run_reaper(["--service", "db=sleep 600", "--service-ready", "db", "--wait-ready", "600", "--",
                    "touch", str(marker)], exe=[*FAULTY, "services"], timeout=30)
    assert r.proc.returncode == 0, r.stderr
    assert marker.exists()
    errors = [line for line in r.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "services failed (RuntimeError('injected fault')): services switched off, " \
                                 "reaper goes on" in errors[0], r.stderr


def test_a_fault_on_a_service_exit_stops_the_restarts_not_reaper(tmp_path):
    log, err = tmp_path / "svc", tmp_path / "stderr"
    # The main child ends once reaper has said so (an event), three restart delays
    # later: time for the restart that must not come.
    main = ["sh", "-c", f"until grep -q 'services switched off' {err}; do sleep 0.02; done; sleep 0.3; exit 7"]
    with open(err, "wb") as f:
        r = run_reaper(["--restart-delay", "0.1", "--service", f"crash={stamper(log)}", "--", *main],
                       exe=[*FAULTY, "service-exit"], timeout=30, stderr=f)
    text = err.read_text()
    assert r.proc.returncode == 7, text
    assert len(stamps(log)) == 1            # switched off at the first exit: never restarted
    assert "services failed (RuntimeError('injected fault')): services switched off" in text


def test_a_service_that_cannot_be_forked_fails_its_starts_and_reaper_goes_on(tmp_path):
    # stop mode: the give-up ends the run (an event to wait for); the main child itself started fine.
    r = run_reaper(["--restart-delay", "0.1", "--restart-limit", "3/60", "--on-service-failure", "stop",
                    "--service", "agent=sleep 600", "--", *forever()], exe=[*FAULTY, "service-fork"], timeout=30)
    assert r.proc.returncode == 143, r.stderr
    assert "WARN service agent: cannot start: Resource temporarily unavailable" in r.stderr
    assert "service agent ended: not started; started 3 times within 60s: given up, state failed" in r.stderr


def test_a_main_child_that_cannot_run_after_the_services_stops_them_and_exits_127(tmp_path):
    log = tmp_path / "log"
    r = run_reaper(["--grace", "30", "--service", f"a={_handler_service(log, 'a')}", "--service-ready", "a",
                    "--wait-ready", "60", "--", "no-such-command-for-reaper"], timeout=30)
    assert r.proc.returncode == 127, r.stderr
    assert "cannot run 'no-such-command-for-reaper': No such file or directory" in r.stderr
    assert lines_of(log)[-2:] == ["a term", "a done"]     # stopped at once, its handler ran


# --- per-service settings: a service directory of its own (s6's model) -----------------

def _service_dir(root: Path, name: str, run: str, **settings) -> Path:
    """root/name/run (executable) and one file per setting (restart_delay -> restart-delay)."""
    d = root / name
    d.mkdir(parents=True)
    (d / "run").write_text(f"#!/bin/sh\n{run}\n")
    (d / "run").chmod(0o755)
    for key, value in settings.items():
        (d / key.replace("_", "-")).write_text(f"{value}\n")
    return d


def test_a_service_directory_has_settings_of_its_own(tmp_path):
    """web (its own restart=never) fails once and is given up at once; agent, a plain file
    under the flags' --restart always, is restarted after the flags' delay; a `ready` file
    makes a service one the main child may wait for."""
    root, web_log, agent_log = tmp_path / "services", tmp_path / "web.log", tmp_path / "agent.log"
    _service_dir(root, "web", f"echo start $$ 0 >> {web_log}; exit 3", restart="never")
    (root / "agent").write_text(f"#!/bin/sh\necho start $$ 0 >> {agent_log}; exit 4\n")
    (root / "agent").chmod(0o755)
    r = run_reaper(["-v", "--services-dir", str(root), "--restart", "always", "--restart-delay", "0.1",
                    "--", *until_stamps(agent_log, 3)], timeout=30)
    assert r.proc.returncode == 0, r.stderr
    assert len(stamps(web_log)) == 1 and len(stamps(agent_log)) >= 3
    assert "service web ended: exit status 3; --restart never: given up" in r.stderr, r.stderr
    assert "service agent ended: exit status 4; restarting in 0.1s" in r.stderr, r.stderr


def test_a_service_directory_overrides_the_delays_and_the_limit_for_itself(tmp_path):
    root, log = tmp_path / "services", tmp_path / "web.log"
    _service_dir(root, "web", f"echo start $$ 0 >> {log}; exit 1", restart_delay="0.1",
                 restart_max_delay="0.1", restart_limit="2/60")
    r = run_reaper(["-v", "--services-dir", str(root), "--restart-delay", "30", "--", *until_stamps(log, 2)],
                   timeout=30)
    assert r.proc.returncode == 0, r.stderr            # not 30 s: its own delay
    assert "restarting in 0.1s" in r.stderr and "started 2 times within 60s: given up" in r.stderr, r.stderr


def test_a_ready_file_declares_readiness(tmp_path):
    root, out = tmp_path / "services", tmp_path / "out"
    _service_dir(root, "db", f'sleep 0.3; echo > /proc/self/fd/"$REAPER_READY_FD"; exec sleep 600', ready="")
    r = run_reaper(["--services-dir", str(root), "--wait-ready", "20", "--", "sh", "-c", f"touch {out}"],
                   timeout=30)
    assert r.proc.returncode == 0 and out.exists(), r.stderr


@pytest.mark.parametrize("file, value", [("restart", "sometimes"), ("restart-delay", "-1"), ("restart-limit", "5")])
def test_a_bad_setting_file_is_one_line_exit_2(tmp_path, file, value):
    root = tmp_path / "services"
    _service_dir(root, "web", "exec sleep 600", **{file.replace("-", "_"): value})
    refused(tmp_path, ["--services-dir", str(root)], f"--services-dir: {root / 'web' / file}: ")


def test_a_setting_that_is_not_a_regular_file_is_refused_never_read(tmp_path):
    root = tmp_path / "services"
    d = _service_dir(root, "web", "exec sleep 600")
    os.mkfifo(d / "restart")                 # a FIFO would block an open for reading
    refused(tmp_path, ["--services-dir", str(root)], "is not a regular file")
    (d / "restart").unlink()
    (d / "restart").write_text("always" * 100)
    refused(tmp_path, ["--services-dir", str(root)], "more than 256 bytes")

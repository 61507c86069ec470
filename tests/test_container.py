"""reaper in a real container: Podman with runc, an image built here (container_helpers).

What a container adds over a bare PID namespace: the runtime's own stop protocol
(`podman stop`: SIGTERM to PID 1 from outside the namespace, SIGKILL after the
timeout), the container's exit status as the runtime reports it, a port published
through the runtime's network, and a read-only /sys/fs/cgroup.
"""
from __future__ import annotations

import time

import pytest

from conftest import free_port, host_pid_below, proc_stat, require, wait_for, wait_for_file, reaper_version
from container_helpers import Container, image_rootfs, missing_tools, out, run  # noqa: F401  (out: a fixture)
from metrics_helpers import get, sample_map as _scrape
import budget_helpers as bh

pytestmark = pytest.mark.container

PY = "/usr/bin/python3"


@pytest.fixture(scope="session")
def rootfs():
    missing = missing_tools()
    require(", ".join(missing), not missing, "run .ci/setup-container-runtime.sh as root")
    return image_rootfs(log=lambda msg: None)




@pytest.fixture
def containers():
    started = []

    def start(*a, **kw):
        c = Container(*a, **kw)
        started.append(c)
        return c
    yield start
    for c in started:
        c.kill()


def test_reaper_is_pid1_and_the_exit_status_is_the_childs(rootfs):
    code = ("import os; print(os.getpid(), os.getppid()); "
            "print(open('/proc/1/cmdline').read().replace(chr(0), ' ')); raise SystemExit(7)")
    c = run(rootfs, ["reaper", "--", PY, "-c", code])
    assert c.proc.returncode == 7, c.stderr
    pid_line, cmdline = c.stdout.splitlines()[:2]
    pid, ppid = map(int, pid_line.split())
    assert ppid == 1 and pid != 1
    # PID 1 is reaper: its argv, or its title once setproctitle (after the spawn) ran.
    assert cmdline.startswith(("/usr/bin/python3 /usr/local/bin/reaper -- ", "reaper: " + PY)), cmdline

    killed = run(rootfs, ["reaper", "--", "sh", "-c", "kill -KILL $$"])
    assert killed.proc.returncode == 128 + 9, killed.stderr


# The main child: a SIGTERM handler that takes a moment (a graceful exit with
# status 3), a detached helper (setsid) that handles SIGTERM, and a stubborn one
# that ignores it. Each records what it received in /out, with CLOCK_MONOTONIC
# times (one clock for the whole machine).
GRACEFUL = r"""
import os, signal, subprocess, sys, time
def note(name):
    with open(f"/out/{name}", "w") as f:
        f.write(f"{time.monotonic()}\n")
helper = '''
import os, signal, sys, time
def term(*_):
    with open("/out/helper-term", "w") as f:
        f.write(f"{time.monotonic()}\\n")
    os._exit(0)
signal.signal(signal.SIGTERM, term)
open("/out/helper-ready", "w").close()
while True:
    time.sleep(1)
'''
stubborn = '''
import signal, time
signal.signal(signal.SIGTERM, lambda *_: open("/out/stubborn-term", "w").close())
open("/out/stubborn-ready", "w").close()
while True:
    time.sleep(1)
'''
subprocess.Popen([sys.executable, "-c", helper], start_new_session=True)
subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)
def term(*_):
    note("main-term")
    time.sleep(0.5)              # the graceful part
    note("main-exit")
    os._exit(3)
signal.signal(signal.SIGTERM, term)
while not (os.path.exists("/out/helper-ready") and os.path.exists("/out/stubborn-ready")):
    time.sleep(0.01)
note("ready")
while True:
    signal.pause()
"""


@pytest.mark.parametrize("user", [None, "1000:100"], ids=["root", "uid1000"])
def test_podman_stop_gives_the_child_its_graceful_exit_and_drains_the_rest(rootfs, out, containers, user):
    grace = 2
    c = containers(rootfs, ["reaper", "-v", "--grace", str(grace), "--", PY, "-c", GRACEFUL],   # -v: event lines
                   volumes=[(out, "/out")], user=user)
    wait_for_file(out / "ready", timeout=30)
    stop_timeout = 30
    t0 = time.monotonic()
    stop = c.stop(stop_timeout)
    took = time.monotonic() - t0
    status = c.wait(30)

    assert stop.returncode == 0, stop.stderr
    assert b"resorting to SIGKILL" not in stop.stderr       # podman never had to kill PID 1
    assert status == 3, c.stderr                              # the child's status, not 143 or 137
    t = {name: float((out / name).read_text()) for name in ("main-term", "main-exit", "helper-term")}
    # SIGTERM went to the main child only; the rest heard of it after the child had exited.
    assert t["main-term"] < t["main-exit"] < t["helper-term"]
    assert (out / "stubborn-term").exists()                   # SIGTERMed in the drain, then SIGKILLed
    assert "SIGKILL to 1 process(es) left" in c.stderr, c.stderr
    assert took >= grace                                      # the stubborn one had its grace period


@pytest.mark.parametrize("remap,expected", [([], 143), (["-e", "143"], 0)], ids=["plain", "remap-143"])
def test_a_child_killed_by_sigterm_exits_143_unless_remapped(rootfs, out, containers, remap, expected):
    c = containers(rootfs, ["reaper", *remap, "--", "sh", "-c", "echo 1 > /out/ready; exec sleep 600"],
                   volumes=[(out, "/out")])
    wait_for_file(out / "ready", timeout=30)
    # Whether sh or the sleep it execs gets the SIGTERM, the child dies of it.
    assert c.stop(30).returncode == 0
    assert c.wait(30) == expected, c.stderr


# Makes 100 orphans that exit at once (double fork), then counts the zombies in
# the container until none is left or 5 s have passed.
ZOMBIES = r"""
import os, time
N = 100
for _ in range(N):
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            time.sleep(0.05)
            os._exit(0)
        os._exit(0)
    os.waitpid(pid, 0)
def zombies():
    n = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    n += f.read().rpartition(")")[2].split()[0] == "Z"
            except OSError:
                pass
    return n
time.sleep(0.2)                       # every orphan has exited by now
deadline = time.monotonic() + 5
while zombies() and time.monotonic() < deadline:
    time.sleep(0.05)
print(zombies())
"""


def test_zombies_made_inside_are_reaped(rootfs):
    reaped = run(rootfs, ["reaper", "--", PY, "-c", ZOMBIES])
    assert reaped.proc.returncode == 0, reaped.stderr
    assert reaped.stdout.split() == ["0"]
    # The same workload as PID 1 itself (no init): the orphans stay zombies.
    control = run(rootfs, [PY, "-c", ZOMBIES])
    assert int(control.stdout.split()[0]) >= 100


ORPHANS = r"""
import os, time
for i in range(20):
    if os.fork() == 0:
        if os.fork() == 0:
            os._exit(0)
        os._exit(0)
    os.wait()
open("/out/ready", "w").write("1")
while True:
    time.sleep(1)
"""


def test_metrics_are_scraped_through_a_published_port(rootfs, out, containers):
    port = free_port()
    c = containers(rootfs, ["reaper", "--metrics-port", "9259", "--", PY, "-c", ORPHANS],
                   volumes=[(out, "/out")], publish=[(port, 9259)])
    wait_for_file(out / "ready", timeout=30)
    url = f"http://127.0.0.1:{port}"
    orphans = (("kind", "orphan"), ("outcome", "exited_0"))

    def reaped():
        # The zombie gauge comes from a /proc scan that scrapes share for 0.5 s: it may
        # lag the reap counters by one scan, so await both.
        try:
            m = _scrape(url + "/metrics")
        except OSError:
            return False
        return m.get(("reaper_reaped_total", orphans), 0) >= 20 and m.get(("reaper_zombies", ()), 1) == 0
    wait_for(reaped, timeout=30, interval=0.2, what="20 orphans reaped and no zombie left")
    m = _scrape(url + "/metrics")
    assert m[("reaper_reaped_total", orphans)] == 20            # the intermediates, exactly
    assert m[("reaper_main_child_up", ())] == 1
    assert m[("reaper_zombies", ())] == 0
    assert m[("reaper_pid", ())] == 1                           # PID 1 of the container
    assert ("reaper_build_info", (("mode", "init"), ("version", reaper_version()))) in m
    assert get(port, "/healthz", timeout=5)[0] == 200
    c.stop(30)
    assert c.wait(30) == 128 + 15


# An orphaned busy loop (double fork) that reports its own CPU time each second.
BUSY_ORPHAN = r"""
import os, time
with open("/proc/self/mountinfo") as f:     # the options of the cgroup mounts, as the container sees them
    opts = [line.split()[5] for line in f if line.split()[4].startswith("/sys/fs/cgroup/")]
with open("/out/cgroup-mounts", "w") as f:
    f.write(" ".join(opts))
if os.fork() == 0:
    if os.fork() == 0:
        with open("/out/busy-pid", "w") as f:
            f.write(str(os.getpid()))
        while True:
            pass
    os._exit(0)
os.wait()
while True:
    time.sleep(1)
"""


@pytest.mark.xdist_group("cpu-heavy")     # a busy stray's CPU is measured: not beside the other heavy tests
def test_budgets_fall_back_to_the_unprivileged_path_on_a_read_only_cgroupfs(rootfs, out, containers):
    c = containers(rootfs, ["reaper", "-v", "--cpu-budget", "0.2", "--budget-action", "throttle", "--budget-grace", "0",
                            "--budget-window", "2", "--budget-interval", "0.25", "--", PY, "-c", BUSY_ORPHAN],
                   volumes=[(out, "/out")])
    wait_for_file(out / "busy-pid", timeout=30)
    # The premise, Podman's doing: the container sees its cgroup filesystem read-only.
    mounts = (out / "cgroup-mounts").read_text().split()
    if not (mounts and all(o.split(",")[0] == "ro" for o in mounts)):
        pytest.skip(f"this Podman mounts the cgroup filesystem writable ({mounts}): nothing to fall back from")
    # The container's pid of the busy loop; from the host, it is the one below the container's init
    # with that pid in its namespace.
    inner = int((out / "busy-pid").read_text())
    host_pid = host_pid_below(wait_for(lambda: _container_init(c.name), timeout=10, what="the container's init"),
                              ns_pid=inner)
    wait_for(lambda: proc_stat(host_pid)["state"] == "T", 30, 0.01, what="the stray stopped by duty-cycling")
    # Held from above and below (a stray stopped for good fails).
    bh.assert_rate_near([host_pid], 0.2, seconds=4, low=0.5, high=1.5)
    c.stop(30)
    c.wait(30)
    # One line says that the cgroup filesystem is read-only and what is used instead.
    fallback = [line for line in c.stderr.splitlines() if "cgroup" in line and "SIGSTOP/SIGCONT" in line]
    assert len(fallback) == 1, c.stderr
    assert "read-only" in fallback[0], fallback[0]


def _container_init(name: str):
    """Host pid of the container's PID 1, as Podman reports it (None until it runs)."""
    import subprocess

    r = subprocess.run(["podman", "container", "inspect", "--format", "{{.State.Pid}}", name],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return int(r.stdout) if r.returncode == 0 and r.stdout.strip() not in (b"", b"0") else None

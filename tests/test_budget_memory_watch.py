"""Memory and lifetime budgets in `reaper watch`, the sidecar: a real shared PID namespace
whose PID 1 (like Kubernetes' pause) starts a stray and the sidecar side by side, real
processes, the real cgroup v1 memory hierarchy the sidecar could have moved a stray into."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest

import budget_helpers as bh
from conftest import CLK_TCK, PYTHON, REAPER, UNSHARE, alive, free_port, host_pid_below, ns_pid, proc_stat, \
    wait_for, wait_for_file
from metrics_helpers import wait_healthy, wait_scrape, write_script

MB = 1 << 20
BUDGET = 64 * MB

pytestmark = pytest.mark.xdist_group("cpu-heavy")     # memory growth is timed against samples

# The namespace's PID 1: starts the stray (the argv in d/stray.json: the tag is not in
# its own argv) and the sidecar (with the flags in the third argument), waits for the
# sidecar and records its status.
INIT = r'''
import json, signal, subprocess, sys
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
d, reaper, flags = sys.argv[1], sys.argv[2], sys.argv[3].split()
stray = subprocess.Popen(json.load(open(d + "/stray.json")))
watch = subprocess.Popen([reaper, "watch", *flags], stderr=open(d + "/watch.err", "w"))
rc = watch.wait()
open(d + "/watch-rc", "w").write(str(rc))
if stray.poll() is None:
    stray.kill()
stray.wait()
'''

# Grows about 40 MB/s (4 MiB every 0.1 s, every page touched); SIGTERM writes "t" to
# argv[1] and exits 0. argv ends with the tag.
GROW = ("import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (open(sys.argv[1], 'w').write('t'), sys.exit(0)))\n"
        "hold = []\n"
        "while True:\n"
        "    hold.append(b'\\x01' * (4 << 20))\n"
        "    time.sleep(0.1)\n")

# Idles; SIGTERM writes CLOCK_BOOTTIME (the clock of /proc/PID/stat's start time) to argv[1].
IDLE = ("import signal, sys, time\n"
        "def term(*_):\n"
        "    open(sys.argv[1], 'w').write(repr(time.clock_gettime(time.CLOCK_BOOTTIME)))\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "time.sleep(600)\n")


needs_v1_memory = bh.needs_v1_memory


def _start(namespace, tmp_path, flags: list, stray_code: str, tag: str) -> tuple:
    """(the namespace's Popen, the stray's host pid, its file for SIGTERM, the metrics port)."""
    port = free_port()
    init = write_script(tmp_path, "init.py", INIT)
    term = tmp_path / "term"
    (tmp_path / "stray.json").write_text(json.dumps([PYTHON, "-c", stray_code, str(term), tag]))
    ns = subprocess.Popen([*UNSHARE, *init, str(tmp_path), REAPER,
                           " ".join(["--metrics-port", str(port), "--metrics-address", "127.0.0.1", *flags])],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    namespace(ns)
    wait_healthy(port)
    (pid,) = bh.wait_tagged(tag)
    return ns, pid, term, port


def _stop(ns, tmp_path) -> str:
    """SIGINT to the sidecar: a clean exit 0; its stderr."""
    os.kill(host_pid_below(ns.pid, arg="watch"), signal.SIGINT)
    assert wait_for_file(tmp_path / "watch-rc", 20) == "0"
    err = (tmp_path / "watch.err").read_text()
    assert "Traceback" not in err, err
    ns.wait(20)
    return err


@needs_v1_memory
def test_watch_holds_memory_by_terminate_and_never_moves_the_stray(namespace, tmp_path):
    """--budget-action throttle in the sidecar: the stray is another container's process,
    so it is never moved into a memory cgroup of the sidecar's own (that would charge the
    sidecar). It grows past its budget and is terminated; its /proc/PID/cgroup never
    changes, and metrics and log say memory is held by terminate."""
    tag = bh.marker()
    ns, pid, term, port = _start(namespace, tmp_path, ["-v", "--memory-budget", "64M", "--budget-action",
                                                       "throttle", "--budget-interval", "0.3", "--budget-grace",
                                                       "0", "--grace", "2"], GROW, tag)
    stray_ns, before = ns_pid(pid), bh.memory_cgroup(pid)
    assert "reaper-strays." not in before
    seen, peak = set(), [0]

    def terminated():
        # A task that is exiting already reads as in the root cgroup: readings taken once
        # its handler ran (or it is gone) are not kept.
        if term.exists() or not alive(pid):
            return True
        try:
            c, hwm = bh.memory_cgroup(pid), bh.peak_rss(pid)
        except OSError:
            return True
        if term.exists() or not alive(pid):
            return True
        seen.add(c)
        peak[0] = max(peak[0], hwm)
        return False
    wait_for(terminated, 30, interval=0.002, what="the growing stray to be terminated")
    wait_for(lambda: not alive(pid), 10, what="the stray to exit")
    assert not any("reaper-strays." in c for c in seen), f"the sidecar moved another container's process: {seen}"
    assert term.exists() and term.read_text() == "t", "not ended by SIGTERM (its handler did not run)"
    assert seen == {before}, f"its memory cgroup changed: {seen}"
    assert peak[0] < 2 * BUDGET, f"the stray reached {peak[0] / MB:.0f} MiB"
    s = wait_scrape(port, lambda s: s.value("reaper_budget_actions_total", action="terminate", reason="memory") == 1,
                    "the memory terminate counted")
    assert s.value("reaper_budget_info", mechanism="none", memory_mechanism="terminate") == 1
    assert s.value("reaper_budget_violations_total", action="throttle", reason="memory") == 1
    assert s.value("reaper_budget_actions_total", action="throttle_memory_cgroup", reason="memory") is None
    assert s.value("reaper_budget_actions_total", action="kill", reason="memory") is None
    err = _stop(ns, tmp_path)
    assert "reaper watch holds memory budgets by terminate" in err, err
    assert "memory controller in" not in err and "reaper-strays." not in err, err     # no memory cgroup made
    over = re.findall(rf"WARN stray {stray_ns} \(python\S*, orphan\) holds ([\d.]+) MiB, over --memory-budget "
                      r"64 MiB: terminate$", err, re.M)
    assert len(over) == 1 and float(over[0]) > 64, err                      # seen over its budget, once
    assert re.search(rf"stray {stray_ns} \(python\S*\) holds [\d.]+ MiB, over its memory budget: SIGTERM", err), err


@pytest.mark.parametrize("action", ["nice", "throttle"])
def test_watch_terminates_an_idle_stray_at_its_max_age_and_its_handler_runs(namespace, tmp_path, action):
    """--stray-max-age in the sidecar: an idle stray (no CPU, no memory to speak of) gets
    SIGTERM once it has been a stray that long, whatever the action, and its handler runs;
    no SIGKILL follows."""
    tag = bh.marker()
    ns, pid, term, port = _start(namespace, tmp_path, ["--stray-max-age", "2", "--budget-action", action,
                                                       "--budget-interval", "0.3", "--grace", "5"], IDLE, tag)
    stray_ns, started = ns_pid(pid), proc_stat(pid)["start"] / CLK_TCK     # seconds after boot
    wait_for(lambda: not alive(pid), 30, what="the idle stray to be terminated")
    assert term.exists(), "not ended by SIGTERM (its handler did not run)"
    lived = float(term.read_text()) - started
    # (The start time is in clock ticks; a sample's time is taken just before its scan.)
    assert lived >= 2 - 0.05, f"SIGTERM {lived:.2f}s after it started: before its max age"
    s = wait_scrape(port, lambda s: s.value("reaper_budget_actions_total", action="terminate", reason="age") == 1,
                    "the age terminate counted")
    assert s.value("reaper_budget_violations_total", action=action, reason="age") == 1
    assert s.total("reaper_budget_actions_total", action="kill") is None
    err = _stop(ns, tmp_path)
    assert len(re.findall(rf"WARN stray {stray_ns} \(python\S*\) first seen 2s ago \(--stray-max-age\): SIGTERM$",
                          err, re.M)) == 1, err
    assert "SIGKILL" not in err, err

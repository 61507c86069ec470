"""`reaper watch`, the sidecar: in a shared PID namespace it reports the zombies a
non-reaping parent leaves, and that parent; it reaps nothing and stops cleanly."""
import os
import signal
import subprocess

import pytest

from conftest import (PYTHON, REAPER, UNSHARE, children_of, free_port, host_pid_below, proc_stat, refused_sub,
                      wait_for_file)
from metrics_helpers import wait_healthy, wait_scrape, write_script

ZOMBIES = 4

# A parent that never waits: its children stay zombies. comm is set so that
# the metric can name it.
PARENT = r'''
import ctypes, os, signal, sys, time
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
ctypes.CDLL(None).prctl(15, b"zombiemaker", 0, 0, 0)     # PR_SET_NAME
for _ in range(int(sys.argv[2])):
    if os.fork() == 0:
        os._exit(0)
open(sys.argv[1] + "/parent-ready", "w").write(str(os.getpid()))
time.sleep(300)
'''

# The namespace's PID 1 (like Kubernetes' pause): starts the parent and the
# sidecar side by side, waits for the sidecar and records how it exited.
INIT = r'''
import os, signal, subprocess, sys
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
d, port, python, reaper, parent_script, extra = sys.argv[1:7]
parent = subprocess.Popen([python, parent_script, d, sys.argv[7]])
busy = subprocess.Popen([python, "-c", "while True: pass"]) if sys.argv[8:] == ["busy"] else None
if busy:
    open(d + "/busy", "w").write(str(busy.pid))
watch = subprocess.Popen([reaper, "watch", "--metrics-port", port, "--metrics-address", "127.0.0.1",
                          *extra.split()], stderr=open(d + "/watch.err", "w"))
open(d + "/pids", "w").write(f"{parent.pid} {watch.pid}")
rc = watch.wait()
open(d + "/watch-rc", "w").write(str(rc))
for p in (parent, busy):
    if p:
        p.kill()
        p.wait()
'''


def _start(tmp_path, port, extra="", busy=False):
    init = write_script(tmp_path, "init.py", INIT)
    parent = write_script(tmp_path, "parent.py", PARENT)
    return subprocess.Popen([*UNSHARE, *init, str(tmp_path), str(port), PYTHON, REAPER, parent[1], extra,
                             str(ZOMBIES), *(["busy"] if busy else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_watch_reports_zombies_and_their_parent(namespace, tmp_path):
    port = free_port()
    ns = _start(tmp_path, port)
    namespace(ns)
    wait_for_file(tmp_path / "parent-ready", 20)
    wait_healthy(port)
    parent_pid, watch_pid = (tmp_path / "pids").read_text().split()
    s = wait_scrape(port, lambda s: s.value("reaper_zombies") == ZOMBIES, f"{ZOMBIES} zombies")
    assert s.value("reaper_zombies_by_parent", parent_pid=parent_pid, parent_name="zombiemaker") == ZOMBIES
    assert len(s.samples("reaper_zombies_by_parent")) == 1
    assert s.value("reaper_zombie_oldest_age_seconds") > 0
    assert s.value("reaper_build_info", mode="watch") == 1
    assert s.value("reaper_pid") == int(watch_pid) != 1
    assert s.value("reaper_main_child_state", state="running") is None     # a sidecar has no main child
    # Live: the namespace's PID 1 and the parent (the watcher is not counted, zombies are not live).
    assert s.value("reaper_processes", **{"class": "all"}) == 2
    assert s.value("reaper_node_cgroups", controller="memory") is not None
    s = wait_scrape(port, lambda s: s.samples("reaper_node_cpu_busiest_ratio"), "node CPU (the summary)")
    assert not [x for f in s.families.values() for x in f.samples if "cpu" in x.labels]   # no per-core series
    assert s.total("reaper_reaped_total") is None           # reaped nothing
    # reaper stats shows only the rows a sidecar has: no reaping, main child, drain or leftovers.
    out = subprocess.run([REAPER, "stats", "--url", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "(watch), pid " in out.stdout, out
    titles = {ln[2:15].strip() for ln in out.stdout.splitlines()[1:]}
    assert not titles & {"reaped", "reap latency", "main child", "drain", "leftovers"}, out.stdout
    assert "zombies" in titles and "passed on to the main child" not in out.stdout, out.stdout
    # It reaps nothing that is not its own: the zombies are still there.
    host_watch = host_pid_below(ns.pid, arg="watch")
    host_init = proc_stat(host_watch)["ppid"]
    host_parent = [c for c in children_of(host_init) if c != host_watch][0]
    kids = children_of(host_parent)
    assert len(kids) == ZOMBIES
    assert all(proc_stat(k)["state"] == "Z" for k in kids)
    # SIGTERM: a clean exit 0.
    os.kill(host_watch, signal.SIGTERM)
    assert wait_for_file(tmp_path / "watch-rc", 20) == "0"
    assert "Traceback" not in (tmp_path / "watch.err").read_text()
    ns.wait(20)


@pytest.mark.xdist_group("cpu-heavy")     # a busy stray's CPU is measured: not beside the other heavy tests
def test_watch_enforces_budgets_when_asked(namespace, tmp_path):
    """With a CPU budget, the sidecar budgets the namespace's strays: a busy one is
    found over budget and reniced, over a real scrape and on the process itself."""
    port = free_port()
    ns = _start(tmp_path, port, "--cpu-budget 0.2 --budget-action nice --budget-interval 0.2 "
                                "--budget-window 1 --budget-grace 0 --node-metrics per-core", busy=True)
    namespace(ns)
    wait_for_file(tmp_path / "parent-ready", 20)
    wait_healthy(port)
    s = wait_scrape(port, lambda s: (s.value("reaper_budget_actions_total", action="nice") or 0) >= 1,
                    "the busy stray to be reniced", timeout=30)
    assert s.value("reaper_budget_violations_total", action="nice") >= 1
    assert s.value("reaper_budget_info", mechanism="none") == 1       # nice needs no throttle mechanism
    assert s.value("reaper_processes", **{"class": "stray"}) >= 1
    # --node-metrics per-core, as reaper takes it: a busy ratio per core, on top of the summary.
    s = wait_scrape(port, lambda s: s.samples("reaper_node_cpu_busy_ratio"), "per-core CPU")
    assert len(s.samples("reaper_node_cpu_busy_ratio")) == s.value("reaper_node_cpus") >= 1
    host_busy = host_pid_below(ns.pid, ns_pid=int(wait_for_file(tmp_path / "busy")))
    assert os.getpriority(os.PRIO_PROCESS, host_busy) == 19
    os.kill(host_pid_below(ns.pid, arg="watch"), signal.SIGINT)
    assert wait_for_file(tmp_path / "watch-rc", 20) == "0"


def test_watch_bad_flags_and_pid1():
    refused_sub("watch", ["--metrics-port", "0"], "port must be 1-65535")
    refused_sub("watch", ["--bogus"], "--bogus")
    refused_sub("watch", ["--node-metrics", "all"], "--node-metrics", "unknown node metrics mode 'all'")
    refused_sub("watch", [], "REAPER_NODE_METRICS", "unknown node metrics mode",
                env={"REAPER_NODE_METRICS": "percore"})
    refused_sub("watch", ["--metrics-port", str(free_port())], "must not be PID 1", pid1=True)

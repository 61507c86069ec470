"""Node signals: per-core CPU follows a busy loop pinned to one core; cgroup counts and pids."""
import os
import subprocess
import time

import pytest

from conftest import PYTHON, free_port, wait_for_file
from metrics_helpers import in_pids_cgroup, remove_cgroup, scrape, wait_healthy, wait_scrape

LOAD_SECONDS = 4.0
USER_LOOP = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass\n"
# Copying from /dev/zero is kernel work: system time, as in the incident (one core at 100 % system).
# readv into one preallocated buffer: the copy is all the work (no allocation in user space).
SYSTEM_LOOP = ("import os, sys, time\nfd = os.open('/dev/zero', os.O_RDONLY)\nbuf = [bytearray(1 << 20)]\n"
               "end = time.monotonic() + float(sys.argv[1])\n"
               "while time.monotonic() < end: os.readv(fd, buf)\n")


def _metrics_reaper(reaper, tmp_path, **kw):
    port = free_port()
    r = reaper(["--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--",
                "sh", "-c", f"echo ready > {tmp_path}/ready; exec sleep 300"], **kw)
    wait_for_file(tmp_path / "ready", 20)
    wait_healthy(port)
    return r, port


def _load(cpu: int, code: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-c", code, str(seconds)],
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


@pytest.mark.xdist_group("cpu-heavy")     # one core must be visibly busy
@pytest.mark.parametrize("mode,code", [("user", USER_LOOP), ("system", SYSTEM_LOOP)])
def test_core_signals_follow_a_pinned_busy_loop(reaper, tmp_path, mode, code):
    r, port = _metrics_reaper(reaper, tmp_path)
    cpu = max(os.sched_getaffinity(0))
    label = str(cpu)
    s = wait_scrape(port, lambda s: s.value("reaper_node_cpu_busy_ratio", cpu=label) is not None,
                    "a first CPU sample")
    ncpu = len(s.samples("reaper_node_cpu_busy_ratio"))
    assert ncpu == len([ln for ln in open("/proc/stat") if ln[:3] == "cpu" and ln[3].isdigit()])
    before, t0 = s.value("reaper_node_cpu_saturated_seconds_total", cpu=label), time.monotonic()
    load = _load(cpu, code, LOAD_SECONDS)
    seen_busy, seen_mode, seen_busiest = [], [], []
    try:
        time.sleep(1.2)               # the first full sample interval under load
        while load.poll() is None:
            s = scrape(port)
            seen_busy.append(s.value("reaper_node_cpu_busy_ratio", cpu=label))
            seen_mode.append(s.value("reaper_node_cpu_mode_ratio", cpu=label, mode=mode))
            seen_busiest.append(s.value("reaper_node_cpu_busiest_ratio", mode="busy"))
            time.sleep(0.25)
    finally:
        load.wait(30)
    time.sleep(1.1)                   # the sample that closes the loaded interval
    after = scrape(port).value("reaper_node_cpu_saturated_seconds_total", cpu=label)
    elapsed = time.monotonic() - t0
    assert max(seen_busy) >= 0.95, seen_busy
    assert max(seen_busiest) >= 0.95, seen_busiest
    # The loop's mode dominates the core (other tests may share the core: relative to busy).
    assert max(m / b for m, b in zip(seen_mode, seen_busy) if b) >= 0.5, (mode, seen_mode, seen_busy)
    # Seconds at >= 95 % busy grew by (most of) the loaded time, and by no more than the
    # time that passed (the other worker's tests may keep the core busy around the load).
    assert after - before >= LOAD_SECONDS - 2.0, (before, after)
    assert after - before <= elapsed + 1.0, (before, after, elapsed)


def test_cgroup_counts(reaper, tmp_path):
    r, port = _metrics_reaper(reaper, tmp_path)
    s = scrape(port)
    listed = {}
    with open("/proc/cgroups") as f:
        for line in f:
            if not line.startswith("#"):
                name, _, num, _ = line.split()
                listed[name] = int(num)
    assert {x.labels["controller"] for x in s.samples("reaper_node_cgroups")} == set(listed)
    assert s.value("reaper_node_memory_cgroups_available") == (1 if "memory" in listed else 0)
    if "memory" in listed:
        # Others create cgroups on this machine too: close, not equal.
        assert abs(s.value("reaper_node_cgroups", controller="memory") - listed["memory"]) <= 20


def test_pids_in_use_against_pids_max(reaper, tmp_path):
    cg = in_pids_cgroup(500)
    if cg is None:
        pytest.skip("needs root and a cgroup-v1 pids hierarchy at /sys/fs/cgroup/pids")
    d, enter = cg
    try:
        port = free_port()
        sleepers = "for i in $(seq 20); do sleep 300 & done; echo ready > {}/ready; wait".format(tmp_path)
        r = reaper(["--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--", "sh", "-c", sleepers],
                   preexec_fn=enter)
        wait_for_file(tmp_path / "ready", 20)
        wait_healthy(port)
        s = wait_scrape(port, lambda s: s.value("reaper_cgroup_pids_available") == 1, "pids readable")
        assert s.value("reaper_cgroup_pids_max") == 500
        current = int((d / "pids.current").read_text())
        # unshare + reaper's threads + sh + 20 sleepers; threads come and go: close, not equal.
        assert s.value("reaper_cgroup_pids") >= 22
        assert abs(s.value("reaper_cgroup_pids") - current) <= 10
        r.kill()
    finally:
        remove_cgroup(d)


def test_pids_unavailable_is_reported(reaper, tmp_path):
    """In the root cgroup (no pids.current) the availability gauge says 0, and no value is made up."""
    own = [ln.split(":", 2) for ln in open("/proc/self/cgroup").read().splitlines()]
    pids_path = next((p for _, c, p in own if "pids" in c.split(",")), None)
    if pids_path != "/" or os.path.exists("/sys/fs/cgroup/pids.current"):
        pytest.skip("this test runs where reaper's pids cgroup is the root")
    r, port = _metrics_reaper(reaper, tmp_path)
    s = scrape(port)
    assert s.value("reaper_cgroup_pids_available") == 0
    assert s.value("reaper_cgroup_pids") is None

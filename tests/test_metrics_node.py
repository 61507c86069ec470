"""Node signals: per-core CPU follows a busy loop pinned to one core; cgroup counts and pids."""
import os
import subprocess

import pytest

from conftest import PYTHON, remove_cgroup, wait_for_file
from metrics_helpers import in_pids_cgroup, scrape, wait_scrape, start_with_metrics

LOAD_SECONDS = 120.0     # an upper bound: the loop is killed once the signals are seen
USER_LOOP = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass\n"
# Copying from /dev/zero is kernel work: system time, as in the incident (one core at 100 % system).
# readv into one preallocated buffer: the copy is all the work (no allocation in user space).
SYSTEM_LOOP = ("import os, sys, time\nfd = os.open('/dev/zero', os.O_RDONLY)\nbuf = [bytearray(1 << 20)]\n"
               "end = time.monotonic() + float(sys.argv[1])\n"
               "while time.monotonic() < end: os.readv(fd, buf)\n")


def _metrics_reaper(reaper, tmp_path, **kw):
    r, port = start_with_metrics(reaper, ["sh", "-c", f"echo ready > {tmp_path}/ready; exec sleep 300"], **kw)
    wait_for_file(tmp_path / "ready", 20)
    return r, port


def _load(cpu: int, code: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-c", code, str(seconds)],
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


@pytest.mark.xdist_group("cpu-heavy")     # one core must be visibly busy
@pytest.mark.parametrize("mode,code", [("user", USER_LOOP), ("system", SYSTEM_LOOP)])
def test_core_signals_follow_a_pinned_busy_loop(reaper, tmp_path, mode, code):
    # Events, not durations: the loaded core shows up busy, in the loop's mode, and
    # its saturated seconds grow. (How many seconds per second: the recorded test below.)
    r, port = _metrics_reaper(reaper, tmp_path)
    cpu = max(os.sched_getaffinity(0))
    label = str(cpu)
    s = wait_scrape(port, lambda s: s.value("reaper_node_cpu_busy_ratio", cpu=label) is not None,
                    "a first CPU sample")
    ncpu = len(s.samples("reaper_node_cpu_busy_ratio"))
    assert ncpu == len([ln for ln in open("/proc/stat") if ln[:3] == "cpu" and ln[3].isdigit()])
    before = s.value("reaper_node_cpu_saturated_seconds_total", cpu=label)
    load = _load(cpu, code, LOAD_SECONDS)
    try:
        def loaded(s):
            busy = s.value("reaper_node_cpu_busy_ratio", cpu=label) or 0
            # The loop's mode dominates the core (other tests may share it: relative to busy).
            return busy >= 0.95 and s.value("reaper_node_cpu_mode_ratio", cpu=label, mode=mode) >= 0.5 * busy \
                and s.value("reaper_node_cpu_busiest_ratio", mode="busy") >= 0.95
        wait_scrape(port, loaded, f"cpu{cpu} busy in {mode} mode", timeout=30)
        wait_scrape(port, lambda s: s.value("reaper_node_cpu_saturated_seconds_total", cpu=label) > before,
                    f"cpu{cpu}'s saturated seconds to grow", timeout=30)
    finally:
        load.kill()
        load.wait(30)


def _stat_file(d, jiffies: dict) -> str:
    """A /proc/stat with the given per-CPU jiffies (user nice system idle iowait irq softirq steal)."""
    d.mkdir(exist_ok=True)
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"] + [f"cpu{n} " + " ".join(map(str, v)) + " 0 0" for n, v in jiffies.items()]
    (d / "stat").write_text("\n".join(lines + ["intr 0", ""]))
    return str(d)


def test_cpu_sampler_ratios_and_saturated_seconds_from_recorded_samples(tmp_path):
    from reaper import nodestats

    d = tmp_path / "proc"
    _stat_file(d, {0: (100, 0, 100, 800, 0, 0, 0, 0), 1: (100, 0, 100, 800, 0, 0, 0, 0)})
    sampler = nodestats.CpuSampler(str(d))
    # One interval of 100 jiffies each: cpu0 all system time, cpu1 a quarter user.
    _stat_file(d, {0: (100, 0, 200, 800, 0, 0, 0, 0), 1: (125, 0, 100, 875, 0, 0, 0, 0)})
    sampler.sample()
    assert sampler.ratios[0]["busy"] == 1.0 and sampler.ratios[0]["system"] == 1.0
    assert sampler.ratios[1]["busy"] == 0.25 and sampler.ratios[1]["user"] == 0.25
    assert sampler.saturated == {0: 100 / nodestats.CLK_TCK, 1: 0.0}


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
    # The counts themselves move while other tests make cgroups: the parser is checked
    # exactly on a recorded file below.


RECORDED_PROC_CGROUPS = """#subsys_name	hierarchy	num_cgroups	enabled
cpuset	5	12	1
cpu	3	240	1
memory	8	68680	1
pids	9	231	1
hugetlb	0	1	0
"""


def test_proc_cgroups_is_read_exactly(tmp_path):
    from reaper import nodestats

    (tmp_path / "cgroups").write_text(RECORDED_PROC_CGROUPS)
    assert nodestats.proc_cgroups(str(tmp_path)) == {"cpuset": 12, "cpu": 240, "memory": 68680,
                                                     "pids": 231, "hugetlb": 1}
    assert nodestats.proc_cgroups(str(tmp_path / "missing")) is None


def test_pids_in_use_against_pids_max(reaper, tmp_path):
    cg = in_pids_cgroup(500)
    if cg is None:
        pytest.skip("needs root and a cgroup-v1 pids hierarchy at /sys/fs/cgroup/pids")
    d, enter = cg
    try:
        sleepers = "for i in $(seq 20); do sleep 300 & done; echo ready > {}/ready; wait".format(tmp_path)
        r, port = start_with_metrics(reaper, ["sh", "-c", sleepers], preexec_fn=enter)
        wait_for_file(tmp_path / "ready", 20)
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


def test_cgroup_stat_reads_the_highest_hierarchy_in_sight(tmp_path):
    """A node-level pod in a private cgroup namespace with the host's cgroupfs mounted:
    the container's own hierarchy has root /, the host's shows /../../.. (above it). The
    host's counts are the ones read, whatever the order of the mounts."""
    from reaper import nodestats

    own, host = tmp_path / "own", tmp_path / "host"
    own.mkdir(), host.mkdir()
    (own / "cgroup.stat").write_text("nr_descendants 3\nnr_dying_descendants 0\n")
    (host / "cgroup.stat").write_text("nr_descendants 412\nnr_dying_descendants 68213\n")
    lines = {"own": f"30 25 0:27 / {own} rw,nosuid - cgroup2 cgroup2 rw",
             "host": f"41 25 0:27 /../../.. {host} rw,nosuid - cgroup2 cgroup2 rw"}
    for order in (("own", "host"), ("host", "own")):
        (tmp_path / "self").mkdir(exist_ok=True)
        (tmp_path / "self" / "mountinfo").write_text("".join(lines[k] + "\n" for k in order))
        st = nodestats.cgroup_stat(str(tmp_path))
        assert (st.path, st.live, st.dying) == (str(host), 412, 68213), order

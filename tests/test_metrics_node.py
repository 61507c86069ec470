"""Node signals: per-core CPU (--node-metrics per-core) and its summary (the default)
follow a busy loop pinned to one core; the default's series do not grow with the cores;
cgroup counts and pids."""
import os
import subprocess
import time

import pytest

from conftest import PYTHON, remove_cgroup, wait_for_file
from metrics_helpers import exporter_config, in_pids_cgroup, own_scope, scrape, start_with_metrics, wait_scrape

LOAD_SECONDS = 120.0     # an upper bound: the loop is killed once the signals are seen
USER_LOOP = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass\n"
# Copying from /dev/zero is kernel work: system time, as in the incident (one core at 100 % system).
# readv into one preallocated buffer: the copy is all the work (no allocation in user space).
SYSTEM_LOOP = ("import os, sys, time\nfd = os.open('/dev/zero', os.O_RDONLY)\nbuf = [bytearray(1 << 20)]\n"
               "end = time.monotonic() + float(sys.argv[1])\n"
               "while time.monotonic() < end: os.readv(fd, buf)\n")


def _metrics_reaper(reaper, tmp_path, flags=(), **kw):
    r, port = start_with_metrics(reaper, ["sh", "-c", f"echo ready > {tmp_path}/ready; exec sleep 300"],
                                 flags, **kw)
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
    r, port = _metrics_reaper(reaper, tmp_path, ["--node-metrics", "per-core"])
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


def _no_cpu_label(s) -> list:
    return [(x.name, x.labels) for f in s.families.values() for x in f.samples if "cpu" in x.labels]


@pytest.mark.xdist_group("cpu-heavy")     # one core must be visibly busy
def test_the_default_summary_shows_a_pinned_busy_core_without_per_core_series(reaper, tmp_path):
    """By default (summary) a saturated core shows in a handful of series, none of them
    labelled by core: the saturated-core count, the seconds any core and the busiest core
    spent saturated, and the busiest ratio."""
    r, port = _metrics_reaper(reaper, tmp_path)
    cpu = max(os.sched_getaffinity(0))
    s = wait_scrape(port, lambda s: s.value("reaper_node_cpu_busiest_ratio", mode="busy") is not None,
                    "a first CPU sample")
    cores = [ln for ln in open("/proc/stat") if ln[:3] == "cpu" and ln[3].isdigit()]
    assert s.value("reaper_node_cpus") == len(cores)
    assert not s.samples("reaper_node_cpu_busy_ratio") and not s.samples("reaper_node_cpu_mode_ratio")
    assert not s.samples("reaper_node_cpu_saturated_seconds_total")
    assert _no_cpu_label(s) == []
    assert s.type("reaper_node_cpu_any_saturated_seconds") == "counter"
    assert s.type("reaper_node_cpu_busiest_saturated_seconds") == "counter"
    any_before = s.value("reaper_node_cpu_any_saturated_seconds_total")
    most_before = s.value("reaper_node_cpu_busiest_saturated_seconds_total")
    load = _load(cpu, USER_LOOP, LOAD_SECONDS)
    try:
        s = wait_scrape(port, lambda s: s.value("reaper_node_cpu_saturated_cores") >= 1
                        and s.value("reaper_node_cpu_busiest_ratio", mode="busy") >= 0.95
                        and s.value("reaper_node_cpu_busiest_ratio", mode="user") >= 0.5,
                        f"cpu{cpu} saturated in the summary", timeout=30)
        assert s.value("reaper_node_cpu_saturated_cores") <= s.value("reaper_node_cpus")
        s = wait_scrape(port, lambda s: s.value("reaper_node_cpu_any_saturated_seconds_total") > any_before
                        and s.value("reaper_node_cpu_busiest_saturated_seconds_total") > most_before,
                        "the saturated seconds to grow", timeout=30)
        # Seconds in which some core was saturated: never fewer than the busiest core's own.
        assert s.value("reaper_node_cpu_any_saturated_seconds_total") >= \
            s.value("reaper_node_cpu_busiest_saturated_seconds_total")
        assert _no_cpu_label(s) == []
    finally:
        load.kill()
        load.wait(30)


def test_node_metrics_off_reads_no_proc_stat_and_exports_no_node_cpu(reaper, tmp_path):
    """--node-metrics off: no reaper_node_cpu_* at all, and proc_stat is not a source
    (not read by choice, not "unreadable"); the rest of the node signals stay."""
    from reaper.metrics.sampler import SAMPLE_INTERVAL

    r, port = _metrics_reaper(reaper, tmp_path, ["--node-metrics", "off"])
    # A scrape from after the first sample would have been taken (summary: SAMPLE_INTERVAL in).
    s = wait_scrape(port, lambda s: time.time() - s.value("reaper_start_time_seconds") > 2 * SAMPLE_INTERVAL,
                    "reaper two sample intervals old")
    assert [n for n in s.families if n.startswith("reaper_node_cpu")] == []
    assert s.value("reaper_source_available", source="proc_stat") is None
    assert s.value("reaper_source_available", source="proc") == 1
    assert s.samples("reaper_node_cgroups")


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
    assert sampler.any_saturated == sampler.busiest_saturated() == 100 / nodestats.CLK_TCK
    # Next: both cores saturated (cpu1 over 100 jiffies, cpu0 over 50); then none.
    _stat_file(d, {0: (100, 0, 250, 800, 0, 0, 0, 0), 1: (225, 0, 100, 875, 0, 0, 0, 0)})
    sampler.sample()
    assert sampler.saturated == {0: 150 / nodestats.CLK_TCK, 1: 100 / nodestats.CLK_TCK}
    assert sampler.any_saturated == 200 / nodestats.CLK_TCK        # the interval once, not once per core
    assert sampler.busiest_saturated() == 150 / nodestats.CLK_TCK
    _stat_file(d, {0: (100, 0, 250, 900, 0, 0, 0, 0), 1: (225, 0, 100, 975, 0, 0, 0, 0)})
    sampler.sample()
    assert sampler.any_saturated == 200 / nodestats.CLK_TCK and sampler.busiest_saturated() == 150 / nodestats.CLK_TCK


class _Log:
    dropped = 0

    def __getattr__(self, level):
        return lambda msg: None


def _cfg(mode: str):
    return exporter_config(metrics_address="127.0.0.1", node_metrics=mode)


def _collected(tmp_path, mode: str, cores: int) -> list:
    """(name, labels) of every series the collector gives a scrape, its sampler reading
    a recorded /proc/stat of `cores` cores (two reads one second apart; cpu0 saturated)."""
    from reaper import metrics, nodestats
    from reaper.metrics.collector import ReaperCollector
    from reaper.stats import Stats

    d = tmp_path / f"proc-{cores}"
    _stat_file(d, {n: (5000 + n, 20, 3000, 90000 + 7 * n, 40, 3, 11, 0) for n in range(cores)})
    sampler = nodestats.CpuSampler(str(d))
    # 100 jiffies each: cpu0 2 user + 98 system, the others 60 user + 5 system + 35 idle.
    _stat_file(d, {n: (5002, 20, 3098, 90000, 40, 3, 11, 0) if n == 0 else
                   (5060 + n, 20, 3005, 90035 + 7 * n, 40, 3, 11, 0) for n in range(cores)})
    sampler.sample()
    x = metrics.prepare(_cfg(mode), Stats(), _Log())
    x.cpu = sampler                    # even off: the collector itself must leave it out
    return [(smp.name, smp.labels) for fam in ReaperCollector(x, own_scope()).collect() for smp in fam.samples]


def _node_cpu(series: list) -> list:
    return [(name, lab) for name, lab in series if name.startswith("reaper_node_cpu")]


def test_a_default_scrape_has_as_many_series_on_96_cores_as_on_2(tmp_path):
    """The summary (default) is a fixed set of series whatever the cores; per-core adds
    7 per core; off has no reaper_node_cpu_* (and no proc_stat source)."""
    small, big = _collected(tmp_path, "summary", 2), _collected(tmp_path, "summary", 96)
    assert len(small) == len(big)
    assert [x for x in big if "cpu" in x[1]] == []
    assert _node_cpu(small) == _node_cpu(big)           # the same series (names and labels)
    assert len(_node_cpu(big)) == 10                    # 6 busiest ratios, 2 gauges, 2 counters
    per_small, per_big = _collected(tmp_path, "per-core", 2), _collected(tmp_path, "per-core", 96)
    assert len(per_big) - len(big) == 7 * 96 and len(per_small) - len(small) == 7 * 2
    assert len({lab["cpu"] for _, lab in per_big if "cpu" in lab}) == 96
    off = _collected(tmp_path, "off", 96)
    assert _node_cpu(off) == []
    assert ("reaper_source_available", {"source": "proc_stat"}) not in off
    assert ("reaper_source_available", {"source": "proc_stat"}) in big


def test_the_summary_values_from_recorded_samples(tmp_path):
    from reaper import metrics, nodestats
    from reaper.metrics.collector import ReaperCollector
    from reaper.stats import Stats

    d = tmp_path / "proc"
    _stat_file(d, {n: (0, 0, 0, 1000, 0, 0, 0, 0) for n in range(96)})
    sampler = nodestats.CpuSampler(str(d))
    # cpu5: all system time; cpu7: 97 % user (saturated too); the rest a tenth busy.
    after = {n: (10, 0, 0, 1090, 0, 0, 0, 0) for n in range(96)}
    after[5], after[7] = (0, 0, 100, 1000, 0, 0, 0, 0), (97, 0, 0, 1003, 0, 0, 0, 0)
    _stat_file(d, after)
    sampler.sample()
    x = metrics.prepare(_cfg("summary"), Stats(), _Log())
    x.cpu = sampler
    got = {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
           for fam in ReaperCollector(x, own_scope()).collect() for smp in fam.samples}
    second = 100 / nodestats.CLK_TCK
    assert got[("reaper_node_cpus", ())] == 96
    assert got[("reaper_node_cpu_saturated_cores", ())] == 2
    assert got[("reaper_node_cpu_busiest_ratio", (("mode", "busy"),))] == 1.0
    assert got[("reaper_node_cpu_busiest_ratio", (("mode", "system"),))] == 1.0
    assert got[("reaper_node_cpu_busiest_ratio", (("mode", "user"),))] == 0.97
    assert got[("reaper_node_cpu_any_saturated_seconds_total", ())] == second
    assert got[("reaper_node_cpu_busiest_saturated_seconds_total", ())] == second


@pytest.mark.parametrize("mode,sampled", [("off", False), ("summary", True), ("per-core", True)])
def test_only_node_metrics_off_leaves_proc_stat_unread(monkeypatch, mode, sampled):
    """off starts no per-core sampler (/proc/stat is never read); the others do."""
    from reaper import metrics, nodestats
    from reaper.stats import Stats

    made = []
    real = nodestats.CpuSampler
    monkeypatch.setattr(nodestats, "CpuSampler", lambda *a: made.append(a) or real(*a))
    x = metrics.prepare(_cfg(mode), Stats(), _Log())
    x.start(own_scope())
    try:
        assert bool(made) == sampled and (x.cpu is not None) == sampled
    finally:
        x.abort()


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
    pids_path = next((p for _, c, p in own if "pids" in c.split(",")), None) or \
        next((p for h, _, p in own if h == "0"), None)            # cgroup v2's one line
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


MEMORY_V1 = "/sys/fs/cgroup/memory"


def test_visible_memory_cgroups_counts_the_directories_of_the_hierarchy_reaper_sees(tmp_path):
    """reaper_visible_memory_cgroups by value: a memory hierarchy of 7 directories (a
    subtree of the real one, bind-mounted over the memory mount in a mount namespace of
    reaper's own, as a container with a private cgroup view sees it), then 9 once two
    more are made (counted every 10 s)."""
    from conftest import REAPER, free_port
    from metrics_helpers import wait_healthy

    if os.geteuid() != 0 or not os.access(MEMORY_V1, os.W_OK):
        pytest.skip("needs root and a writable cgroup v1 memory hierarchy")
    base = os.path.join(MEMORY_V1, f"reaper-visible-test-{os.getpid()}-{os.urandom(3).hex()}")
    dirs = [base] + [os.path.join(base, f"c{i}") for i in range(5)] + [os.path.join(base, "c0", "d")]
    for d in dirs:
        os.mkdir(d)
    port = free_port()
    inner = (f"mount --bind {base} {MEMORY_V1} && exec {REAPER} --metrics-port {port} "
             f"--metrics-address 127.0.0.1 -- sleep 600")
    p = subprocess.Popen(["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", inner],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_healthy(port)
        s = wait_scrape(port, lambda s: s.value("reaper_visible_memory_cgroups") is not None, "a first count", 30)
        assert s.value("reaper_visible_memory_cgroups") == 7
        for i in (5, 6):
            os.mkdir(os.path.join(base, f"c{i}"))
            dirs.insert(1, os.path.join(base, f"c{i}"))
        wait_scrape(port, lambda s: s.value("reaper_visible_memory_cgroups") == 9, "the count after two more", 40)
    finally:
        p.kill()
        p.wait(30)
        for d in reversed(sorted(dirs, key=len)):
            remove_cgroup(d)

"""reaper node on this machine's real cores and cgroups: a process burning one core in
the kernel is seen as a saturation streak, in system mode, and named with its pid
(metrics, log and --diagnose, which exits 1); a few thousand dying memory cgroups
(cgroup v1: a leaf per short-lived process that wrote page cache, removed) are counted;
zombies are grouped by cgroup; recorded /proc and /sys trees give the exit statuses
and the report; bad input is one line and exit 2; the metric reference matches."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PYTHON, REAPER, free_port, refused_sub, wait_for, rmdir_quietly, reaper_version
from metrics_helpers import Scrape, wait_healthy, wait_scrape

DATA = Path(__file__).resolve().parent / "data" / "node"
DOCS = Path(__file__).resolve().parent.parent / "docs"
MEMORY_V1 = Path("/sys/fs/cgroup/memory")
DYING = 2000              # memory cgroups left dying by the test below
BURN_LIMIT = 30.0         # seconds: the burner is killed once the streak is seen, long before


def _node(args, **kw) -> subprocess.Popen:
    return subprocess.Popen([REAPER, "node", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def _finish(p: subprocess.Popen, timeout: float = 30.0) -> tuple:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"reaper node did not exit within {timeout} s: {err}")
    assert "Traceback" not in err, err
    return p.returncode, out, err


@pytest.fixture
def burner(tmp_path):
    """A copy of dd under a name only this test uses: `dd if=/dev/zero of=/dev/null bs=1M`
    spends its core in the kernel (clearing the buffer it reads), pinned to one core."""
    name = f"kburn{os.urandom(3).hex()}"
    exe = tmp_path / name
    shutil.copy("/bin/dd", exe)
    started = []

    def start(cpu: int) -> subprocess.Popen:
        p = subprocess.Popen([str(exe), "if=/dev/zero", "of=/dev/null", "bs=1M"], stderr=subprocess.DEVNULL,
                             preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        started.append(p)
        return p
    start.name = name
    yield start
    for p in started:
        p.kill()
        p.wait(30)


def watching(extra=()) -> tuple:
    """(reaper node --diagnose 120 serving metrics, its port, its first scrape that shows a
    core other work on this host leaves idle now, that core). A CPU-bound job beside the
    suite keeps one busy: the idle one's streak can end once a burner is gone."""
    port = free_port()
    node = _node(["--diagnose", "120", *extra, "--metrics-port", str(port), "--metrics-address", "127.0.0.1"])
    try:
        wait_healthy(port)
        s = wait_scrape(port, lambda s: _idle_core(s) is not None, "a core not saturated by other work",
                        timeout=60)
    except BaseException:
        node.kill()
        node.communicate()
        raise
    return node, port, s, _idle_core(s)


@pytest.mark.xdist_group("cpu-heavy")     # one core must be saturated by the test alone
def test_a_core_burnt_in_the_kernel_is_a_streak_with_its_culprit_named(burner, tmp_path):
    node, port, s, cpu = watching()
    try:
        label = str(cpu)
        long_before = _long_system_streaks(s)
        dd = burner(cpu)

        def named(s):
            top = [x for x in s.samples("reaper_node_kernel_time_top_ratio") if x.labels["pid"] == str(dd.pid)]
            return top and top[0].labels["comm"] == burner.name and top[0].labels["cpu"] == label \
                and top[0].value >= 0.5
        s = wait_scrape(port, named, f"{burner.name} (pid {dd.pid}) named on cpu{cpu}", timeout=BURN_LIMIT)
        cgroup = [x for x in s.samples("reaper_node_kernel_time_top_ratio")
                  if x.labels["pid"] == str(dd.pid)][0].labels["cgroup"]
        assert cgroup == _own_cgroup(dd.pid)
        # The signature: a streak of 5 s and more, with the culprit still burning.
        wait_scrape(port, lambda s: s.value("reaper_node_cpu_saturation_streak_seconds", cpu=label) >= 6,
                    f"cpu{cpu}'s streak to reach 6 s", timeout=BURN_LIMIT)
        dd.kill()
        dd.wait(30)
        # The burst ended: the streak is over (once the other jobs of this machine leave the core a
        # moment idle), counted as a system-mode streak of more than 5 s, and the longest of the
        # window keeps it.
        s = wait_scrape(port, lambda s: _long_system_streaks(s) > long_before, "the completed streak",
                        timeout=60)
        assert s.value("reaper_node_cpu_saturation_streak_max_seconds", cpu=label) >= 6
        node.send_signal(signal.SIGINT)          # --diagnose ends early on a stop signal, with its report
        status, out, err = _finish(node)
    finally:
        node.kill()
    assert status == 1, (out, err)
    m = re.search(rf"^  cpu{cpu}: longest streak (\d+) s \((\w+) \d+%\)", out, re.M)
    assert m and int(m.group(1)) >= 6 and m.group(2) == "system", out
    assert re.search(rf"^  {burner.name} \(pid {dd.pid}\): [\d.]+ s of system time, up to \d+% of a core, "
                     rf"last on cpu{cpu}, cgroup {re.escape(cgroup)}$", out, re.M), out
    assert f"Signature found:\n  - cpu{cpu} was saturated for" in out, out
    # The log: one line when the streak reached 5 s, one when it ended, both naming the culprit.
    lines = [ln for ln in err.splitlines() if f"cpu{cpu} saturat" in ln]
    assert len(lines) == 2, err
    assert "saturated for 5 s (system" in lines[0] or "saturated for 6 s (system" in lines[0], lines
    assert "saturation ended after" in lines[1], lines
    assert all(f"{burner.name} (pid {dd.pid} on cpu{cpu}" in ln for ln in lines), lines


def _idle_core(s):
    """The highest core of this process's affinity whose streak is 0 at this scrape."""
    for cpu in sorted(os.sched_getaffinity(0), reverse=True):
        if s.value("reaper_node_cpu_saturation_streak_seconds", cpu=str(cpu)) == 0:
            return cpu
    return None


def _long_system_streaks(s) -> float:
    """Completed streaks of more than 5 s dominated by system time."""
    return s.value("reaper_node_cpu_saturation_streak_length_seconds_count", mode="system") - \
        s.value("reaper_node_cpu_saturation_streak_length_seconds_bucket", mode="system", le="5.0")


def _own_cgroup(pid: int) -> str:
    from reaper.node.culprits import pick_cgroup

    return pick_cgroup(Path(f"/proc/{pid}/cgroup").read_text())


# --- dying memory cgroups (cgroup v1) ----------------------------------------------------------

LEAVES = r'''
import os, sys
base, files, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    leaf = os.path.join(base, f"l{i}")
    os.mkdir(leaf)
    pid = os.fork()
    if pid == 0:                  # the short-lived process: into its leaf, one page of cache, gone
        with open(os.path.join(leaf, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        with open(os.path.join(files, f"f{i}"), "wb") as f:
            f.write(b"x" * 4096)
        os._exit(0)
    os.waitpid(pid, 0)
    os.rmdir(leaf)                # removed; its page cache keeps it dying
print(n)
'''


def _v1_dying() -> int:
    counts = {ln.split()[0]: int(ln.split()[2]) for ln in open("/proc/cgroups") if not ln.startswith("#")}
    return counts["memory"] - sum(1 for _ in os.walk(MEMORY_V1))


@pytest.fixture
def leaky_cgroup(tmp_path):
    if not (MEMORY_V1 / "cgroup.procs").exists() or os.geteuid() != 0:
        pytest.skip("needs root and a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
    base = MEMORY_V1 / f"reaper-node-test-{os.getpid()}-{os.urandom(3).hex()}"
    base.mkdir()
    files = tmp_path / "cache"
    files.mkdir()
    yield base, files
    shutil.rmtree(files, ignore_errors=True)        # the page cache goes: the dying cgroups can be freed
    for leaf in base.glob("l*"):
        leaf.rmdir()
    base.rmdir()


@pytest.mark.xdist_group("cpu-heavy")     # counts host-wide memory cgroups: not beside other cgroup tests
def test_a_few_thousand_dying_memory_cgroups_are_counted_and_a_signature(leaky_cgroup, tmp_path):
    base, files = leaky_cgroup
    before = _v1_dying()
    made = subprocess.run([PYTHON, "-c", LEAVES, str(base), str(files), str(DYING)], capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0 and made.stdout.strip() == str(DYING), made.stderr
    assert not list(base.iterdir()) or not list(base.glob("l*"))     # no leaf is left as a directory
    mfile = tmp_path / "node.prom"
    status, out, err = _finish(_node(["--diagnose", "1", "--metrics-file", str(mfile)]))
    m = re.search(r"^  live (\d+), dying (\d+)", out, re.M)
    assert m, out
    live, dying = int(m.group(1)), int(m.group(2))
    assert dying >= before + 0.9 * DYING, (before, out)
    assert "Memory cgroups (cgroup v1, /proc/cgroups against the directories):" in out
    assert "cgroup v1 does not say" in out
    f = Scrape(mfile.read_text())
    assert f.value("reaper_node_memory_cgroups", state="dying") >= before + 0.9 * DYING
    assert f.value("reaper_node_memory_cgroups", state="live") >= 2        # the root and the test's base
    if dying > 10 * live and dying > 1000:
        assert status == 1 and "dying memory cgroups against" in out, out
    assert err == "", err


# --- zombies by cgroup ---------------------------------------------------------------------------

ZOMBIE_PARENT = "import os, sys, time\nif os.fork() == 0: os._exit(0)\nprint('ready', flush=True)\ntime.sleep(120)\n"


def test_zombies_are_counted_by_their_pods_cgroup(tmp_path):
    if not (MEMORY_V1 / "cgroup.procs").exists() or os.geteuid() != 0:
        pytest.skip("needs root and a writable cgroup v1 memory hierarchy")
    d = MEMORY_V1 / f"reaper-node-z-{os.getpid()}-{os.urandom(3).hex()}"
    d.mkdir()
    parent = None
    try:
        parent = subprocess.Popen([PYTHON, "-c", ZOMBIE_PARENT], stdout=subprocess.PIPE, text=True,
                                  preexec_fn=lambda: (d / "cgroup.procs").write_text(str(os.getpid())))
        assert parent.stdout.readline() == "ready\n"
        mfile = tmp_path / "node.prom"
        status, out, err = _finish(_node(["--diagnose", "1", "--metrics-file", str(mfile)]))
        f = Scrape(mfile.read_text())
        assert f.value("reaper_node_zombies_by_cgroup", cgroup=f"/{d.name}") == 1, mfile.read_text()
        assert f.value("reaper_node_zombies") >= 1
        assert f"/{d.name} (1)" in out
    finally:
        if parent is not None:
            parent.kill()
            parent.wait(30)
        wait_for(lambda: rmdir_quietly(d), 10, 0.05, what=f"{d} to be removable")


# --- recorded /proc and /sys: the report and the exit statuses -------------------------------------

def _recorded(tmp_path, memory_cgroups: int) -> Path:
    proc = tmp_path / "proc"
    shutil.copytree(DATA / "proc", proc)
    text = (proc / "cgroups").read_text()
    (proc / "cgroups").write_text(re.sub(r"^memory\t4\t\d+", f"memory\t4\t{memory_cgroups}", text, flags=re.M))
    return proc


def test_a_quiet_node_exits_0_with_a_report_that_says_so(tmp_path):
    proc = _recorded(tmp_path, 6)
    status, out, err = _finish(_node(["--diagnose", "1", "--proc", str(proc), "--sys", str(DATA / "sys-v1")]))
    assert status == 0, (out, err)
    assert "Saturated cores:\n  none\n" in out
    assert "  live 4, dying 2\n" in out
    assert "Pressure (share of the watch stalled): cpu some 0.0%, full 0.0%; " in out     # a file that stands still
    assert "irq full 0.0%" in out
    assert out.rstrip().endswith("dying memory cgroups not over 10 times the live ones and 1000, and no NIC event "
                                 "after a core saturated in kernel time.")
    assert "Zombie processes on the host: 1; by cgroup: /kubepods.slice/kubepods-burstable.slice/" in out
    assert err == ""


def test_dying_memory_cgroups_over_ten_times_the_live_ones_are_a_signature(tmp_path):
    proc = _recorded(tmp_path, 5000)
    status, out, _ = _finish(_node(["--diagnose", "1", "--proc", str(proc), "--sys", str(DATA / "sys-v1")]))
    assert status == 1 and "  - 4996 dying memory cgroups against 4 live ones" in out, out
    # v2: the counts from cgroup.stat, and who holds them.
    status, out, _ = _finish(_node(["--diagnose", "1", "--proc", str(proc), "--sys", str(DATA / "sys-v2")]))
    assert status == 1, out
    assert "Memory cgroups (cgroup v2, cgroup.stat nr_subsys_memory, nr_dying_subsys_memory):" in out
    assert "  live 8, dying 3000 (375 times the live ones)" in out
    assert "  held below: /kubepods.slice/pod-aaa.slice (1990), /system.slice/ecs-agent.service (990)" in out


def test_a_stop_signal_ends_the_daemon_with_status_0_and_a_last_metrics_file(tmp_path):
    mfile = tmp_path / "node.prom"
    p = _node(["--metrics-file", str(mfile), "--metrics-interval", "600", "--proc", str(_recorded(tmp_path, 9)),
               "--sys", str(DATA / "sys-v2")])
    try:
        wait_for(lambda: mfile.exists(), 20, what="the first metrics file")
        first = mfile.stat().st_mtime_ns
        p.send_signal(signal.SIGTERM)
        status, out, err = _finish(p)
    finally:
        p.kill()
    assert (status, out, err) == (0, "", "")
    f = Scrape(mfile.read_text())
    assert mfile.stat().st_mtime_ns >= first
    assert f.value("reaper_build_info", mode="node", version=reaper_version()) == 1
    assert f.value("reaper_node_cgroup_dying_children", cgroup="/kubepods.slice/pod-aaa.slice") == 1990
    assert f.value("reaper_node_zombies") == 1
    for source in ("proc_stat", "processes", "cgroups", "pressure", "softnet", "interrupts"):
        assert f.value("reaper_node_source_available", source=source) == 1, source


# --- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, needles", [
    (["--threshold", "0"], ["--threshold", "percentage > 0"]),
    (["--threshold", "101%"], ["--threshold", "at most 100"]),
    (["--threshold", "high"], ["--threshold", "expected a percentage"]),
    (["--window", "0"], ["--window", "> 0"]),
    (["--diagnose", "86400000"], ["--diagnose", "at most 604800"]),
    (["--proc", "/nonexistent-proc"], ["--proc", "not a directory"]),
    (["--sys", "/etc/hostname"], ["--sys", "not a directory"]),
    (["--budget-action", "nice"], ["unknown option --budget-action"]),
    (["extra"], ["unexpected argument 'extra'"]),
    (["--metrics-port", "0"], ["port must be 1-65535"]),
])
def test_bad_input_is_one_line_and_exit_2(args, needles):
    refused_sub("node", args, *needles)


def test_a_proc_without_cores_is_bad_input(tmp_path):
    refused_sub("node", ["--diagnose", "1", "--proc", str(tmp_path)], "--proc: cannot read")
    (tmp_path / "stat").write_text("intr 0\n")
    refused_sub("node", ["--diagnose", "1", "--proc", str(tmp_path)], "lists no cores")


def test_a_bad_variable_is_bad_input():
    refused_sub("node", [], "REAPER_NODE_THRESHOLD", env={"REAPER_NODE_THRESHOLD": "0"})


# --- the metric reference ---------------------------------------------------------------------------

def test_the_documented_node_metrics_are_the_exported_ones(tmp_path):
    """docs/metrics.md's section for reaper node names every family it exports, and only
    those (the growth needs two counts, --window apart: documented, not awaited here)."""
    port = free_port()
    proc = _recorded(tmp_path, 9)
    p = _node(["--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--sys", str(DATA / "sys-v2"),
               "--proc", str(proc)])
    try:
        wait_healthy(port)
        s = wait_scrape(port, lambda s: s.samples("reaper_node_zombies"), "a first sample")
    finally:
        p.send_signal(signal.SIGTERM)
        _finish(p)
    exported = {name + ("_total" if f.type == "counter" else "") for name, f in s.families.items()
                if name.startswith("reaper_")}
    section = (DOCS / "metrics.md").read_text().split("## reaper node", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(reaper_[a-z0-9_]+)`", section, re.M))
    assert exported - documented == set(), "exported but not documented"
    assert documented - exported == {"reaper_node_memory_cgroups_dying_growth_per_second"}, \
        "documented but not exported"


# --- the cost: bench/bench_node.py runs, and the scan stays within its bounds -----------------------

def test_the_cost_benchmark_runs_and_the_scan_runs_only_while_a_core_is_saturated(tmp_path):
    """No timing assertion (docs/benchmarks-node.md has the figures): the per-process scan
    reads nothing while no core is saturated, and while one is it reads every process of a
    1,000-process node within a few samples and names the culprit."""
    import json

    out = tmp_path / "bench.json"
    bench = Path(__file__).resolve().parent.parent / "bench" / "bench_node.py"
    r = subprocess.run([sys.executable, str(bench), "--quick", "--json", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["idle"]["scans"] == 0 and res["idle"]["reads_per_scan"] == 0
    assert res["attributing"]["scans"] == res["samples"] and res["attributing"]["culprit_named"]
    assert res["attributing"]["passes"] >= 1
    for row in ("no core saturated", "one core saturated (attributing)", "one scrape", "real /proc"):
        assert row in r.stdout, r.stdout

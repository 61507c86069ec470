"""reaper node's readers on recorded files (tests/data/node/): /proc/stat, /proc/cgroups
and the live directories (v1), cgroup.stat of several kernels (v2), the holders of dying
cgroups, PSI, softnet_stat, /proc/interrupts, zombies by cgroup, a process name that
lies; and the streaks and the per-process scan on a /proc the test writes."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from reaper.node import cgroups, culprits, interrupts, pressure, softnet, streaks, zombies
from reaper.nodestats import CpuSampler, read_cpu_times
from reaper.procfs.cgroups import parse_cgroup_stat

DATA = Path(__file__).resolve().parent / "data" / "node"


# --- /proc/stat -----------------------------------------------------------------------------

def test_proc_stat_per_core_and_its_intervals(tmp_path):
    cpus = read_cpu_times(str(DATA / "proc"))
    assert sorted(cpus) == [0, 1] and all(len(v) == 8 for v in cpus.values())
    proc = tmp_path / "proc"
    shutil.copytree(DATA / "proc", proc)
    _write_stat(proc, {0: (10, 0, 10, 80, 0, 0, 0, 0), 1: (0, 0, 0, 100, 0, 0, 0, 0)})
    s = CpuSampler(str(proc))
    _write_stat(proc, {0: (20, 0, 100, 80, 0, 0, 0, 0), 1: (0, 0, 0, 200, 0, 0, 0, 0)})
    s.sample()
    assert s.ratios[0]["busy"] == 1.0 and abs(s.ratios[0]["system"] - 0.9) < 1e-9
    assert s.ratios[1]["busy"] == 0.0
    tick = os.sysconf("SC_CLK_TCK")
    assert s.seconds == {0: 100 / tick, 1: 100 / tick}


def _write_stat(proc: Path, jiffies: dict) -> None:
    total = [sum(v[i] for v in jiffies.values()) for i in range(8)]
    lines = ["cpu  " + " ".join(map(str, total)) + " 0 0"]
    lines += [f"cpu{n} " + " ".join(map(str, v)) + " 0 0" for n, v in sorted(jiffies.items())]
    (proc / "stat").write_text("\n".join(lines) + "\nintr 0\nctxt 0\n")


# --- streaks ------------------------------------------------------------------------------

def _r(busy: float, mode: str = "system") -> dict:
    r = dict.fromkeys(("user", "system", "irq", "softirq", "steal"), 0.0)
    r[mode] = busy
    r["busy"] = busy
    return r


def test_streaks_grow_end_and_fill_the_histogram_by_dominant_mode():
    st = streaks.Streaks(threshold=0.95, window=60)
    t = 0.0
    for i in range(7):                      # cpu1: 7 s in the kernel; cpu0 idle
        t += 1
        assert st.update(t, {0: _r(0.1, "user"), 1: _r(1.0)}, {0: 1.0, 1: 1.0}) == []
        assert st.current(1) == i + 1 and st.current(0) == 0
    t += 1
    ended = st.update(t, {0: _r(0.1), 1: _r(0.5)}, {0: 1.0, 1: 1.0})
    assert [(s.cpu, s.seconds, s.mode, s.in_kernel) for s in ended] == [(1, 7.0, "system", True)]
    assert st.current(1) == 0 and st.longest(1) == 7.0
    rows, total = st.histogram()["system"]
    assert dict(rows)[5.0] == 0 and dict(rows)[10.0] == 1 and dict(rows)[float("inf")] == 1 and total == 7.0
    assert dict(st.histogram()["user"][0])[float("inf")] == 0
    # A user-mode streak of 2 s: counted under user, at or below the 5 s bucket.
    for _ in range(2):
        t += 1
        st.update(t, {1: _r(0.97, "user")}, {1: 1.0})
    t += 1
    (s,) = st.update(t, {1: _r(0.0)}, {1: 1.0})
    assert (s.mode, s.seconds, s.in_kernel) == ("user", 2.0, False)
    assert dict(st.histogram()["user"][0])[5.0] == 1
    # The window forgets the 7 s streak: the longest is then the 2 s one.
    t += 60
    st.update(t, {1: _r(0.0)}, {1: 1.0})
    assert st.longest(1) == 2.0
    t += 10
    st.update(t, {1: _r(0.0)}, {1: 1.0})
    assert st.longest(1) == 0.0


def test_a_threshold_below_busy_counts_and_the_dominant_mode_is_the_largest():
    st = streaks.Streaks(threshold=0.5)
    r = {"user": 0.2, "system": 0.1, "irq": 0.0, "softirq": 0.3, "steal": 0.0, "busy": 0.6}
    st.update(1, {3: r}, {3: 1.0})
    (s,) = st.now_ongoing(1)
    assert s.mode == "softirq" and s.in_kernel and abs(s.share - 0.5) < 1e-9


# --- cgroups ------------------------------------------------------------------------------

def test_v1_dying_is_proc_cgroups_minus_the_live_directories():
    h = cgroups.hierarchies(str(DATA / "sys-v1"))
    assert h.v1_memory.endswith("fs/cgroup/memory") and h.v2 is None
    m = cgroups.memory_cgroups(str(DATA / "proc"), str(DATA / "sys-v1"))
    assert (m.version, m.live, m.dying) == (1, 4, 4996)


def test_v2_counts_from_the_root_cgroup_stat():
    m = cgroups.memory_cgroups(str(DATA / "proc"), str(DATA / "sys-v2"))
    assert (m.version, m.live, m.dying) == (2, 8, 3000)
    assert "nr_dying_subsys_memory" in m.source


def test_cgroup_stat_of_three_kernels():
    new = parse_cgroup_stat((DATA / "cgroup.stat.v2-6.12").read_text())
    assert (new.live, new.dying, new.subsys["memory"], new.dying_subsys["memory"]) == (241, 68440, 242, 68439)
    old = parse_cgroup_stat((DATA / "cgroup.stat.v2-5.15").read_text())
    assert (old.live, old.dying, old.subsys, old.dying_subsys) == (120, 3100, {}, {})
    hybrid = parse_cgroup_stat((DATA / "cgroup.stat.hybrid-unified").read_text())
    assert hybrid is not None and "memory" not in hybrid.dying_subsys


def test_v2_without_nr_dying_subsys_memory_falls_back_to_dying_descendants(tmp_path):
    top = tmp_path / "fs" / "cgroup"
    top.mkdir(parents=True)
    (top / "cgroup.controllers").write_text("cpu memory\n")
    (top / "cgroup.stat").write_text((DATA / "cgroup.stat.v2-5.15").read_text())
    m = cgroups.memory_cgroups(str(DATA / "proc"), str(tmp_path))
    assert (m.live, m.dying) == (121, 3100) and "nr_dying_descendants" in m.source


def test_holders_are_the_live_cgroups_right_above_the_dying_ones():
    top = str(DATA / "sys-v2" / "fs" / "cgroup")
    assert cgroups.holders(top) == [("/kubepods.slice/pod-aaa.slice", 1990), ("/system.slice/ecs-agent.service", 990),
                                    ("/kubepods.slice/pod-bbb.slice", 10), ("/system.slice", 10)]
    # Every dying cgroup, memory or not (no nr_dying_subsys_memory): pod-bbb holds 40.
    assert ("/kubepods.slice/pod-bbb.slice", 40) in cgroups.holders(top, memory=False)
    # Bounded: with three reads it names what it reached and stops.
    assert len(cgroups.holders(top, max_reads=3)) <= 1


def test_no_hierarchy_is_unknown_not_zero(tmp_path):
    assert cgroups.memory_cgroups(str(DATA / "proc"), str(tmp_path)) is None
    assert cgroups.count_dirs(str(tmp_path / "nope")) is None


def test_growth_over_the_window():
    g = cgroups.Growth(window=100)
    assert g.per_second() is None
    g.add(0, 10)
    g.add(50, 110)
    assert g.per_second() == 2.0
    g.add(200, 110)            # the first two are out of the window
    assert g.per_second() is None


# --- pressure, softnet, interrupts ------------------------------------------------------------

def test_pressure_files_and_irq_full_only():
    psi = pressure.read_pressure(str(DATA / "proc"))
    assert set(psi) == {"cpu", "memory", "io", "irq"}
    assert set(psi["cpu"]) == {"some", "full"} and set(psi["irq"]) == {"full"}
    assert psi["irq"]["full"] == pressure.Pressure(1.5, 0.2, 0.05, 2.5)
    assert pressure.parse_pressure("some avg10=x total=1\ngarbage\n") == {}


def test_pressure_absent_is_unknown(tmp_path):
    assert pressure.read_pressure(str(tmp_path)) is None


def test_softnet_of_three_kernel_formats():
    here = softnet.read_softnet(str(DATA / "proc"))           # 6.x: 15 columns, the 13th the core
    assert sorted(here) == [0, 1]
    old = softnet.parse_softnet((DATA / "softnet_stat.5.4").read_text())      # no core column: the row
    assert old == {0: softnet.Softnet(0x1e240, 3, 12), 1: softnet.Softnet(16, 0, 1)}
    offline = softnet.parse_softnet((DATA / "softnet_stat.5.10-offline-cpu1").read_text())
    assert sorted(offline) == [0, 2] and offline[2].squeezed == 7


def test_interrupts_sum_every_line_per_core_column():
    irq = interrupts.parse_interrupts((DATA / "interrupts.4cpu-offline").read_text())
    assert irq == {0: 36 + 100000 + 1 + 1000000, 1: 7 + 2 + 2000000, 3: 55555 + 3 + 3000000}
    here = interrupts.read_interrupts(str(DATA / "proc"))
    assert sorted(here) == [0, 1] and all(v >= 0 for v in here.values())


# --- processes: a lying name, zombies by cgroup, the bounded scan --------------------------------

def test_zombies_are_grouped_by_the_parents_cgroup_when_their_own_reads_root():
    z = zombies.count_zombies(str(DATA / "proc"))
    pod = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c.slice/cri-containerd-ab12.scope"
    assert (z.total, z.by_cgroup, z.partial) == (1, [(pod, 1)], False)


def test_pick_cgroup_prefers_memory_then_unified():
    v1 = "12:pids:/a\n4:memory:/kubepods/pod1/c1\n0::/system.slice/x\n"
    assert culprits.pick_cgroup(v1) == "/kubepods/pod1/c1"
    assert culprits.pick_cgroup("0::/kubepods.slice/p.slice\n") == "/kubepods.slice/p.slice"
    assert culprits.pick_cgroup("1:name=systemd:/user.slice\n") == "/user.slice"
    assert culprits.pick_cgroup("") == ""
    assert culprits.pick_cgroup("0::/evil\x1bname\n") == "/evil\\x1bname"


def _proc_with(tmp_path: Path, n: int) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    for pid in range(1, n + 1):
        d = proc / str(pid)
        d.mkdir()
        _write_pid(d, pid, 0)
        (d / "cgroup").write_text(f"0::/slice/p{pid}\n")
    return proc


def _write_pid(d: Path, pid: int, stime: float, comm: str = "", start: int = 777, state: str = "S") -> None:
    """proc/PID/stat: state, stime (field 15), starttime (22) and processor 3 (39)."""
    comm = comm or f"p{pid}"
    fields = [state, "1"] + ["0"] * 10 + [str(int(stime))] + ["0"] * 6 + [str(start)] + ["0"] * 16 + ["3"] + ["0"] * 5
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_scan_names_the_process_with_most_system_time_and_trusts_no_name(tmp_path):
    proc = _proc_with(tmp_path, 20)
    clock = _Clock()
    k = culprits.KernelTime(str(proc), budget=10.0, clock=clock)
    assert k.scan() == []                                 # the baseline
    clock.t += 1.0
    tick = os.sysconf("SC_CLK_TCK")
    _write_pid(proc / "7", 7, tick * 0.9, comm="evil) R 1 (x")      # 0.9 s of system time in 1 s
    _write_pid(proc / "3", 3, tick * 0.1)
    top = k.scan()
    assert [c.pid for c in top] == [7, 3]
    assert top[0].comm == "evil) R 1 (x" and top[0].cpu == 3 and top[0].cgroup == "/slice/p7"
    assert abs(top[0].ratio - 0.9) < 0.02
    assert k.hot == [7, 3]


def test_the_scan_is_bounded_and_goes_on_where_it_stopped(tmp_path):
    proc = _proc_with(tmp_path, 200)
    clock = _Clock()
    k = culprits.KernelTime(str(proc), budget=0.0, clock=clock)    # no time at all: one clock step of reads
    k.scan()
    assert 0 < k.reads <= culprits.CLOCK_EVERY
    scans = 1
    while k.queue:
        k.scan()
        scans += 1
    assert k.reads == 200 and k.passes == 1 and scans >= 200 // culprits.CLOCK_EVERY


def test_a_pid_reused_is_not_a_culprit(tmp_path):
    proc = _proc_with(tmp_path, 3)
    clock = _Clock()
    k = culprits.KernelTime(str(proc), budget=10.0, clock=clock)
    k.scan()
    clock.t += 1
    _write_pid(proc / "2", 2, 50, start=999)            # another process under the same pid
    assert k.scan() == []
    clock.t += 1
    _write_pid(proc / "2", 2, 100, start=999)           # its own second reading: named
    assert [c.pid for c in k.scan()] == [2]


def test_a_process_running_at_its_first_reading_is_read_again_first(tmp_path):
    proc = _proc_with(tmp_path, 50)
    _write_pid(proc / "40", 40, 0, state="R")
    k = culprits.KernelTime(str(proc), budget=10.0, clock=_Clock())
    k.scan()
    assert k.hot == [40]


def test_a_multithreaded_culprit_is_placed_on_the_core_its_busiest_thread_burns(tmp_path):
    """proc/PID/stat's processor is the main thread's: a daemon that burns its time in
    another thread is placed on that thread's core."""
    proc = _proc_with(tmp_path, 3)
    tasks = proc / "2" / "task"
    for tid, cpu in ((2, 3), (9, 5)):
        (tasks / str(tid)).mkdir(parents=True)
        _write_thread(tasks / str(tid), tid, 0, cpu)
    clock = _Clock()
    k = culprits.KernelTime(str(proc), budget=10.0, clock=clock)
    k.scan()
    clock.t += 1
    tick = os.sysconf("SC_CLK_TCK")
    _write_pid(proc / "2", 2, tick)                  # the process: one second more, main thread on cpu 3
    _write_thread(tasks / "9", 9, tick, 5)           # ... all of it in thread 9, on cpu 5
    (top,) = k.scan()
    assert (top.pid, top.cpu) == (2, 3)              # no thread readings yet: the main thread's core
    clock.t += 1
    _write_pid(proc / "2", 2, 2 * tick)
    _write_thread(tasks / "9", 9, 2 * tick, 5)
    (top,) = k.scan()
    assert (top.pid, top.cpu) == (2, 5)


def _write_thread(d: Path, tid: int, stime: int, cpu: int) -> None:
    fields = ["R", "1"] + ["0"] * 10 + [str(int(stime))] + ["0"] * 6 + ["777"] + ["0"] * 16 + [str(cpu)] + ["0"] * 5
    (d / "stat").write_text(f"{tid} (worker) " + " ".join(fields) + "\n")

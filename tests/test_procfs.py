"""reaper/procfs/ in process, on recorded files (tests/data/procfs, tests/data/node/proc):
the one reader and parser of /proc/PID/cgroup, this process's cgroups and their
directories, cgroup.stat and /proc/PID/stat."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from reaper.procfs import cgroups, processes

DATA = Path(__file__).resolve().parent / "data"


def _host(tmp_path, name: str, enabled: str = "") -> str:
    """A recorded /proc (self/mountinfo, self/cgroup) whose mount points lie under tmp_path;
    the v2 mount's cgroup.controllers lists `enabled`. Returns the proc directory."""
    proc = tmp_path / "proc"
    shutil.copytree(DATA / "procfs" / name, proc)
    info = proc / "self" / "mountinfo"
    info.write_text(info.read_text().replace("ROOT/", f"{tmp_path}/"))
    for m in cgroups.mounts(str(proc)):
        Path(m.point).mkdir(parents=True, exist_ok=True)
        if m.version == 2:
            (Path(m.point) / "cgroup.controllers").write_text(enabled + "\n")
    return str(proc)


# --- /proc/PID/cgroup: one reader, one parser --------------------------------------------

HYBRID = b"5:cpuset:/x\n4:cpu,cpuacct:/a/b\n1:name=systemd:/s\n0::/u\n"


def test_the_parser_keeps_every_hierarchy_in_order():
    lines = cgroups.parse_pid_cgroup(HYBRID)
    assert lines == [("5", ("cpuset",), "/x"), ("4", ("cpu", "cpuacct"), "/a/b"),
                     ("1", ("name=systemd",), "/s"), ("0", (), "/u")]
    assert cgroups.parse_pid_cgroup(HYBRID.decode()) == lines          # text or bytes alike
    assert cgroups.parse_pid_cgroup(b"no colons\n\n") == []


@pytest.mark.parametrize("data,version,controller,path", [
    (HYBRID, 1, "cpu", "/a/b"),
    (HYBRID, 1, "cpuacct", "/a/b"),
    (HYBRID, 2, "", "/u"),
    (HYBRID, 1, "memory", None),                                   # no such hierarchy
    (b"6:memory:/x\n4:cpu:/leaf\n4:cpu:/parent\n", 1, "cpu", None),  # a name on two lines: unknown
    (b"0::/x\n0::/leaf\n", 2, "", None),
    (b"4:cpu:relative\n", 1, "cpu", None),
    (b"0::/with:colon and \xff byte\n", 2, "", "/with:colon and \udcff byte"),   # lossless
])
def test_path_in_names_one_hierarchys_cgroup_or_nothing(data, version, controller, path):
    assert cgroups.path_in(cgroups.parse_pid_cgroup(data), version, controller) == path


def test_the_reader_is_bounded_and_says_none_for_the_gone_and_the_too_long(tmp_path):
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_bytes(HYBRID)
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "cgroup").write_bytes(b"0::/" + b"x" * 100 + b"\n")
    assert cgroups.read_pid_cgroup(7, proc=str(tmp_path)) == HYBRID
    assert cgroups.read_pid_cgroup(8, 50, str(tmp_path)) is None          # cut short: not trusted
    assert cgroups.read_pid_cgroup(9, proc=str(tmp_path)) is None         # gone
    assert processes.read_cgroup(9, str(tmp_path)) == ""
    own = cgroups.read_pid_cgroup(os.getpid())
    assert own is not None and own == cgroups.read_pid_cgroup("self")


def test_read_cgroup_reads_a_recorded_process_as_text():
    proc = str(DATA / "node" / "proc")
    text = processes.read_cgroup(4300, proc)
    assert text == "0::/system.slice/sshd.service\n"
    assert cgroups.path_in(cgroups.parse_pid_cgroup(text), 2, "") == "/system.slice/sshd.service"


# --- this process's cgroups and their directories -----------------------------------------

def test_own_paths_and_dirs_on_a_hybrid_host(tmp_path):
    proc = _host(tmp_path, "hybrid", enabled="")
    own = cgroups.own_paths(proc)
    assert own == {"name=systemd": "/", "pids": "/", "memory": "/process_api/058df2bc", "cpu": "/", "": "/"}
    base = f"{tmp_path}/sys/fs/cgroup"
    assert [m.version for m in cgroups.mounts(proc)] == [1, 1, 1, 1, 2]
    assert cgroups.own_dir("cpu", proc) == (1, f"{base}/cpu")
    assert cgroups.own_dir("memory", proc) == (1, f"{base}/memory/058df2bc")   # the mount shows /process_api
    assert cgroups.own_dir("", proc) == (2, f"{base}/unified")
    assert cgroups.own_dir("io", proc) is None
    assert cgroups.own_dir("pids", proc, or_v2=True) == (1, f"{base}/pids")     # v1 first
    assert cgroups.own_dir("io", proc, or_v2=True) is None                      # not enabled in v2


def test_own_dir_falls_back_to_v2_where_the_controller_is_enabled(tmp_path):
    proc = _host(tmp_path, "v2", enabled="cpu memory pids")
    assert cgroups.own_paths(proc) == {"": "/kubepods.slice/pod1/c1"}
    d = f"{tmp_path}/sys/fs/cgroup/pod1/c1"
    assert cgroups.own_dir("pids", proc) is None                    # no v1 pids hierarchy
    assert cgroups.own_dir("pids", proc, or_v2=True) == (2, d)
    assert cgroups.own_dir("io", proc, or_v2=True) is None
    assert cgroups.own_dir("", proc) == (2, d)


def test_nothing_to_read_is_empty_not_an_exception(tmp_path):
    assert cgroups.mounts(str(tmp_path)) == []
    assert cgroups.own_paths(str(tmp_path)) == {}
    assert cgroups.own_dir("", str(tmp_path)) is None
    assert cgroups.read_cgroup_stat(str(tmp_path)) is None


def test_a_mount_shows_only_what_lies_below_its_root():
    m = cgroups.Mount("/a", "/sys/fs/cgroup/cpu", 1, frozenset({"cpu"}))
    assert cgroups.cgroup_dir(m, "/a/b") == "/sys/fs/cgroup/cpu/b"
    assert cgroups.cgroup_dir(m, "/other") is None


def test_cgroup_stat_needs_both_counts_and_keeps_the_per_controller_ones():
    text = "nr_descendants 3\nnr_dying_descendants 40\nnr_subsys_memory 2\nnr_dying_subsys_memory 39\nbad x\n"
    st = cgroups.parse_cgroup_stat(text, "/d")
    assert st == ("/d", 3, 40, {"memory": 2}, {"memory": 39})
    assert cgroups.parse_cgroup_stat("nr_descendants 3\n") is None


# --- /proc/PID/stat -------------------------------------------------------------------------

def test_stat_fields_of_a_recorded_process():
    comm, rest = processes.stat_fields(4000, str(DATA / "node" / "proc"))
    assert comm == "kubelet" and rest[0] == b"S" and int(rest[1]) == 1
    assert processes.stat_fields(1, str(DATA / "node" / "proc")) is None


def test_a_name_may_hold_parentheses_and_spaces(tmp_path):
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "stat").write_bytes(b"5 (a) b (c) S 1 5 5 0 -1 0\n")
    comm, rest = processes.stat_fields(5, str(tmp_path))
    assert comm == "a) b (c" and rest[:2] == [b"S", b"1"]


def test_the_tree_below_a_process():
    table = {p.pid: p for p in (processes.Proc(1, 0, "S", "i", 1), processes.Proc(2, 1, "S", "a", 1),
                                  processes.Proc(3, 2, "S", "b", 1), processes.Proc(4, 1, "S", "c", 1))}
    assert processes.descendants(table, 2) == {3}
    assert processes.descendants(table, 1) == {2, 3, 4}
    assert processes.below(processes.children_index(table.values()), [4]) == set()


def test_signal_masks_show_what_this_process_blocks():
    import signal

    bit = 1 << (signal.SIGUSR2 - 1)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        pending, blocked, ignored = processes.signal_masks(os.getpid())
        assert blocked & bit and not pending & bit
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    assert not processes.signal_masks(os.getpid())[1] & bit
    assert processes.signal_masks(2 ** 22 + 1) is None          # above pid_max: never a process
    assert processes.visible()


# --- node-wide figures --------------------------------------------------------------------

def test_system_figures_from_a_recorded_proc(tmp_path):
    from reaper.procfs import system

    proc = DATA / "node" / "proc"
    assert system.read_cpu_times(str(proc))                       # per-core lines, cpu0...
    assert set(system.proc_cgroups(str(proc))) >= {"memory"}
    (tmp_path / "uptime").write_text("12.5 40.0\n")
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "statm").write_text("100 25 5 1 0 50 0\n")
    assert system.uptime(str(tmp_path)) == 12.5
    assert system.own_rss(str(tmp_path)) == 25 * os.sysconf("SC_PAGE_SIZE")
    assert system.own_rss(str(tmp_path / "none")) is None
    assert system.proc_cgroups(str(tmp_path)) is None
    with pytest.raises(OSError):
        system.uptime(str(tmp_path / "none"))

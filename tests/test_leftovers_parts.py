"""The leftovers piece's parts in-process, on hostile input: the device globs, the fd
links of a real process, Ray's job id from an environment and a worker's log (a FIFO on
fd 1 never blocks, a huge or lying log is read bounded)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from reaper.leftovers import devices, jobs
from reaper.leftovers.devices import Devices, match, parse_globs


@pytest.mark.parametrize("glob, path, hit", [
    ("/dev/nvidia[0-9]*", "/dev/nvidia0", True), ("/dev/nvidia[0-9]*", "/dev/nvidia12", True),
    ("/dev/nvidia[0-9]*", "/dev/nvidiactl", False), ("/dev/nvidia[0-9]*", "/dev/nvidia-uvm", False),
    ("/dev/dri/renderD*", "/dev/dri/renderD128", True), ("/dev/dri/renderD*", "/dev/dri/card0", False),
    ("/dev/accel/*", "/dev/accel/accel0", True), ("/dev/kfd", "/dev/kfd", True), ("/dev/kfd", "/dev/kfd0", False),
    ("/dev/neuron?", "/dev/neuron3", True), ("/dev/x[!0-9]", "/dev/xa", True), ("/dev/x[!0-9]", "/dev/x1", False),
    ("/dev/x[]]", "/dev/x]", True),
])
def test_globs_match_as_fnmatch_does(glob, path, hit):
    import fnmatch

    assert match(glob, path) is hit is fnmatch.fnmatchcase(path, glob)


def test_the_default_list_leaves_dev_null_and_the_shared_nvidia_nodes_out():
    d = Devices(devices.DEFAULT_GLOBS)
    assert not any(d.matches(p) for p in ("/dev/null", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/dri/card0"))
    assert all(d.matches(p) for p in ("/dev/nvidia7", "/dev/kfd", "/dev/neuron0", "/dev/accel/accel1"))


@pytest.mark.parametrize("text", ["", " , ", "dev/nvidia*", "/dev/x[", "/dev/x]", "/dev/\x1b", ",".join(["/a"] * 65)])
def test_bad_globs_are_refused(text):
    with pytest.raises(ValueError):
        parse_globs(text)


def test_a_holder_is_found_by_its_fd_links_and_a_dev_null_holder_is_not(tmp_path):
    from leftovers_helpers import make_device

    dev = make_device(tmp_path)
    code = f"import os,time; a=os.open({str(dev)!r}, os.O_RDWR); b=os.open('/dev/null', os.O_RDONLY); print(1, flush=True); time.sleep(30)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        p.stdout.readline()
        assert Devices([str(tmp_path / "nvidia*")]).held_by(p.pid) == [str(dev)]
        assert Devices(devices.DEFAULT_GLOBS).held_by(p.pid) == []
    finally:
        p.kill()
        p.wait()


def test_a_process_with_more_fds_than_the_bound_costs_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(devices, "MAX_FDS", 3)
    assert Devices(["/dev/null"]).held_by(os.getpid()) in ([], ["/dev/null"])   # read, bounded, no error


@pytest.mark.parametrize("env, want", [
    ({"RAY_JOB_ID": "02000000"}, (True, "02000000")), ({"RAY_JOB_ID": "ffffffff"}, (True, None)),
    ({"RAY_JOB_ID": "0200\n0000"}, (True, None)), ({"RAY_JOB_ID": "x" * 5000}, (True, None)),
    ({}, (False, None)),
])
def test_the_job_from_the_environment_never_the_null_id(env, want):
    p = subprocess.Popen(["sleep", "30"], env={"PATH": os.environ["PATH"], **env})
    try:
        time.sleep(0.05)
        assert jobs.from_environ(p.pid) == want
    finally:
        p.kill()
        p.wait()


def test_the_job_from_a_workers_log_is_its_last_marker():
    assert jobs.last_marker(b":job_id:01000000\n:task_name:f\nhello\n:job_id:02000000\n") == "02000000"
    assert jobs.last_marker(b":job_id:02000000\n:job_id:ffffffff\n") == "02000000"
    assert jobs.last_marker(b"print(':job_id:03000000')\nx:job_id:04000000\n") is None
    assert jobs.last_marker(b":job_id:zz\n" + os.urandom(100)) is None


def test_a_fifo_on_fd_1_never_blocks_and_a_big_log_is_read_from_its_end(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    w = os.open(fifo, os.O_RDWR)
    p = subprocess.Popen(["sleep", "30"], stdout=w)
    try:
        t0 = time.monotonic()
        assert jobs.Jobs().from_log(p.pid) is None
        assert time.monotonic() - t0 < 1
    finally:
        p.kill()
        p.wait()
        os.close(w)
    log = tmp_path / "worker.out"
    with open(log, "wb") as f:
        f.write(b":job_id:01000000\n" + b"x" * (1 << 20) + b"\n:job_id:05000000\n")
    with open(log, "ab") as f:
        p = subprocess.Popen(["sleep", "30"], stdout=f)
    try:
        assert jobs.Jobs().from_log(p.pid) == "05000000"
    finally:
        p.kill()
        p.wait()


def test_a_holder_that_does_not_let_go_is_named(tmp_path):
    """End.release() after an end: a leftover still holding its device is named (here one
    that is still alive; in life, one stuck in the driver in state D)."""
    from leftovers_helpers import make_device
    from reaper.leftovers.ender import End, start_of
    from reaper.leftovers.owners import SERVICE, Owner
    from reaper.leftovers.tracker import Ended

    dev = make_device(tmp_path, "nvidia3\nFAKE")
    code = f"import os,time; a=os.open({str(dev)!r}, os.O_RDWR); print(1, flush=True); time.sleep(30)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        p.stdout.readline()
        key = (p.pid, start_of(p.pid))
        end = End(Ended(Owner((1, 1), SERVICE, "svc"), [key]), "end", 5.0,
                  Devices([str(tmp_path / "nvidia*")]), None, 0.0)
        said = end.release()
        assert said.startswith(f"devices NOT released: {p.pid} holds ") and "\n" not in said, said
        assert end.still_holding() == {str(dev): 1}
    finally:
        p.kill()
        p.wait()
    assert end.release() == "devices released"


def test_a_process_in_a_cgroup_ray_manages_is_never_moved(tmp_path):
    """Ray's resource isolation (cgroup v2) places its processes itself: a leftover in a
    ray-node_* cgroup is left where it is (ended by sweeps instead)."""
    from reaper.leftovers import mechanisms
    from reaper.procctl import Handle
    from reaper.procfs.cgroups import own_dir

    found = own_dir("")
    if found is None or found[0] != 2 or not os.access(found[1], os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy here")
    ray_dir = os.path.join(found[1], f"ray-node_{os.getpid()}_{tmp_path.name}"[:200])
    os.mkdir(ray_dir)
    p = subprocess.Popen(["sleep", "30"])
    ours = None
    try:
        with open(os.path.join(ray_dir, "cgroup.procs"), "w") as f:
            f.write(str(p.pid))
        assert mechanisms.ray_managed(p.pid)
        c = mechanisms.Cgroups(2, found[1])
        ours = c.make()
        h = Handle(p.pid, mechanisms_start(p.pid))
        assert c.move(ours, h) is False
        assert mechanisms.members(ours) == [] and mechanisms.members(ray_dir) == [p.pid]
    finally:
        p.kill()
        p.wait()
        for d in (ours, ray_dir):
            if d:
                wait_rmdir(d)


def mechanisms_start(pid: int) -> int:
    from reaper.leftovers.ender import start_of

    return start_of(pid)


def wait_rmdir(d: str) -> None:
    for _ in range(200):
        try:
            os.rmdir(d)
            return
        except OSError:
            time.sleep(0.01)


class _FakeNvml:
    """pynvml as far as gpumem.py uses it: one GPU whose minor number is that of the
    test's device node (/dev/null's), 8 GiB in use, then 1 GiB once freed."""

    def __init__(self, minor: int, pid: int) -> None:
        self.minor, self.pid, self.used = minor, pid, 8 << 30

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return "gpu0"

    def nvmlDeviceGetMinorNumber(self, h):
        return self.minor

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("Mem", (), {"used": self.used})()

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [type("P", (), {"pid": self.pid, "usedGpuMemory": 7 << 30})(),
                type("P", (), {"pid": 99999999, "usedGpuMemory": None})()]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []


def test_gpu_memory_before_after_and_the_holders_own_through_nvml(tmp_path, monkeypatch):
    from leftovers_helpers import make_device
    from reaper.leftovers import publish
    from reaper.leftovers.ender import End, start_of
    from reaper.leftovers.gpumem import Gpus
    from reaper.leftovers.owners import SERVICE, Owner
    from reaper.leftovers.tracker import Ended

    dev = make_device(tmp_path)
    code = f"import os,time; a=os.open({str(dev)!r}, os.O_RDWR); print(1, flush=True); time.sleep(30)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        p.stdout.readline()
        fake = _FakeNvml(os.minor(os.stat(dev).st_rdev), p.pid)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        gpus = Gpus()
        end = End(Ended(Owner((1, 1), SERVICE, "svc"), [(p.pid, start_of(p.pid))]), "report", 5.0,
                  Devices([str(tmp_path / "nvidia*")]), None, 0.0, gpus)
        fake.used = 1 << 30
        end.gpu_after()
        end.begin()
        line = publish.line(end)
        assert f"GPU memory on {dev}: 8.0 GiB in use at the owner's end, 1.0 GiB after, " \
               "the leftovers' own 7.0 GiB" in line, line
    finally:
        p.kill()
        p.wait()


def test_gpu_memory_without_nvml_is_unavailable_with_its_reason(monkeypatch):
    from reaper.leftovers.gpumem import Gpus, Unavailable

    monkeypatch.setitem(sys.modules, "pynvml", None)      # import pynvml raises ImportError
    with pytest.raises(Unavailable, match=r"reaper-init\[nvml\]"):
        Gpus()


@pytest.mark.gpu
def test_a_real_gpu_maps_to_its_device_node():
    if not os.path.exists("/dev/nvidiactl"):
        pytest.skip("needs an NVIDIA GPU (/dev/nvidiactl is absent)")
    pytest.importorskip("pynvml", reason="needs nvidia-ml-py (pip install 'reaper-init[nvml]')")
    from reaper.leftovers.gpumem import Gpus

    gpus = Gpus()
    nodes = [f"/dev/{n}" for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit()]
    assert nodes and all(gpus.handle(n) is not None and gpus.used(n) is not None for n in nodes)


HARNESS = r"""
import ctypes, json, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)            # PR_SET_CHILD_SUBREAPER: orphans come here
from reaper.leftovers.jobs import Jobs
from reaper.leftovers.tracker import Tracker

class NotRay:
    def kind(self, pid, start):
        return None

def orphan(job):
    # A double fork: the subshell exits, sleep is adopted by this process at once.
    sh = subprocess.Popen(["sh", "-c", f"(RAY_JOB_ID={job} exec sleep 30 &)"], stdout=subprocess.DEVNULL)
    sh.wait()
    while True:
        kids = open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()
        mine = [int(k) for k in kids if open(f"/proc/{k}/comm").read().strip() == "sleep" and int(k) not in seen]
        if mine:
            seen.extend(mine)
            return mine[0]
        time.sleep(0.01)

seen = []
t = Tracker(os.getpid(), NotRay(), Jobs())
svc = subprocess.Popen(["sh", "-c", "read x"], stdin=subprocess.PIPE)
t.sample(time.monotonic(), {svc.pid: "svc"}, {svc.pid})         # the owner, nothing below it yet
svc.stdin.close(); svc.wait()                                    # it ends...
a = orphan("02000000")                                           # ...and one is born and orphaned at once
b = orphan("ffffffff")
ended = t.sample(time.monotonic(), {}, set())
out = {"ended": [[e.owner.describe(), sorted(k[0] for k in e.keys)] for e in ended], "a": a, "b": b}
c = orphan("03000000")                                           # no owner ends in this window
out["quiet"] = [e.owner.describe() for e in t.sample(time.monotonic(), {}, set())]
for p in (a, b, c):
    os.kill(p, 9)
print(json.dumps(out))
"""


def test_born_and_orphaned_between_two_samples_is_an_unknown_owners_in_its_job():
    """When an owner ended in the same window, a new orphan with Ray's RAY_JOB_ID (and no
    worker's log as stdout) is a leftover of an unknown owner in that job; the null id
    is "unknown job", never ffffffff; with no owner ended, a new orphan is nobody's."""
    import json

    p = subprocess.run([sys.executable, "-c", HARNESS], capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    said = dict((who, pids) for who, pids in out["ended"])
    assert said == {"an unknown owner (job 02000000)": [out["a"]], "an unknown owner (unknown job)": [out["b"]]}, out
    assert out["quiet"] == [], out


CREATOR = """
import os, sys, time
from reaper.leftovers import mechanisms
c = mechanisms.Cgroups(1, sys.argv[1])
d = c.make()
with open(os.path.join(d, "cgroup.procs"), "w") as f:
    f.write(sys.argv[2])
with open(os.path.join(d, "freezer.state"), "w") as f:
    f.write("FROZEN")
print(d, flush=True)
time.sleep(600)
"""


def test_a_stale_frozen_end_cgroup_is_thawed_kept_while_it_holds_and_removed_after(tmp_path):
    """A reaper killed between FROZEN and THAWED (cgroup v1 freezer): while it lives its
    cgroup is never touched; once it is gone, the next cleaner thaws the cgroup (what it
    holds runs again), keeps it while it holds a process, removes it after, and leaves
    the budgets' reaper-strays.* alone."""
    from conftest import PYTHON, remove_cgroup, wait_for
    from reaper.budgets import cleanup
    from reaper.budgets.cgroupfs import make_owned
    from reaper.leftovers import mechanisms
    from reaper.procfs.cgroups import own_dir

    found = own_dir("freezer")
    if found is None or found[0] != 1 or not os.access(found[1], os.W_OK):
        pytest.skip("no writable cgroup v1 freezer hierarchy here")
    box = os.path.join(found[1], f"reaper-test-box.{os.getpid()}.{time.monotonic_ns()}")
    os.mkdir(box)
    held = subprocess.Popen(["sleep", "600"])
    creator = subprocess.Popen([PYTHON, "-c", CREATOR, box, str(held.pid)], stdout=subprocess.PIPE, text=True)
    strays = None
    try:
        d = creator.stdout.readline().strip()
        assert os.path.dirname(d) == box and os.path.basename(d).startswith(mechanisms.PREFIX), d
        assert mechanisms.members(d) == [held.pid]
        strays, fd = make_owned(box)         # a budgets' directory whose creator is gone too
        os.close(fd)
        assert cleanup.remove_stale([box], mechanisms.PREFIX) == ([], [])     # its creator lives
        assert open(os.path.join(d, "freezer.state")).read().strip() == "FROZEN"

        creator.kill()
        creator.wait()
        assert cleanup.remove_stale([box], mechanisms.PREFIX) == ([], [d])   # held: thawed, kept
        assert open(os.path.join(d, "freezer.state")).read().strip() == "THAWED"
        wait_for(lambda: open(f"/proc/{held.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "S", 10,
                 what="the held process running again")
        held.kill()
        held.wait()
        wait_for(lambda: cleanup.remove_stale([box], mechanisms.PREFIX) == ([d], []), 10,
                 what="the emptied stale cgroup removed")
        assert not os.path.exists(d) and os.path.isdir(strays)
    finally:
        for p in (creator, held):
            p.kill()
            p.wait()
        remove_cgroup(box)

"""Ray's own processes are told by their executable and script, never by a name: a
stray renamed raylet or gcs_server (prctl), a plain child below a process renamed
raylet, a busy loop started with `exec -a "/usr/bin/python ray/_private/x.py"` and
a script named ray that reads like Ray's launcher but that no Ray installed are all strays, held to their budget like any other. (The real raylet and workers
stay Ray's own: tests/test_budget_ray.py.)"""
from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path

import pytest

import budget_helpers as bh
from conftest import PYTHON, importable, pids_with_arg, require, wait_for

heavy = pytest.mark.xdist_group("cpu-heavy")   # CPU shares are measured: one at a time (not parsing tests)

BUSY = "import time\nwhile True:\n    t = time.monotonic() + 0.025\n    while time.monotonic() < t: pass\n    time.sleep(0.025)\n"
RENAMED = ("import ctypes, sys\n"
           "ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n"     # PR_SET_NAME
           "for t in __import__('os').listdir('/proc/self/task'):\n"            # every thread, as the kernel shows
           "    open(f'/proc/self/task/{t}/comm', 'w').write(sys.argv[1])\n") + BUSY
# A process renamed raylet that starts a busy child, as the raylet starts its workers.
FAKE_RAYLET = ("import ctypes, subprocess, sys, time\n"
               "ctypes.CDLL(None).prctl(15, b'raylet', 0, 0, 0)\n"
               f"subprocess.Popen([sys.executable, '-c', {BUSY!r}, sys.argv[1] + '-kid'])\n"
               "time.sleep(600)\n")


def _fake_launcher(d) -> str:
    """A file named ray with the shebang and the import line of pip's console script."""
    path = d / "ray"
    path.write_text(f"#!{PYTHON}\nimport sys\nif 0:\n    from ray.scripts.scripts import main\n" + BUSY)
    return str(path)


@heavy
def test_renamed_and_spoofed_processes_are_strays(reaper, tmp_path):
    tags = {name: bh.marker() for name in ("raylet", "gcs_server", "child", "exec_a", "launcher")}
    cmds = [f"{PYTHON} -c {shlex.quote(RENAMED)} raylet {tags['raylet']}",
            f"{PYTHON} -c {shlex.quote(RENAMED)} gcs_server {tags['gcs_server']}",
            f"{PYTHON} -c {shlex.quote(FAKE_RAYLET)} {tags['child']}",
            f"bash -c 'exec -a \"/usr/bin/python ray/_private/x.py\" {PYTHON} -c \"{BUSY}\" {tags['exec_a']}'",
            f"{PYTHON} {_fake_launcher(tmp_path)} {tags['launcher']}"]
    r = reaper(["--cpu-budget", "0.05", "--budget-action", "nice", "--budget-grace", "0", "--budget-window", "1",
                "--budget-interval", "0.3", "--", *bh.orphans_then_sleep(*cmds)])
    want = {**tags, "child": tags["child"] + "-kid"}
    def find(name, tag):       # the launcher runs a script, not -c
        return pids_with_arg(tag, last=True) if name == "launcher" else bh.pids_tagged(tag)
    pids = {name: wait_for(lambda n=name, t=tag: find(n, t) or None, 20, what=name)[0] for name, tag in want.items()}
    def comm(pid):
        return open(f"/proc/{pid}/comm").read().strip()
    wait_for(lambda: comm(pids["raylet"]) == "raylet" and comm(pids["gcs_server"]) == "gcs_server"
             and comm(bh.stat(pids["child"])["ppid"]) == "raylet", 20, what="the renames")
    assert open(f"/proc/{pids['exec_a']}/cmdline").read().startswith("/usr/bin/python ray/_private/x.py\0")
    for name, pid in pids.items():
        wait_for(lambda p=pid: os.sched_getscheduler(p) == os.SCHED_IDLE and bh.stat(p)["nice"] == 19, 30, 0.05,
                 what=f"the {name} spoof to be niced as a stray")
    r.send(signal.SIGTERM)
    r.wait()


def test_the_detector_itself_on_spoofs_and_on_this_python():
    from reaper.budgets.ray import RayProcesses

    ray = RayProcesses()
    me = os.getpid()
    assert ray.kind(me, bh.stat(me)["start"]) is None      # pytest: a Python interpreter, not Ray's script


@heavy
@pytest.mark.ray
def test_the_detector_knows_rays_own_launcher_and_not_a_copy(tmp_path):
    """The console script pip installed with Ray (listed in its RECORD, same hash) is
    `ray start`; the same text copied elsewhere, or one byte changed in place of it, is not."""
    require("ray", importable("ray"), "pip install -e '.[test]'")
    import importlib.metadata
    import shutil
    import subprocess
    from reaper.budgets.ray import RayProcesses

    dist = importlib.metadata.distribution("ray")
    (real,) = [os.path.realpath(dist.locate_file(f)) for f in dist.files if str(f).endswith("bin/ray")]
    copy = tmp_path / "bin" / "ray"
    copy.parent.mkdir()
    shutil.copy(real, copy)
    ray = RayProcesses()
    kinds = {}
    for name, script in (("real", real), ("copy", str(copy))):
        # Stopped as soon as it has exec'd: what is classified is the process, not what it does next.
        p = subprocess.Popen([PYTHON, script, "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: script.encode() in open(f"/proc/{p.pid}/cmdline", "rb").read(), 10, 0.001,
                     what=f"the {name} launcher's exec")
            os.kill(p.pid, signal.SIGSTOP)
            kinds[name] = ray.kind(p.pid, bh.stat(p.pid)["start"])
        finally:
            p.kill()
            p.wait()
    assert kinds == {"real": "ray_start", "copy": None}, kinds


@heavy
def test_a_fake_ray_layout_beside_a_launcher_is_not_rays_and_breaks_nothing(tmp_path):
    """A stray can build prefix/bin/ray beside prefix/lib/pythonX/site-packages/ray (with
    a _raylet.so) and a RECORD of its own: one that lists the script with another hash or
    with none (a NUL where the hash goes; an older csv cannot even read it) makes it no
    launcher, and never an error. The control: the same layout with the script's own
    hash is Ray's launcher (a detector that always says no fails here)."""
    import base64
    import hashlib
    import subprocess
    from reaper.budgets.ray import RayProcesses

    site = tmp_path / "lib" / "python3.11" / "site-packages"
    (site / "ray").mkdir(parents=True)
    (site / "ray" / "__init__.py").write_text("")
    (site / "ray" / "_raylet.so").write_text("")
    (site / "ray-9.dist-info").mkdir()
    (tmp_path / "bin").mkdir()
    launcher = _fake_launcher(tmp_path / "bin")
    digest = hashlib.sha256(b"something else").hexdigest()
    # As a wheel's RECORD writes it (PEP 376/427: urlsafe base64 of the sha256, no padding).
    own = base64.urlsafe_b64encode(hashlib.sha256(Path(launcher).read_bytes()).digest()).rstrip(b"=").decode()
    kinds = {}
    for name, record in (("other hash", f"../../../bin/ray,sha256={digest},1\n"),
                         ("no hash", "../../../bin/ray,\0x\n"),
                         ("its own hash", f"../../../bin/ray,sha256={own},1\n")):
        (site / "ray-9.dist-info" / "RECORD").write_text(record)
        p = subprocess.Popen([PYTHON, launcher, bh.marker()])
        try:
            wait_for(lambda: launcher.encode() in open(f"/proc/{p.pid}/cmdline", "rb").read(), 10, 0.001,
                     what="the launcher's exec")
            kinds[name] = RayProcesses().kind(p.pid, bh.stat(p.pid)["start"])
        finally:
            p.kill()
            p.wait()
    assert kinds == {"other hash": None, "no hash": None, "its own hash": "ray_start"}, kinds


@heavy
@pytest.mark.parametrize("planted", ["fifo", "dev-zero", "huge"])
def test_a_planted_record_never_blocks_nor_floods_reaper(tmp_path, planted):
    """Issue 20, point 1: a stray's own layout with RECORD as a FIFO (an open for reading
    would wait for a writer for ever), a link to /dev/zero (reads without end) or a huge
    file: no launcher, found at once, and nothing read without bound."""
    import subprocess
    from reaper.budgets.ray import MAX_RECORD

    site = tmp_path / "lib" / "python3.11" / "site-packages"
    (site / "ray").mkdir(parents=True)
    (site / "ray" / "__init__.py").write_text("")
    (site / "ray" / "_raylet.so").write_text("")
    (site / "ray-9.dist-info").mkdir()
    record = site / "ray-9.dist-info" / "RECORD"
    if planted == "fifo":
        os.mkfifo(record)
    elif planted == "dev-zero":
        os.symlink("/dev/zero", record)
    else:
        with open(record, "wb") as f:
            f.truncate(MAX_RECORD + 1)            # sparse: no disk used
    (tmp_path / "bin").mkdir()
    launcher = _fake_launcher(tmp_path / "bin")
    p = subprocess.Popen([PYTHON, launcher, bh.marker()])
    # The detector runs in a process of its own, so that a read that blocks fails this
    # test at the timeout instead of hanging it.
    probe = ("import resource, sys\n"
             "from reaper.budgets.ray import RayProcesses\n"
             "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             "kind = RayProcesses().kind(int(sys.argv[1]), int(sys.argv[2]))\n"
             "print(kind, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    try:
        wait_for(lambda: launcher.encode() in open(f"/proc/{p.pid}/cmdline", "rb").read(), 10, 0.001,
                 what="the launcher's exec")
        try:
            out = subprocess.run([PYTHON, "-c", probe, str(p.pid), str(bh.stat(p.pid)["start"])],
                                 capture_output=True, text=True, timeout=20, cwd=tmp_path)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the detector blocked on a {planted} RECORD") from None
    finally:
        p.kill()
        p.wait()
    assert out.returncode == 0, out.stderr
    kind, grew_kib = out.stdout.split()
    assert kind == "None"                          # no launcher: a stray, held to its budget
    assert int(grew_kib) < 64 * 1024, f"{grew_kib} KiB read"

"""Leftovers of services (--leftovers): a service's run starts a rank in a new
session (as torchrun does), holding a device node named like a GPU, and exits;
reaper, PID 1 of a fresh namespace, ends the rank before the next run starts
(end), stops it (stop), says so (report) or leaves it (keep). The Ray owners are
tests/test_leftovers_ray.py's."""
from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import PYTHON, alive, held_cgroups, proc_stat, py, wait_for, wait_for_file
import budget_helpers as bh
import leftovers_helpers as lh

MAIN = py("import time\nwhile True: time.sleep(1)")


def service(out, wait: float, *rank_args: str) -> str:
    return f"svc={PYTHON} {lh.HERE} launcher {out} rank {wait} " + " ".join(rank_args)


def host_pid(out, name: str) -> int:
    return wait_for(lambda: (lh.marked(out, name) or [None])[0], 10, what=name)


def stop(r) -> str:
    r.send(signal.SIGTERM)
    r.wait(30)
    return r.stderr


def test_end_terms_the_device_holder_before_the_restart_and_says_released(reaper, tmp_path):
    dev = lh.make_device(tmp_path)
    r = reaper(["--leftovers", "end", "--devices", str(tmp_path / "nvidia[0-9]*"), "--restart-delay", "0.1",
                "--service", service(tmp_path, 1.5, f"device={dev}"), "--", *MAIN])
    wait_for_file(tmp_path / "rank-1.term", timeout=15)
    assert wait_for_file(tmp_path / "run-2.prev", timeout=15) == "gone"
    err = stop(r)
    line = next(x for x in err.splitlines() if "leftovers of service svc" in x)
    assert f"holding {dev}" in line and "ended by SIGTERM" in line and "devices released" in line, line
    assert "by cgroup.kill" in err or "by freezer" in err or "by sweeps" in err


def test_end_kills_a_term_ignoring_forker_after_the_grace_without_a_survivor(reaper, tmp_path):
    r = reaper(["--leftovers", "end", "--leftover-grace", "1", "--restart-delay", "0.1",
                "--service", service(tmp_path, 1.5, "ignore-term", "fork"), "--", *MAIN])
    term = float(wait_for_file(tmp_path / "rank-1.term", timeout=15))
    rank = host_pid(tmp_path, "rank-1")
    assert wait_for_file(tmp_path / "run-2.prev", timeout=15) == "gone"
    assert time.monotonic() - term >= 0.9            # the grace was given
    assert not alive(rank)
    assert not lh.marked(tmp_path, "rank-1"), "a fork of the leftover survived"
    # reaper lets an end's cgroup's lock go only once the directory is gone.
    assert not held_cgroups(r.pid), "the end's cgroup was left behind"
    err = stop(r)
    line = next(x for x in err.splitlines() if "leftovers of service svc" in x)
    assert "SIGKILL to" in line and "after the grace" in line, line


def _v1_freezer() -> bool:
    from reaper.procfs.cgroups import mounts

    return any(m.version == 1 and "freezer" in m.options for m in mounts())


@pytest.mark.parametrize("ro", ["v2", "all"], ids=["freezer-v1", "no-cgroups"])
def test_end_without_cgroup_kill(reaper, tmp_path, ro):
    if ro == "v2" and not _v1_freezer():
        pytest.skip("no cgroup v1 freezer hierarchy here (a cgroup v2-only host)")
    r = reaper(["--leftovers", "end", "--leftover-grace", "0.5", "--restart-delay", "0.1",
                "--service", service(tmp_path, 1.5, "ignore-term", "fork"), "--", *MAIN],
               preexec_fn=readonly_v2 if ro == "v2" else bh.readonly_cgroups)
    assert wait_for_file(tmp_path / "run-2.prev", timeout=15) == "gone"
    assert not lh.marked(tmp_path, "rank-1"), "a fork of the leftover survived"
    err = stop(r)
    assert ("by freezer" if ro == "v2" else "by sweeps") in err, err


def test_stop_keeps_them_stopped(reaper, tmp_path):
    r = reaper(["--leftovers", "stop", "--restart-delay", "0.1",
                "--service", service(tmp_path, 1.5), "--", *MAIN])
    wait_for_file(tmp_path / "run-2.prev", timeout=15)
    rank = host_pid(tmp_path, "rank-1")
    wait_for(lambda: proc_stat(rank)["state"] == "T", 5, what="the leftover stopped")
    assert not (tmp_path / "rank-1.term").exists()
    r.kill()
    assert "leftovers of service svc" in r.stderr and "stopped (SIGSTOP, kept)" in r.stderr, r.stderr


@pytest.mark.parametrize("mode", ["report", "keep"])
def test_report_says_and_keep_is_silent(reaper, tmp_path, mode):
    r = reaper(["--leftovers", mode, "--restart-delay", "0.1", "--service", service(tmp_path, 1.5), "--", *MAIN])
    assert wait_for_file(tmp_path / "run-2.prev", timeout=15) == "alive"
    rank = host_pid(tmp_path, "rank-1")
    time.sleep(1.5)             # two samples: nothing may happen to it
    assert alive(rank) and proc_stat(rank)["state"] != "T"
    assert not (tmp_path / "rank-1.term").exists()
    os.kill(rank, signal.SIGKILL)
    err = stop(r)
    said = [x for x in err.splitlines() if "leftovers of service svc" in x]
    if mode == "report":
        assert len(said) == 1 and "reported" in said[0], err
    else:
        assert not said and "leftover" not in err, err


def test_a_live_services_rank_and_the_main_childs_daemon_are_left_alone(reaper, tmp_path):
    daemon = f"{PYTHON} {lh.HERE} rank {tmp_path} {lh.MARK}daemon"
    main = ["sh", "-c", f"setsid {daemon} & wait; exec sleep 600"]
    svc = f"svc={PYTHON} {lh.HERE} launcher {tmp_path} rank 600"
    r = reaper(["--leftovers", "end", "--service", svc, "--", *main])
    wait_for_file(tmp_path / "daemon.pid")
    wait_for_file(tmp_path / "rank-1.pid")
    d, k = host_pid(tmp_path, "daemon"), host_pid(tmp_path, "rank-1")
    time.sleep(2.5)             # two samples and more
    assert alive(d) and alive(k)
    assert not (tmp_path / "daemon.term").exists() and not (tmp_path / "rank-1.term").exists()
    r.kill()
    assert "leftovers of service" not in (r.stderr or "")


def readonly_v2() -> None:
    """preexec_fn: a mount namespace where the cgroup v2 hierarchy is read-only (the
    v1 ones stay writable: the freezer is what reaper can use)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.unshare(0x00020000) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(None, b"/", None, 16384 | (1 << 18), None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    with open("/proc/self/mountinfo") as f:
        points = [line.split(" - ")[0].split()[4] for line in f if line.split(" - ")[1].startswith("cgroup2 ")]
    for mnt in points:
        if libc.mount(mnt.encode(), mnt.encode(), None, 32 | 4096 | 1, None) != 0:
            raise OSError(ctypes.get_errno(), f"remount {mnt} read-only")


def test_report_counts_in_the_metrics_and_the_device_holder_stays_counted(reaper, tmp_path):
    from metrics_helpers import start_with_metrics, wait_scrape

    dev = lh.make_device(tmp_path)
    r, port = start_with_metrics(reaper, MAIN, ["--leftovers", "report", "--devices", str(tmp_path / "nvidia*"),
                                                "--restart-delay", "0.1",
                                                "--service", service(tmp_path, 1.5, f"device={dev}")])
    s = wait_scrape(port, lambda s: s.value("reaper_leftover_device_holders", device=str(dev)) == 1,
                    "the reported holder counted")
    assert s.value("reaper_leftovers_total", action="reported") == 1
    assert s.value("reaper_leftover_owners_ended_total", kind="service") == 1
    assert s.value("reaper_leftovers_total", action="killed") == 0
    os.kill(host_pid(tmp_path, "rank-1"), signal.SIGKILL)
    wait_scrape(port, lambda s: s.value("reaper_leftover_device_holders", device=str(dev)) is None,
                "the holder gone from the gauge")
    r.kill()


def test_gpu_memory_without_nvml_says_why_once_and_the_end_goes_on(reaper, tmp_path):
    (tmp_path / "pynvml.py").write_text("raise ImportError('no NVML here')\n")     # even on a GPU machine
    r = reaper(["--leftovers", "end", "--gpu-memory", "--restart-delay", "0.1",
                "--service", service(tmp_path, 1.5), "--", *MAIN], env={"PYTHONPATH": str(tmp_path)})
    assert wait_for_file(tmp_path / "run-2.prev", timeout=15) == "gone"
    err = stop(r)
    assert err.count("--gpu-memory:") == 1 and "GPU memory is not read" in err, err


def test_a_reaper_killed_in_an_end_leaves_its_cgroup_to_the_next_one(reaper, tmp_path):
    """reaper SIGKILLed while an end's cgroup holds a leftover (a TERM-ignoring rank in
    its grace): the cgroup stays, its owner's lock gone with reaper; the next reaper with
    leftovers on removes it at start. Both run in a cgroup of this test's own, so that
    no other test's reaper takes the stale one first."""
    from conftest import remove_cgroup
    from reaper.procfs.cgroups import own_dir

    found = own_dir("")
    if found is None or found[0] != 2 or not os.access(found[1], os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy here (the end's cgroup is v2's cgroup.kill)")
    box = os.path.join(found[1], f"reaper-test-box.{os.getpid()}.{time.monotonic_ns()}")
    os.mkdir(box)

    def into_box() -> None:
        with open(os.path.join(box, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    try:
        first = reaper(["--leftovers", "end", "--leftover-grace", "60", "--restart-delay", "0.1",
                        "--service", service(tmp_path, 1.5, "ignore-term"), "--", *MAIN], preexec_fn=into_box)
        wait_for_file(tmp_path / "rank-1.term", timeout=15)
        (stale,) = wait_for(lambda: [d for d in held_cgroups(first.pid) if "/reaper-leftovers." in d], 10,
                            what="the end's cgroup")
        assert os.path.dirname(stale) == box and lh.marked(tmp_path, "rank-1")
        first.proc.kill()                   # unshare --kill-child: reaper and its namespace die
        first.proc.wait(10)
        wait_for(lambda: not lh.marked(tmp_path, "rank-1"), 10, what="the namespace gone")
        assert os.path.isdir(stale), "the killed reaper's cgroup went without a cleaner"
        second = reaper(["-v", "--leftovers", "report", "--", *MAIN], preexec_fn=into_box)
        wait_for(lambda: not os.path.exists(stale), 10, what="the stale cgroup removed")
        err = stop(second)
        assert f"removed 1 leftover cgroup(s) left by reapers that are gone: {stale}" in err, err
    finally:
        remove_cgroup(box)

"""File work that may block runs off PID 1's loop under a deadline (reaper/procfs/offloop.py):
issue 20, point 1. A hung filesystem cannot be had on demand here, so the blocking
call is a real thread blocked on a real pipe read, as it would be in the kernel."""
import os
import threading
import time

import pytest

from reaper.procfs.offloop import Late, OffLoop


def _blocking_read():
    """A call that blocks in the kernel until its release() is called."""
    r, w = os.pipe()

    def read():
        try:
            return os.read(r, 1)
        finally:
            os.close(r)

    def release():
        os.write(w, b"x")
        os.close(w)
    return read, release


def test_a_call_that_answers_returns_its_result_and_what_it_raised():
    pool = OffLoop(1.0)
    assert pool.run(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(FileNotFoundError):
        pool.run(os.stat, "/nonexistent/offloop")
    assert pool.stuck == 0 and pool.late == 0


def test_a_blocked_call_is_late_at_its_deadline_and_never_blocks_the_caller_longer():
    pool = OffLoop(0.2, max_stuck=2)
    releases = []
    try:
        for _ in range(2):
            read, release = _blocking_read()
            releases.append(release)
            start = time.monotonic()
            with pytest.raises(Late):
                pool.run(read)
            assert time.monotonic() - start < 2.0          # the deadline, not the read
        assert pool.stuck == 2
        # Past max_stuck: Late at once, and no new thread is made for it.
        threads = threading.active_count()
        start = time.monotonic()
        with pytest.raises(Late):
            pool.run(lambda: "never run")
        assert time.monotonic() - start < 0.1
        assert threading.active_count() == threads
        assert pool.late == 3
    finally:
        for release in releases:
            release()
    # The blocked reads return at last: their workers are idle again and do work.
    deadline = time.monotonic() + 10
    while pool.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.stuck == 0
    threads = threading.active_count()
    assert pool.run(lambda: "again") == "again"
    assert threading.active_count() == threads            # an idle worker, not a new thread


def test_ray_detection_judges_a_process_whose_files_hang_as_not_rays_within_the_deadline(monkeypatch):
    """A process whose root leads into a filesystem that never answers costs the
    loop one deadline, once: it is judged not Ray's (its budget applies) and cached."""
    from reaper.budgets import ray

    read, release = _blocking_read()
    calls = []

    def classify(pid, cmdline):
        calls.append(pid)
        return read()
    rp = ray.RayProcesses()
    monkeypatch.setattr(rp, "_classify", classify)
    try:
        start = time.monotonic()
        assert rp.kind(os.getpid(), 1, b"python\0x\0") is None
        assert time.monotonic() - start < ray.CLASSIFY_TIMEOUT + 1.5
        assert rp.late == [os.getpid()]
        start = time.monotonic()
        assert rp.kind(os.getpid(), 1, b"python\0x\0") is None      # cached: not asked again
        assert time.monotonic() - start < 0.1 and len(calls) == 1
    finally:
        release()

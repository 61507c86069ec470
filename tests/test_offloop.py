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


def test_ray_detection_leaves_a_process_whose_files_hang_undecided_and_asks_again(monkeypatch):
    """Issue 33 point 5: a process whose root leads into a filesystem that never answers
    costs the loop one deadline a check, and is never judged not Ray's (its budget would
    then act on what may be Ray's own): UNDECIDED, not kept, asked again, and told once
    its files answer."""
    from reaper.budgets import ray

    reads = [_blocking_read() for _ in range(2)]
    calls = []
    answer = []

    def classify(pid, cmdline, deadline):
        calls.append(pid)
        return answer[0] if answer else reads[len(calls) - 1][0]()
    rp = ray.RayProcesses()
    monkeypatch.setattr(rp, "_classify", classify)
    me = os.getpid()
    try:
        for n in (1, 2):
            start = time.monotonic()
            assert rp.kind(me, 1, b"python\0x\0") == ray.UNDECIDED
            assert time.monotonic() - start < ray.CLASSIFY_TIMEOUT + 1.5
            assert len(calls) == n and (me, 1) not in rp.cache        # asked again: no verdict kept
        assert rp.late == [me, me]
        start = time.monotonic()                                     # both checkers held: at once
        assert rp.kind(me, 1, b"python\0x\0") == ray.UNDECIDED
        assert time.monotonic() - start < 0.1 and len(calls) == 2
    finally:
        for _, release in reads:
            release()
    deadline = time.monotonic() + 10
    while rp.files.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    answer.append("daemon")
    assert rp.kind(me, 1, b"python\0x\0") == "daemon"                # decided once it answers


def test_work_that_checks_its_deadline_stops_there_and_frees_its_worker():
    """Issue 33 point 4: a check that is long, not blocked (a deep path a stray chose),
    stops soon after its deadline instead of burning on in its thread."""
    from reaper.procfs.offloop import check

    pool = OffLoop(0.1, max_stuck=2)
    spins = []

    def endless(deadline):
        while True:
            spins.append(1)
            check(deadline)
    with pytest.raises(Late):          # the loop's wait, or the work's own check just before it
        pool.run(endless, pool.deadline())
    deadline = time.monotonic() + 2
    while pool.stuck and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pool.stuck == 0, "the late call still runs"
    n = len(spins)
    time.sleep(0.05)
    assert len(spins) == n

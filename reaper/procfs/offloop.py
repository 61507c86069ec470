"""File work that may still block, run off PID 1's loop and waited for at most a deadline.

read_regular (procfs/files.py) keeps a FIFO or a device from blocking reaper, but no
flag helps on a path that leads into a hung filesystem (a FUSE mount whose server
does not answer, an NFS server gone): a path inside a process's root
(/proc/PID/root/...) is one a process chose. Such work runs on a worker thread; the
loop waits at most `timeout` for it. A call still running at its deadline is Late
and left to its thread (a thread cannot be killed); the next call gets a new worker.
Work that checks its deadline between its steps (check()) stops soon after it and
frees its worker: only a call blocked in the kernel stays. At most `max_stuck`
threads are ever left that way; past that, every call is Late at once, so a hostile
process costs reaper a bounded number of threads and of waits, never its loop. A
worker whose call returns at last is idle again. If no thread can be made (the pids limit), the work runs inline.
"""
from __future__ import annotations

import threading
import time


class Late(OSError):
    """The work did not end by its deadline; it goes on, on its own thread (until it
    checks its deadline: check())."""


def check(deadline: float) -> None:
    """Raises Late once time.monotonic() is past deadline. Work that may be long (a
    path a process chose, walked a component at a time) calls it between its steps:
    past its deadline it stops there, freeing its worker, instead of burning on."""
    if time.monotonic() > deadline:
        raise Late("stopped past its deadline")


class OffLoop:
    def __init__(self, timeout: float, max_stuck: int = 2, name: str = "reaper-files") -> None:
        self.timeout = timeout
        self.max_stuck = max_stuck
        self.name = name
        self.stuck = 0                   # workers left with a call past its deadline
        self.late = 0                    # calls that were Late, for the record
        self._idle: list = []
        self._lock = threading.Lock()

    def deadline(self) -> float:
        """The time.monotonic() at which a call started now is Late: for check()."""
        return time.monotonic() + self.timeout

    def run(self, fn, *args):
        """fn(*args) on a worker thread: its result, or what it raised, or Late."""
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            stuck = self.stuck
        if worker is None:
            if stuck >= self.max_stuck:
                self.late += 1
                raise Late(f"{stuck} file reads still blocked")
            try:
                worker = _Worker(self)
            except RuntimeError:         # no thread can be had: inline, as before there were any
                return fn(*args)
        box: list = []
        done = threading.Event()
        worker.give(fn, args, box, done)
        if not done.wait(self.timeout):
            with self._lock:
                if not box:              # still running: left to its thread
                    worker.late = True
                    self.stuck += 1
                    self.late += 1
                    raise Late(f"no answer within {self.timeout:g} s")
        ok, value = box[0]
        if ok:
            return value
        raise value

    def _back(self, worker: "_Worker") -> None:
        with self._lock:
            if worker.late:
                worker.late = False
                self.stuck -= 1
            self._idle.append(worker)


class _Worker:
    def __init__(self, pool: OffLoop) -> None:
        self.pool = pool
        self.late = False
        self.job = None
        self.go = threading.Event()
        threading.Thread(target=self._loop, name=pool.name, daemon=True).start()

    def give(self, fn, args, box: list, done: threading.Event) -> None:
        self.job = (fn, args, box, done)
        self.go.set()

    def _loop(self) -> None:
        while True:
            self.go.wait()
            self.go.clear()
            fn, args, box, done = self.job
            self.job = None
            try:
                box.append((True, fn(*args)))
            except BaseException as e:   # handed to the caller, who may have left: never raised here
                box.append((False, e))
            self.pool._back(self)
            done.set()

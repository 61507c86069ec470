"""Helpers for tests/test_leftovers*.py: processes that leave others behind the way
Ray workers and services do, and a device node named like an accelerator.

Run as a script:
  python leftovers_helpers.py rank DIR NAME [ignore-term] [device=PATH] [fork]
      a leftover: writes NAME.pid (its pid in reaper's namespace), NAME.term when it
      gets SIGTERM (then exits, unless ignore-term), holds PATH open, and with fork
      forks a child every 50 ms (each child ignores SIGTERM too and sleeps)
  python leftovers_helpers.py launcher DIR NAME WAIT [rank args...]
      a service's run: starts `rank DIR NAME-<run> ...` in a new session
      (start_new_session=True, as torchrun starts its ranks), waits until its pid
      file exists and WAIT seconds more, and exits 1; run 2 writes run-2.prev
      (whether run 1's rank was still alive when it started) and stays up
"""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
MARK = "reaper-leftover:"


def make_device(directory: Path, name: str = "nvidia0") -> Path:
    """A real character device with /dev/null's numbers, named like a GPU."""
    st = os.stat("/dev/null")
    path = directory / name
    os.mknod(path, 0o666 | stat.S_IFCHR, st.st_rdev)
    return path


def rank_argv(out, name: str, *extra: str) -> list:
    return [sys.executable, str(HERE), "rank", str(out), MARK + name, *extra]


def marked(out, name: str) -> list:
    """Host pids of the live ranks named name started for directory out (the marker
    alone is not unique: tests run side by side)."""
    want = [str(out).encode(), (MARK + name).encode()]
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if all(w in args for w in want):
            found.append(int(pid))
    return found


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


def rank(out: str, marked: str, *extra: str) -> None:
    name = marked[len(MARK):]
    ignore = "ignore-term" in extra
    held = [os.open(e[len("device="):], os.O_RDWR) for e in extra if e.startswith("device=")]

    def term(*_):
        _write(os.path.join(out, name + ".term"), f"{time.monotonic()}\n")
        if not ignore:
            os._exit(0)
    signal.signal(signal.SIGTERM, term)
    _write(os.path.join(out, name + ".pid"), str(os.getpid()))
    if "fork" in extra:
        while True:
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                while True:
                    time.sleep(1)
            time.sleep(0.05)
    while True:
        time.sleep(1)
    del held


def launcher(out: str, name: str, wait: str, *extra: str) -> None:
    runs = sorted(Path(out).glob("run-*"))
    n = len([r for r in runs if r.suffix == ""]) + 1
    if n > 1:
        prev = Path(out, f"{name}-{n - 1}.pid")
        still = False
        if prev.exists():
            try:
                os.kill(int(prev.read_text()), 0)
                still = True
            except OSError:
                still = False
        _write(os.path.join(out, f"run-{n}.prev"), "alive" if still else "gone")
        while True:                       # the second run stays up
            time.sleep(1)
    Path(out, f"run-{n}").write_text(str(os.getpid()))
    subprocess.Popen(rank_argv(out, f"{name}-{n}", *extra), start_new_session=True)
    pid_file = Path(out, f"{name}-{n}.pid")
    while not pid_file.exists():
        time.sleep(0.01)
    time.sleep(float(wait))
    sys.exit(1)


def agent(out: str, *ranks: str) -> None:
    """torchrun's agent: each argument NAME[:arg:arg] starts a rank in a new session;
    `timeout` in an argument starts that rank under GNU timeout (its own process group)."""
    for spec in ranks:
        name, *extra = spec.split(":")
        argv = rank_argv(out, name, *[e for e in extra if e != "timeout"])
        if "timeout" in extra:
            subprocess.Popen(["timeout", "600", *argv])
        else:
            subprocess.Popen(argv, start_new_session=True)
    while True:
        time.sleep(1)


def ray_driver(out: str) -> None:
    """The main child of tests/test_leftovers_ray.py: a local Ray (ray.init), an actor
    whose agent starts ranks that flee its session, killed with ray.kill; a live actor
    with a setsid'd rank; a task whose worker is SIGKILLed; its own setsid'd daemon."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    me = sys.executable

    def wait_pids(*names):
        for n in names:
            while not Path(out, n + ".pid").exists():
                time.sleep(0.01)

    @ray.remote
    class Holder:
        def run(self, ranks):
            self.agent = subprocess.Popen([me, str(HERE), "agent", out, *ranks])
            wait_pids(*[r.split(":")[0] for r in ranks])
            time.sleep(2.5)                 # two samples of reaper's with the ranks below it
            return os.getpid()

        def quick(self, name):
            # Born and orphaned at once (sh returns before reaper's next sample).
            subprocess.run(["sh", "-c", "setsid " + " ".join(rank_argv(out, name)) + " &"], check=True)
            wait_pids(name)

    @ray.remote(max_retries=0)
    def doomed():
        subprocess.Popen([me, str(HERE), "agent", out, "task-rank"])
        wait_pids("task-rank")
        time.sleep(2.5)
        os.kill(os.getpid(), signal.SIGKILL)

    @ray.remote(max_retries=0, runtime_env={"env_vars": {"REAPER_TEST_POOL": "quick"}})
    def quick(name):
        # Born and orphaned at once (sh returns before reaper's next sample), then its worker dies.
        subprocess.run(["sh", "-c", "setsid " + " ".join(rank_argv(out, name)) + " &"], check=True)
        wait_pids(name)
        time.sleep(1.5)                     # a sample sees the worker's title (never the rank below it)
        os.kill(os.getpid(), signal.SIGKILL)

    _write(os.path.join(out, "job"), ray.get_runtime_context().get_job_id())
    subprocess.Popen(rank_argv(out, "daemon"), start_new_session=True)     # the main child's: nobody's leftover
    keeper = Holder.remote()
    ray.get(keeper.run.remote(["live-rank"]))
    ray.get(keeper.quick.remote("quick-live"))          # its actor lives on: left alone
    device = Path(out, "nvidia0")
    holder = Holder.remote()
    ray.get(holder.run.remote([f"gpu-rank:device={device}", "stubborn-rank:ignore-term", "timeout-rank:timeout"]))
    _write(os.path.join(out, "killed"), f"{time.monotonic()}\n")
    ray.kill(holder)
    try:
        ray.get(doomed.remote())
    except ray.exceptions.WorkerCrashedError:
        _write(os.path.join(out, "task-killed"), f"{time.monotonic()}\n")
    try:
        ray.get(quick.remote("quick-dead"))
    except ray.exceptions.WorkerCrashedError:
        _write(os.path.join(out, "quick-killed"), f"{time.monotonic()}\n")
    while not Path(out, "exit").exists():
        time.sleep(0.05)
    ray.shutdown()


if __name__ == "__main__":
    {"rank": rank, "launcher": launcher, "agent": agent, "ray-driver": ray_driver}[sys.argv[1]](*sys.argv[2:])

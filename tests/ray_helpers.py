"""Helpers for tests/test_ray_e2e.py: a Ray head under reaper, a driver that leaks
processes the ways real Ray jobs do, and the strays it leaves.

Run as a script:
  python ray_helpers.py driver ADDRESS DIR     the job (see driver())
  python ray_helpers.py stray DIR NAME MODE    a leaked process (busy or sleep)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
PYTHON = sys.executable
MARK = "reaper-stray:"
STRAYS_BUSY = ("orphaned", "daemonised", "idle-worker")
STRAYS_ASLEEP = ("actor-detached", "killed-worker-child")
# Started with setsid: outside every process group Ray cleans up.
STRAYS_DETACHED = ("daemonised", "idle-worker", "actor-detached", "killed-worker-child")


def stray_argv(out: str, name: str, mode: str) -> list:
    # The marker in argv lets the test find the process from outside the namespace.
    return [PYTHON, str(HERE), "stray", out, MARK + name, mode]


def stray(out: str, marked: str, mode: str) -> None:
    """A leaked process: records the SIGTERM it gets (a SIGKILL cannot be recorded,
    so the file proves the SIGTERM came first), then exits."""
    name = marked[len(MARK):]

    def term(*_):
        with open(os.path.join(out, name + ".term"), "w") as f:
            f.write(f"{time.monotonic()}\n")
        os._exit(0)
    signal.signal(signal.SIGTERM, term)
    _write(os.path.join(out, name + ".pid"), str(os.getpid()))
    if mode == "busy":
        while True:
            pass
    while True:
        time.sleep(1)


def driver(address: str, out: str) -> int:
    import ray

    ray.init(address=address, log_to_driver=False)
    sh_stray = " ".join(stray_argv(out, "{name}", "{mode}"))

    # 1. Fire-and-forget shell helpers: `sleep` is orphaned as soon as sh returns.
    @ray.remote(num_cpus=2)
    def fire_and_forget():
        subprocess.run(["sh", "-c", "sleep 0.1 &"], check=True)
        return os.getpid()
    ray.get([fire_and_forget.remote() for _ in range(50)])

    # 2. An orphaned busy loop (sh exits under it) and a daemonised one (setsid too).
    @ray.remote
    def orphaned_busy():
        subprocess.run(["sh", "-c", sh_stray.format(name="orphaned", mode="busy") + " &"], check=True)

    @ray.remote
    def daemonised_busy():
        subprocess.run(["sh", "-c", "setsid " + sh_stray.format(name="daemonised", mode="busy") + " &"],
                       check=True)

    # 3. A detached (setsid) busy loop that outlives its task and stays the child of
    # its pooled worker, which shows ray::IDLE once the task has returned.
    @ray.remote
    def idle_worker_busy():
        return subprocess.Popen(stray_argv(out, "idle-worker", "busy"), start_new_session=True).pid

    ray.get([orphaned_busy.remote(), daemonised_busy.remote(), idle_worker_busy.remote()])

    # 4. An actor killed with ray.kill while it has children. Ray kills the worker's
    # direct children and its process group; a launcher's detached child (setsid,
    # below a shell) is reached by neither and is orphaned.
    @ray.remote
    class Parent:
        def __init__(self):
            launcher = "setsid " + sh_stray.format(name="actor-detached", mode="sleep") + " & wait"
            self.kids = [subprocess.Popen(["sleep", "600"]), subprocess.Popen(["sh", "-c", launcher])]

        def pids(self):
            return [k.pid for k in self.kids]

    actor = Parent.remote()
    ray.get(actor.pids.remote())
    _wait_file(os.path.join(out, "actor-detached.pid"))
    ray.kill(actor)

    # 5. A task whose worker is SIGKILLed while it has a detached child (in a
    # worker pool of its own, so the worker it kills is not the idle one above).
    @ray.remote(max_retries=0, runtime_env={"env_vars": {"REAPER_TEST_POOL": "doomed"}})
    def doomed():
        subprocess.Popen(stray_argv(out, "killed-worker-child", "sleep"), start_new_session=True)
        _wait_file(os.path.join(out, "killed-worker-child.pid"))
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        ray.get(doomed.remote())
        raise AssertionError("the doomed task returned")
    except ray.exceptions.WorkerCrashedError:
        pass

    # 6. The job goes on: small tasks, in their own worker pool (another runtime
    # env) so they never reuse the idle worker above, until the test says stop.
    @ray.remote(runtime_env={"env_vars": {"REAPER_TEST_POOL": "ping"}})
    def ping(i):
        return i

    ray.get(ping.remote(-1), timeout=60)
    _write(os.path.join(out, "driver-ready"), "1")
    ok, latencies = 0, []
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, "stop")) and time.monotonic() < deadline:
        t0 = time.monotonic()
        assert ray.get(ping.remote(ok), timeout=30) == ok
        latencies.append(time.monotonic() - t0)
        ok += 1
        _write(os.path.join(out, "pings"), str(ok))
        time.sleep(0.1)
    _write(os.path.join(out, "health.json"), json.dumps({"ok": ok, "max_latency": max(latencies, default=0)}))
    # Stay connected (the job is not over) until the test is done with the cluster.
    _wait_file(os.path.join(out, "exit"), timeout=120)
    return 0


def _wait_file(path: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


# --- seen from the test, outside the namespace ---------------------------------

def tree(root: int) -> list:
    """root and every descendant (host pids). Test side only: this module also runs
    as a script inside Ray, where the test harness is not importable."""
    from conftest import descendants

    return [root, *descendants(root)]


def zombies(root: int) -> list:
    from conftest import proc_stat

    def zombie(p):
        try:
            return proc_stat(p)["state"] == "Z"
        except OSError:
            return False
    return [p for p in tree(root) if zombie(p)]


def find_marked(root: int, name: str):
    """The process below root marked name (test side: conftest is importable)."""
    from conftest import pids_with_arg

    below = set(tree(root))
    return next((p for p in pids_with_arg(MARK + name) if p in below), None)


# --- starting a head under reaper (test side) ---------------------------------------

def head_command(ray: str, temp_dir: str, num_cpus: int, block: bool = True) -> tuple:
    """(`ray start --head --block ...` on loopback with every port named, its GCS port).
    block=False: `ray start` without --block in a shell that then sleeps, as images that
    start Ray in a script do; Ray's daemons are orphaned to reaper once it returns."""
    from conftest import reserve_ports     # test side: the harness is importable here

    workers = 100                    # one port per live worker; Ray leaves some unused
    gcs, *named, worker_low = reserve_ports(7 + workers)[:8]
    worker_high = worker_low + workers - 1
    names = ("node-manager-port", "object-manager-port", "metrics-export-port",
             "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port")
    argv = [ray, "start", "--head", "--block", f"--num-cpus={num_cpus}", "--include-dashboard=false",
            "--disable-usage-stats", "--node-ip-address=127.0.0.1", f"--port={gcs}",
            f"--temp-dir={temp_dir}", f"--min-worker-port={worker_low}", f"--max-worker-port={worker_high}",
            *[f"--{n}={p}" for n, p in zip(names, named)]]
    if not block:
        import shlex

        argv.remove("--block")
        argv = ["sh", "-c", f"{shlex.join(argv)} && exec sleep 3600"]
    return argv, gcs


def log_tails(temp_dir: str, limit: int = 1500) -> str:
    """The end of each of Ray's own logs, to say why a start failed."""
    import glob

    tails = []
    for path in sorted(glob.glob(os.path.join(temp_dir, "session_*", "logs", "*"))):
        if os.path.isfile(path) and os.path.getsize(path):
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - limit))
                tails.append(f"--- {path}\n{f.read().decode(errors='replace')}")
    return "\n".join(tails) or f"(no Ray logs under {temp_dir})"


def start_head(reaper, reaper_args: list, ray: str, temp_root: str, num_cpus: int, env: dict,
               attempts: int = 2, block: bool = True) -> tuple:
    """reaper [reaper_args] -- ray start --head --block ..., awaited until Ray says it
    started: (the Reaper, the GCS port). Ray's own start has fixed 30 s deadlines (the
    raylet's registration, the GCS's port) that a loaded 2-core machine can overrun; a
    failed start is retried once, on fresh ports, and reported as a warning."""
    import warnings

    env = {"RAY_gcs_server_port_wait_time_s": "60", **env}    # 30 s by default
    failures = []
    for attempt in range(1, attempts + 1):
        temp_dir = os.path.join(temp_root, f"t{attempt}")
        argv, gcs = head_command(ray, temp_dir, num_cpus, block)
        r = reaper([*reaper_args, "--", *argv], env=env)
        try:
            while "Ray runtime started" not in r.readline(timeout=90):
                pass
            if failures:
                warnings.warn(f"Ray's first start failed, the retry started: {failures[0][:3000]}")
            return r, gcs
        except AssertionError as e:
            r.kill()
            failures.append(f"ray start failed ({e}); exit status {r.proc.returncode}\n"
                            f"stdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-3000:]}\n{log_tails(temp_dir)}")
    raise AssertionError("\n\n".join(failures))


if __name__ == "__main__":
    if sys.argv[1] == "driver":
        sys.exit(driver(sys.argv[2], sys.argv[3]))
    if sys.argv[1] == "stray":
        stray(*sys.argv[2:5])

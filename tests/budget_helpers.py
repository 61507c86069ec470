"""Helpers for the CPU budget tests: busy processes, /proc measurements, a
read-only cgroup filesystem, a setuid-root busy loop, and an in-process harness
(run as PID 1 of its own namespace) for what only the enforcer itself can show:
resume at close, a recycled pid that must not be hit, and strays reaper may not
signal.

    python tests/budget_helpers.py close-resumes | recycled-pid | duty-faults |
        close-with-refused                                       (under unshare)
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import uuid

from conftest import proc_stat as stat   # noqa: F401  (bh.stat: the suite's one /proc/PID/stat reader)
from conftest import wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = sys.executable
V1_CPU = "/sys/fs/cgroup/cpu"
# CPU budgets that act within seconds: a short grace and window, frequent samples.
FAST = ["--budget-grace", "1", "--budget-window", "2", "--budget-interval", "0.5"]


def v1_writable() -> bool:
    """Root, with a writable cgroup v1 cpu hierarchy (reaper caps CPU with cpu.cfs_quota_us)."""
    return os.geteuid() == 0 and os.access(V1_CPU, os.W_OK) and os.path.exists(os.path.join(V1_CPU, "cpu.cfs_quota_us"))


def needs_v1(test):
    import pytest

    return pytest.mark.skipif(not v1_writable(), reason="needs root and a writable cgroup v1 cpu hierarchy")(test)


def marker() -> str:
    return "m" + uuid.uuid4().hex[:12]


def busy_code(tag: str, ignore_term: bool = False, seconds: float = 0, share: float = 1.0) -> str:
    """A busy loop whose argv carries tag (so the test can find it). share < 1:
    busy for that share of every 50 ms, asleep for the rest (over a small budget
    all the same, and kinder to the machine)."""
    lines = ["import signal, sys, time"]
    if ignore_term:
        lines.append("signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    if seconds:
        lines.append(f"end = time.monotonic() + {seconds}")
        lines.append("while time.monotonic() < end: pass")
    elif share < 1.0:
        lines.append("while True:")
        lines.append(f"    t = time.monotonic() + {0.05 * share}")
        lines.append("    while time.monotonic() < t: pass")
        lines.append(f"    time.sleep({0.05 * (1 - share)})")
    else:
        lines.append("while True: pass")
    return "\n".join(lines)


def busy_argv(tag: str, **kw) -> str:
    """Shell words running busy_code, tagged."""
    code = busy_code(tag, **kw).replace("'", "'\\''")
    return f"{PYTHON} -c '{code}' {tag}"


def orphans_then_sleep(*busy: str, main_extra: str = "") -> list:
    """Main child: starts each busy command as an orphan (its parent subshell exits
    at once), then runs main_extra in the foreground and sleeps."""
    parts = [f"( {b} & )" for b in busy]
    if main_extra:
        parts.append(main_extra)
    parts.append("exec sleep 600")
    return ["sh", "-c", "\n".join(parts)]


def pids_tagged(tag: str) -> list:
    """Live `python -c CODE ... tag` processes (busy_argv's): tag last, after a -c (a
    driver script given the tag as its last argument is not one)."""
    from conftest import pids_with_arg

    def inline(pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return b"-c" in f.read().split(b"\0")
        except OSError:
            return False
    return [p for p in pids_with_arg(tag, last=True) if inline(p)]


def wait_tagged(tag: str, n: int = 1, timeout: float = 30.0) -> list:
    """The pids of n processes tagged with tag, once there are that many."""
    from conftest import wait_for

    return wait_for(lambda: (lambda p: p if len(p) >= n else None)(pids_tagged(tag)), timeout,
                    what=f"{n} process(es) tagged {tag}")


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def proc_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    return -1


def cpu_rate(pids: list, seconds: float) -> float:
    """Cores used by pids together over the next `seconds` (utime+stime from /proc)."""
    def total():
        s = 0.0
        for p in pids:
            try:
                s += stat(p)["cpu"]
            except OSError:
                pass
        return s
    c0, t0 = total(), time.monotonic()
    time.sleep(seconds)
    return (total() - c0) / (time.monotonic() - t0)


def idle_class() -> None:
    """preexec_fn: nice 19 and SCHED_IDLE, as reaper makes a stray it throttles."""
    os.nice(19)
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def cpu_seconds(pids: list) -> float:
    """CPU seconds the live ones among pids have used (utime + stime)."""
    total = 0.0
    for p in pids:
        try:
            total += stat(p)["cpu"]
        except OSError:
            pass
    return total


def measure_with_control(pids, budget, seconds=6.0, limit=90.0) -> tuple:
    """({pid: CPU seconds used}, wall seconds, CPU seconds an unthrottled busy loop of
    the strays' scheduling class (SCHED_IDLE) got meanwhile). What a capped stray can
    reach depends on free CPU: it gets what such a loop gets, up to its budget. So the
    window lasts at least `seconds` and until the loop has had budget * seconds of
    CPU (an event, bounded by limit)."""
    control = subprocess.Popen([PYTHON, "-c", busy_code("control")], preexec_fn=idle_class)
    try:
        wait_for_cpu(control.pid, 0.01, 10)                 # the loop runs
        c0, t0 = cpu_seconds([control.pid]), time.monotonic()
        before = {p: cpu_seconds([p]) for p in pids}
        while True:
            time.sleep(0.2)
            got, wall = cpu_seconds([control.pid]) - c0, time.monotonic() - t0
            if wall >= seconds and got >= budget * seconds:
                break
            assert wall < limit, (f"in {limit}s an unthrottled loop got only {got:.2f} CPU seconds: "
                                  f"the machine is too busy to measure a budget of {budget}")
        used = {p: cpu_seconds([p]) - before[p] for p in pids}
    finally:
        control.kill()
        control.wait()
    return used, wall, got


def assert_used_near(used: float, wall: float, got: float, budget: float, low=0.6, high=1.2) -> float:
    """used CPU seconds in wall seconds are within the budget (high) and, up to what an
    unthrottled loop got, at least low of it: low * budget * seconds of CPU at the least,
    however busy the machine, so a stray stopped for good always fails. (On a loaded
    machine a duty-cycled stray was seen at 0.75 of the loop: low is 0.6.)"""
    rate = used / wall
    assert rate <= budget * high, f"{rate:.3f} cores, budget {budget}"
    floor = low * min(budget * wall, got)
    assert used >= floor, (f"{used:.2f} CPU seconds in {wall:.1f}s, budget {budget} (floor {floor:.2f}; "
                           f"an unthrottled loop got {got:.2f})")
    return rate


def assert_rate_near(pids, budget, seconds=6.0, low=0.6, high=1.2):
    """pids together use their budget: at most high of it, at least low of what they
    could get (measure_with_control, assert_used_near)."""
    used, wall, got = measure_with_control(pids, budget, seconds)
    return assert_used_near(sum(used.values()), wall, got, budget, low, high)


def wait_for_cpu(pid: int, seconds: float, timeout: float) -> None:
    """Until pid has used `seconds` of CPU more than now."""
    start = cpu_seconds([pid])
    wait_for(lambda: cpu_seconds([pid]) - start >= seconds, timeout, 0.02, what=f"{pid} to get CPU")


def states_for(pids: list, seconds: float) -> set:
    """Every state the live ones among pids were seen in over the next `seconds`."""
    states = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for p in pids:
            try:
                states.add(stat(p)["state"])
            except OSError:
                pass
        time.sleep(0.005)
    return states


# --- processes reaper may not signal ----------------------------------------------

# A busy loop that makes itself root for good (real, effective and saved uid), when
# installed setuid root: a process its uid-1000 parent started and may not signal.
ROOT_BUSY_C = r"""
#include <stdio.h>
#include <time.h>
#include <unistd.h>
int main(void) {
    if (setresuid(0, 0, 0) != 0) { perror("setresuid"); return 1; }
    for (;;) {      /* busy half of every 50 ms */
        struct timespec t0, t, nap = {0, 25000000};
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do clock_gettime(CLOCK_MONOTONIC, &t);
        while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 25000000L);
        nanosleep(&nap, NULL);
    }
}
"""


def setuid_root_busy(directory: str) -> str:
    """Compiles ROOT_BUSY_C into directory, owned by root and setuid. Needs root."""
    src, out = os.path.join(directory, "rootbusy.c"), os.path.join(directory, "rootbusy")
    with open(src, "w") as f:
        f.write(ROOT_BUSY_C)
    subprocess.run(["gcc", "-O1", "-o", out, src], check=True, capture_output=True)
    os.chown(out, 0, 0)
    os.chmod(out, 0o4755)
    return out


def as_user(uid: int):
    """preexec_fn: the child becomes uid (and gid) for good."""
    def switch():
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    return switch


def cpu_cgroup(pid: int) -> str:
    """pid's cgroup for the cpu controller: the v1 cpu line, else the v2 one."""
    v2 = ""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if "cpu" in ctrls.split(","):
                return path
            if ctrls == "":
                v2 = path
    return v2


# --- a read-only cgroup filesystem (the normal case in a Kubernetes pod) ------

_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18


def readonly_cgroups() -> None:
    """preexec_fn: a mount namespace of its own where every cgroup mount is
    read-only (bind-remounted ro). Runs in the forked child before exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            mnt, fstype = left.split()[4], right.split()[0]
            if fstype in ("cgroup", "cgroup2") or mnt == "/sys/fs/cgroup":
                points.append(mnt)
    for mnt in points:
        m = mnt.encode()
        if libc.mount(m, m, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None) != 0:
            raise OSError(ctypes.get_errno(), f"remount {mnt} read-only")


def v2_cpu_delegated() -> str:
    """'' if a writable cgroup v2 hierarchy delegates the cpu controller to us, else why not."""
    own = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                own = line.rstrip("\n")[3:]
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[0] == "cgroup2":
                mounts.append(left.split()[4])
    if not mounts or own is None:
        return "no cgroup v2 hierarchy on this machine"
    d = os.path.normpath(mounts[0] + "/" + own)
    try:
        ctrls = open(os.path.join(d, "cgroup.controllers")).read().split()
    except OSError as e:
        return f"{d}: {e.strerror}"
    if "cpu" not in ctrls:
        return f"the cgroup v2 hierarchy at {d} has no cpu controller (controllers: {ctrls or 'none'})"
    if not os.access(d, os.W_OK):
        return f"{d} is not writable"
    return ""


# --- the in-process harness ----------------------------------------------------

def _enforcer(args: list, main_pid: int):
    from types import SimpleNamespace

    from reaper import options
    from reaper.budgets import enforcer
    from reaper.log import Log
    from reaper.stats import BudgetStats

    cfg = options.parse([*args, "--", "true"])
    scope = SimpleNamespace(pid=os.getpid(), is_pid1=os.getpid() == 1, main_pid=main_pid,
                            supervised=set(), watch=False, phase="running")
    return enforcer.Enforcer(cfg, Log(3), BudgetStats(), scope)


def _run_until(enf, pred, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        due = enf.next_deadline()
        time.sleep(max(0.0, min(0.05, due - time.monotonic())))
        now = time.monotonic()
        if enf.next_deadline() <= now:
            enf.tick(now)
        _reap()
        if pred():
            return True
    return False


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def close_resumes() -> dict:
    """A stray duty-cycled by SIGSTOP/SIGCONT is running again after close()."""
    main = subprocess.Popen(["sleep", "600"])
    stray = subprocess.Popen([PYTHON, "-c", busy_code("x")])
    enf = _enforcer(["--cpu-budget", "0.2", "--budget-grace", "0", "--budget-window", "1",
                     "--budget-interval", "0.2", "--budget-action", "throttle"], main.pid)
    seen_stopped = _run_until(enf, lambda: stat(stray.pid)["state"] == "T", 15)
    mechanism = enf.stats.mechanism
    # Close at a moment it is stopped (the duty cycle just stopped it).
    enf.close()
    time.sleep(0.3)
    states = set()
    c0 = stat(stray.pid)["cpu"]
    for _ in range(20):
        states.add(stat(stray.pid)["state"])
        time.sleep(0.02)
    ran = stat(stray.pid)["cpu"] - c0
    stray.kill()
    main.kill()
    _reap()
    return {"seen_stopped": seen_stopped, "mechanism": mechanism, "states_after": sorted(states),
            "cpu_after": ran, "actions": dict(enf.stats.actions)}


def _wait_state(pid: int, want: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stat(pid)["state"] == want:
            return True
        time.sleep(0.002)
    return False


def duty_faults() -> dict:
    """The duty cycler, run as uid 1000 on two real processes: one of root's (it may
    not signal it) listed first, one of its own. The root one's refusal must not
    stop the other being stopped, nor leave a deadline behind, nor keep close()
    from resuming the other."""
    from reaper.procctl import Handle, NotPermitted
    from reaper.budgets.throttle import DutyCycler

    # Another session: within one, SIGCONT may go to anyone (so close() would not meet a refusal).
    root = subprocess.Popen(["sleep", "600"], start_new_session=True)
    mine = subprocess.Popen(["sleep", "600"], preexec_fn=as_user(1000))
    as_user(1000)()
    kr, km = (root.pid, stat(root.pid)["start"]), (mine.pid, stat(mine.pid)["start"])
    duty = DutyCycler()
    t = time.monotonic()
    duty.set(kr, Handle(*kr), 0.1, t)
    duty.set(km, Handle(*km), 0.1, t)
    duty.step(t + 0.05)                          # both due to stop
    out = {"members_after_step": [list(k) for k in duty.members],
           "deadline_ahead": (duty.next_deadline() or 0) > t + 0.05,
           "mine_stopped": _wait_state(mine.pid, "T", 5),
           "root_state": stat(root.pid)["state"],
           "faults": [(list(k), sig, type(e).__name__, e.what) for k, sig, e in duty.take_faults()]}
    # Many periods on: the refused member stays out, the other one cycles.
    for i in range(1, 20):
        duty.step(t + 0.05 + i * 0.05)
    out["members_later"] = [list(k) for k in duty.members]
    out["faults_later"] = len(duty.take_faults())
    # close(): the root member back in, as stopped and first in line (as if its
    # credentials had changed since): its refused SIGCONT must not keep the other
    # one stopped.
    duty.step(t + 2.0)
    duty.step(t + 2.05)
    out["mine_stopped_before_close"] = _wait_state(mine.pid, "T", 5)
    members = dict(duty.members)
    duty.members = {kr: DutyCycler.Member(Handle(*kr)), **members}
    duty.members[kr].stopped_at = t + 2.0
    try:
        duty.close(t + 2.06)
        out["close_raised"] = None
    except Exception as e:
        out["close_raised"] = repr(e)
    out["mine_states_after_close"] = sorted(states_for([mine.pid], 0.3))
    out["close_faults"] = [(sig, isinstance(e, NotPermitted)) for _, sig, e in duty.take_faults()]
    out["members_after_close"] = len(duty.members)
    return out


def close_with_refused() -> dict:
    """The enforcer, run as uid 1000, with two busy strays: root's (it may not act on
    it) and its own (duty-cycled). close() at a moment its own is stopped leaves it
    running; the root one is named once."""
    main = subprocess.Popen(["sleep", "600"])
    root = subprocess.Popen([PYTHON, "-c", busy_code("r", share=0.5)], start_new_session=True)
    mine = subprocess.Popen([PYTHON, "-c", busy_code("m")], preexec_fn=as_user(1000))
    as_user(1000)()
    enf = _enforcer(["--cpu-budget", "0.2", "--budget-grace", "0", "--budget-window", "1",
                     "--budget-interval", "0.2", "--budget-action", "throttle"], main.pid)
    seen_stopped = _run_until(enf, lambda: enf.stats.actions["not_permitted"] >= 1
                              and stat(mine.pid)["state"] == "T", 20)
    for _ in range(5):                            # a few more samples: nothing is retried
        _run_until(enf, lambda: False, 0.2)
    # Close at a moment it is stopped (the duty cycle just stopped it).
    _run_until(enf, lambda: stat(mine.pid)["state"] == "T", 5)
    enf.close()
    states = sorted(states_for([mine.pid], 0.3))
    out = {"seen_stopped": seen_stopped, "mechanism": enf.stats.mechanism, "states_after": states,
           "root_states": sorted(states_for([root.pid], 0.1)), "actions": dict(enf.stats.actions),
           "root": root.pid, "mine": mine.pid}
    for p in (mine, root, main):
        try:
            p.kill()
        except PermissionError:
            pass                                  # root's: the namespace takes it down
    return out


def recycled_pid(pidfds: bool = True) -> dict:
    """Pins a process, lets it die, brings its pid back in a new process, then
    tries every action through the stale handle: each must refuse. Without pidfds
    (as on kernels before 5.3) signals fall back to a start-time check and kill()."""
    from reaper import procctl
    from reaper.budgets.throttle import DutyCycler

    procctl.HAVE_PIDFD = pidfds

    # A small pid space so the pid comes around after a few hundred forks.
    # (After a wrap the kernel hands out pids from 300 up: the pid must be above.)
    with open("/proc/sys/kernel/pid_max", "w") as f:
        f.write("400")
    while True:
        filler = subprocess.Popen(["true"])
        filler.wait()
        if filler.pid >= 310:
            break
    old = subprocess.Popen(["sleep", "600"])
    start = stat(old.pid)["start"]
    early = procctl.Handle(old.pid, start)        # takes its pidfd while the process lives
    early_fd = early._fd() is not None
    late = procctl.Handle(old.pid, start)         # will open its pidfd only after the pid is reused
    duty = DutyCycler()
    duty.set((old.pid, start), procctl.Handle(old.pid, start), 0.01, time.monotonic())
    old.kill()
    old.wait()

    target, new, forks = old.pid, None, 0
    while forks < 4000:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            if os.getpid() == target:
                os.write(w, b"1")
                os.execvp("sleep", ["sleep", "600"])
            os._exit(0)
        os.close(w)
        forks += 1
        got = os.read(r, 1)
        os.close(r)
        if pid == target:
            assert got == b"1"
            new = pid
            break
        os.waitpid(pid, 0)
    if new is None:
        return {"reused": False, "forks": forks}
    deadline = time.monotonic() + 10              # let the new process reach sleep(1)'s wait
    while not (_comm(new) == "sleep" and stat(new)["state"] == "S") and time.monotonic() < deadline:
        time.sleep(0.005)
    before = stat(new)
    results = {}
    for name, handle, fn in (
            ("signal_via_early_pidfd", early, lambda h: h.signal(signal.SIGKILL)),
            ("signal_via_late_pidfd", late, lambda h: h.signal(signal.SIGSTOP)),
            ("renice", late, lambda h: h.renice(19)),
            ("sched_idle", late, lambda h: h.sched_idle()),
            ("affinity", late, lambda h: h.set_affinity(frozenset({0}))),
            ("cgroup_move", late, lambda h: h.checked(lambda: (_ for _ in ()).throw(AssertionError("ran")))),
    ):
        try:
            fn(handle)
            results[name] = "acted"
        except procctl.Gone:
            results[name] = "refused"
        except AssertionError:
            results[name] = "acted"
    now = time.monotonic()
    duty.step(now + 1.0)                          # a new period starts...
    duty.step(now + 1.05)                         # ...and its member is due to be stopped
    after = stat(new)
    alive = after["state"] != "Z"
    policy_other = os.sched_getscheduler(new) == os.SCHED_OTHER
    affinity = sorted(os.sched_getaffinity(new))
    os.kill(new, signal.SIGKILL)
    os.waitpid(new, 0)
    return {"reused": True, "forks": forks, "early_fd": early_fd, "results": results,
            "new_state": after["state"], "new_nice": after["nice"], "alive": alive,
            "new_start_differs": before["start"] != start,
            "new_policy_other": policy_other,
            "new_affinity": affinity, "all_cpus": sorted(os.sched_getaffinity(0)), "duty_members": len(duty.members)}


if __name__ == "__main__":
    # The installed reaper first (a source tree, as an unpacked sdist, has no built _core).
    sys.path.append(os.path.dirname(HERE))
    what = sys.argv[1]
    out = {"close-resumes": close_resumes, "recycled-pid": recycled_pid,
           "recycled-pid-no-pidfd": lambda: recycled_pid(pidfds=False),
           "duty-faults": duty_faults, "close-with-refused": close_with_refused}[what]()
    print(json.dumps(out), flush=True)


# --- memory: the v1 memory hierarchy these machines have ------------------------------

def own_memory_dir() -> "str | None":
    """This process's v1 memory cgroup directory, if root may write it."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if "memory" in ctrls.split(","):
                d = "/sys/fs/cgroup/memory" + path
                return d if os.geteuid() == 0 and os.access(d, os.W_OK) else None
    return None


def _needs_v1_memory():
    import pytest

    return pytest.mark.skipif(own_memory_dir() is None, reason="needs root and a writable cgroup v1 memory hierarchy")


needs_v1_memory = _needs_v1_memory()


def memory_cgroup(pid: int) -> str:
    """pid's cgroup in the v1 memory hierarchy ('' if there is none)."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if "memory" in ctrls.split(","):
                return path
    return ""


def peak_rss(pid: int) -> int:
    """VmHWM: the most the process ever held resident."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def private_memory(pid: int) -> int:
    """Resident memory minus file-backed and shared pages (statm), in bytes: Ray's rule,
    and reaper's cheap figure for what a process holds of its own."""
    with open(f"/proc/{pid}/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")

"""A scripted world for the budgets engine, in-process: the characterization harness of
tests/test_budget_golden.py.

The engine (reaper/budgets/enforcer.py and its parts) is driven as reaper's loop drives
it (tick() at each next_deadline()), on a fake clock, over a world of fake processes:
every reader of /proc, of reaper's cgroup and of the clock the budgets look up is
replaced, in every module of reaper.budgets that holds it, by the world's; a process
handle (procctl.Handle) is a FakeHandle that records each signal, renice, scheduling
class, affinity and cgroup move and applies it to the world (SIGSTOP stops a process's
CPU, SIGTERM ends one that honours it, SIGKILL ends any). Nothing real is read, signalled
or moved: pids are above the kernel's pid_max.

World.run() returns the trace: per tick where something happened, the time, the
samples so far, the handle's events, the actions counted (action, reason) and the log
lines since the last entry, and after each sample a snapshot of BudgetStats.
"""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import _signal as signal

CLK_TCK = os.sysconf("SC_CLK_TCK")
BOOT0 = 1_000_000                 # boot ticks at the world's time 0
REAPER, MAIN = 1, 2
PID0 = 5_000_000                  # first stray pid: above any pid_max (4,194,304)
SIGNAMES = {signal.SIGSTOP: "SIGSTOP", signal.SIGCONT: "SIGCONT", signal.SIGTERM: "SIGTERM",
            signal.SIGKILL: "SIGKILL"}


class P:
    """One process of the world."""

    def __init__(self, pid, ppid, start, comm, cmdline, rate=0.0, rss=4 << 20, mem=2 << 20, pgid=None,
                 sid=None, forknoexec=False, term_exits=True, deny=()) -> None:
        self.pid, self.ppid, self.start, self.comm, self.cmdline = pid, ppid, start, comm, cmdline
        self.rate, self.rss, self.mem = rate, rss, mem           # cores while running; bytes
        self.pgid = pid if pgid is None else pgid
        self.sid = pid if sid is None else sid
        self.forknoexec, self.term_exits, self.deny = forknoexec, term_exits, set(deny)
        self.cpu = 0.0                   # seconds
        self.stopped = False
        self.ending = False              # signalled to end: gone once the clock moves on

    @property
    def state(self) -> str:
        return "T" if self.stopped else ("R" if self.rate > 0 else "S")

    @property
    def ticks(self) -> int:
        return int(self.cpu * CLK_TCK)


class FakeTime:
    """The time module as the budgets use it, on the world's clock."""

    CLOCK_BOOTTIME = 7

    def __init__(self, world) -> None:
        self.world = world

    def monotonic(self) -> float:
        return 1000.0 + self.world.now

    def time(self) -> float:
        return 1_800_000_000.0 + self.world.now

    def process_time(self) -> float:
        return 0.0

    def clock_gettime(self, clock) -> float:
        return BOOT0 / CLK_TCK + self.world.now


class World:
    def __init__(self, args: list, duration: float, watch: bool = False, reaped: bool = False) -> None:
        from reaper import options

        self.cfg = options.parse([*args, "--", "true"])
        self.duration = duration
        self.now = 0.0
        self.procs: dict = {}
        self.next_pid = PID0
        self.last_pid = PID0
        self.total_cpu = 0.0             # every process's CPU, the gone ones' too (reaper's cgroup)
        self.reaped = reaped             # reaper counts the CPU of what it reaps (reaped.ReapedCPU)
        self.reaped_cpu = 0.0            # CPU seconds of the orphans reaper reaped
        self.script: list = []           # (at, fn): world changes, in time order
        self.events: list = []           # what the handles did, since the last trace entry
        self.logged: list = []
        self.scope = SimpleNamespace(pid=REAPER, is_pid1=True, main_pid=MAIN, supervised=set(), watch=watch,
                                     phase="running")
        self.add(ppid=0, comm="reaper", cmdline="reaper", pid=REAPER)
        self.add(ppid=REAPER, comm="main", cmdline="main --serve", pid=MAIN)

    # --- the script --------------------------------------------------------------

    def add(self, ppid=REAPER, comm="sleep", cmdline="sleep 600", pid=None, **kw) -> P:
        if pid is None:
            pid = self.next_pid
            self.next_pid += 1
            self.last_pid = pid
        p = self.procs[pid] = P(pid, ppid, self.boot(), comm, cmdline, **kw)
        return p

    def at(self, when: float, fn) -> None:
        self.script.append((when, fn))
        self.script.sort(key=lambda e: e[0])

    def exit(self, pid: int) -> None:
        """pid ends (its children are reaper's now; reaper reaps it if it is its child)."""
        p = self.procs.pop(pid, None)
        if p is not None and p.ppid == REAPER:
            self.reaped_cpu += p.cpu
        for p in self.procs.values():
            if p.ppid == pid:
                p.ppid = REAPER

    def fork(self, parent: P, **kw) -> P:
        """A fork-copy of parent (never exec'd): its name, command line, group and session."""
        return self.add(ppid=parent.pid, comm=parent.comm, cmdline=parent.cmdline, pgid=parent.pgid,
                        sid=parent.sid, forknoexec=True, **kw)

    def boot(self) -> int:
        return BOOT0 + int(self.now * CLK_TCK)

    def advance(self, to: float) -> None:
        if to > self.now:
            for p in [p for p in self.procs.values() if p.ending]:
                self.exit(p.pid)
        while self.script and self.script[0][0] <= to:
            when, fn = self.script.pop(0)
            self._run(when)
            fn()
        self._run(to)

    def _run(self, to: float) -> None:
        dt = to - self.now
        if dt > 0:
            for p in self.procs.values():
                if p.rate and not p.stopped:
                    p.cpu += p.rate * dt
                    self.total_cpu += p.rate * dt
            self.now = to

    # --- what the budgets read -----------------------------------------------------

    def get(self, pid, start=None):
        p = self.procs.get(pid)
        if p is None or (start is not None and p.start != start):
            return None
        return p

    def read_stat(self, pid):
        p = self.get(pid)
        return None if p is None else (p.ppid, p.start, p.comm, p.state, p.ticks)

    def read_counters(self, pid, start):
        from reaper.procfs.processes import Counters

        p = self.get(pid, start)
        return None if p is None else Counters(p.state, p.ticks, p.rss, p.comm)

    def read_groups(self, pid, start):
        p = self.get(pid, start)
        return None if p is None else (p.pgid, p.sid, p.forknoexec)

    def read_children(self, pid):
        return [p.pid for p in self.procs.values() if p.ppid == pid]

    def read_cmdline(self, pid):
        p = self.get(pid)
        return "" if p is None else p.cmdline

    def read_comm(self, pid):
        p = self.get(pid)
        return "" if p is None else p.comm

    def refresh(self, table, now, reapers=()):
        from reaper.procfs.processes import Proc, children_index

        table.procs = {p.pid: Proc(p.pid, p.ppid, p.state, p.comm, p.start, p.start) for p in self.procs.values()}
        table.children = children_index(table.procs.values())
        if now - table.last_full >= 120.0:     # procfs.processes.FULL_EVERY
            table.last_full = now

    # --- running it ----------------------------------------------------------------

    def patches(self) -> list:
        """(module, name, fake) for every module of reaper.budgets holding one of the
        originals: the engine's readers wherever they are looked up."""
        import time

        from reaper import procctl
        from reaper.budgets import cgroupfs, cleanup, lineage, pulse, strays
        from reaper.procfs import cgroups, processes

        world = self
        fakes = {
            processes.read_stat: self.read_stat, processes.read_counters: self.read_counters,
            processes.read_children: self.read_children, processes.read_cmdline: self.read_cmdline,
            processes.read_comm: self.read_comm, lineage.read_groups: self.read_groups,
            lineage.boot_ticks: self.boot, cgroups.read_pid_cgroup: lambda pid: None,
            procctl.Handle: _handle_class(self), procctl.pidfds_work: lambda: True,
            cleanup.remove_stale: lambda parents=None, prefix=None: ([], []), time: FakeTime(self),
            pulse.cgroup_usage_file: lambda: "world/cpuacct.usage",
            pulse.cgroup_memory_file: lambda: "world/memory.usage_in_bytes",
            pulse._usage: lambda path: world.total_cpu,
            pulse._number: lambda path: sum(p.rss for p in world.procs.values()),
            processes.last_pid: lambda proc="/proc": world.last_pid,
            strays._has_program: lambda pid: world.get(pid) is not None,
            strays.RayProcesses: _NoRay,
        }
        found = []
        for name, mod in list(sys.modules.items()):
            if not name.startswith("reaper.budgets") or mod is None:
                continue
            for attr, value in list(vars(mod).items()):
                for orig, fake in fakes.items():
                    if value is orig:
                        found.append((mod, attr, fake))
        return found

    def run(self, monkeypatch, each=None) -> list:
        """The trace; each(enforcer), if given, after every tick."""
        from reaper.budgets import enforcer
        from reaper.budgets.throttle import CgroupThrottle, Unavailable
        from reaper.budgets.memory_cgroup import MemoryCgroup
        from reaper.procfs.processes import ProcTable
        from reaper.stats import BudgetStats

        # Every kind module loaded first: their names are patched too.
        from reaper.budgets.kinds import age, cpu, memory  # noqa: F401

        for mod, attr, fake in self.patches():
            monkeypatch.setattr(mod, attr, fake)
        world = self
        monkeypatch.setattr(ProcTable, "refresh", lambda table, now, reapers=(): world.refresh(table, now, reapers))

        def no_cgroup(*a, **kw):
            raise Unavailable("no cgroup in the scripted world")

        monkeypatch.setattr(CgroupThrottle, "probe", classmethod(no_cgroup))
        monkeypatch.setattr(MemoryCgroup, "probe", classmethod(no_cgroup))
        stats = BudgetStats()
        reaped = None
        if self.reaped:
            from reaper.budgets.reaped import ReapedCPU

            reaped = ReapedCPU(lambda: world.reaped_cpu)
        enf = enforcer.Enforcer(self.cfg, _Log(self.logged), stats, self.scope, reaped)
        trace: list = []
        counted: dict = {}
        mono = FakeTime(self).monotonic
        while True:
            due = enf.next_deadline() - 1000.0
            if due > self.duration:
                break
            self.advance(max(due, self.now))
            samples = stats.samples
            enf.tick(mono())
            if each is not None:
                each(enf)
            entry: dict = {"t": round(self.now, 6)}
            if stats.samples != samples:
                entry["seq"] = stats.samples
            if self.events:
                entry["events"], self.events = self.events, []
            acts = {f"{a}/{r}": n - counted.get(f"{a}/{r}", 0) for (a, r), n in stats.actions_by_reason.items()
                    if n != counted.get(f"{a}/{r}", 0)}
            if acts:
                entry["actions"] = acts
                counted.update({k: counted.get(k, 0) + v for k, v in acts.items()})
            if self.logged:
                entry["log"], self.logged[:] = list(self.logged), []
            if "seq" in entry:
                entry["stats"] = snapshot(stats)
            if len(entry) > 1:
                trace.append(entry)
        self.advance(self.duration)
        enf.close()
        end = {"t": "close"}
        if self.events:
            end["events"] = self.events
        if self.logged:
            end["log"] = list(self.logged)
        end["stats"] = snapshot(stats)
        trace.append(end)
        return trace


def _num(x):
    return round(x, 6) if isinstance(x, float) else x


def snapshot(b) -> dict:
    """BudgetStats as plain data (counters sorted)."""
    def counter(c):
        return {("/".join(k) if isinstance(k, tuple) else k): v for k, v in sorted(c.items()) if v}

    return {
        "strays": b.strays, "strays_seen": b.strays_seen, "stray_cpu_seconds": _num(b.stray_cpu_seconds),
        "stray_cgroup_escapes": b.stray_cgroup_escapes, "violations": counter(b.violations),
        "actions": counter(b.actions), "violations_by_reason": counter(b.violations_by_reason),
        "actions_by_reason": counter(b.actions_by_reason), "mechanism": b.mechanism,
        "memory_mechanism": b.memory_mechanism, "samples": b.samples,
        "stale_cgroups_removed": b.stale_cgroups_removed, "over_budget": dict(b.over_budget),
        "cgroups": dict(b.cgroups),
        "stray_list": [{k: _num(v) for k, v in row.items()} for row in b.stray_list],
    }


class _NoRay:
    """No process of the world is Ray's."""

    def __init__(self) -> None:
        self.cache: dict = {}

    def kind(self, *args, **kw):
        return None

    def prune(self, *args, **kw) -> None:
        pass


class _Log:
    def __init__(self, lines: list) -> None:
        self.lines = lines

    def enabled(self, level: int) -> bool:
        return True

    def error(self, msg: str) -> None:
        self.lines.append(f"E {msg}")

    def warn(self, msg: str) -> None:
        self.lines.append(f"W {msg}")

    def info(self, msg: str) -> None:
        self.lines.append(f"I {msg}")

    def debug(self, msg: str) -> None:
        self.lines.append(f"D {msg}")


def _handle_class(world):
    from reaper.procctl import Gone, NotPermitted

    class FakeHandle:
        """procctl.Handle on the world: each act recorded as (time, pid, what)."""

        def __init__(self, pid: int, start: int) -> None:
            self.pid, self.start = pid, start
            p = world.get(pid)
            if p is not None and "read" in p.deny:
                raise NotPermitted(pid, "read")
            if p is None or p.start != start or p.state in ("Z", "X"):
                raise Gone(pid)

        @classmethod
        def unchecked(cls, pid: int, start: int):
            h = cls.__new__(cls)
            h.pid, h.start = pid, start
            return h

        def _p(self, what: str):
            p = world.get(self.pid, self.start)
            if p is None:
                raise Gone(self.pid)
            if what in p.deny:
                raise NotPermitted(self.pid, what)
            return p

        def _note(self, what: str) -> None:
            world.events.append(f"{round(world.now, 6)} {self.pid} {what}")

        def same(self) -> bool:
            return world.get(self.pid, self.start) is not None

        def read(self):
            c = world.read_counters(self.pid, self.start)
            if c is None:
                raise Gone(self.pid)
            return c

        def cpu_seconds(self) -> float:
            return self.read().cpu / CLK_TCK

        def private_memory(self, exact_above=None) -> int:
            return self._p("read").mem

        def memory(self, exact_above=None) -> tuple:
            return self.private_memory(exact_above), self._p("read").mem

        def signal(self, signo: int) -> bool:
            name = SIGNAMES.get(signo, str(signo))
            p = self._p(name)
            self._note(name)
            if signo == signal.SIGSTOP:
                p.stopped = True
            elif signo == signal.SIGCONT:
                p.stopped = False
            elif signo == signal.SIGKILL or (signo == signal.SIGTERM and p.term_exits):
                p.ending = True
            return True

        def renice(self, value: int = 19) -> None:
            self._p("nice")
            self._note(f"nice {value}")

        def sched_idle(self) -> None:
            self._p("sched_idle")
            self._note("sched_idle")

        def autogroup_nice(self, value: int = 19) -> bool:
            self._p("autogroup_nice")
            return False

        def set_affinity(self, cpus) -> None:
            self._p("affinity")
            self._note(f"affinity {sorted(cpus)}")

        def checked(self, fn, what: str = "cgroup move") -> None:
            self._p(what)
            self._note(what)
            fn()

        def close(self) -> None:
            pass

    return FakeHandle

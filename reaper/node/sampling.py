"""While a core is saturated in kernel time: sample that core alone (perf.CpuSampler)
until its streak ends, and keep what it did (profile.Profile) until the core's next
kernel-time streak. The processes named are the samples' pids, read in /proc for their
name and cgroup only: the cost is the samples', whatever the node runs.

Sampling that is not permitted or not possible (no CAP_PERFMON, kallsyms addresses
hidden, an architecture without a known syscall number) is said once, in one line, and
left off: the per-process scan (culprits.py) names the processes without functions.
"""
from __future__ import annotations

from reaper.node import kallsyms, perf, profile
from reaper.node.culprits import Culprit, pick_cgroup
from reaper.procfs.processes import read_cgroup, stat_fields
from reaper.text import display

MAX_CORES = 4            # cores sampled at once (each is FREQ samples a second to read)
KERNEL_SHARE = 0.5       # a saturated core with at least this share in system, irq, softirq: sampled
NAMED_MIN = 0.05         # a process with less of the core's samples is not named (a sample is 0.5 %)


class Identity:
    """A sampled pid's name and cgroup, read once a streak."""

    def __init__(self, proc: str) -> None:
        self.proc = proc
        self.known: dict = {}

    def __call__(self, pid: int) -> tuple:
        hit = self.known.get(pid)
        if hit is None:
            if pid == 0:
                hit = ("[idle, or outside this PID namespace]", "")
            else:
                st = stat_fields(pid, self.proc, maxsplit=1)
                comm = display(st[0]) if st is not None else "?"
                hit = (comm, pick_cgroup(read_cgroup(pid, self.proc)))
            if len(self.known) > 4096:
                self.known.clear()
            self.known[pid] = hit
        return hit


class Sampling:
    def __init__(self, proc: str, log, opener=perf.CpuSampler, loader=kallsyms.load) -> None:
        self.proc, self.log, self.opener, self.loader = proc, log, opener, loader
        self.off: "str | None" = None      # why sampling is off, once said
        self.symbols = None
        self.active: dict = {}             # cpu -> (perf.CpuSampler, profile.Profile)
        self.last: dict = {}               # cpu -> the Profile of its last kernel-time streak
        self.identity = Identity(proc)
        self.batch: dict = {}              # cpu -> (samples, {pid: kernel samples}) of the last drain

    @property
    def available(self) -> bool:
        return self.off is None

    def update(self, now: float, kernel: set, saturated: set) -> list:
        """kernel: the cores saturated mostly in kernel time at this sample (sampled from
        now on); saturated: every saturated core (a sampled core not in it is done).
        Returns the profiles of the streaks that ended."""
        ended = []
        for cpu in [c for c in self.active if c not in saturated]:
            sampler, prof = self.active.pop(cpu)
            self._drain(cpu, sampler, prof)
            sampler.close()
            prof.ended = now
            for c in prof.culprits():       # named while they may still run
                prof.names[c.pid] = self.identity(c.pid)
            self.last[cpu] = prof
            ended.append(prof)
        if not self.active:
            self.identity.known.clear()      # a new episode: pids may have been reused
        for cpu in sorted(kernel):
            if self.off is not None or len(self.active) >= MAX_CORES:
                break
            if cpu not in self.active:
                self._start(cpu, now)
        self.batch = {}
        for cpu, (sampler, prof) in self.active.items():
            self._drain(cpu, sampler, prof)
        return ended

    def _start(self, cpu: int, now: float) -> None:
        try:
            if self.symbols is None:
                self.symbols = self.loader(self.proc)
            self.active[cpu] = (self.opener(cpu), profile.Profile(cpu, now))
        except (perf.Unavailable, kallsyms.Hidden, OSError) as e:
            self.stop(f"node: kernel functions not sampled: {e}")

    def _drain(self, cpu: int, sampler, prof) -> None:
        samples = sampler.drain()
        prof.add(samples, self.symbols)
        kernel: dict = {}
        for s in samples:
            if s.chain:
                kernel[s.pid] = kernel.get(s.pid, 0) + 1
        self.batch[cpu] = (len(samples), kernel)

    def stop(self, why: "str | None" = None) -> None:
        if why and self.off is None:
            self.off = why
            self.log.warn(why)
        for sampler, _ in self.active.values():
            sampler.close()
        self.active = {}

    def profiles(self) -> dict:
        """cpu -> the ongoing streak's Profile, else the last one's."""
        out = dict(self.last)
        out.update({cpu: prof for cpu, (_, prof) in self.active.items()})
        return out

    def culprits(self, top: int) -> list:
        """The processes with most kernel samples in the last drain, as the scan's
        Culprit (ratio: share of the core over that second, seconds: kernel time)."""
        out = []
        for cpu, (total, kernel) in self.batch.items():
            for pid, n in kernel.items():
                if pid == 0 or n < NAMED_MIN * total:
                    continue
                comm, cgroup = self.identity(pid)
                if comm == "?":             # gone: nothing to name
                    continue
                out.append(Culprit(pid, comm, cpu, cgroup, n / max(total, 1), n / perf.FREQ))
        out.sort(key=lambda c: (-c.ratio, c.pid))
        return out[:top]

    def line(self, prof: profile.Profile, n: int = 1) -> list:
        """'kubelet (pid 123, 72% of cpu1) in f <- caller <- caller', for the n processes
        with most kernel samples on the core."""
        out = []
        for i, c in enumerate(prof.culprits(n)):
            if i and c.ratio < NAMED_MIN:
                break
            comm, _ = self.name(prof, c.pid)
            where = f" in {profile.path(c.functions[0])}" if c.functions else ""
            out.append(f"{comm} (pid {c.pid}, {c.kernel_ratio:.0%} of cpu{prof.cpu}){where}")
        return out

    def name(self, prof: profile.Profile, pid: int) -> tuple:
        """(comm, cgroup) of a pid of prof: as read at its streak's end, or now."""
        return prof.names.get(pid) or self.identity(pid)

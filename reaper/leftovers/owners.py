"""Owners: the processes whose leftovers reaper ends.

- A Ray worker (a task's or an actor's, and Ray's agents): a child of a real
  raylet, the raylet told by its executable (reaper/budgets/ray.py), never by a
  name a process can set. Only the raylet makes its own children.
- A supervised service (--service): the process reaper started for it.

The main child is no owner: what it leaves is the drain's, at its exit.
An owner is known by (pid, start time): a pid reused is another process.
"""
from __future__ import annotations

from reaper.procfs.processes import read_cmdline
from reaper.text import display

RAY = "ray"
SERVICE = "service"
UNKNOWN = "unknown"          # leftovers born and orphaned between two samples: their Ray job only
TITLE_MAX = 120


class Owner:
    __slots__ = ("key", "kind", "name", "job", "comm", "job_comm")

    def __init__(self, key: tuple, kind: str, name: str = "", job=None) -> None:
        self.key = key           # (pid, start)
        self.kind = kind         # RAY, SERVICE or UNKNOWN
        self.name = name         # Ray's title (ray::Holder.run), the service's name
        self.job = job           # the Ray job id, None where unknown
        self.comm = None         # the name last seen: the title is read again when it changes
        self.job_comm = None     # the name it had when its job was read

    def noted(self, comm: str) -> None:
        """A Ray worker's title, read again when its name changes (Ray renames a worker
        for each task; ray::IDLE between them)."""
        if comm == self.comm:
            return
        self.comm = comm
        title = display(read_cmdline(self.key[0]))[:TITLE_MAX]
        # Ray's titles only (not the argv it starts with); an actor between calls is titled
        # ray::Holder: its last call's title (ray::Holder.run) says more.
        if title.startswith("ray::") and title != "ray::IDLE" and not self.name.startswith(title + "."):
            self.name = title

    def job_of(self, comm: str, jobs) -> None:
        """Its job, read (environment, log) once per name it has while it has descendants."""
        if comm == self.job_comm:
            return
        self.job_comm = comm
        _, job = jobs.of(self.key[0])
        if job is not None:
            self.job = job

    def describe(self) -> str:
        job = f"job {self.job}" if self.job else "unknown job"
        if self.kind == SERVICE:
            return f"service {self.name} ({self.key[0]})"
        if self.kind == UNKNOWN:
            return f"an unknown owner ({job})"
        return f"{self.name or 'a Ray worker'} ({self.key[0]}, {job})"


def raylets(table, ray) -> list:
    """Pids of the real raylets in table (comm picks the candidates, the executable decides)."""
    return [p.pid for p in table.procs.values() if p.comm == "raylet" and ray.kind(p.pid, p.start) == "raylet"]

"""Which owner each process descends from, kept while it lives.

At each sample (a ProcTable refresh: only new or re-parented processes are read)
every process below a live owner is noted with that owner's (pid, start). When
an owner is no longer there, the processes noted with it that are still alive,
and what they forked since, are its leftovers, wherever they went in the
meantime: a new session or process group, a double fork, a hop (a parent that
forks and exits) change their parent or group, not the note. The innermost
owner wins (a Ray worker inside a service's tree is the worker's).

A process born and orphaned between two samples was never seen below its
owner. A new orphan (adopted by reaper, not the main child or a service) whose
environment carries Ray's RAY_JOB_ID is its Ray worker's if its stdout is that
worker's log (worker_of_log); else, when an owner ended since the last sample,
a leftover of an unknown owner in its job (reaper/leftovers/jobs.py). One
without the variable is nobody's (the main child's double-forked daemon): never
a leftover; so is one orphaned while every owner lives.

Costs: one dict entry per process below an owner; each Ray worker's name (one
small read) per sample, its title when that changes, its job only when it has
descendants and changed its name; a new orphan's environment once.
"""
from __future__ import annotations

from reaper.leftovers.owners import RAY, SERVICE, UNKNOWN, Owner, raylets
from reaper.procfs.processes import ProcTable, below, read_comm

DEAD_KEPT = 256           # ended Ray workers a late orphan's stdout still attributes to them


class Ended:
    """An owner gone, and its leftovers: [(pid, start)]."""
    __slots__ = ("owner", "keys")

    def __init__(self, owner: Owner, keys: list) -> None:
        self.owner = owner
        self.keys = keys


class Tracker:
    def __init__(self, me: int, ray, jobs) -> None:
        self.me = me
        self.ray = ray                   # reaper.budgets.ray.RayProcesses
        self.jobs = jobs                 # reaper.leftovers.jobs.Jobs
        self.table = ProcTable()
        self.owners: dict = {}           # (pid, start) -> Owner, while alive
        self.owned: dict = {}            # (pid, start) of a live process -> its owner's (pid, start)
        self.samples = 0
        self.dead: dict = {}             # pid -> Owner, of the last DEAD_KEPT Ray workers ended

    def sample(self, now: float, services: dict, kept) -> list:
        """Brings the notes up to date; returns the owners found gone (Ended).
        services: pid -> name of the services running; kept: pids never leftovers
        (the main child, the services)."""
        t = self.table
        old = t.procs
        t.refresh(now, [self.me])
        procs = t.procs
        self.samples += 1
        current: dict = {}               # key -> (kind, name), services first: the innermost wins
        for pid, name in services.items():
            p = procs.get(pid)
            if p is not None:
                current[(pid, p.start)] = (SERVICE, name)
        for r in raylets(t, self.ray):
            for w in t.children.get(r, ()):
                p = procs.get(w)
                if p is not None and p.state not in ("Z", "X"):
                    current.setdefault((w, p.start), (RAY, ""))
        for key, (kind, name) in current.items():
            o = self.owners.get(key)
            if o is None:
                o = self.owners[key] = Owner(key, kind, name)
            desc = below(t.children, [key[0]])
            if kind == RAY:
                # The title whenever it changes (a worker may die before its child is seen);
                # the job, a read of its environment and log, only while it has descendants.
                comm = read_comm(key[0])     # the table's name is its first read's: Ray renames workers
                o.noted(comm)
                if desc:
                    o.job_of(comm, self.jobs)
            if not desc:
                continue
            for d in desc:
                q = procs.get(d)
                if q is not None:
                    self.owned[(d, q.start)] = key
        ended = [self._gone(key) for key, o in list(self.owners.items()) if not _alive(procs, key)]
        orphans = self._new_orphans(old, procs, kept, ended)
        live = {k for k in self.owned if _alive(procs, k)}
        if len(live) != len(self.owned):
            self.owned = {k: v for k, v in self.owned.items() if k in live}
        return [e for e in ended if e.keys] + orphans

    def gone(self, pid: int) -> "Ended | None":
        """An owner reaper saw exit (a service, reaped by reaper): its leftovers now,
        not at the next sample."""
        for key in self.owners:
            if key[0] == pid:
                e = self._gone(key)
                return e if e.keys else None
        return None

    def _gone(self, key: tuple) -> Ended:
        o = self.owners.pop(key)
        keys = [k for k, v in self.owned.items() if v == key]
        for k in keys:
            self.owned[k] = None         # known, nobody's now: not found again as a new orphan
        return Ended(o, keys)

    def _new_orphans(self, old: dict, procs: dict, kept, ended: list) -> list:
        """Processes adopted by reaper since the last sample, never seen below an owner,
        with Ray's variable in their environment. Each is its Ray worker's if its stdout
        is that worker's own log file, worker-<id>-<job>-<pid>.out (a worker's children
        inherit it): noted with the worker if it lives, a leftover of it if it ended.
        Else, if an owner ended since the last sample, a leftover of an unknown owner in
        its job; if none did, nobody's."""
        live = {o.key[0]: o for o in self.owners.values() if o.kind == RAY}
        gone = {e.owner.key[0]: e for e in ended if e.owner.kind == RAY}
        by_job: dict = {}
        found: list = []
        for pid, p in procs.items():
            if p.ppid != self.me or pid in kept or p.state in ("Z", "X"):
                continue
            q = old.get(pid)
            if q is not None and q.start == p.start or (pid, p.start) in self.owned:
                continue
            ray, job = self.jobs.of(pid)
            if not ray or self.ray.kind(pid, p.start) is not None:
                continue                 # nobody's, or Ray's own (an orphaned raylet)
            keys = [(pid, p.start)] + [(d, procs[d].start) for d in below(self.table.children, [pid]) if d in procs]
            worker = worker_of_log(self.jobs.stdout(pid))
            owner = live.get(worker)
            for k in keys:
                self.owned[k] = None if owner is None else owner.key
            if owner is not None:
                continue                 # its worker lives: noted, as if seen below it
            e = gone.get(worker)
            if e is None and worker in self.dead:
                e = Ended(self.dead[worker], [])
                found.append(e)
            if e is not None:
                e.keys.extend(keys)
                if e.owner.job is None:
                    e.owner.job = job    # what the orphan inherited from it
            elif ended:
                by_job.setdefault(job, []).extend(keys)
        for e in ended:
            if e.owner.kind == RAY:
                self.dead[e.owner.key[0]] = e.owner
        while len(self.dead) > DEAD_KEPT:
            del self.dead[next(iter(self.dead))]
        return found + [Ended(Owner((0, 0), UNKNOWN, "", job), keys) for job, keys in by_job.items()]


def worker_of_log(path: str) -> "int | None":
    """The pid in a Ray worker's log file name, worker-<id>-<job>-<pid>.out; None for any
    other path. A name a process chose: it can claim a worker, and so be ended with it,
    never make reaper end another's process."""
    name = path.rpartition("/")[2]
    if not (name.startswith("worker-") and name.endswith(".out")):
        return None
    parts = name[len("worker-"):-len(".out")].split("-")
    if len(parts) != 3 or not parts[2].isascii() or not parts[2].isdigit() or len(parts[2]) > 9:
        return None
    return int(parts[2])


def _alive(procs: dict, key: tuple) -> bool:
    p = procs.get(key[0])
    return p is not None and p.start == key[1] and p.state not in ("Z", "X")

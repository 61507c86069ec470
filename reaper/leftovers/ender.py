"""What happens to one owner's leftovers (an End), by --leftovers:

- report: counted, described in one line, left alone;
- stop: SIGSTOP to each, and to what they forked, until a round finds none new;
  kept stopped for a person to inspect;
- end: SIGTERM at once, device holders first (and to whatever they fork during
  the grace); SIGKILL after --leftover-grace to those alive, by the mechanism
  (reaper/leftovers/mechanisms.py), then sweeps until none is left; then the
  devices are checked: released, or the holder named (one in uninterruptible
  sleep, D, is said to be, and not waited for beyond VERIFY_FOR).

Every signal goes through procctl.signal_one: to (pid, start) only.
"""
from __future__ import annotations

import os

# _signal: the numbers without the enum module.
import _signal as signal

from reaper.procctl import Gone, Handle, signal_one
from reaper.procfs.processes import read_all_children, read_counters, read_stat
from reaper.text import display

SWEEP_EVERY = 0.1        # seconds between sweeps while an end runs
VERIFY_FOR = 2.0         # seconds after the SIGKILL an end waits for its leftovers to go
STOP_ROUNDS = 50         # SIGSTOP rounds at most (each finds the children forked before it)
MAX_LEFTOVERS = 4096     # of one owner, followed at most


def start_of(pid: int) -> "int | None":
    st = read_stat(pid)
    return None if st is None or st[3] in ("Z", "X") else st[1]


class End:
    def __init__(self, ended, mode: str, grace: float, devices, cgroups, now: float, gpus=None) -> None:
        self.owner = ended.owner
        self.mode = mode
        self.devices = devices
        self.cgroups = cgroups           # mechanisms.Cgroups, or None: sweeps
        self.members: dict = {}          # (pid, start) -> devices it held when found
        self.memory = 0                  # resident bytes of the leftovers when found
        self.signalled: set = set()
        self.killed = 0                  # leftovers alive at the SIGKILL
        self.kill_at = now + grace
        self.verify_until = None
        self.cgroup = None
        self.done = False
        self.result = ""
        for key in ended.keys[:MAX_LEFTOVERS]:
            self._add(key)
        # --gpu-memory (gpumem.Gpus): device -> [in use at the owner's end, after, the leftovers' own]
        self.gpus = gpus
        self.gpu: dict = {}
        if gpus is not None:
            for d in self.held:
                mine = gpus.by_pid(d)
                self.gpu[d] = [gpus.used(d), None, sum(mine.get(k[0], 0) for k in self.members) or None]

    def gpu_after(self) -> None:
        """The GPUs' memory in use now, after the end (or the report)."""
        for d, row in self.gpu.items():
            row[1] = self.gpus.used(d)

    def _add(self, key: tuple) -> bool:
        if key in self.members or len(self.members) >= MAX_LEFTOVERS:
            return False
        c = read_counters(*key)
        if c is None or c.state in ("Z", "X"):
            return False
        self.members[key] = self.devices.held_by(key[0])
        self.memory += c.rss
        return True

    @property
    def held(self) -> list:
        return sorted({d for ds in self.members.values() for d in ds})

    def holders(self) -> int:
        return sum(1 for ds in self.members.values() if ds)

    def alive(self) -> list:
        return [k for k in self.members if start_of(k[0]) == k[1]]

    def _grow(self) -> list:
        """Adds what the members forked since (their children, recursively); the new keys."""
        new, todo = [], [k[0] for k in self.alive()]
        while todo:
            for c in read_all_children(todo.pop()):
                s = start_of(c)
                if s is not None and self._add((c, s)):
                    new.append((c, s))
                    todo.append(c)
        return new

    # --- the modes --------------------------------------------------------------------

    def begin(self) -> None:
        if self.mode == "stop":
            self._stop_all()
            self.done = True
            self.result = "stopped (SIGSTOP, kept)"
        elif self.mode == "end":
            if self.cgroups is not None:
                try:
                    self.cgroup = self.cgroups.make()
                except OSError:
                    self.cgroup = None
            self._term(list(self.members))
        else:
            self.done = True
            self.result = "reported (--leftovers report)"

    def _order(self, keys) -> list:
        """Device holders first: their release is what the next run waits for."""
        return sorted(keys, key=lambda k: not self.members.get(k))

    def _term(self, keys) -> None:
        for key in self._order(keys):
            if self.cgroup is not None:
                try:
                    self.cgroups.move(self.cgroup, Handle.unchecked(*key))
                except (Gone, OSError):
                    pass
            if key not in self.signalled:
                self.signalled.add(key)
                signal_one(key[0], key[1], signal.SIGTERM)
                signal_one(key[0], key[1], signal.SIGCONT)    # a stopped one must run to end

    def _stop_all(self) -> None:
        for _ in range(STOP_ROUNDS):
            for key in self._order(self.members):
                if key not in self.signalled:
                    self.signalled.add(key)
                    signal_one(key[0], key[1], signal.SIGSTOP)
            if not self._grow():
                return

    def _kill(self) -> None:
        alive = self.alive()
        self.killed = len(alive)
        if self.cgroup is not None:
            try:
                self.cgroups.kill(self.cgroup, lambda pid: _kill_pid(pid))
            except OSError:
                pass
        self.signalled = set()
        self._stop_all()               # what no cgroup holds: stopped, then killed
        for key in self._order(self.alive()):
            signal_one(key[0], key[1], signal.SIGKILL)

    def tick(self, now: float) -> None:
        """One sweep: new forks get their SIGTERM; at kill_at the SIGKILL; then the check."""
        if self.done:
            return
        if self.verify_until is None:
            new = self._grow()
            if new:
                self._term(new)
            if not self.alive():
                self._finish("ended by SIGTERM")
                return
            if now >= self.kill_at:
                self._kill()
                self.verify_until = now + VERIFY_FOR
            return
        self._grow()
        left = self.alive()
        for key in left:
            signal_one(key[0], key[1], signal.SIGKILL)
        if not left:
            self._finish(f"SIGTERM, SIGKILL to {self.killed} after the grace")
        elif now >= self.verify_until:
            self._finish(f"SIGTERM, SIGKILL to {self.killed} after the grace; {len(left)} still there")

    def _finish(self, what: str) -> None:
        self.done = True
        self.result = what
        if self.cgroup is not None and self.cgroups.remove(self.cgroup):
            self.cgroup = None

    def release(self) -> str:
        """After an end: 'released', or who still holds which device."""
        if not self.held:
            return ""
        still = []
        for key in self.alive():
            ds = self.devices.held_by(key[0])
            if ds:
                c = read_counters(*key)
                d_state = " (in uninterruptible sleep, D: in the driver)" if c is not None and c.state == "D" else ""
                still.append(f"{key[0]} holds {', '.join(display(d) for d in ds)}{d_state}")
        return "devices released" if not still else "devices NOT released: " + "; ".join(still)

    def still_holding(self) -> dict:
        """device -> leftovers of this end holding it now (for the metrics)."""
        out: dict = {}
        for key in self.alive():
            for d in self.devices.held_by(key[0]):
                out[d] = out.get(d, 0) + 1
        return out

    def close(self) -> None:
        if self.cgroup is not None:
            self.cgroups.remove(self.cgroup)
            self.cgroup = None


def _kill_pid(pid: int) -> None:
    """SIGKILL to a member of a frozen cgroup: frozen, it can neither exit nor have
    its pid reused, so the pid names it."""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass

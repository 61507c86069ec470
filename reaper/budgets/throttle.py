"""Hard CPU caps for strays: the cgroup CPU controller when reaper may create
cgroups, SIGSTOP/SIGCONT duty-cycling otherwise.

Cgroup layout, made on first need and removed at exit:
    <reaper's own cpu cgroup>/reaper-strays.<id>/        quota: --cpu-budget-total (or none)
                                                         (owned: cgroupfs.make_owned)
        shared/                                          strays capped by the total only
        s<pid>.<start>/                                  quota: --cpu-budget (a lineage: its first member's)
"""
from __future__ import annotations

import os
import time

# _signal: the numbers and pidfd_send_signal without the enum module (start-up time and memory).
import _signal as signal

from reaper import signals as _signals
from reaper.budgets.cgroupfs import Unavailable, close_fd, delegate_v2, dir_in, dying_descendants, make_owned, \
    read as _read, remove, remove_tree, rmdir, why as _why, write as _write
from reaper.procfs.cgroups import cgroup_dir as _cgroup_dir, mounts as _mounts, own_paths as _own_paths

__all__ = ["CgroupThrottle", "DutyCycler", "Unavailable"]

PERIOD_US = 100_000          # CFS bandwidth period, the kernel's default
CLK_TCK = os.sysconf("SC_CLK_TCK")
DUTY_PERIOD = 0.1            # seconds per run/stop cycle (cpulimit uses 0.1 s too)
CHECK_EVERY = 3              # a stopped member's CPU is read as it is resumed every this many periods
CHECKED_MIN = 0.5            # seconds of its stops checked before ran_stopped judges a member
MIN_FRACTION = 0.01


class CgroupThrottle:
    """A cgroup (v1 cpu or v2) of reaper's own holding the capped strays."""

    def __init__(self, version: int, parent: str, mount=None) -> None:
        self.version = version
        self.kind = f"cgroup_v{version}"
        self.parent = parent                     # reaper's own cgroup: strays go back here
        self.mount = mount                       # the hierarchy's mount (procfs.cgroups.Mount)
        self.base = ""                           # made by _create
        self.fd: int | None = None               # holds the owner's lock on base
        self.leaves: set = set()                 # leaf dirs made and not removed
        self.total: float | None = None          # the base's quota (--cpu-budget-total), cores
        self._throttled: dict = {}               # dir -> last throttled time seen

    # --- setup -----------------------------------------------------------

    @classmethod
    def probe(cls, skip_v2: bool = False) -> "CgroupThrottle":
        """The first mechanism that works, v2 then v1; Unavailable says why none does.
        skip_v2: the v2 hierarchy holds the strays' memory cgroups (a process is in
        one v2 cgroup only)."""
        reasons = []
        found = _mounts()
        own = _own_paths()
        for version in (2, 1):
            if version == 2 and skip_v2:
                reasons.append("cgroup v2: taken by the memory caps")
                continue
            if version == 2:
                cands = [m for m in found if m.version == 2]
                path = own.get("")
            else:
                cands = [m for m in found if m.version == 1 and "cpu" in m.options]
                path = own.get("cpu")
            if not cands or path is None:
                reasons.append(f"no cgroup v{version}{' cpu' if version == 1 else ''} hierarchy")
                continue
            parent = _cgroup_dir(cands[0], path)
            if parent is None:
                reasons.append(f"cgroup v{version}: reaper's cgroup {path} is outside the mounted hierarchy")
                continue
            t = cls(version, parent, cands[0])
            try:
                t._create()
                return t
            except Unavailable as e:
                reasons.append(f"cgroup v{version}: {e}")
        raise Unavailable("; ".join(reasons))

    def _create(self) -> None:
        if self.version == 2:
            delegate_v2(self.parent, "cpu")
        try:
            self.base, self.fd = make_owned(self.parent)
        except OSError as e:
            raise Unavailable(_why(e, self.parent)) from None
        try:
            if self.version == 2:
                _write(os.path.join(self.base, "cgroup.subtree_control"), "+cpu")
            else:
                _write(os.path.join(self.base, "cpu.cfs_period_us"), str(PERIOD_US))
            self._set_quota(self.base, None)
        except OSError as e:
            rmdir(self.base)
            close_fd(self.fd)
            self.fd = None
            raise Unavailable(f"{self.base}: {e.strerror}") from None

    def _set_quota(self, d: str, cores: float | None) -> None:
        quota = -1 if cores is None else max(1000, int(cores * PERIOD_US))
        if self.version == 2:
            _write(os.path.join(d, "cpu.max"), f"{'max' if quota < 0 else quota} {PERIOD_US}")
        else:
            if quota >= 0:
                _write(os.path.join(d, "cpu.cfs_period_us"), str(PERIOD_US))
            _write(os.path.join(d, "cpu.cfs_quota_us"), str(quota))

    # --- use -------------------------------------------------------------

    def set_total(self, cores: float | None) -> None:
        self._set_quota(self.base, cores)
        self.total = cores

    def leaf(self, key: tuple, cores: float | None) -> str:
        d = self.leaf_dir(key, cores)
        if cores is not None and self.total is not None:
            # cgroup v1 refuses a child's quota above its parent's (EINVAL); the
            # parent's caps it anyway, in v2 too.
            cores = min(cores, self.total)
        if not os.path.isdir(d):
            os.mkdir(d)
            self.leaves.add(d)
            if self.version == 1:
                _write(os.path.join(d, "cpu.cfs_period_us"), str(PERIOD_US))
        self._set_quota(d, cores)
        return d

    def leaf_dir(self, key: tuple, cores: float | None) -> str:
        """The leaf of lineage key (its root's (pid, start)) at its own budget (cores),
        or the shared one (cores None: held by the total only)."""
        return os.path.join(self.base, "shared" if cores is None else f"s{key[0]}.{key[1]}")

    def move(self, pid: int, d: str) -> None:
        _write(os.path.join(d, "cgroup.procs"), str(pid))

    def dir_of(self, data: bytes | None) -> str | None:
        """The cpu cgroup directory a process is in, from its /proc/PID/cgroup (data);
        None where that cannot be told."""
        return dir_in(data, self.mount, self.version, "cpu")

    def pressing(self, d: str) -> bool:
        """True if the cgroup hit its quota since the last call."""
        try:
            for line in _read(os.path.join(d, "cpu.stat")).splitlines():
                k, _, v = line.partition(" ")
                if k in ("throttled_time", "throttled_usec"):
                    last = self._throttled.get(d)
                    self._throttled[d] = int(v)
                    return last is not None and int(v) > last
        except OSError:
            pass
        return False

    def drop_leaf(self, d: str) -> None:
        self._throttled.pop(d, None)
        if os.path.basename(d) != "shared" and self._rmdir(d):
            self.leaves.discard(d)

    @staticmethod
    def _rmdir(d: str) -> bool:
        return remove(d)        # reclaimed first where the leaf has a memory controller

    def live(self) -> int:
        """The cgroups reaper holds here: the base and its leaves."""
        return (1 + len(self.leaves)) if self.base else 0

    def dying(self) -> int | None:
        """Cgroups removed below the base that the kernel still holds (v2); None on v1."""
        return dying_descendants(self.base) if self.base and self.version == 2 else None

    def close(self) -> list:
        """Moves any process still inside back to reaper's own cgroup, removes
        every cgroup made; returns the directories that could not be removed.
        Never sleeps (it runs on the loop's path): a process moved out has left by
        the second pass, and the drain has reaped everything before this runs."""
        try:
            return remove_tree(self.base, self.parent)
        finally:
            self.leaves.clear()
            close_fd(self.fd)
            self.fd = None


class DutyCycler:
    """cpulimit's method: in every DUTY_PERIOD a throttled stray runs for its
    fraction, then is stopped until the next period. All members share one
    period, so the loop wakes at most 1 + len(members) times per period.

    A member that cannot be signalled leaves the cycle at once (what cannot be
    stopped is not stopped; what cannot be resumed cannot be helped), so one
    member's fault never holds up the others and no deadline stays in the past.
    Faults other than Gone are kept in `faults` for the enforcer to take."""

    def __init__(self) -> None:
        self.members: dict = {}        # key -> Member
        self.period_start = 0.0
        self.periods = 0               # periods begun (every CHECK_EVERY-th checks the stopped ones)
        self.faults: list = []         # (key, signal name, OSError): members dropped for it
        # (key, CPU seconds, boot ticks) of members found gone (they may have forked first):
        # their CPU as read when last stopped (None if never), and when that was.
        self.lost: list = []

    class Group:
        """Members stopped and resumed together (a lineage): the time any one of them
        was held stopped, counted once however many they are and however they change."""
        __slots__ = ("stopped_at", "stopped_total")

        def __init__(self) -> None:
            self.stopped_at: float | None = None
            self.stopped_total = 0.0

        def stopped(self, now: float) -> float:
            return self.stopped_total + (now - self.stopped_at if self.stopped_at is not None else 0.0)

        def _resumed(self, now: float) -> None:
            if self.stopped_at is not None:
                self.stopped_total += now - self.stopped_at
                self.stopped_at = None

    class Member:
        __slots__ = ("handle", "fraction", "stopped_at", "stopped_total", "group", "cpu", "cpu_ticks",
                     "ran", "checked")

        def __init__(self, handle, group=None) -> None:
            self.handle = handle
            self.fraction = 1.0
            self.stopped_at: float | None = None
            self.stopped_total = 0.0   # seconds this stray spent stopped by us
            self.group = group
            self.cpu: float | None = None        # its CPU seconds when last stopped, and when (boot ticks)
            self.cpu_ticks = 0
            self.ran = 0.0             # CPU seconds it used while stopped (someone sent it SIGCONT)...
            self.checked = 0.0         # ...over this many seconds of its stops (ran_stopped)

    def set(self, key: tuple, handle, fraction: float, now: float, group: "DutyCycler.Group | None" = None) -> None:
        m = self.members.get(key)
        if m is None:
            m = self.members[key] = self.Member(handle, group)
            if len(self.members) == 1:
                self.period_start = now
        m.fraction = min(1.0, max(MIN_FRACTION, fraction))

    def stopped_total(self, key: tuple, now: float) -> float:
        m = self.members.get(key)
        if m is None:
            return 0.0
        return m.stopped_total + (now - m.stopped_at if m.stopped_at is not None else 0.0)

    def take_faults(self) -> list:
        out, self.faults = self.faults, []
        return out

    def take_lost(self) -> list:
        out, self.lost = self.lost, []
        return out

    def release(self, key: tuple, now: float) -> None:
        """Stops duty-cycling key; resumes it if it is stopped."""
        m = self.members.pop(key, None)
        if m is not None and m.stopped_at is not None:
            self._cont(key, m, now)

    def forget(self, key: tuple) -> None:
        m = self.members.pop(key, None)
        if m is not None and m.stopped_at is not None and m.group is not None:
            m.group._resumed(time.monotonic())

    def _send(self, key: tuple, m, signo: int) -> bool:
        """signo to a member; False if it did not arrive (the process is gone, or
        reaper may not signal it: then the fault is kept)."""
        from reaper.procctl import Gone

        try:
            m.handle.signal(signo)
            return True
        except Gone:
            self.lost.append((key, m.cpu, m.cpu_ticks))
            return False
        except OSError as e:               # NotPermitted, or anything else the OS says
            self.faults.append((key, _signals.name(signo), e))
            return False

    def ran_stopped(self, key: tuple) -> float | None:
        """The share of the time key was held stopped that it ran all the same (another
        process resumed it: SIGCONT), once CHECKED_MIN seconds of its stops were checked;
        None before, or if it is not in the cycle."""
        m = self.members.get(key)
        if m is None or m.checked < CHECKED_MIN:
            return None
        return m.ran / m.checked

    def _check(self, m, now: float) -> None:
        """m, stopped since m.stopped_at, is about to be resumed: the CPU it used meanwhile
        (none if it stayed stopped; a short read of its stat, every CHECK_EVERY periods)."""
        if m.cpu is None:
            return
        try:
            cpu = m.handle.cpu_seconds()
        except OSError:                     # Gone, NotPermitted: the resume says what happened
            return
        m.ran += max(0.0, cpu - m.cpu)
        m.checked += now - m.stopped_at

    def _cont(self, key: tuple, m, now: float, check: bool = False) -> bool:
        if check:
            self._check(m, now)
        m.stopped_total += now - m.stopped_at
        m.stopped_at = None
        if m.group is not None:
            m.group._resumed(now)
        return self._send(key, m, signal.SIGCONT)

    def _stop_at(self, m) -> float:
        return self.period_start + m.fraction * DUTY_PERIOD

    def next_deadline(self) -> float | None:
        if not self.members:
            return None
        due = self.period_start + DUTY_PERIOD
        for m in self.members.values():
            if m.stopped_at is None and m.fraction < 1.0:
                due = min(due, self._stop_at(m))
        return due

    def _next_period(self, now: float) -> None:
        # Keep the cadence unless the loop fell far behind.
        self.period_start += DUTY_PERIOD
        if now - self.period_start >= DUTY_PERIOD:
            self.period_start = now
        self.periods += 1
        check = self.periods % CHECK_EVERY == 0
        for key, m in list(self.members.items()):
            if m.stopped_at is not None and not self._cont(key, m, now, check):
                del self.members[key]

    def step(self, now: float) -> None:
        """Resumes everything at a period's start, stops each member whose run time
        is over. Afterwards every deadline lies ahead: each member due was stopped
        or has left the cycle."""
        if not self.members:
            return
        if now >= self.period_start + DUTY_PERIOD:
            self._next_period(now)
        for key, m in list(self.members.items()):
            if m.stopped_at is None and m.fraction < 1.0 and now >= self._stop_at(m):
                if self._send(key, m, signal.SIGSTOP):
                    m.stopped_at = now
                    if m.group is not None:
                        if m.group.stopped_at is None:
                            m.group.stopped_at = now
                        self._read_cpu(m)
                else:
                    del self.members[key]

    @staticmethod
    def _read_cpu(m) -> None:
        """A lineage's member's CPU as it stops: if it forks and exits before the next
        sample, its lineage still counts what it used (a short read of its stat)."""
        try:
            m.cpu = m.handle.cpu_seconds()
            m.cpu_ticks = int(time.clock_gettime(time.CLOCK_BOOTTIME) * CLK_TCK)
        except OSError:                     # Gone, NotPermitted: nothing to keep
            pass

    def close(self, now: float) -> None:
        """Resumes every stopped member, whatever happens to the others: an
        unexpected error is raised only once all have been tried."""
        error = None
        for key in list(self.members):
            try:
                self.release(key, now)
            except Exception as e:          # a bug: raise it, after the rest are resumed
                error = error or e
        if error is not None:
            raise error

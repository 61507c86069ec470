"""Memory caps for strays (--budget-action throttle): a memory cgroup of reaper's own,
so that reclaim and the OOM killer act inside it and never on the main tree.

    <reaper's own memory cgroup>/reaper-strays.<id>/     limit: --memory-budget-total
        m<n>/                                            limit: --memory-budget (one stray each)

Memory already charged does not move with a process (cgroup v2 never moves it; v1
would only with move_charge_at_immigrate, which recent kernels refuse): a leaf's
limit caps what its stray allocates after the move, and the enforcer judges what
it holds in all. Swap is capped too where the kernel has the files (v2
memory.swap.max, v1 memsw), best effort.

Leaves are pooled, not made and removed per stray: a stray's page cache stays
charged to its leaf after it exits, and a leaf removed then would linger in the
kernel as a dying cgroup, one per stray, which is how a node ends up with tens of
thousands of them. A leaf whose stray is gone goes back to the pool for the next
stray (the kernel reclaims the old cache under the new stray's limit as needed);
at most FREE_MAX wait there, the rest are reclaimed (cgroupfs.reclaim) and
removed as they come free (TRIM_TIME of the loop a sample at most: those that hold
nothing cost a rmdir), and at exit all are, reclaimed first (waiting up to
EXIT_PATIENCE for the disk). A burst of strays makes at most MAKE_EACH leaves a sample
(the kind moves the rest in later samples: memory.py): a leaf made costs the loop
about 0.2 ms, and thousands made at once held reaping for a second (issue 33.12).
"""
from __future__ import annotations

import errno
import os
import time

from reaper.budgets.cgroupfs import Unavailable, close_fd, delegate_v2, dir_in, dying_descendants, make_owned, \
    mount_of, reclaim, remove_tree, rmdir, unwritten, why, write
from reaper.procfs.cgroups import own_dir

FREE_MAX = 4              # free leaves kept for the next strays
TRIM_EACH = 2             # free leaves tried per sample at least, whatever the time
TRIM_TIME = 0.01          # seconds of the loop a sample's removals may take at most (then the next sample)
MAKE_EACH = 32            # new leaves made per sample at most
UNWRITTEN_MAX = 8 << 20   # a free leaf with more dirty page cache waits for the flusher before its reclaim
# Seconds reaper's exit waits at most for its leaves' page cache to be written (and, on v2,
# the filesystem's journal to commit their metadata: ext4 every 5 s) before it removes them.
EXIT_PATIENCE = 6.0


class MemoryCgroup:
    def __init__(self, version: int, parent: str) -> None:
        self.version = version
        self.kind = f"cgroup_v{version}"
        self.parent = parent
        self.base = ""
        self.fd: int | None = None
        self.in_use: set = set()         # leaves holding a stray
        self.free: list = []             # leaves waiting for the next stray
        self.made = 0                    # leaves made: names m1, m2, ...
        self.made_now = 0                # ... of them at this sample (MAKE_EACH at most: may_take)
        self.mount = mount_of(parent, version, "memory")   # where /proc/PID/cgroup's paths lie

    @classmethod
    def probe(cls, skip_v2: bool = False, total: int | None = None) -> "MemoryCgroup":
        """v2, then v1, its base limited to total; Unavailable says why neither can be
        used. skip_v2: the v2 hierarchy holds the strays' cpu cgroups (a process is
        in one v2 cgroup only)."""
        reasons = []
        for version, controller in ((2, ""), (1, "memory")):
            if version == 2 and skip_v2:
                reasons.append("cgroup v2: taken by the cpu caps")
                continue
            where = own_dir(controller)
            if where is None or where[0] != version:
                reasons.append(f"no cgroup v{version}{' memory' if version == 1 else ''} hierarchy")
                continue
            m = cls(version, where[1])
            try:
                m._create(total)
                return m
            except Unavailable as e:
                reasons.append(f"cgroup v{version}: {e}")
        raise Unavailable("; ".join(reasons))

    def _create(self, total: int | None) -> None:
        if self.version == 2:
            delegate_v2(self.parent, "memory")
        try:
            self.base, self.fd = make_owned(self.parent)
        except OSError as e:
            raise Unavailable(why(e, self.parent)) from None
        try:
            if self.version == 2:
                write(os.path.join(self.base, "cgroup.subtree_control"), "+memory")
            else:
                try:
                    write(os.path.join(self.base, "memory.use_hierarchy"), "1")
                except OSError:
                    pass                # always hierarchical on recent kernels
            if total is not None:
                self.set_limit(self.base, total)
        except OSError as e:
            self.close()
            raise Unavailable(f"{self.base}: {e.strerror}") from None

    # --- limits ------------------------------------------------------------

    def set_limit(self, d: str, limit: int | None) -> None:
        if self.version == 2:
            write(os.path.join(d, "memory.max"), "max" if limit is None else str(limit))
            try:
                write(os.path.join(d, "memory.swap.max"), "max" if limit is None else "0")
            except OSError:
                pass
            return
        text = "-1" if limit is None else str(limit)
        memsw = os.path.join(d, "memory.memsw.limit_in_bytes")
        # memsw must stay >= the limit: raise it first when raising, lower it after.
        if limit is None:
            self._try(memsw, text)
        write(os.path.join(d, "memory.limit_in_bytes"), text)
        if limit is not None:
            self._try(memsw, text)

    @staticmethod
    def _try(path: str, text: str) -> None:
        try:
            write(path, text)
        except OSError:
            pass

    def oom_kills(self, d: str) -> int:
        """Processes the kernel's OOM killer killed inside d, ever (leaves are reused:
        compare with the count when the stray moved in)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            with open(os.path.join(d, name)) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == "oom_kill":
                        return int(v)
        except (OSError, ValueError):
            pass
        return 0

    # --- the pool of leaves ---------------------------------------------------

    def new_sample(self) -> None:
        self.made_now = 0

    def may_take(self) -> bool:
        """A leaf can be had at this sample: a free one, or a new one within MAKE_EACH."""
        return bool(self.free) or self.made_now < MAKE_EACH

    def take_leaf(self, limit: int | None) -> str:
        """A leaf for one stray, limited to limit: a free one, else a new one."""
        d = self.free.pop() if self.free else self._new_leaf()
        try:
            try:
                self.set_limit(d, limit)
            except OSError as e:
                # v1 refuses a limit below what is charged already (EBUSY): the old
                # stray's page cache. Reclaim it, then try once more.
                if e.errno not in (errno.EBUSY, errno.EINVAL):
                    raise
                reclaim(d)
                self.set_limit(d, limit)
        except OSError:
            self.free.append(d)
            raise
        self.in_use.add(d)
        return d

    def _new_leaf(self) -> str:
        self.made += 1
        self.made_now += 1
        d = os.path.join(self.base, f"m{self.made}")
        os.mkdir(d)
        return d

    def give_back(self, d: str) -> None:
        """d's stray is gone or moved out: d waits for the next one."""
        self.in_use.discard(d)
        if d not in self.free:
            self.free.append(d)

    def trim(self) -> None:
        """Removes free leaves beyond FREE_MAX, as many as TRIM_TIME allows (TRIM_EACH
        tried at least), each only once its reclaim left nothing charged: cgroup v2's
        reclaim does not write dirty page cache back (it wakes the flusher, and the next
        sample's reclaim frees it), and shared memory (tmpfs) cannot be reclaimed
        without swap; such a leaf waits in the pool rather than linger as a dying
        cgroup. A leaf with much unwritten page cache is not even reclaimed (v1's
        reclaim would wait for the disk)."""
        if len(self.free) <= FREE_MAX:
            return
        end = time.monotonic() + TRIM_TIME
        for n, d in enumerate(list(self.free)):
            if len(self.free) <= FREE_MAX or (n >= TRIM_EACH and time.monotonic() >= end):
                return
            if unwritten(d) > UNWRITTEN_MAX:
                continue
            if reclaim(d) and rmdir(d):
                self.free.remove(d)

    def live(self) -> int:
        """The cgroups reaper holds here: the base and every leaf."""
        return (1 + len(self.in_use) + len(self.free)) if self.base else 0

    def dying(self) -> int | None:
        """Cgroups removed below the base that the kernel still holds (v2); None on v1."""
        return dying_descendants(self.base) if self.base and self.version == 2 else None

    def move(self, pid: int, d: str) -> None:
        write(os.path.join(d, "cgroup.procs"), str(pid))

    def dir_of(self, data: bytes | None) -> str | None:
        """The memory cgroup directory a process is in, from its /proc/PID/cgroup (data);
        None where that cannot be told."""
        return dir_in(data, self.mount, self.version, "memory")

    def close(self) -> list:
        """Removes every leaf and the base, each reclaimed first, waiting up to
        EXIT_PATIENCE for what the flusher must write first (remove_tree); returns what
        could not be removed."""
        try:
            return remove_tree(self.base, self.parent, EXIT_PATIENCE) if self.base else []
        finally:
            self.in_use.clear()
            self.free.clear()
            close_fd(self.fd)
            self.fd = None


"""Memory caps for strays (--budget-action throttle): a memory cgroup of reaper's own,
so that reclaim and the OOM killer act inside it and never on the main tree.

    <reaper's own memory cgroup>/reaper-strays.<id>/     limit: what --memory-budget-total leaves
        s<pid>.<start>/                                  limit: what --memory-budget leaves

Memory already charged does not move with a process (cgroup v2 never moves it; v1
would only with move_charge_at_immigrate, which recent kernels refuse). A stray
moved in with R bytes resident keeps R charged where it was, so its leaf gets
budget - R: the stray never holds more than its budget in all. Swap is capped the
same way where the kernel has the files (v2 memory.swap.max, v1 memsw), best effort.
"""
from __future__ import annotations

import errno
import os
from typing import Optional

from reaper.budgets.cgroupfs import Unavailable, delegate_v2, close_fd, make_owned, own_dir, read, remove_tree, rmdir, \
    why, write


class MemoryCgroup:
    def __init__(self, version: int, parent: str) -> None:
        self.version = version
        self.kind = f"cgroup_v{version}"
        self.parent = parent
        self.base = ""
        self.fd: Optional[int] = None
        self.base_limit: Optional[int] = None

    @classmethod
    def probe(cls, skip_v2: bool = False) -> "MemoryCgroup":
        """v2, then v1; Unavailable says why neither can be used. skip_v2: the v2
        hierarchy holds the strays' cpu cgroups (a process is in one v2 cgroup only)."""
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
                m._create()
                return m
            except Unavailable as e:
                reasons.append(f"cgroup v{version}: {e}")
        raise Unavailable("; ".join(reasons))

    def _create(self) -> None:
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
        except OSError as e:
            self.close()
            raise Unavailable(f"{self.base}: {e.strerror}") from None

    # --- limits ------------------------------------------------------------

    def set_limit(self, d: str, limit: Optional[int]) -> None:
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

    def set_total(self, limit: Optional[int]) -> None:
        """The base's limit; OSError (EBUSY) when more is charged there already."""
        if limit != self.base_limit:
            self.set_limit(self.base, limit)
            self.base_limit = limit

    def usage(self, d: str) -> int:
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        try:
            return int(read(os.path.join(d, name)))
        except (OSError, ValueError):
            return 0

    def leaf(self, key: tuple, limit: Optional[int]) -> str:
        d = os.path.join(self.base, f"s{key[0]}.{key[1]}")
        try:
            os.mkdir(d)
        except FileExistsError:
            pass
        try:
            self.set_limit(d, limit)
        except OSError:
            rmdir(d)
            raise
        return d

    def move(self, pid: int, d: str) -> None:
        write(os.path.join(d, "cgroup.procs"), str(pid))

    def oom_kills(self, d: str) -> int:
        """Processes the kernel's OOM killer killed inside d."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in read(os.path.join(d, name)).splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
        except (OSError, ValueError):
            pass
        return 0

    def drop_leaf(self, d: str) -> None:
        if not rmdir(d):
            # A dead stray's pages may still be charged for a moment: the next
            # close() pass or reaper's exit removes it.
            pass

    def close(self) -> list:
        try:
            return remove_tree(self.base, self.parent) if self.base else []
        finally:
            close_fd(self.fd)
            self.fd = None


def refused_limit(e: OSError) -> bool:
    """A limit below what is charged already (v1 answers EBUSY)."""
    return e.errno in (errno.EBUSY, errno.EINVAL)

"""What the cgroup caps (cpu, memory) share: the mounted hierarchies, reaper's own
cgroups in them, and the directories reaper makes there.

Every directory reaper makes is named ``reaper-strays.<random>`` (the leftovers'
ends: ``reaper-leftovers.<random>``) and is *owned*:
reaper holds an exclusive flock(2) on it for as long as it lives. The kernel drops
the lock when the holder dies, SIGKILL included, so "its creator is gone" is
decided by the lock alone, whatever PID namespace, container or pid the creator
had (pids repeat across namespaces; a lock does not). cleanup.py removes the
empty ones nobody holds.
"""
from __future__ import annotations

import errno
import fcntl
import os
import time

from reaper.procfs.cgroups import cgroup_dir, mounts, parse_pid_cgroup, path_in, read_cgroup_stat

PREFIX = "reaper-strays."


class Unavailable(Exception):
    """This mechanism cannot be used here; the message says why."""


def write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def why(e: OSError, path: str) -> str:
    if e.errno == errno.EROFS:
        return f"{path} is read-only"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"{path} is not writable by uid {os.getuid()}"
    return f"{path}: {e.strerror}"


def delegate_v2(parent: str, controller: str) -> None:
    """Makes controller available to the cgroups reaper creates below parent (cgroup v2),
    or raises Unavailable saying why."""
    try:
        ctrls = read(os.path.join(parent, "cgroup.controllers")).split()
    except OSError as e:
        raise Unavailable(why(e, parent)) from None
    if controller not in ctrls:
        raise Unavailable(f"{controller} controller not delegated to {parent}")
    try:
        if controller not in read(os.path.join(parent, "cgroup.subtree_control")).split():
            write(os.path.join(parent, "cgroup.subtree_control"), f"+{controller}")
    except OSError as e:
        # EBUSY: the no-internal-processes rule (reaper's cgroup holds processes).
        raise Unavailable(f"cannot enable {controller} below {parent}: {e.strerror}") from None


def lock(fd: int) -> bool:
    """Takes the owner's lock on a directory without waiting; False if someone holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise


def make_owned(parent: str, prefix: str = PREFIX) -> tuple:
    """(path, fd): a new <prefix><random> directory under parent (reaper-strays. by
    default; reaper-leftovers. for the leftovers' ends), locked by this process
    through fd (close fd only after removing the directory).

    A cleaner in another reaper may take the lock of a brand-new directory in the
    instant before its creator does, find it empty and remove it: so the creator
    retries (a new name) until it holds the lock of a directory that still exists.
    Raises OSError when mkdir fails."""
    for _ in range(5):
        path = os.path.join(parent, prefix + os.urandom(4).hex())
        os.mkdir(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue                    # a cleaner removed it already
        held = False
        for _ in range(100):            # a cleaner holds it for a few system calls at most
            if lock(fd):
                held = True
                break
            os.sched_yield()
        try:
            if held and os.fstat(fd).st_ino == os.stat(path).st_ino:
                return path, fd
        except FileNotFoundError:
            pass
        os.close(fd)
        rmdir(path)
    raise OSError(errno.EBUSY, f"could not keep a directory under {parent}")


def rmdir(d: str) -> bool:
    try:
        os.rmdir(d)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def procs(d: str) -> list:
    try:
        return [int(p) for p in read(os.path.join(d, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


# --- memory still charged to a cgroup reaper removes ---------------------------------
#
# A memory cgroup removed while pages are charged to it (the page cache of files its
# processes wrote) is gone from the tree but not from the kernel: it lingers as a
# dying cgroup until memory pressure reclaims those pages, which may be never. Tens
# of thousands of them cost a node's kernel a core (the incident behind reaper). So
# reaper reclaims what is charged to a cgroup of its own before it removes it.

def reclaim(d: str) -> bool:
    """Reclaims what is charged to d, a cgroup reaper made and emptied: cgroup v1's
    memory.force_empty (which also writes dirty pages back: about 2 ms for 2 MB on
    a local disk), v2's memory.reclaim (kernel 5.19+). Nothing where d has no memory
    controller or still holds a process. True if d holds (almost) nothing now or
    never had the controller; best effort, never raises."""
    if procs(d):
        return False
    if memory_charged(d) <= RECLAIMED and page_cache(d) == 0:
        return True                     # nothing a reclaim would free (a leaf of short-lived strays)
    try:
        if os.path.exists(os.path.join(d, "memory.force_empty")):
            write(os.path.join(d, "memory.force_empty"), "0")
        elif os.path.exists(os.path.join(d, "memory.reclaim")):
            charged = memory_charged(d)
            if charged:
                write(os.path.join(d, "memory.reclaim"), str(charged))
        else:
            return True
    except OSError:
        pass                            # EAGAIN: not all of it could be reclaimed
    # No page cache left (one page would keep a removed cgroup dying), and what is left
    # is small: kernel objects, which the kernel hands to the parent at removal.
    return page_cache(d) == 0 and memory_charged(d) <= RECLAIMED


RECLAIMED = 1 << 20     # what may stay charged after a reclaim: kernel objects, not page cache
RECLAIM_RETRY = 0.02    # seconds between two reclaims of what a first one left (the flusher writes meanwhile)


def memory_charged(d: str) -> int:
    """Bytes charged to memory cgroup d (0 where it has no memory controller)."""
    for name in ("memory.current", "memory.usage_in_bytes"):
        try:
            return int(read(os.path.join(d, name)))
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            return 0
    return 0


def page_cache(d: str) -> int:
    """Page cache (files, tmpfs) charged to memory cgroup d, in bytes: v2 memory.stat's
    `file`, v1's `total_cache`; 0 where d has no memory controller."""
    return _memory_stat(d, ("file", "total_cache"))


def unwritten(d: str) -> int:
    """Dirty and writeback page cache charged to memory cgroup d, in bytes: what a
    reclaim of d would have to wait for the disk to write."""
    return _memory_stat(d, ("total_dirty", "total_writeback", "file_dirty", "file_writeback"))


def _memory_stat(d: str, keys: tuple) -> int:
    """The sum of keys in d's memory.stat (0 where there is none)."""
    try:
        text = read(os.path.join(d, "memory.stat"))
    except OSError:
        return 0
    n = 0
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k in keys:
            try:
                n += int(v)
            except ValueError:
                pass
    return n


def dying_descendants(d: str) -> "int | None":
    """Removed cgroups below v2 cgroup d that the kernel still holds (cgroup.stat's
    nr_dying_descendants); None where d has no cgroup.stat (cgroup v1, whose kernel
    counts dying cgroups only machine-wide, in /proc/cgroups)."""
    st = read_cgroup_stat(d)
    return None if st is None else st.dying


def remove(d: str) -> bool:
    """Reclaims, then removes an empty cgroup of reaper's; True once it is gone."""
    reclaim(d)
    return rmdir(d)


def empty_and_remove(d: str, back: str) -> bool:
    """Moves whatever is in d back to back, then reclaims and removes d; True once it is gone."""
    for pid in procs(d):
        try:
            write(os.path.join(back, "cgroup.procs"), str(pid))
        except OSError:
            pass
    return remove(d)


def remove_tree(base: str, back: str, patience: float = 0.0) -> list:
    """Empties and removes base and its leaves (one level, as reaper makes them);
    returns what could not be removed. It runs on the loop's path at exit: it waits
    only for what is still charged after a first reclaim, patience seconds at most
    (cgroup v2's reclaim leaves dirty page cache to the flusher it wakes, and a file's
    metadata to the journal's next commit); a process moved out has left by the
    second pass."""
    try:
        dirs = [os.path.join(base, n) for n in os.listdir(base)
                if os.path.isdir(os.path.join(base, n))] + [base]
    except FileNotFoundError:
        return []
    except OSError:
        return [base]
    for d in dirs:
        for pid in procs(d):
            try:
                write(os.path.join(back, "cgroup.procs"), str(pid))
            except OSError:
                pass
    charged = [d for d in dirs if not reclaim(d)]
    deadline = time.monotonic() + patience
    while charged and time.monotonic() < deadline:
        time.sleep(RECLAIM_RETRY)
        charged = [d for d in charged if not reclaim(d)]
    for _ in range(2):
        dirs = [d for d in dirs if not empty_and_remove(d, back)]
        if not dirs:
            break
    return dirs


# --- where a process is: /proc/PID/cgroup ---------------------------------------------
#
# A process that may create cgroups (a delegated subtree) chooses their names: a path
# in /proc/PID/cgroup is hostile input. The kernel refuses a newline in a name only
# since 5.x, so a hierarchy named on two lines is taken as unknown, never as the first.

def mount_of(d: str, version: int, controller: str):
    """The mounted hierarchy (procfs.cgroups.Mount) directory d lies in, or None."""
    for m in mounts():
        if m.version != version or (version == 1 and controller not in m.options):
            continue
        if d == m.point or d.startswith(m.point.rstrip("/") + "/"):
            return m
    return None


def dir_in(data: bytes | None, mount, version: int, controller: str) -> str | None:
    """The directory, under mount, of the cgroup data (/proc/PID/cgroup) names for one
    hierarchy; None where that cannot be told (unreadable, ambiguous, out of view)."""
    if data is None or mount is None:
        return None
    path = path_in(parse_pid_cgroup(data), version, controller)
    if path is None or "\0" in path:
        return None
    return cgroup_dir(mount, path)


def close_fd(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass

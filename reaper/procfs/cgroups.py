"""The cgroup filesystem as this process sees it: the cgroup mounts (/proc/self/mountinfo),
a process's cgroups (/proc/PID/cgroup: the one reader and the one parser), where a
cgroup's directory is (this process's own: own_dir), and a v2 cgroup.stat. Read-only;
what cannot be read is empty (or None), never an exception."""
from __future__ import annotations

import os
from collections import namedtuple

PID_CGROUP_MAX = 64 << 10      # bytes of /proc/PID/cgroup read at most (one path per hierarchy)


class Mount(namedtuple("Mount", "root point version options")):
    # root: the cgroup the mount shows at its top (a container sees its own as "/");
    # point: where it is mounted; version: 1 or 2; options: its super options (a
    # frozenset: the v1 controllers it carries). collections' namedtuple, not typing's:
    # typing would cost PID 1 about 1 MB of memory.
    __slots__ = ()


def mounts(proc: str = "/proc") -> list:
    """Every cgroup (v1) and cgroup2 mount, in mountinfo's order; [] if unreadable."""
    out = []
    try:
        with open(f"{proc}/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rfields = left.split(), right.split()
                if len(fields) < 5 or len(rfields) < 3 or rfields[0] not in ("cgroup", "cgroup2"):
                    continue
                point = fields[4].replace("\\040", " ")
                out.append(Mount(fields[3], point, 2 if rfields[0] == "cgroup2" else 1,
                                 frozenset(rfields[2].split(","))))
    except OSError:
        pass
    return out


# --- /proc/PID/cgroup ---------------------------------------------------------------
# A process that may create cgroups (a delegated subtree) chooses their names: the paths
# in /proc/PID/cgroup are hostile input. Read bounded, split on the kernel's newlines
# only, decoded losslessly (os.fsdecode): compared and escaped when shown, never trusted.

class CgroupLine(namedtuple("CgroupLine", "hierarchy controllers path")):
    # hierarchy: its id ("0" for the v2 one); controllers: the v1 controllers (and
    # name=...) it carries, () for v2; path: the cgroup's path in it.
    __slots__ = ()


def read_pid_cgroup(pid, limit: int = PID_CGROUP_MAX, proc: str = "/proc") -> "bytes | None":
    """proc/PID/cgroup (pid: a number or "self"), at most limit bytes; None if the process
    is gone, the file unreadable, or longer than limit (a list cut short could name the
    wrong cgroup)."""
    try:
        fd = os.open(f"{proc}/{pid}/cgroup", os.O_RDONLY)
    except OSError:
        return None
    chunks, size = [], 0
    try:
        while size <= limit:
            b = os.read(fd, 16384)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
            size += len(b)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


def parse_pid_cgroup(data: "bytes | str") -> list:
    """/proc/PID/cgroup's lines (hierarchy-id:controllers:path) as CgroupLines, in order;
    a line not of that shape is left out."""
    text = os.fsdecode(data) if isinstance(data, bytes) else data
    out = []
    for line in text.split("\n"):
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append(CgroupLine(parts[0], tuple(parts[1].split(",")) if parts[1] else (), parts[2]))
    return out


def path_in(lines: list, version: int, controller: str) -> "str | None":
    """The cgroup path lines (parse_pid_cgroup) give for one hierarchy (v1: the one carrying
    controller; v2: the 0:: line); None if no line names it, more than one does (a name
    spread over two lines), or the path is not absolute."""
    if version == 2:
        found = [ln.path for ln in lines if ln.hierarchy == "0" and not ln.controllers]
    else:
        found = [ln.path for ln in lines if controller in ln.controllers]
    if len(found) != 1 or not found[0].startswith("/"):
        return None
    return found[0]


def own_paths(proc: str = "/proc") -> dict:
    """controller -> this process's cgroup path ("" for the v2 hierarchy); {} if unreadable."""
    out = {}
    for line in parse_pid_cgroup(read_pid_cgroup("self", PID_CGROUP_MAX, proc) or b""):
        for c in line.controllers or ("",):
            out[c] = line.path
    return out


def cgroup_dir(mount: Mount, path: str) -> "str | None":
    """Where cgroup `path` appears under `mount`, or None if outside what it shows."""
    rel = os.path.relpath(path, mount.root)
    if rel == ".." or rel.startswith("../"):
        return None
    return os.path.normpath(os.path.join(mount.point, rel))


def own_dir(controller: str, proc: str = "/proc", or_v2: bool = False) -> "tuple | None":
    """(version, directory) of this process's cgroup in the v1 hierarchy of controller,
    or in the v2 hierarchy (controller ""); None if it is not mounted here. or_v2: without
    a v1 hierarchy of controller, the v2 directory if controller is enabled there (its
    mount's cgroup.controllers lists it)."""
    own, found = own_paths(proc), mounts(proc)
    for m in found:
        if controller == "" and m.version == 2 and "" in own:
            d = cgroup_dir(m, own[""])
            if d is not None:
                return 2, d
        if controller and m.version == 1 and controller in m.options and controller in own:
            d = cgroup_dir(m, own[controller])
            if d is not None:
                return 1, d
    if not (or_v2 and controller and "" in own):
        return None
    for m in found:
        d = cgroup_dir(m, own[""]) if m.version == 2 and enabled(m, controller) else None
        if d is not None:
            return 2, d
    return None


def enabled(mount: Mount, controller: str) -> bool:
    """controller is enabled at the top of v2 mount (its cgroup.controllers lists it)."""
    try:
        with open(os.path.join(mount.point, "cgroup.controllers")) as f:
            return controller in f.read().split()
    except OSError:
        return False


def read_number(path: str) -> "float | None":
    """A cgroup file holding one number or "max" (pids.max, memory.max...): inf for max;
    None if it cannot be read."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return float("inf") if text == "max" else float(text)


class CgroupStat(namedtuple("CgroupStat", "path live dying subsys dying_subsys")):
    """A cgroup v2 directory's cgroup.stat: the directory read; nr_descendants (live
    cgroups below it); nr_dying_descendants (removed, still held by the kernel: charged
    memory); controller -> live cgroups using it (nr_subsys_*, kernel 6.12+);
    controller -> dying cgroups using it (nr_dying_subsys_*)."""
    __slots__ = ()


def parse_cgroup_stat(text: str, path: str = "") -> "CgroupStat | None":
    """cgroup.stat's "key value" lines; None without the two counts every kernel has."""
    values, subsys, dying_subsys = {}, {}, {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if not value.strip().isdigit():
            continue
        n = int(value)
        if key.startswith("nr_dying_subsys_"):
            dying_subsys[key[len("nr_dying_subsys_"):]] = n
        elif key.startswith("nr_subsys_"):
            subsys[key[len("nr_subsys_"):]] = n
        else:
            values[key] = n
    if "nr_descendants" not in values or "nr_dying_descendants" not in values:
        return None
    return CgroupStat(path, values["nr_descendants"], values["nr_dying_descendants"], subsys, dying_subsys)


def read_cgroup_stat(d: str) -> "CgroupStat | None":
    """d's cgroup.stat; None where there is none (cgroup v1) or it cannot be read."""
    try:
        with open(os.path.join(d, "cgroup.stat")) as f:
            return parse_cgroup_stat(f.read(), d)
    except OSError:
        return None

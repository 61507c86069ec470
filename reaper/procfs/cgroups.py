"""The cgroup filesystem as this process sees it: the cgroup mounts (/proc/self/mountinfo),
this process's cgroups (/proc/self/cgroup), where a cgroup's directory is, and a v2
cgroup.stat. Read-only; what cannot be read is empty (or None), never an exception."""
from __future__ import annotations

import os
from collections import namedtuple


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


def own_paths(proc: str = "/proc") -> dict:
    """controller -> this process's cgroup path ("" for the v2 hierarchy); {} if unreadable."""
    out = {}
    try:
        with open(f"{proc}/self/cgroup") as f:
            for line in f:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) != 3:
                    continue
                for c in parts[1].split(",") if parts[1] else [""]:
                    out[c] = parts[2]
    except OSError:
        pass
    return out


def cgroup_dir(mount: Mount, path: str) -> "str | None":
    """Where cgroup `path` appears under `mount`, or None if outside what it shows."""
    rel = os.path.relpath(path, mount.root)
    if rel == ".." or rel.startswith("../"):
        return None
    return os.path.normpath(os.path.join(mount.point, rel))


def own_dir(controller: str, proc: str = "/proc") -> "tuple | None":
    """(version, directory) of this process's cgroup in the v1 hierarchy of controller,
    or in the v2 hierarchy (controller ""); None if it is not mounted here."""
    own = own_paths(proc)
    for m in mounts(proc):
        if controller == "" and m.version == 2 and "" in own:
            d = cgroup_dir(m, own[""])
            if d is not None:
                return 2, d
        if controller and m.version == 1 and controller in m.options and controller in own:
            d = cgroup_dir(m, own[controller])
            if d is not None:
                return 1, d
    return None


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

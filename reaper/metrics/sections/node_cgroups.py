"""Cgroups: per controller (/proc/cgroups), below the highest cgroup v2 directory
(cgroup.stat), and the memory cgroups visible to reaper (counted by the sampler)."""
from __future__ import annotations

from reaper.metrics import names as N


def collect(r, available):
    from prometheus_client.core import GaugeMetricFamily as G

    from reaper import nodestats

    cgroups = r.fresh("proc_cgroups", nodestats.proc_cgroups)
    available["proc_cgroups"] = cgroups is not None
    if cgroups is not None:
        g = G(N.NODE_CGROUPS, "Cgroups per controller as /proc/cgroups counts them (host-wide, "
                              "dying ones included; recent kernels list v1 controllers only)",
              labels=["controller"])
        for ctrl, n in sorted(cgroups.items()):
            g.add_metric([ctrl], n)
        yield g
    yield G(N.NODE_MEMORY_CGROUPS_AVAILABLE, "1 if /proc/cgroups lists the memory controller",
            value=1 if cgroups and "memory" in cgroups else 0)
    st = r.fresh("cgroup_stat", nodestats.cgroup_stat)
    available["cgroup_stat"] = st is not None
    if st is not None:
        g = G(N.CGROUP_V2_DESCENDANTS, "Cgroups below the highest cgroup v2 directory visible "
                                       "(its cgroup.stat): live ones, and dying ones (removed, "
                                       "still held by charged memory)", labels=["state"])
        g.add_metric(["live"], st.live)
        g.add_metric(["dying"], st.dying)
        yield g
        g = G(N.CGROUP_V2_CONTROLLER_CGROUPS, "The same by controller (cgroup.stat's nr_subsys_* "
                                              "and nr_dying_subsys_*, newer kernels)",
              labels=["controller", "state"])
        for ctrl in sorted(set(st.subsys) | set(st.dying_subsys)):
            if ctrl in st.subsys:
                g.add_metric([ctrl, "live"], st.subsys[ctrl])
            if ctrl in st.dying_subsys:
                g.add_metric([ctrl, "dying"], st.dying_subsys[ctrl])
        yield g
    visible = r.x.memory_visible
    available["cgroup_tree"] = visible is not None
    if visible is not None:
        yield G(N.VISIBLE_MEMORY_CGROUPS, "Memory cgroup directories visible to reaper (live ones; "
                                          "only its own subtree in a private cgroup namespace)", value=visible)

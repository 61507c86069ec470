"""The collector's sections, one module per source, in the order a scrape lists them.
Each is collect(reading, available): it yields metric families from a
reaper.metrics.reading.Reading and sets available[source] for the sources of
collector.SOURCES it reads. A section that raises is left out of that scrape
(collector.guard, policy.SayOnce). A new section: a module here, a row below, its names in
reaper/metrics/names.py, its rows in docs/metrics.md.
"""
from reaper.metrics.sections import (budget, cgroup_pids, drain, errors, identity, leftovers, main_child,
                                     node_cgroups, node_cpu, reaping, scope, self_usage, services, signals)

SECTIONS = (
    ("identity", identity.collect),
    ("main_child", main_child.collect),
    ("services", services.collect),
    ("reaping", reaping.collect),
    ("signals", signals.collect),
    ("drain", drain.collect),
    ("errors", errors.collect),
    ("scope_metrics", scope.collect),
    ("budget", budget.collect),
    ("self_usage", self_usage.collect),
    ("node_cpu", node_cpu.collect),
    ("node_cgroups", node_cgroups.collect),
    ("cgroup_pids", cgroup_pids.collect),
    ("leftovers", leftovers.collect),
)

"""Budgets for stray processes: CPU, memory and lifetime.

    enforcer.py       the engine (Enforcer): the plugin, one sample's pipeline, the Sample
                      the kinds read; it alone holds its parts, each the only writer of its state:
    book.py           who is known: tracked and dormant strays, lineages, the scan, track()
    schedule.py       who is read when: awake lineages, sleepers due, scans, ages due
    reader.py         how a stray is read: CPU, memory, the CPU of what reaper reaped
    actions.py        how reaper acts: the kinds' one door (named levels), the duty cycle,
                      SIGTERM/SIGKILL, refusals, the action and violation counts
    publish.py        what BudgetStats shows: over budget, cgroups, the stray list
    dormant.py        sleeping strays kept as packed records
    pulse.py          the cheap triggers: when to scan, when to read every stray
    reaped.py         the CPU of strays no sample read, from what reaper reaped
    kinds/            one module per budget kind, judging its strays: cpu.py, memory.py,
                      age.py; kinds/__init__.py is the registry (reasons, the options
                      that turn each on)
    strays.py         who is a stray (orphans, children of idle Ray workers, --stray-match)
    lineage.py        a stray and its descendants share one account (pid hopping starts nothing afresh)
    hops.py           a lineage between samples: CPU burnt unseen, a duty-cycled fork held at once
    escapes.py        the members of a lineage held in a cgroup stay in it (moved back, counted)
    ray.py            which processes are Ray's own, by executable and script, never by name
    throttle.py       CPU caps: the cgroup cpu controller (v1, v2), else SIGSTOP/SIGCONT
    memory_cgroup.py  memory caps: a memory cgroup of reaper's own (v1, v2)
    cgroupfs.py       what the caps share: mounts, reaper's own cgroups, owned directories
    cleanup.py        stray cgroups left by reapers that are gone, removed at start
    stray_cpus.py     --stray-cpus: the CPUs strays may run on

Nothing here is imported unless a budget option is given, but the registry
(kinds/__init__.py, names only), which the metrics read for their reason labels.
"""

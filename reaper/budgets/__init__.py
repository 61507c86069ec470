"""Budgets for stray processes: CPU, memory and lifetime.

    enforcer.py       the sampling loop: finds strays, measures them, responds (Enforcer)
    strays.py         who is a stray (orphans, children of idle Ray workers, --stray-match)
    ray.py            which processes are Ray's own, by executable and script, never by name
    procctl.py        acting on one process safely against pid reuse (Handle)
    throttle.py       CPU caps: the cgroup cpu controller (v1, v2), else SIGSTOP/SIGCONT
    memory_cgroup.py  memory caps: a memory cgroup of reaper's own (v1, v2)
    cgroupfs.py       what the caps share: mounts, reaper's own cgroups, owned directories
    cleanup.py        stray cgroups left by reapers that are gone, removed at start
    stray_cpus.py     --stray-cpus: the CPUs strays may run on

Nothing here is imported unless a budget option is given.
"""

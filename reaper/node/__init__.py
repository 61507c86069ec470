"""``reaper node``'s detector (docs/reaper-node.md): what a node does to the jobs on it,
read-only from the host's /proc and /sys, one module per concern:

    streaks.py     saturation streaks per core, by the mode that dominated them
    culprits.py    while a core is saturated: the processes with most system time (the scan)
    perf.py        perf_event_open on one core: cpu-clock samples with kernel call chains
    kallsyms.py    kernel addresses to function names
    profile.py     a sampled core's processes and kernel functions over a streak
    sampling.py    which cores are sampled, when; the culprits from their samples
    cgroups.py     live and dying memory cgroups (v1 and v2), who holds the dying ones
    pressure.py    pressure stall information (/proc/pressure/*)
    softnet.py     per-core softnet drops and time squeezes (/proc/net/softnet_stat)
    interrupts.py  interrupts per core (/proc/interrupts)
    zombies.py     the host's zombies by cgroup
    kmsg.py        the kernel log's NIC and watchdog lines (/dev/kmsg or a file), followed
    ethtool.py     drivers' statistics through the ethtool ioctl
    queues.py      NIC queues' IRQs and cores; a queue that stops on a core held in the kernel
    chain.py       a NIC event tied to the core, process and function that starved it
    nic.py         the NIC side, run from the monitor's sample
    view.py        the node's view for reaper stats and top, from one scrape's samples
    monitor.py     the sampler that runs them at one sample a second
    collector.py   the Prometheus families
    diagnose.py    the report of ``--diagnose``

Everything a process controls (its name, its cgroup path) is text for a label or a
line, bounded and shown on one line, never a path opened or a pattern matched.
Nothing here writes, signals or moves anything (the kernel log is opened read-only).
"""

"""Leftovers: what a Ray worker or a service started ends with it, GPU holders first
(docs/leftovers.md).

    piece.py       the policy piece "leftovers" (a boundary plugin): samples, ends, tells
    tracker.py     which owner each process descends from, kept while it lives; owners gone
    owners.py      owners: Ray workers (children of a real raylet), services; their titles, jobs
    jobs.py        a process's Ray job: RAY_JOB_ID (never the null id), a worker's log
    devices.py     the --devices globs and who holds a matching device open
    ender.py       one owner's end: report, stop, or SIGTERM then SIGKILL, the release check
    mechanisms.py  how no fork escapes the SIGKILL: cgroup.kill, the freezer, sweeps
    publish.py     the log line and the numbers the metrics section reads
    gpumem.py      --gpu-memory: GPU memory through NVML (the optional nvml extra)

Nothing here is imported unless the piece starts (--leftovers other than keep, or
services); gpumem.py only with --gpu-memory.
"""

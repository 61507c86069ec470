"""reaper's one layer over /proc and the cgroup filesystem, read-only:

    processes.py   the process table: one record (Proc), one stat parser, a full scan,
                   an incremental table (ProcTable), the tree below a process
    cgroups.py     cgroup mounts, this process's cgroups and their directories, cgroup.stat

One error policy, as psutil's _pslinux has one: a process that vanishes mid-read is
simply not there (None, or left out of a table), and a file the kernel or the sandbox
does not offer is "unknown" (None, an empty table or list), never an exception and
never a zero that would look healthy (some sandboxes bind an empty directory over
/proc). What a process controls (its name, its command line) is read with a bounded
read and never trusted as more than text.

Why not psutil for this: the drain and the budget sampler need the whole table every
second at a cost of microseconds per process (one stat read, incremental by inode), and
the start path may not import it; psutil serves the per-process figures it does well
(CPU times, memory through statm and smaps_rollup: reaper/procctl.py).
"""

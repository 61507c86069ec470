"""reaper's layer over /proc and the cgroup filesystem, read-only: /proc and cgroup
paths are read here, each file by one parser.

    processes.py   the process table: one record (Proc), one stat parser, a full scan,
                   an incremental table (ProcTable), the tree below a process; a
                   process's cmdline, comm, children, signal masks (status), cgroups
    cgroups.py     cgroup mounts, the one reader and parser of /proc/PID/cgroup, this
                   process's cgroups and their directories (own_dir), cgroup.stat,
                   a controller enabled in v2, a cgroup's number files (pids.max...)
    system.py      node-wide figures: uptime, per-core CPU (/proc/stat), /proc/cgroups,
                   /proc/interrupts and an IRQ's affinity, reaper's own resident size
    files.py       not /proc: a bounded read of a regular file a process controls
                   (scripts, dist-info, service settings), under the same rule for
                   hostile input
    offloop.py     not /proc: a thread with a deadline for reads that may hang

The exceptions, each for a reason its module gives: the start path before the exec
(cli.py, usage.py, log.py: /proc/self/fd; procfs is not loaded then), the boundary's
minimal loop (drain.py's last section: os alone, no file to import), procctl.py (acts
on a pinned process: its statm, tasks and autogroup, checked against its start), oom.py
(writes reaper's own oom_score_adj), budgets/ray.py (a stray's exe, cwd and script
path, resolved inside /proc/PID/root under a deadline: the walk is the recognition
itself), leftovers/devices.py and jobs.py (a process's fd links and environ, bounded,
hostile input read where it is judged), and reaper node's readers of files no other
module reads, one parser each (node/softnet.py, pressure.py, zombies.py, kmsg.py,
kallsyms.py: they take the --proc root of the host).

One error policy, as psutil's _pslinux has one: a process that vanishes mid-read is
simply not there (None, or left out of a table), and a file the kernel or the sandbox
does not offer is "unknown" (None, an empty table or list), never an exception (but
system.py's uptime and CPU times and files.read_regular, whose callers say why) and
never a zero that would look healthy (some sandboxes bind an empty directory over
/proc). What a process controls (its name, its command line) is read with a bounded
read and never trusted as more than text.

Why not psutil for this: the drain and the budget sampler need the whole table every
second at a cost of microseconds per process (one stat read, incremental by inode), and
the start path may not import it; psutil serves the per-process figures it does well
(CPU times, memory through statm and smaps_rollup: reaper/procctl.py).
"""

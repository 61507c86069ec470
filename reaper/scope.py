"""Reaper's scope: the processes it answers for, computed here once for all who ask
(the drain, the services' ordered stop, the metrics' process counts, the budgets'
strays).

As PID 1, or in watch mode (reaper watch: the whole PID namespace), that is every
process but reaper; as a subreaper, reaper's descendants. Inside it, the trees
reaper keeps (the main child's and the services') are its own work, never strays.

A scope is an object with the attributes of Scope below: the Supervisor in reaper,
commands/watch.WatchScope in reaper watch. A table is pid -> Proc
(procfs.processes.scan(), or a ProcTable's procs, whose children index may be
passed along to save building it again).
"""
from __future__ import annotations

from reaper.procfs.processes import below, children_index

TYPE_CHECKING = False            # typing is not imported at run time (start-up time and memory)
if TYPE_CHECKING:
    from typing import Protocol

    class Scope(Protocol):
        pid: int                      # reaper's own pid
        is_pid1: bool                 # reaper is the namespace's init
        watch: bool                   # reaper watch: the whole namespace, no main child
        main_pid: "int | None"        # the main child while it runs
        supervised: set               # the services' pids
        phase: str                    # running, draining, killing, done (reaper/drain.py)


def whole(scope: "Scope") -> bool:
    """The scope is the whole PID namespace (but reaper)."""
    return scope.watch or scope.is_pid1


def members(scope: "Scope", table: dict, children: "dict | None" = None) -> set:
    """The pids of table in scope, zombies included."""
    if whole(scope):
        return set(table) - {scope.pid}
    return below(children_index(table.values()) if children is None else children, [scope.pid])


def trees(table: dict, roots, children: "dict | None" = None) -> set:
    """roots (those in table) and every pid below them."""
    roots = [r for r in roots if r in table]
    return set(roots) | below(children_index(table.values()) if children is None else children, roots)


def kept(scope: "Scope", table: dict, children: "dict | None" = None) -> set:
    """The main child's tree and the services' trees, as far as table has them."""
    return trees(table, [p for p in (scope.main_pid, *scope.supervised) if p is not None], children)

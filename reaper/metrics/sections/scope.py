"""Zombies and live processes in reaper's scope, from one /proc scan (reused by the
scrapes within reading.SCAN_MAX_AGE)."""
from __future__ import annotations

import os

from reaper.metrics import names as N

TOP = 10                    # at most this many zombie parents are labelled


def collect(r, available):
    from prometheus_client.core import GaugeMetricFamily as G

    v = r.fresh("proc", lambda: read(r))
    available["proc"] = v is not None
    if v is None:
        return
    yield G(N.ZOMBIES, "Zombie processes in reaper's scope now (PID 1 or watch: the whole PID "
                       "namespace; else reaper's descendants)", value=v["zombies"])
    if v["oldest"] is not None:
        yield G(N.ZOMBIE_OLDEST_AGE_SECONDS, "Age (since process start) of the oldest zombie in "
                                             "scope; 0 when there is none", value=v["oldest"])
    g = G(N.ZOMBIES_BY_PARENT, f"Zombies in scope by parent process (the {TOP} parents with most)",
          labels=["parent_pid", "parent_name"])
    for pid, name, n in v["parents"]:
        g.add_metric([str(pid), name], n)
    yield g
    g = G(N.PROCESSES, "Live processes in scope by class (main_tree: the main child and its "
                       "descendants; stray: the budget enforcer's strays when budgets are on, "
                       "else the live processes outside the main tree; all: every live process "
                       "but reaper)", labels=["class"])
    strays = r.stats.budget.strays
    if r.mode == "init":
        g.add_metric(["main_tree"], v["main_tree"])
        g.add_metric(["stray"], strays if r.budgets else v["outside"])
    elif r.budgets:
        g.add_metric(["stray"], strays)
    g.add_metric(["all"], v["live"])
    yield g


def read(r) -> "dict | None":
    """The process table's view of reaper's scope; None when /proc cannot be read
    (an empty directory bound over it lists nothing, not even reaper)."""
    from reaper import nodestats, scope
    from reaper.procfs import processes

    s, sc = r.stats, r.scope
    table = processes.scan()
    me = os.getpid()
    if me not in table:
        return None
    try:
        up = nodestats.uptime()
    except (OSError, ValueError, IndexError):
        up = None                      # no ages, the counts still hold
    children = processes.children_index(table.values())
    in_scope = scope.members(sc, table, children)
    zombies = [table[p] for p in in_scope if table[p].state == "Z"]
    live = [p for p in in_scope if table[p].state != "Z"]
    main = s.main_pid if s.main_state == "running" else None
    main_tree = scope.trees(table, [main] if main is not None else [], children)
    kept = main_tree | scope.trees(table, sc.supervised, children)      # services are not strays
    parents: dict = {}
    for z in zombies:
        parents[z.ppid] = parents.get(z.ppid, 0) + 1
    top = sorted(parents.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]
    return {
        "zombies": len(zombies),
        "oldest": None if up is None else max((up - z.started for z in zombies), default=0.0),
        "parents": [(pid, table[pid].comm if pid in table else "", n) for pid, n in top],
        "live": len(live),
        "main_tree": len([p for p in live if p in main_tree]),
        "outside": len([p for p in live if p not in kept]),
    }

"""The budget enforcer's figures (stats.BudgetStats): stray CPU, violations and
actions by reason; with budgets on, the rest and the strays it names."""
from __future__ import annotations

from reaper.metrics import names as N
from reaper.metrics.reading import copy


def collect(r, available):
    from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

    # The budget kinds' registry, names only (it imports nothing): the reasons are the
    # kinds', kept beside them; the one piece-to-piece import besides services'.
    from reaper.budgets.kinds import ANY, REASONS

    b = r.stats.budget
    yield C(N.STRAY_CPU_SECONDS, "CPU used by stray processes while reaper watched them", value=b.stray_cpu_seconds)
    for name, doc, counter in (
            (N.BUDGET_VIOLATIONS, "Budget violations, by the configured action and the budget "
                                  f"(reason: {', '.join(REASONS)})", b.violations_by_reason),
            (N.BUDGET_ACTIONS, "Actions taken on strays, by action and by what they were for "
                               f"(reason: {', '.join(REASONS + (ANY,))})", b.actions_by_reason)):
        c = C(name, doc, labels=["action", "reason"])
        for (action, reason), n in sorted(copy(counter).items()):
            c.add_metric([str(action), str(reason)], n)
        yield c
    if not r.budgets:
        return
    yield C(N.BUDGET_SAMPLES, "Samples the budget enforcer has taken", value=b.samples)
    yield C(N.STRAY_CGROUP_ESCAPES, "Strays found outside the cgroup reaper holds them in, "
                                    "moved back", value=b.stray_cgroup_escapes)
    yield C(N.BUDGET_STALE_CGROUPS_REMOVED, "Stray cgroups left by reapers that are gone, removed "
                                            "at start", value=b.stale_cgroups_removed)
    g = G(N.STRAYS_OVER_BUDGET, "Strays over their budget at the last sample, by budget (cpu, "
                                "memory; age: past --stray-max-age and still alive)", labels=["reason"])
    over = dict(b.over_budget)
    for reason in REASONS:
        g.add_metric([reason], over.get(reason, 0))
    yield g
    g = G(N.BUDGET_CGROUPS, "Cgroups reaper holds for strays (live), and those removed below its own "
                            "that the kernel still holds (dying; cgroup v2 only)", labels=["state"])
    for state, n in sorted(dict(b.cgroups).items()):
        g.add_metric([state], n)
    yield g
    g = G(N.BUDGET_INFO, "Budgets are on; mechanism: how CPU throttling is done; memory_mechanism: "
                         "how memory budgets are held", labels=["mechanism", "memory_mechanism"])
    g.add_metric([b.mechanism or "none", b.memory_mechanism or "none"], 1)
    yield g
    yield from _strays(b)


def _strays(b):
    """The strays the budgets name: the busiest, and those holding most memory."""
    from prometheus_client.core import GaugeMetricFamily as G

    from reaper.stats import TOP_STRAYS

    strays = list(b.stray_list)
    for metric, doc, field in (
            (N.STRAY_CPU_CORES, f"CPU cores used by the {TOP_STRAYS} busiest strays (comm, never the "
                                "command line)", "cpu_cores"),
            (N.STRAY_MEMORY_BYTES, f"Private memory (what a stray alone holds: shared pages left out) "
                                   f"of the {TOP_STRAYS} strays holding most (comm, never the command line)",
             "memory_bytes")):
        g = G(metric, doc, labels=["pid", "name", "action", "reason"])
        for d in sorted(strays, key=lambda d: -float(d.get(field, 0) or 0))[:TOP_STRAYS]:
            g.add_metric([str(d.get("pid", "")), str(d.get("name", ""))[:32],
                          str(d.get("action", "") or "none"), str(d.get("reason", "") or "orphan")],
                         float(d.get(field, 0) or 0))
        yield g

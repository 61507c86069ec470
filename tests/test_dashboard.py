"""docs/grafana-dashboard.json reads as a person needs it: panels on the 24-column grid
without overlaps, one unit per panel, every query filtered by the namespace, Ray
cluster, pod and instance variables, only documented metrics of the default
--node-metrics mode, panels for the budget, stop and own-cgroup gauges; a Node row of
`reaper node`'s metrics, filtered by the node variable (the nodes of the chosen pods);
and the rendered picture docs/metrics.md shows is there."""
import json
import re
from itertools import combinations
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
VARIABLES = {"namespace": "namespace", "cluster": "ray_io_cluster", "pod": "pod", "instance": "instance"}
SELECTOR = re.compile(r"\b(reaper_[a-z0-9_]+)\s*(\{[^}]*\})?")
PER_CORE = {"reaper_node_cpu_mode_ratio", "reaper_node_cpu_busy_ratio", "reaper_node_cpu_saturated_seconds_total"}
NODE_ROW = "Node (reaper node)"
# What the Node row must show (issue 21): streaks, their modes, the culprits, live and
# dying memory cgroups, who holds them, pressure, softnet, interrupts, zombies.
NODE_ROW_METRICS = {
    "reaper_node_cpu_saturation_streak_seconds", "reaper_node_cpu_saturation_streak_max_seconds",
    "reaper_node_cpu_saturation_streak_length_seconds", "reaper_node_kernel_time_top_ratio",
    "reaper_node_memory_cgroups", "reaper_node_cgroup_dying_children", "reaper_node_pressure_stalled_seconds",
    "reaper_node_softnet_dropped", "reaper_node_softnet_times_squeezed", "reaper_node_interrupts",
    "reaper_node_zombies", "reaper_node_zombies_by_cgroup", "reaper_node_source_available",
    # the kernel function and the NIC side (docs/reaper-node.md)
    "reaper_node_kernel_function_top_ratio", "reaper_node_nic_events", "reaper_node_nic_chains",
    "reaper_node_nic_driver_stats",
}


def _dashboard() -> dict:
    return json.loads((DOCS / "grafana-dashboard.json").read_text())


def _panels(items=None):
    """Every panel, those inside (collapsed) rows too; rows themselves are not panels."""
    for p in _dashboard()["panels"] if items is None else items:
        if p["type"] != "row":
            yield p
        yield from _panels(p.get("panels", []))


def _node_row_panels() -> list:
    """The panels below the Node row, up to the next row (an expanded row keeps its
    panels in the dashboard's list, after it)."""
    items = _dashboard()["panels"]
    (at,) = [i for i, p in enumerate(items) if p["type"] == "row" and p["title"] == NODE_ROW]
    out = []
    for p in items[at + 1:]:
        if p["type"] == "row":
            break
        out.append(p)
    return out + items[at].get("panels", [])


def _exprs(panels=None):
    return [(p["title"], t["expr"]) for p in (_panels() if panels is None else panels) for t in p.get("targets", [])]


def _family(metric: str) -> str:
    """A series' family as the tables name it: without _bucket/_count/_sum of a
    histogram, or the _total prometheus_client adds to a counter."""
    return re.sub(r"_(bucket|count|sum|total)$", "", metric)


def _documented() -> set:
    """docs/metrics.md's reference, and its section of reaper node's own metrics."""
    text = (DOCS / "metrics.md").read_text()
    names = set()
    for section in ("## Metric reference", "## reaper node"):
        table = text.split(section + "\n", 1)[1].split("\n## ", 1)[0]
        names |= set(re.findall(r"^\| `(reaper_[a-z0-9_]+)`", table, re.M))
    return {_family(n) for n in names} | names


def test_panels_fit_the_grid_without_overlaps():
    panels = list(_panels())
    assert len(panels) >= 25
    assert len({p["id"] for p in panels}) == len(panels), "panel ids repeat"
    boxes = []
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["y"] >= 0 and g["w"] >= 1 and g["h"] >= 1, p["title"]
        assert g["x"] + g["w"] <= 24, p["title"]
        boxes.append((p["title"], g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
    for (a, ax0, ay0, ax1, ay1), (b, bx0, by0, bx1, by1) in combinations(boxes, 2):
        assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, f"{a!r} overlaps {b!r}"


def test_every_panel_has_exactly_one_unit():
    panels = list(_panels())
    assert panels, "no panels parsed from the dashboard"
    for p in panels:
        field = p.get("fieldConfig", {})
        assert field.get("defaults", {}).get("unit"), p["title"]
        for override in field.get("overrides", []):
            assert not [x for x in override.get("properties", []) if x.get("id") == "unit"], p["title"]
        # and the unit fits what is drawn: bytes with bytes only, ratios as percent
        metrics = {m for t in p.get("targets", []) for m, _ in SELECTOR.findall(t["expr"])}
        unit = field["defaults"]["unit"]
        if any(m.endswith("_bytes") for m in metrics) or unit == "bytes":
            assert unit == "bytes" and all(m.endswith("_bytes") for m in metrics), p["title"]
        if any(m.endswith("_ratio") for m in metrics):
            assert unit == "percentunit" and all(m.endswith("_ratio") for m in metrics), p["title"]


def test_variables_namespace_cluster_pod_and_instance():
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    assert set(VARIABLES) | {"datasource", "node"} == set(variables)
    for name, label in VARIABLES.items():
        v = variables[name]
        assert v["type"] == "query" and v["multi"] and v["includeAll"], name
        # All is ".*", which matches a missing label too: a scrape without the PodMonitor's
        # labels (a static target, the textfile collector) still shows.
        assert v["allValue"] == ".*", name
        assert re.fullmatch(rf"label_values\(reaper_build_info(\{{.*\}})?, {label}\)", v["query"]), name
    # chained: each narrows the next
    assert 'namespace=~"$namespace"' in variables["cluster"]["query"]
    assert 'ray_io_cluster=~"$cluster"' in variables["pod"]["query"]
    assert 'pod=~"$pod"' in variables["instance"]["query"]
    # node: the nodes the chosen pods run on (the PodMonitors' node label); its All is the
    # list itself, not ".*", so the Node row follows the pods chosen above
    node = variables["node"]
    assert node["type"] == "query" and node["multi"] and node["includeAll"] and "allValue" not in node
    assert re.fullmatch(r"label_values\(reaper_build_info\{(.*)\}, node\)", node["query"])
    for name, label in VARIABLES.items():
        assert f'{label}=~"${name}"' in node["query"], name


def test_every_query_filters_by_the_variables():
    """The pods' panels by namespace, cluster, pod and instance; the Node row (reaper
    node's DaemonSet pods, in a namespace of their own) by node only."""
    node_titles = {p["title"] for p in _node_row_panels()}
    exprs = _exprs()
    assert len(exprs) >= 30
    for title, expr in exprs:
        selectors = SELECTOR.findall(expr)
        assert selectors, (title, expr)
        for metric, braces in selectors:
            if title in node_titles:
                assert 'node=~"$node"' in braces, (title, metric)
                assert not any(f'{label}=~' in braces for label in VARIABLES.values()), (title, metric)
            else:
                for name, label in VARIABLES.items():
                    assert f'{label}=~"${name}"' in braces, (title, metric, label)


def test_every_metric_is_documented_and_in_the_default_mode():
    documented = _documented()
    used = {m for _, e in _exprs() for m, _ in SELECTOR.findall(e)}
    # a histogram's series carry _bucket/_count, a counter _total; the tables name the family
    families = {m if m in documented else _family(m) for m in used}
    assert families <= documented, sorted(families - documented)
    assert not families & PER_CORE, "per-core series exist only with --node-metrics per-core"


def test_panels_for_the_new_gauges():
    by_metric = {}
    for p in _panels():
        for t in p.get("targets", []):
            for m, _ in SELECTOR.findall(t["expr"]):
                by_metric.setdefault(m, []).append((p, t["expr"]))
    assert any("by (reason)" in e for _, e in by_metric["reaper_strays_over_budget"])
    assert by_metric["reaper_stop_requested"]
    assert any("by (state)" in e for _, e in by_metric["reaper_budget_cgroups"])
    # reaper's own CPU and memory: two panels, cores and bytes
    (cpu,) = {p["id"]: p for p, _ in by_metric["reaper_cpu_seconds_total"]}.values()
    (mem,) = {p["id"]: p for p, _ in by_metric["reaper_resident_memory_bytes"]}.values()
    assert cpu is not mem
    assert mem["fieldConfig"]["defaults"]["unit"] == "bytes"
    # leftovers (docs/leftovers.md): what was done to them, and who still holds a device
    assert any("by (action)" in e for _, e in by_metric["reaper_leftovers_total"])
    assert any("device)" in e for _, e in by_metric["reaper_leftover_device_holders"])


def test_the_rendered_picture_is_shown():
    png = DOCS / "img" / "dashboard.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert 20_000 < len(data) < 300_000
    assert "(img/dashboard.png)" in (DOCS / "metrics.md").read_text()


def test_the_node_row():
    """Below the other panels, a row of reaper node's figures: every one the issue names,
    each panel drawn per node (by (node, ...)), and the 5 s streak marked."""
    items = _dashboard()["panels"]
    (row,) = [p for p in items if p["type"] == "row"]
    assert row["title"] == NODE_ROW and row["collapsed"] is False and row["gridPos"]["w"] == 24
    panels = _node_row_panels()
    assert len(panels) >= 8
    others = [p for p in _panels() if p not in panels]
    assert row["gridPos"]["y"] >= max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in others)
    assert all(p["gridPos"]["y"] > row["gridPos"]["y"] for p in panels)
    used = {_family(m) for _, e in _exprs(panels) for m, _ in SELECTOR.findall(e)}
    assert NODE_ROW_METRICS <= used, sorted(NODE_ROW_METRICS - used)
    assert used <= NODE_ROW_METRICS, sorted(used - NODE_ROW_METRICS)
    for title, expr in _exprs(panels):
        assert re.search(r"\b(by)\s*\(node\b", expr), (title, expr)
    (streaks,) = [p for p in panels if any("streak_max_seconds" in t["expr"] for t in p["targets"])]
    assert streaks["fieldConfig"]["defaults"]["unit"] == "s"
    steps = streaks["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps if s["color"] == "red"] == [5]
    # the kernel modes are told apart from user time, over the 5 s bound
    (modes,) = [p for p in panels if any("streak_length_seconds" in t["expr"] for t in p["targets"])]
    assert 'le="5.0"' in modes["targets"][0]["expr"] and "mode)" in modes["targets"][0]["expr"]


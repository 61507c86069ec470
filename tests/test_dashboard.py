"""docs/grafana-dashboard.json reads as a person needs it: panels on the 24-column grid
without overlaps, one unit per panel, every query filtered by the namespace, Ray
cluster, pod and instance variables, only documented metrics of the default
--node-metrics mode, panels for the budget, stop and own-cgroup gauges; and the
rendered picture docs/metrics.md shows is there."""
import json
import re
from itertools import combinations
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
VARIABLES = {"namespace": "namespace", "cluster": "ray_io_cluster", "pod": "pod", "instance": "instance"}
SELECTOR = re.compile(r"\b(reaper_[a-z0-9_]+)\s*(\{[^}]*\})?")
PER_CORE = {"reaper_node_cpu_mode_ratio", "reaper_node_cpu_busy_ratio", "reaper_node_cpu_saturated_seconds_total"}


def _dashboard() -> dict:
    return json.loads((DOCS / "grafana-dashboard.json").read_text())


def _panels(items=None):
    """Every panel, those inside (collapsed) rows too; rows themselves are not panels."""
    for p in _dashboard()["panels"] if items is None else items:
        if p["type"] != "row":
            yield p
        yield from _panels(p.get("panels", []))


def _exprs():
    return [(p["title"], t["expr"]) for p in _panels() for t in p.get("targets", [])]


def _documented() -> set:
    table = (DOCS / "metrics.md").read_text().split("## Metric reference", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(reaper_[a-z0-9_]+)`", table, re.M))


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
    for p in _panels():
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
    assert set(VARIABLES) | {"datasource"} == set(variables)
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


def test_every_query_filters_by_the_variables():
    exprs = _exprs()
    assert len(exprs) >= 30
    for title, expr in exprs:
        selectors = SELECTOR.findall(expr)
        assert selectors, (title, expr)
        for metric, braces in selectors:
            for name, label in VARIABLES.items():
                assert f'{label}=~"${name}"' in braces, (title, metric, label)


def test_every_metric_is_documented_and_in_the_default_mode():
    documented = _documented()
    used = {m for _, e in _exprs() for m, _ in SELECTOR.findall(e)}
    # a histogram's series carry _bucket; the table names the family
    families = {re.sub(r"_bucket$", "", m) for m in used}
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


def test_the_rendered_picture_is_shown():
    png = DOCS / "img" / "dashboard.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert 20_000 < len(data) < 300_000
    assert "(img/dashboard.png)" in (DOCS / "metrics.md").read_text()

"""docs/: the dashboard, the alert rules and the metric reference name only metrics the
exporter really exports. promtool's checks of the rules are in tests/test_alerts.py."""
import json
import re
from pathlib import Path

import pytest

from conftest import free_port, wait_for_file, remove_cgroup
from metrics_helpers import Scrape, in_pids_cgroup, start_with_metrics, wait_healthy, wait_scrape

DOCS = Path(__file__).resolve().parent.parent / "docs"
NAME = re.compile(r"\b((?:reaper|process)_[a-z0-9_]+)\b")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every family and sample name a real reaper exports: with budgets on, in a pids
    cgroup when the host has one, during the run (endpoint) and after it (final file).
    Started here rather than by metrics_helpers.start_with_metrics: one run serves every
    check of the module, in a pids cgroup of its own and with a metrics file."""
    tmp = tmp_path_factory.mktemp("exported")
    port, mfile = free_port(), tmp / "m.prom"
    cg = in_pids_cgroup(1000)
    from conftest import Reaper
    r = Reaper(["--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--metrics-file", str(mfile),
                "--cpu-budget", "1", "--budget-action", "observe",
                "--node-metrics", "per-core",       # the per-core families on top of the default summary
                # services: one running, one that exited (its last exit code)
                "--service", "agent=sleep 60", "--service", "once=true", "--restart", "on-failure", "--",
                "sh", "-c", f"(sleep 60 &); echo ready > {tmp}/ready; "
                            f"while [ ! -e {tmp}/go ]; do sleep 0.05; done"],
               preexec_fn=cg[1] if cg else None)
    try:
        wait_for_file(tmp / "ready", 20)
        wait_healthy(port)
        live = wait_scrape(port, lambda s: s.samples("reaper_node_cpu_busy_ratio")
                           and s.samples("reaper_visible_memory_cgroups"), "node samples")
        (tmp / "go").touch()
        assert r.wait(30) == 0
    finally:
        r.kill()
        if cg:
            remove_cgroup(cg[0])
    final = Scrape(mfile.read_text())
    names = set()
    for s in (live, final):
        names |= set(s.families)
        names |= {x.name for f in s.families.values() for x in f.samples}
        names |= {f.name + "_total" for f in s.families.values() if f.type == "counter"}   # even without samples
    return names | _node_names(), set(live.families) | set(final.families), bool(cg)


def _node_names() -> set:
    """reaper node's names, as docs/metrics.md's section for it lists them (and their
    samples' suffixes): tests/test_node.py checks that section against a real `reaper
    node`'s scrape."""
    section = (DOCS / "metrics.md").read_text().split("## reaper node", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(reaper_node_[a-z0-9_]+)`", section, re.M))
    assert documented, "docs/metrics.md has no reaper node section"
    return documented | {n + s for n in documented for s in ("_bucket", "_count", "_sum")}


def test_dashboard_names_only_exported_metrics(exported):
    names, _, _ = exported
    dash = json.loads((DOCS / "grafana-dashboard.json").read_text())

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))
    exprs = [t["expr"] for p in panels(dash["panels"]) for t in p.get("targets", [])]
    assert len(exprs) >= 10
    used = {m for e in exprs for m in NAME.findall(e)}
    for var in dash.get("templating", {}).get("list", []):
        used |= set(NAME.findall(str(var.get("query", ""))))
    assert "reaper_reap_latency_seconds_bucket" in used
    assert used <= names, sorted(used - names)


def test_alert_rules_name_only_exported_metrics(exported):
    names, _, _ = exported
    used = set(NAME.findall((DOCS / "alerts.yml").read_text().split("groups:", 1)[1]))
    assert used <= names, sorted(used - names)


def test_metric_reference_matches_the_exporter(exported):
    _, families, in_cgroup = exported
    text = (DOCS / "metrics.md").read_text()
    table = text.split("## Metric reference", 1)[1].split("\n## ", 1)[0]
    documented = {m.rstrip("_") for m in re.findall(r"^\| `((?:reaper|process)_[a-z0-9_*]*)`", table, re.M)}
    documented.discard("process_*")
    # The parser gives counters' family names without _total.
    exported_reaper = {f + "_total" if f + "_total" in text else f for f in families if f.startswith("reaper_")}
    conditional = set() if in_cgroup else {"reaper_cgroup_pids", "reaper_cgroup_pids_max"}
    conditional.add("reaper_leftover_gpu_memory_bytes")     # --gpu-memory with NVML only (a GPU machine)
    assert exported_reaper - documented == set(), "exported but not documented"
    assert documented - exported_reaper - conditional == set(), "documented but not exported"


# Families whose series the host's cgroup files decide (docs/metrics.md, "Series per scrape").
HOST_FAMILIES = {"reaper_node_cgroups", "reaper_cgroup_v2_descendants", "reaper_cgroup_v2_controller_cgroups",
                 "reaper_visible_memory_cgroups", "reaper_cgroup_pids", "reaper_cgroup_pids_max"}


def test_a_plain_default_scrape_has_the_documented_number_of_series(reaper):
    """docs/metrics.md says how many series a default scrape of a plain run has (and that
    the cores do not change it: tests/test_metrics_node.py); a real run has that many,
    none labelled by core."""
    m = re.search(r"a plain run .*? has \*\*(\d+) series\*\*", (DOCS / "metrics.md").read_text(), re.S)
    assert m, "docs/metrics.md no longer states the series of a plain run"
    _, port = start_with_metrics(reaper, ["sleep", "600"])
    s = wait_scrape(port, lambda s: s.samples("reaper_node_cpu_busiest_ratio")
                    and s.samples("reaper_visible_memory_cgroups"), "a first CPU sample")
    series = [(x.name, x.labels) for f in s.families.values() for x in f.samples]
    assert [x for x in series if "cpu" in x[1]] == []
    fixed = sorted((n, sorted(lab.items())) for n, lab in series if n not in HOST_FAMILIES)
    assert len(fixed) == int(m.group(1)), \
        f"a plain run has {len(fixed)} series besides the host's cgroup ones, docs/metrics.md says " \
        f"{m.group(1)}: update it ('Series per scrape'). They are: {fixed}"

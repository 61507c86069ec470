"""docs/: the alert rules pass promtool (syntax and a rule unit test), and the dashboard,
the rules and the metric reference name only metrics the exporter really exports."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import free_port, require, wait_for_file, remove_cgroup
from metrics_helpers import Scrape, in_pids_cgroup, wait_healthy, wait_scrape

DOCS = Path(__file__).resolve().parent.parent / "docs"
NAME = re.compile(r"\b((?:reaper|process)_[a-z0-9_]+)\b")

RULE_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'reaper_zombie_oldest_age_seconds{{instance="a"}}'
        values: '700+60x20'
      - series: 'reaper_zombies{{instance="a"}}'
        values: '0+2x40'
      - series: 'reaper_node_cgroups{{instance="a",controller="memory"}}'
        values: '68680x60'
      - series: 'reaper_visible_memory_cgroups{{instance="a"}}'
        values: '240x60'
      - series: 'reaper_cgroup_v2_descendants{{instance="a",state="dying"}}'
        values: '68213x60'
      - series: 'reaper_cgroup_v2_descendants{{instance="a",state="live"}}'
        values: '412x60'
      - series: 'reaper_start_time_seconds{{instance="a"}}'
        values: '100x5 500x10'
      - series: 'reaper_service_starts_total{{instance="a",service="agent"}}'
        values: '1+1x5 6x20'
      - series: 'reaper_service_failed{{instance="a",service="agent"}}'
        values: '0x5 1x20'
      - series: 'reaper_service_failed{{instance="b",service="proxy"}}'
        values: '0x20'
    alert_rule_test:
      - eval_time: 10m
        alertname: ReaperZombieOld
        exp_alerts:
          - exp_labels: {{severity: warning, instance: a}}
            exp_annotations:
              summary: A zombie older than 10 minutes in a
              description: The oldest zombie started 21m 40s ago and is still not reaped.
      - eval_time: 30m
        alertname: ReaperZombiesGrowing
        exp_alerts:
          - exp_labels: {{severity: warning, instance: a}}
            exp_annotations:
              summary: Zombies keep accumulating in a
              description: "30 more zombies than 15 minutes ago. A live parent does not wait for its children (see reaper_zombies_by_parent); zombies hold pids until reaped."
      - eval_time: 45m
        alertname: ReaperMemoryCgroupsLeaking
        exp_alerts:
          - exp_labels: {{severity: warning, instance: a, controller: memory}}
            exp_annotations:
              summary: Memory cgroups far above the live ones on the node of a
              description: "/proc/cgroups counts 68680 memory cgroups, over ten times the live directories: dying cgroups are piling up (meaningful where reaper sees the host cgroup hierarchy)."
      - eval_time: 45m
        alertname: ReaperDyingCgroupsPilingUp
        exp_alerts:
          - exp_labels: {{severity: warning, instance: a, state: dying}}
            exp_annotations:
              summary: Dying cgroups far above the live ones on the node of a
              description: "cgroup.stat counts 68213 dying cgroups, over ten times the live ones: removed cgroups held by charged memory are piling up (cgroup v2; meaningful where reaper sees the host's cgroup hierarchy)."
      - eval_time: 8m
        alertname: ReaperMainChildRestarted
        exp_alerts:
          - exp_labels: {{severity: info, instance: a}}
            exp_annotations:
              summary: The container of a restarted
              description: "reaper (and so its main child) started again within 15 minutes; the previous main child's exit code is in reaper's exit summary and its final metrics file."
      - eval_time: 3m
        alertname: ReaperMainChildRestarted
        exp_alerts: []
      - eval_time: 10m
        alertname: ReaperServiceCrashLooping
        exp_alerts:
          - exp_labels: {{severity: warning, instance: a, service: agent}}
            exp_annotations:
              summary: Service agent of a keeps restarting
              description: "5 more starts than 10 minutes ago: it ends soon after each start. reaper backs off and gives it up at --restart-limit (docs/services.md); its last exit code is reaper_service_last_exit_code."
      - eval_time: 10m
        alertname: ReaperServiceGivenUp
        exp_alerts:
          - exp_labels: {{severity: critical, instance: a, service: agent}}
            exp_annotations:
              summary: Service agent of a was given up
              description: "It reached the restart limit (or failed under --restart never) and will not be started again until the container restarts; with --on-service-failure stop the container ends instead."
      - eval_time: 3m
        alertname: ReaperServiceGivenUp
        exp_alerts: []
"""


def _promtool():
    tool = shutil.which("promtool")
    require("promtool", tool is not None, "Debian package prometheus")
    return tool


@pytest.mark.prometheus
def test_alert_rules_pass_promtool(tmp_path):
    tool = _promtool()
    check = subprocess.run([tool, "check", "rules", str(DOCS / "alerts.yml")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = tmp_path / "rules_test.yml"
    tests.write_text(RULE_TESTS.format(rules=json.dumps(str(DOCS / "alerts.yml"))))
    unit = subprocess.run([tool, "test", "rules", str(tests)], capture_output=True, text=True)
    assert unit.returncode == 0, unit.stdout + unit.stderr


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
    return names, set(live.families) | set(final.families), bool(cg)


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
    assert exported_reaper - documented == set(), "exported but not documented"
    assert documented - exported_reaper - conditional == set(), "documented but not exported"

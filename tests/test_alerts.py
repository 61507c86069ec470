"""docs/alerts.yml: promtool accepts the rules and passes their unit tests
(docs/alerts.test.yml, a firing and a quiet case for every alert); every alert has a
runbook section in docs/alerts.md, names the pod in its summary, works with the
default --node-metrics summary, and keeps the pod's labels; generate.py's
--runbook-base rewrites every link."""
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import importable, require

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
BASE = "https://reaper.invalid/docs/"
WHERE = "{{ with $labels.pod }}{{ $labels.namespace }}/{{ . }}{{ else }}{{ $labels.instance }}{{ end }}"
NAME = re.compile(r"\b(reaper_[a-z0-9_]+)\b")
# Exported only with --node-metrics per-core: an alert on them is silent by default.
PER_CORE = {"reaper_node_cpu_mode_ratio", "reaper_node_cpu_busy_ratio", "reaper_node_cpu_saturated_seconds_total"}


def _promtool():
    tool = shutil.which("promtool")
    require("promtool", tool is not None, "Debian package prometheus")
    return tool


def _yaml():
    require("pyyaml", importable("yaml"), "pip install -e '.[test]'")
    import yaml

    return yaml


def _rules():
    return [r for g in _yaml().safe_load((DOCS / "alerts.yml").read_text())["groups"] for r in g["rules"]]


def _slugs(markdown: str) -> set:
    """The anchors GitHub/GitLab give the headings: lower case, punctuation dropped,
    spaces to hyphens."""
    out = set()
    for title in re.findall(r"^#{1,6} (.+)$", markdown, re.M):
        out.add(re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-"))
    return out


@pytest.mark.prometheus
def test_promtool_checks_the_rules():
    check = subprocess.run([_promtool(), "check", "rules", str(DOCS / "alerts.yml")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in check.stdout


@pytest.mark.prometheus
def test_promtool_unit_tests_pass(tmp_path):
    # From another directory: rule_files is relative to the test file, not the cwd.
    unit = subprocess.run([_promtool(), "test", "rules", str(DOCS / "alerts.test.yml")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert unit.returncode == 0, unit.stdout + unit.stderr
    assert "SUCCESS" in unit.stdout


@pytest.mark.prometheus
def test_promtool_unit_tests_can_fail(tmp_path):
    """The same tests against the rules as they were before issue 18 (violations
    counter, no stop flag) fail on the two alerts it is about."""
    old = (DOCS / "alerts.yml").read_text()
    old = old.replace("expr: reaper_strays_over_budget > 0",
                      "expr: sum by (instance, job) (increase(reaper_budget_violations_total[10m])) > 0")
    start = old.index("max_over_time((\n")
    end = old.index(")[10m:15s])", start) + len(")[10m:15s])")
    old = old[:start] + 'reaper_main_child_outcome{outcome!="exited_0"} == 1' + old[end:]
    (tmp_path / "alerts.yml").write_text(old)
    (tmp_path / "alerts.test.yml").write_text((DOCS / "alerts.test.yml").read_text())
    unit = subprocess.run([_promtool(), "test", "rules", str(tmp_path / "alerts.test.yml")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert unit.returncode != 0
    failed = set(re.findall(r"alertname: (\w+), time:", unit.stdout + unit.stderr))
    assert failed == {"ReaperStraysOverBudget", "ReaperMainChildFailed"}, unit.stdout + unit.stderr


def test_every_alert_has_a_firing_and_a_quiet_case():
    rules = {r["alert"] for r in _rules()}
    tests = _yaml().safe_load((DOCS / "alerts.test.yml").read_text())
    assert tests["rule_files"] == ["alerts.yml"]
    firing, quiet = set(), set()
    for group in tests["tests"]:
        for case in group.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert rules - firing == set(), "no case where it fires"
    assert rules - quiet == set(), "no case where it stays quiet"
    assert (firing | quiet) - rules == set(), "tests of alerts that do not exist"


def test_every_alert_links_to_its_runbook_section():
    runbook = (DOCS / "alerts.md").read_text()
    anchors = _slugs(runbook)
    sections = dict(re.findall(r"^## (Reaper\w+)\n(.*?)(?=^## |\Z)", runbook, re.M | re.S))
    names = [r["alert"] for r in _rules()]
    assert len(names) == len(set(names))
    for rule in _rules():
        name = rule["alert"]
        url = rule["annotations"]["runbook_url"]
        assert url == f"{BASE}alerts.md#{name.lower()}", name
        assert url.split("#", 1)[1] in anchors, name
        lines = sections[name].strip().splitlines()
        assert [ln.split(":**")[0] for ln in lines] == ["- **Means", "- **Look at", "- **Do"], name
    assert set(sections) == set(names), "runbook sections of alerts that do not exist"
    # the placeholder base is explained where the links point
    assert "where-the-links-point" in anchors and BASE in runbook


def test_every_summary_names_the_pod_or_the_instance():
    for rule in _rules():
        assert WHERE in rule["annotations"]["summary"], rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, rule["alert"]
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule["alert"]


def test_rules_work_with_default_node_metrics_and_keep_the_pod_labels():
    for rule in _rules():
        expr = rule["expr"]
        assert not set(NAME.findall(expr)) & PER_CORE, rule["alert"]
        # an aggregation `by (...)` or a match `on (...)` would drop namespace, pod and
        # ray_io_cluster before Alertmanager sees them
        assert not re.search(r"\b(by|on)\s*\(", expr), rule["alert"]


def test_rules_name_only_documented_metrics():
    table = (DOCS / "metrics.md").read_text().split("## Metric reference", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(reaper_[a-z0-9_]+)`", table, re.M))
    for rule in _rules():
        used = set(NAME.findall(rule["expr"]))
        assert used and used <= documented, (rule["alert"], sorted(used - documented))


def test_generate_rewrites_the_runbook_base(tmp_path):
    yaml = _yaml()
    spec = importlib.util.spec_from_file_location("k8s_generate", REPO / "docker/k8s/generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.RUNBOOK_BASE == BASE
    base = "https://git.example.com/platform/reaper/-/blob/v0.1.0/docs"     # no trailing slash
    assert gen.main(["--runbook-base", base, "--out", str(tmp_path)]) == 0
    (rule,) = [d for d in yaml.safe_load_all((tmp_path / "prometheusrule.yaml").read_text()) if d]
    urls = {r["alert"]: r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert urls == {r["alert"]: f"{base}/alerts.md#{r['alert'].lower()}" for r in _rules()}
    assert (tmp_path / "grafana-dashboard-configmap.yaml").exists()
    # the shipped files keep the placeholder (tests/test_manifests.py compares them)
    assert BASE + "alerts.md#" in (REPO / "docker/k8s/prometheusrule.yaml").read_text()

"""docs/alerts.yml: promtool accepts the rules and passes their unit tests
(docs/alerts.test.yml, a firing and a quiet case for every alert); every alert has a
runbook section in docs/alerts.md, names the pod in its summary, works with the
default --node-metrics summary, and keeps the pod's labels; the alerts of `reaper node`
(group reaper-node) fire once per node, not per pod or core; generate.py's
--runbook-base rewrites every link."""
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import require, yaml_module

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
BASE = "https://reaper.invalid/docs/"
WHERE = "{{ with $labels.pod }}{{ $labels.namespace }}/{{ . }}{{ else }}{{ $labels.instance }}{{ end }}"
# reaper node's alerts name the node (the PodMonitor's node label), else the instance
WHERE_NODE = "{{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}"
NODE_GROUP = "reaper-node"
# what a node rule drops from every series so that it fires once per node: the pod's own
# labels (a restarted or surge pod is the same node) and the core
PER_POD = {"pod", "container", "endpoint"}
NAME = re.compile(r"\b(reaper_[a-z0-9_]+)\b")
# Exported only with --node-metrics per-core: an alert on them is silent by default.
PER_CORE = {"reaper_node_cpu_mode_ratio", "reaper_node_cpu_busy_ratio", "reaper_node_cpu_saturated_seconds_total"}


def _promtool():
    tool = shutil.which("promtool")
    require("promtool", tool is not None, "Debian package prometheus")
    return tool


def _rules(group=None):
    return [r for g in yaml_module().safe_load((DOCS / "alerts.yml").read_text())["groups"]
            if group is None or g["name"] == group for r in g["rules"]]


def _pod_rules():
    node = {r["alert"] for r in _rules(NODE_GROUP)}
    return [r for r in _rules() if r["alert"] not in node]



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
    tests = yaml_module().safe_load((DOCS / "alerts.test.yml").read_text())
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
    node = {r["alert"] for r in _rules(NODE_GROUP)}
    assert node == {"ReaperNodeCoreSaturationStreak", "ReaperNodeDyingMemoryCgroupsGrowing",
                    "ReaperNodeNicStallAfterKernelSaturation"}
    for rule in _rules():
        where = WHERE_NODE if rule["alert"] in node else WHERE
        assert where in rule["annotations"]["summary"], rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, rule["alert"]
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule["alert"]


def test_rules_work_with_default_node_metrics_and_keep_the_pod_labels():
    rules = _pod_rules()
    assert rules, "no pod rules parsed from docs/alerts.yml"
    for rule in rules:
        expr = rule["expr"]
        assert not set(NAME.findall(expr)) & PER_CORE, rule["alert"]
        # an aggregation `by (...)` or a match `on (...)` would drop namespace, pod and
        # ray_io_cluster before Alertmanager sees them
        assert not re.search(r"\b(by|on)\s*\(", expr), rule["alert"]


def test_rules_name_only_documented_metrics():
    """In docs/metrics.md's reference, or its section of reaper node's own metrics (the
    reaper-node rules, which read nothing else); a histogram's series by its family."""
    text = (DOCS / "metrics.md").read_text()

    def table(section):
        return set(re.findall(r"^\| `(reaper_[a-z0-9_]+)`", text.split(section + "\n", 1)[1].split("\n## ", 1)[0], re.M))
    pods, node = table("## Metric reference"), table("## reaper node")
    node_rules = {r["alert"] for r in _rules(NODE_GROUP)}
    rules = _rules()
    assert rules and pods and node, "nothing parsed from docs/alerts.yml or docs/metrics.md"
    for rule in rules:
        documented = node if rule["alert"] in node_rules else pods
        used = {re.sub(r"_(bucket|count)$", "", m) for m in NAME.findall(rule["expr"])}
        assert used and used <= documented, (rule["alert"], sorted(used - documented))


def test_generate_rewrites_the_runbook_base(tmp_path):
    yaml = yaml_module()
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


def test_node_rules_drop_the_pod_and_the_core_from_every_series():
    """Each series a reaper-node rule reads is aggregated `without` the pod's own labels
    (and the core or the mode, where the metric has one) before anything else: once per
    node. No `by`: that would drop the labels a deployment adds (a cluster name, the job)."""
    rules = _rules(NODE_GROUP)
    assert rules
    for rule in rules:
        expr = rule["expr"]
        assert not re.search(r"\b(by|on)\s*\(", expr), rule["alert"]
        selectors = list(re.finditer(r"\breaper_[a-z0-9_]+", expr))
        assert selectors, rule["alert"]
        for m in selectors:
            wrap = re.search(r"(max|sum) without \(([^)]*)\) \((increase\()?$", expr[:m.start()])
            assert wrap, (rule["alert"], m.group())
            dropped = {x.strip() for x in wrap.group(2).split(",")}
            assert PER_POD <= dropped, (rule["alert"], m.group())
            per = {"cpu"} if m.group().startswith("reaper_node_cpu_saturation_streak_") and \
                "_length_" not in m.group() else {"mode"} if "_length_" in m.group() else set()
            assert per <= dropped, (rule["alert"], m.group())


def _node_variant(old: str, change) -> str:
    """docs/alerts.yml with change applied to the reaper-node group's text only."""
    start = old.index(f"  - name: {NODE_GROUP}\n")
    return old[:start] + change(old[start:])


def _promtool_output(tmp_path, rules_text: str) -> str:
    (tmp_path / "alerts.yml").write_text(rules_text)
    (tmp_path / "alerts.test.yml").write_text((DOCS / "alerts.test.yml").read_text())
    unit = subprocess.run([_promtool(), "test", "rules", str(tmp_path / "alerts.test.yml")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    return unit.stdout + unit.stderr


@pytest.mark.prometheus
@pytest.mark.parametrize("keep", ["pod", "cpu"])
def test_node_alerts_fire_once_per_node(tmp_path, keep):
    """Keep the pod's labels (or the core) in the rules and the same promtool cases fail:
    the old and the surge pod of node-a give an alert each (a core's streak no longer
    matches the node's kernel streaks, which have no core)."""
    drop = {"pod": ("pod", "container", "endpoint"), "cpu": ("cpu",)}[keep]

    def keep_them(text):
        return re.sub(r"without \(([^)]*)\)", lambda m: "without (" + ", ".join(
            x for x in m.group(1).split(", ") if x not in drop) + ")", text)

    variant = _node_variant((DOCS / "alerts.yml").read_text(), keep_them)
    assert variant != (DOCS / "alerts.yml").read_text()
    out = _promtool_output(tmp_path, variant)
    failed = set(re.findall(r"alertname: (\w+), time:", out))
    expected = {"ReaperNodeCoreSaturationStreak"} | ({"ReaperNodeDyingMemoryCgroupsGrowing",
                                                      "ReaperNodeNicStallAfterKernelSaturation"}
                                                     if keep == "pod" else set())
    assert failed == expected, out
    if keep == "pod":
        assert 'pod="reaper-node-q9w4z"' in out.split("got:", 1)[1], out


@pytest.mark.prometheus
@pytest.mark.parametrize("condition, loose, alert, quiet_node", [
    ('{mode=~"system|softirq|irq"}', '{mode=~".+"}', "ReaperNodeCoreSaturationStreak", "node-b"),  # user time
    ('le="5.0"}', 'le="3.0"}', "ReaperNodeCoreSaturationStreak", "node-c"),                         # a 4 s streak
    ("> 1000\n", "> 0\n", "ReaperNodeDyingMemoryCgroupsGrowing", "node-c"),                      # 700, growing
    ("> ignoring(state) 10 * ", "> ignoring(state) 0 * ", "ReaperNodeDyingMemoryCgroupsGrowing", "node-d"),
    ("[6h:5m]) > 100", "[6h:5m]) > -1", "ReaperNodeDyingMemoryCgroupsGrowing", "node-b"),         # no longer growing
])
def test_each_condition_of_the_node_rules_keeps_a_node_quiet(tmp_path, condition, loose, alert, quiet_node):
    """Each condition of the node rules has a case it alone keeps quiet: loosened, the
    promtool cases fail on that alert, because that node fires."""
    text = (DOCS / "alerts.yml").read_text()
    assert text.split(f"name: {NODE_GROUP}\n")[1].count(condition) in (1, 2), condition
    out = _promtool_output(tmp_path, _node_variant(text, lambda t: t.replace(condition, loose)))
    assert set(re.findall(r"alertname: (\w+), time:", out)) == {alert}, out
    got = out.split("got:", 1)[1]
    assert f'node="{quiet_node}"' in got, out

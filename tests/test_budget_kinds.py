"""The budget kinds (reaper/budgets/kinds/): each kind's decisions on recorded samples
(plain numbers, no process), and the registry as the one source of the options that
turn budgets on, the metrics' reason labels and the docs' lists.

The recorded samples drive a kind's judge() with a stand-in for the engine
(budget_recorder.Recorder: a Sample and an Actions door) that keeps the actions asked
for instead of acting: what a real process
would get is tested in test_budget*.py."""
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from reaper import options
from reaper.budgets import kinds
from reaper.budgets.enforcer import Usage
from reaper.budgets.kinds import age, cpu, memory

from budget_recorder import Recorder

DOCS = Path(__file__).resolve().parent.parent / "docs"
MB = 1 << 20


# --- the registry --------------------------------------------------------------------

def test_the_registry_lists_each_kind_once_with_its_module():
    assert kinds.REASONS == ("cpu", "memory", "age")           # the order they judge in
    assert len(set(kinds.REASONS)) == len(kinds.REASONS) and kinds.ANY not in kinds.REASONS
    for reason, dests in kinds.KINDS:
        module = __import__(f"reaper.budgets.kinds.{reason}", fromlist=["Kind"])
        assert module.Kind.reason == reason and issubclass(module.Kind, kinds.Kind)
        assert dests and all(hasattr(options.Config, d) for d in dests)


def test_options_turn_budgets_on_with_the_registrys_dests_only():
    """options.BUDGETS is spelt out (nothing of reaper.budgets on the way to the exec):
    it must be the registry's, and every one of them alone turns its kind on."""
    assert options.BUDGETS == kinds.DESTS
    budget_rows = {o.dest: o for o in options.OPTIONS if o.section == "budget"}
    assert set(kinds.DESTS) <= set(budget_rows)
    hint_flags = set(re.findall(r"--[a-z-]+", options.IDLE_BUDGET_HINT))
    assert hint_flags == {"--" + budget_rows[d].long for d in kinds.DESTS}
    assert not options.parse(["--budget-action", "throttle", "--", "true"], environ={}).budgets_enabled
    for reason, dests in kinds.KINDS:
        for dest in dests:
            value = {"stray_max_age": "60", "memory_budget": "64M", "memory_budget_total": "1G"}.get(dest, "0.5")
            cfg = options.parse(["--" + budget_rows[dest].long, value, "--", "true"], environ={})
            assert cfg.budgets_enabled and kinds.turned_on(cfg) == [reason]
            assert [k.reason for k in kinds.load(cfg)] == [reason]


def test_metrics_reason_labels_are_the_registrys():
    from metrics_helpers import exporter_config, own_scope

    from reaper import metrics
    from reaper.log import Log
    from reaper.metrics.reading import Reading
    from reaper.metrics.sections import budget
    from reaper.stats import Stats

    stats = Stats()
    stats.budget.over_budget = {"cpu": 2, "memory": 1, "age": 0}
    x = metrics.prepare(exporter_config(cpu_budget=0.5), stats, Log(0))
    families = {f.name: f for f in budget.collect(Reading(x, own_scope()), {})}
    over = families["reaper_strays_over_budget"]
    assert [s.labels["reason"] for s in over.samples] == list(kinds.REASONS)
    assert {s.labels["reason"]: s.value for s in over.samples} == {"cpu": 2, "memory": 1, "age": 0}
    assert f"(reason: {', '.join(kinds.REASONS)})" in families["reaper_budget_violations"].documentation
    assert f"(reason: {', '.join(kinds.REASONS + (kinds.ANY,))})" in families["reaper_budget_actions"].documentation


def test_the_docs_list_the_registrys_kinds():
    budgets = " ".join((DOCS / "budgets.md").read_text().split())
    on = re.search(r"Budgets are off unless one of (.*?) is given", budgets).group(1)
    assert re.findall(r"`(--[a-z-]+)`", on) == ["--" + d.replace("_", "-") for d in kinds.DESTS]
    reasons = ", ".join(f"`{r}`" for r in kinds.REASONS)
    assert f"the budget kinds {reasons}, and `{kinds.ANY}`" in budgets
    metrics = (DOCS / "metrics.md").read_text()
    for family in ("reaper_budget_violations_total", "reaper_budget_actions_total", "reaper_strays_over_budget"):
        row = next(line for line in metrics.splitlines() if line.startswith(f"| `{family}` "))
        assert all(f"`{r}`" in row for r in kinds.REASONS), row


# --- recorded samples ------------------------------------------------------------------

def test_cpu_over_each_on_numbers():
    assert cpu.over_each(0.5, 0.5, False, 0.25) and not cpu.over_each(0.2, 0.2, False, 0.25)
    assert not cpu.over_each(None, None, False, 0.25)                  # nothing measured yet
    # Duty-cycled: judged on demand, let go only below RELEASE of the budget.
    assert cpu.over_each(0.2, 0.24, True, 0.25) and not cpu.over_each(0.2, 0.22, True, 0.25)
    # In a cgroup capped at its budget: over while it presses on the quota, or past the margin.
    assert cpu.over_each(0.1, 0.1, False, 0.25, pressing=True)
    assert not cpu.over_each(0.26, 0.26, False, 0.25, pressing=False)
    assert cpu.over_each(0.27, 0.27, False, 0.25, pressing=False)


def test_cpu_total_and_its_proportional_shares():
    assert cpu.over_total(use=1.2, demand=1.2, total=1.0, cycled=False)
    assert not cpu.over_total(use=0.8, demand=3.0, total=1.0, cycled=False)
    assert cpu.over_total(use=0.8, demand=0.95, total=1.0, cycled=True)      # held down, would be over
    assert not cpu.over_total(use=0.5, demand=0.85, total=1.0, cycled=True)  # under RELEASE: let go
    assert cpu.over_total(use=0.1, demand=0.1, total=1.0, cycled=False, pressing=True)
    share = cpu.shares({"a": 3.0, "b": 1.0, "c": None}, 1.0)
    assert share["a"] == pytest.approx(3 * share["b"]) and sum(share.values()) == pytest.approx(1.0)
    assert share["c"] == pytest.approx(1e-3 / 4.001)                        # no demand shown: the least


def test_cpu_duty_fraction_control_law():
    assert cpu.duty_fraction(0.25, 0.5) == 0.25            # first: demand taken as at least one core
    assert cpu.duty_fraction(0.25, 2.0) == 0.125
    # Then half the error, in run time at its speed: used 0.35 for a target of 0.25 at 1 core.
    assert cpu.duty_fraction(0.25, 1.0, 0.25, used=0.35) == pytest.approx(0.2)
    assert cpu.duty_fraction(0.25, 0.1, 0.25, used=0.15) == pytest.approx(0.45)   # speed: SLOW_SPEED at least
    assert cpu.duty_fraction(0.25, 1.0, 0.3, used=None) == 0.3                     # no last sample: kept
    assert cpu.duty_fraction(0.1, 1.0, 0.9, used=0.0) == pytest.approx(0.4)        # at most target / SLOW_SPEED
    assert cpu.duty_fraction(0.25, 1.0, 0.02, used=1.0) == 0.01                    # at least LEAST_FRACTION


def test_usage_averages_cpu_over_the_window_and_demand_over_run_time():
    u = Usage()
    for i in range(5):                      # half a core; stopped half the time from t=2 on
        u.add(float(i), 0.5 * i, float(i) if i <= 2 else 2 + 0.5 * (i - 2), window=10.0, interval=1.0)
    assert u.rate == pytest.approx(0.5) and u.demand == pytest.approx(2.0 / 3.0)
    assert u.last_rate() == pytest.approx(0.5)
    u = Usage()
    u.add(0.0, 0.0, 0.0, 10.0, 1.0)
    assert u.rate is None and u.last_rate() is None      # one sample: nothing to average


def test_cpu_a_stray_over_budget_after_its_grace_and_one_under():
    r = Recorder(["--cpu-budget", "0.25", "--budget-grace", "30"])
    r.stray(11, age=40, rate=0.5)
    r.stray(12, age=40, rate=0.2)
    r.stray(13, age=10, rate=0.9)          # in its grace: free
    r.stray(14, age=40, rate=0.4, reason="match")   # --stray-match: its session is not all strays
    assert r.judge() == [("violation", "cpu", 11), ("nice", "cpu", 11), ("autogroup_nice", "cpu", None),
                         ("violation", "cpu", 14), ("nice", "cpu", 14)]
    assert r.warnings()[0] == "stray 11 (s11, orphan) uses 0.50 cores, over --cpu-budget 0.25 (window 10s): nice"
    assert [t.kinds["cpu"].over for t in r.tracked.values()] == [True, False, False, True]
    r.done.clear()
    assert r.judge() == []                  # still over: said once, niced once


def test_cpu_strays_together_over_the_total():
    r = Recorder(["--cpu-budget-total", "0.4", "--budget-action", "observe"])
    r.stray(21, age=40, rate=0.3)
    r.stray(22, age=40, rate=0.2)
    assert r.judge() == [("violation", "cpu", 21), ("violation", "cpu", 22)]
    assert all("strays together over --cpu-budget-total 0.4" in w for w in r.warnings())
    assert all(t.action == "observe" for t in r.tracked.values())


def test_memory_over_each_and_the_total_biggest_first():
    assert memory.over_each({"a": 70 * MB, "b": 60 * MB}, 64 * MB) == {"a"}
    held = {"a": 100, "b": 300, "c": 200}
    assert memory.biggest_first(held, 650, 400) == {"b"}           # 350 left: fits
    assert memory.biggest_first(held, 650, 200) == {"b", "c"}
    assert memory.biggest_first(held, 650, 10) == {"a", "b", "c"}  # what is in its grace stays held
    assert memory.biggest_first(held, 600, 600) == set()


def test_memory_a_stray_over_its_budget_and_the_total_biggest_first():
    r = Recorder(["--memory-budget", "64M"])
    r.stray(31, age=40, mem=130 * MB)
    r.stray(32, age=40, mem=30 * MB)
    r.stray(33, age=5, mem=500 * MB)        # in its grace
    assert r.judge() == [("violation", "memory", 31), ("nice", "memory", 31)]
    assert r.warnings() == ["stray 31 (s31, orphan) holds 130 MiB, over --memory-budget 64 MiB: nice"]

    # The total: the cheap figures are over, so each one's exact figure is read and the
    # biggest are ended first until the rest fit.
    r = Recorder(["--memory-budget-total", "100M", "--budget-action", "terminate"])
    r.stray(41, age=40, mem=60 * MB, exact=50 * MB)
    r.stray(42, age=40, mem=70 * MB, exact=45 * MB)
    r.stray(43, age=40, mem=40 * MB, exact=40 * MB)
    assert r.judge() == [("violation", "memory", 41), ("nice", "memory", 41), ("terminate", "memory", 41)]
    assert r.warnings() == ["stray 41 (s41, orphan) holds 50 MiB, strays together over "
                            "--memory-budget-total 100 MiB: terminate"]


def test_age_past_max_age():
    assert age.past_max_age(since=0.0, now=60.0, max_age=60.0) and not age.past_max_age(0.0, 59.9, 60.0)
    r = Recorder(["--stray-max-age", "60", "--budget-action", "observe"])
    r.stray(51, age=61)
    r.stray(52, age=30)
    assert r.judge() == [("violation", "age", 51)]
    assert r.warnings() == ["stray 51 (s51, orphan) first seen 61s ago, past --stray-max-age 60: observe"]
    r.done.clear()
    assert r.judge() == []                  # reported once
    r = Recorder(["--stray-max-age", "60", "--budget-action", "nice"])
    r.stray(53, age=61)
    assert r.judge() == [("violation", "age", None), ("terminate", "age", 53)]   # whatever the action but observe

"""reaper as PID 1 with metrics on: known events, scraped over real HTTP, exact counts and types."""
import json
import signal

from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families

from conftest import wait_for_file
from metrics_helpers import (EVENTS_CHILD, OPENMETRICS, Scrape, get, send_and_confirm, start_with_metrics,
                             wait_scrape, write_script)


def test_known_events_exact_counts_and_types(reaper, tmp_path):
    summary, mfile = tmp_path / "summary.json", tmp_path / "reaper.prom"
    r, port = start_with_metrics(reaper, [*write_script(tmp_path, "child.py", EVENTS_CHILD), str(tmp_path)],
                                 ["--metrics-file", str(mfile), "--summary-file", str(summary)])
    wait_for_file(tmp_path / "ready", 20)
    sigs = tmp_path / "signals"
    for i, sig in enumerate([signal.SIGUSR1] * 3 + [signal.SIGHUP] * 2):
        send_and_confirm(r, sig, sigs, i + 1)

    # The main child still runs: everything below is a live scrape.
    # (The zombie's age counts in clock ticks: await the first one.)
    # (The counters are live, the process gauges come from a scan reused for 0.5 s: await both.)
    s = wait_scrape(port, lambda s: s.total("reaper_reaped_total") == 6 and s.value("reaper_zombies") == 1
                    and s.value("reaper_zombie_oldest_age_seconds") > 0
                    and s.value("reaper_processes", **{"class": "stray"}) == 0,
                    "6 orphans reaped and one zombie left")
    assert s.value("reaper_reaped_total", kind="orphan", outcome="exited_0") == 3
    assert s.value("reaper_reaped_total", kind="orphan", outcome="exited_nonzero") == 2
    assert s.value("reaper_reaped_total", kind="orphan", outcome="SIGTERM") == 1
    assert s.value("reaper_reaped_total", kind="main") is None
    assert s.value("reaper_signals_received_total", signal="SIGUSR1") == 3
    assert s.value("reaper_signals_received_total", signal="SIGHUP") == 2
    assert s.value("reaper_signals_forwarded_total", signal="SIGUSR1") == 3
    assert s.value("reaper_signals_forwarded_total", signal="SIGHUP") == 2
    assert s.value("reaper_main_child_state", state="running") == 1
    assert s.value("reaper_main_child_up") == 1
    assert s.value("reaper_main_child_exit_code") is None
    assert s.value("reaper_phase", phase="running") == 1
    assert s.value("reaper_build_info", mode="init") == 1
    assert s.value("reaper_pid") == 1
    # The main child's own zombie, named with its parent (pid 2 in the namespace).
    assert s.value("reaper_zombies") == 1
    assert s.value("reaper_zombies_by_parent", parent_pid="2") == 1
    assert s.value("reaper_zombie_oldest_age_seconds") > 0
    assert s.value("reaper_processes", **{"class": "main_tree"}) == 1      # the zombie is not live
    assert s.value("reaper_processes", **{"class": "stray"}) == 0
    # The histogram holds every reap, cumulative buckets ending at +Inf.
    assert s.value("reaper_reap_latency_seconds_count") == 6
    assert s.value("reaper_reap_latency_seconds_bucket", le="+Inf") == 6
    les = [x for x in s.samples("reaper_reap_latency_seconds_bucket")]
    assert [x.value for x in les] == sorted(x.value for x in les)
    # Wake-up to reap is C work of microseconds: at least 1 µs each, far under 50 ms on
    # average even on a loaded machine (a unit slip, ns for s or s for ms, fails one side).
    assert 6 * 1e-6 <= s.value("reaper_reap_latency_seconds_sum") <= 6 * 0.05
    assert s.value("reaper_cpu_seconds_total", mode="user") > 0
    assert s.value("reaper_resident_memory_bytes") > 1e6
    assert s.value("process_resident_memory_bytes") > 1e6
    types = {
        "reaper_build_info": "gauge", "reaper_reaped": "counter", "reaper_reap_latency_seconds": "histogram",
        "reaper_signals_received": "counter", "reaper_signals_forwarded": "counter", "reaper_zombies": "gauge",
        "reaper_zombie_oldest_age_seconds": "gauge", "reaper_processes": "gauge",
        "reaper_drain_processes": "counter", "reaper_stray_cpu_seconds": "counter",
        "reaper_budget_actions": "counter", "reaper_budget_violations": "counter",
        "reaper_main_child_state": "gauge", "reaper_cpu_seconds": "counter",
    }
    assert {name: s.type(name) for name in types} == types

    # OpenMetrics when the scraper asks; the plain text format otherwise.
    status, ctype, body = get(port, accept=OPENMETRICS)
    assert status == 200 and ctype.startswith("application/openmetrics-text")
    assert body.endswith("# EOF\n")
    om = {f.name: f for f in om_families(body)}
    assert om["reaper_reaped"].type == "counter"
    assert om["reaper_reap_latency_seconds"].type == "histogram"
    status, ctype, _ = get(port)
    assert status == 200 and ctype.startswith("text/plain")
    assert get(port, "/healthz")[:1] == (200,)
    assert get(port, "/nope")[0] == 404

    # A known exit code: the final metrics file and the summary carry it.
    (tmp_path / "go").touch()
    assert r.wait(30) == 7
    final = Scrape(mfile.read_text())
    assert final.value("reaper_main_child_exit_code") == 7
    assert final.value("reaper_main_child_outcome", outcome="exited_nonzero") == 1
    assert final.value("reaper_main_child_state", state="exited") == 1
    assert final.value("reaper_reaped_total", kind="main", outcome="exited_nonzero") == 1
    assert final.value("reaper_reaped_total", kind="orphan", outcome="exited_0") == 4   # + the zombie
    assert final.value("reaper_phase", phase="done") == 1
    assert final.value("reaper_drain_duration_seconds") is not None
    assert not final.samples("process_resident_memory_bytes")    # node_exporter has its own process_*
    logged = [ln for ln in r.stderr.splitlines() if " summary {" in ln]
    assert len(logged) == 1
    totals = json.loads(logged[0].split(" summary ", 1)[1])
    assert json.loads(summary.read_text()) == totals
    assert totals["reaped"] == 8 and totals["orphans"] == 7
    assert totals["signals_forwarded"] == 5 and totals["exit_status"] == 7
    assert totals["drain"] == {"terminated": 0, "killed": 0, "survived": 0, "not_permitted": 0}
    for key in ("strays", "budget_actions"):
        assert key in totals


def test_drain_results_are_counted(reaper, tmp_path):
    """A process that ignores SIGTERM is killed at the end of the grace: counted as killed."""
    mfile = tmp_path / "m.prom"
    code = ("import os, signal, sys, time\n"
            "if os.fork() == 0:\n"
            "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "    open(sys.argv[1] + '/ready', 'w').write('ready')\n"
            "    time.sleep(60)\n"
            "    os._exit(0)\n"
            "while not os.path.exists(sys.argv[1] + '/go'):\n"
            "    time.sleep(0.01)\n")
    r, port = start_with_metrics(reaper, [*write_script(tmp_path, "c.py", code), str(tmp_path)],
                                 ["--metrics-file", str(mfile), "--grace", "0.5"])
    wait_for_file(tmp_path / "ready", 20)
    # The metrics file's writer may have scanned /proc just before the fork: await a scan after it.
    wait_scrape(port, lambda s: s.value("reaper_processes", **{"class": "main_tree"}) == 2,
                "the main child and its child in the main tree")
    (tmp_path / "go").touch()
    assert r.wait(30) == 0
    final = Scrape(mfile.read_text())
    assert final.value("reaper_drain_processes_total", result="killed") == 1
    assert final.value("reaper_drain_processes_total", result="terminated") == 0
    assert final.value("reaper_drain_processes_total", result="survived") == 0
    assert final.value("reaper_drain_duration_seconds") >= 0.5

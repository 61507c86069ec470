"""`reaper stats`: a compact view of a running reaper's numbers, from its endpoint or its file."""
import signal
import subprocess

import pytest

from budget_helpers import busy_argv, marker, orphans_then_sleep, wait_tagged
from conftest import REAPER, SLOW, free_port, proc_status, remove_cgroup, wait_for_file, reaper_stats
from metrics_helpers import (EVENTS_CHILD, in_pids_cgroup, send_and_confirm, start_with_metrics, wait_scrape,
                             write_script)


def test_stats_from_url_and_file(reaper, tmp_path):
    mfile = tmp_path / "m.prom"
    r, port = start_with_metrics(reaper, [*write_script(tmp_path, "child.py", EVENTS_CHILD), str(tmp_path)],
                                 ["--metrics-file", str(mfile), "--metrics-interval", "0.2"])
    wait_for_file(tmp_path / "ready", 20)
    send_and_confirm(r, signal.SIGUSR1, tmp_path / "signals", 1)
    wait_scrape(port, lambda s: s.total("reaper_reaped_total") == 6 and s.value("reaper_zombies") == 1
                and s.samples("reaper_node_cpu_busiest_ratio"), "the orphans reaped")
    out = reaper_stats("--url", f"http://127.0.0.1:{port}/metrics")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    print(text)
    assert text.startswith("reaper ") and "(init), pid 1" in text
    lines = {ln.split()[0]: ln for ln in text.splitlines()[1:] if ln.strip()}
    assert "running" in lines["main"]
    assert ("reaped       6 processes (6 orphans); the orphans: 3 exited 0, 2 exited with an error, "
            "1 killed by SIGTERM") in text
    assert "1 now" in lines["zombies"] and "[2] 1" in lines["zombies"]
    assert "received 1 SIGUSR1; passed on to the main child 1 SIGUSR1" in lines["signals"]
    assert "  budgets      off (no budget option given)\n" in text, text
    # The default summary: no core is named (no per-core series), the saturated ones are counted.
    assert "busiest core " in lines["node"] and "cores saturated now" in lines["node"], text
    assert "busiest core cpu" not in lines["node"], text
    assert len(text.splitlines()) <= 20               # compact: fits a terminal

    (tmp_path / "go").touch()
    assert r.wait(30) == 7
    out = reaper_stats("--file", str(mfile))
    assert out.returncode == 0, out.stderr
    assert "exited, exit code 7 (exited_nonzero)" in out.stdout
    assert "phase done" in out.stdout


NODE_SUMMARY = """# TYPE reaper_build_info gauge
reaper_build_info{version="1.0",mode="init"} 1
# TYPE reaper_node_cpu_busiest_ratio gauge
reaper_node_cpu_busiest_ratio{mode="busy"} 1.0
reaper_node_cpu_busiest_ratio{mode="system"} 0.97
reaper_node_cpu_busiest_ratio{mode="user"} 0.4
# TYPE reaper_node_cpus gauge
reaper_node_cpus 96
# TYPE reaper_node_cpu_saturated_cores gauge
reaper_node_cpu_saturated_cores 1
# TYPE reaper_node_cpu_any_saturated_seconds counter
reaper_node_cpu_any_saturated_seconds_total 530
# TYPE reaper_node_cpu_busiest_saturated_seconds counter
reaper_node_cpu_busiest_saturated_seconds_total 520
"""
PER_CORE = """# TYPE reaper_node_cpu_busy_ratio gauge
reaper_node_cpu_busy_ratio{cpu="0"} 0.1
reaper_node_cpu_busy_ratio{cpu="7"} 1.0
# TYPE reaper_node_cpu_mode_ratio gauge
reaper_node_cpu_mode_ratio{cpu="7",mode="system"} 0.97
# TYPE reaper_node_cpu_saturated_seconds counter
reaper_node_cpu_saturated_seconds_total{cpu="0"} 0
reaper_node_cpu_saturated_seconds_total{cpu="7"} 520
"""


@pytest.mark.parametrize("text,expected", [
    (NODE_SUMMARY, "busiest core 100% busy, system up to 97%; 1 of 96 cores saturated now; "
                   "seconds saturated: any core 530s, the busiest core 520s"),
    (NODE_SUMMARY + PER_CORE, "busiest core cpu7 100% busy (97% system); seconds saturated: cpu7 520s"),
], ids=["summary", "per-core"])
def test_stats_node_cpu_row_from_either_mode(tmp_path, text, expected):
    """--node-metrics summary (the default) has no per-core series: the row is made of
    the summary; with per-core it names the busiest core."""
    f = tmp_path / "m.prom"
    f.write_text(text)
    out = reaper_stats("--file", str(f))
    assert out.returncode == 0, out.stderr
    assert f"  node cpu     {expected}\n" in out.stdout, out.stdout


def test_stats_errors_are_one_line():
    port = free_port()            # nothing listens there
    out = reaper_stats("--url", f"http://127.0.0.1:{port}/metrics", "--timeout", "2")
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "Connection refused" in out.stderr
    out = reaper_stats("--file", "/nonexistent/m.prom")
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "No such file" in out.stderr
    out = reaper_stats("--url", "x", "--file", "y")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--url and --file exclude each other" in out.stderr


def test_stats_rejects_a_non_reaper_endpoint(tmp_path):
    other = tmp_path / "other.prom"
    other.write_text("# TYPE foo counter\nfoo_total 1\n")
    out = reaper_stats("--file", str(other))
    assert out.returncode == 1 and "reaper_build_info missing" in out.stderr


@pytest.mark.xdist_group("cpu-heavy")     # a busy stray acted on: not beside the other heavy tests
def test_stats_shows_budgets_strays_cgroups_and_pids(reaper):
    """The budget, stray, cgroup and pids rows, from a reaper that acts on a real stray
    and runs inside a pids cgroup of the test's own."""
    cg = in_pids_cgroup(400)
    if cg is None:
        pytest.skip("needs root and a cgroup-v1 pids hierarchy")
    tag = marker()
    try:
        r, port = start_with_metrics(
            reaper, orphans_then_sleep(busy_argv(tag, share=0.5)),
            ["--cpu-budget", "0.1", "--budget-action", "nice", "--budget-grace", "0", "--budget-interval", "0.2"],
            preexec_fn=cg[1])
        [stray] = wait_tagged(tag)
        ns_pid = proc_status(stray)["NSpid"].split()[-1]       # as reaper (PID 1) sees it
        wait_scrape(port, lambda s: (s.total("reaper_budget_actions_total") or 0) >= 1 and s.samples("reaper_stray_cpu_cores"),
                    "the stray reniced and listed")
        out = reaper_stats("--url", f"http://127.0.0.1:{port}/metrics", "--timeout", str(5 * SLOW))
        assert out.returncode == 0, out.stderr
        rows = {}
        for ln in out.stdout.splitlines()[1:]:
            key = ln[:15].strip() or "(more)"
            rows.setdefault(key, []).append(ln[15:].strip())
        budgets = rows["budgets"][0]
        assert budgets.startswith("on; strays used ") and "acted on: 1 reniced for CPU" in budgets \
            and "over a budget 1 time (1 for CPU)" in budgets, out.stdout
        assert any(f"[{ns_pid}]" in s and "cores" in s and "(reniced)" in s for s in rows["(more)"]), out.stdout
        assert "memory cgroups on the node" in rows["cgroups"][0] or "not listed" in rows["cgroups"][0], out.stdout
        if "cgroup v2" in rows:
            assert "live and" in rows["cgroup v2"][0] and "dying" in rows["cgroup v2"][0], out.stdout
        # The pids row counts reaper's own cgroup: the test's, holding unshare, reaper, its child, the stray.
        used, _, limit = rows["pids"][0].partition(" / ")
        assert limit.startswith("400 ") and 4 <= int(used) < 400, out.stdout
        r.send(signal.SIGTERM)
        assert r.wait() == 143, r.stderr
    finally:
        remove_cgroup(cg[0])


# --- where people use it: the variables, HOST:PORT, a finished run, one snapshot ------------------

ORPHAN_THEN_SLEEP = """
import subprocess, sys, time
subprocess.run(["sh", "-c", "(exec sleep 300 &)"])
open(sys.argv[1] + "/ready", "w").write("ready")
time.sleep(300)
"""


def test_stats_finds_the_endpoint_the_variables_name_and_takes_host_port(reaper, tmp_path):
    """kubectl exec ... reaper stats in a container whose REAPER_METRICS_PORT moved the
    port: the same variables tell reaper stats where to look; --url takes HOST:PORT."""
    import os

    r, port = start_with_metrics(reaper, [*write_script(tmp_path, "c.py", ORPHAN_THEN_SLEEP), str(tmp_path)],
                                 ["--stray-max-age", "300", "--budget-interval", "0.2"])
    wait_for_file(tmp_path / "ready", 20)
    wait_scrape(port, lambda s: s.value("reaper_processes", **{"class": "stray"}) == 1, "the stray")
    env = {**os.environ, "REAPER_METRICS_PORT": str(port), "REAPER_METRICS_ADDRESS": "0.0.0.0"}
    out = subprocess.run([REAPER, "stats"], capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 0, out.stderr
    assert "(init), pid 1, up " in out.stdout.splitlines()[0], out.stdout
    for url in (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}"):
        out = reaper_stats("--url", url)
        assert out.returncode == 0 and "(init), pid 1" in out.stdout, (url, out.stderr)
    # One snapshot: the live processes are the main tree and the others, which add up.
    line = [ln for ln in out.stdout.splitlines() if ln.split()[:1] == ["processes"]][0]
    import re
    every, tree, others = map(int, re.search(r"(\d+) live: main tree (\d+), others (\d+)", line).groups())
    assert every == tree + others and others == 1, line
    assert "strays 1 (the budgets' last sample)" in line, line


def test_stats_refuses_a_bad_port_variable():
    import os

    env = {**os.environ, "REAPER_METRICS_PORT": "99999"}
    out = subprocess.run([REAPER, "stats"], capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 2 and out.stderr == \
        "reaper stats: REAPER_METRICS_PORT: port must be 1-65535, not '99999' (see 'reaper stats --help')\n"


def test_stats_of_a_finished_run_says_how_long_it_ran_and_when_it_ended(reaper, tmp_path):
    """The file of a run that ended: its length and its end (the file's last write),
    not an uptime that goes on growing."""
    import os
    import time

    mfile = tmp_path / "m.prom"
    r = reaper(["--metrics-file", str(mfile), "--metrics-interval", "0.2", "--", "sleep", "1.5"])
    assert r.wait(30) == 0
    ended = os.stat(mfile).st_mtime
    out = reaper_stats("--file", str(mfile))
    assert out.returncode == 0, out.stderr
    head = out.stdout.splitlines()[0]
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ended))
    assert f", ended {when} (" in head and head.endswith("ago), phase done"), head
    assert any(f"ran {n}s, ended" in head for n in (1, 2, 3)), head
    assert " up " not in head, head


# --- reaper node: its view, not a reaper's rows ----------------------------------------------------

def test_stats_and_top_show_reaper_nodes_view(tmp_path):
    """Pointed at a real `reaper node` (recorded /proc with 3,000 dying memory cgroups,
    recorded kernel log lines of a NIC incident), reaper stats and top's model show the
    node's view (reaper/node/view.py's rows), not `pid -, up ?` nor a reaper's rows."""
    import shutil
    import time
    from pathlib import Path

    from metrics_helpers import wait_healthy

    data = Path(__file__).resolve().parent / "data" / "node"
    shutil.copytree(data / "proc", tmp_path / "proc")
    port = free_port()
    node = subprocess.Popen([REAPER, "node", "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
                             "--proc", str(tmp_path / "proc"), "--sys", str(data / "sys-v2"),
                             "--kmsg", str(data / "kmsg.incident")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(port)
        wait_scrape(port, lambda s: s.samples("reaper_node_zombies") and s.samples("reaper_node_nic_events_total"),
                    "a first sample with the kernel log read")
        out = reaper_stats("--url", f"127.0.0.1:{port}")
        assert out.returncode == 0, out.stderr
        print(out.stdout)
        lines = out.stdout.splitlines()
        assert lines[0].startswith("reaper ") and lines[0].endswith(" (node)"), lines[0]
        titles = [ln[2:15].strip() for ln in lines[1:]]
        assert {t for t in titles if t} == {"cores", "memory", "nic", "zombies"}, out.stdout
        assert "  cores        no core saturated in the window" in out.stdout
        assert "memory cgroups: live 8, dying 3,000" in out.stdout
        assert "dying ones held below: /kubepods.slice/pod-aaa.slice (1,990)" in out.stdout
        assert "eth0 reset 1" in out.stdout and "ens5 tx_timeout 1" in out.stdout
        assert "  zombies      1 on the host; by cgroup: /kubepods.slice/" in out.stdout

        from reaper.commands.top import model

        source = model.Source(f"127.0.0.1:{port}", 5)
        first = source.frame(time.time())
        assert first.node and first.view is not None and first.error == "", first.error
        assert ("memory", "memory cgroups: live 8, dying 3,000") in first.node_rows
        assert not [r for r in first.node_rows if r[0] == "pressure"]      # a rate: needs a second fetch
        second = source.frame(time.time())
        pressure = [t for s, t in second.node_rows if s == "pressure"]
        assert pressure and pressure[0].startswith("stalled: cpu full 0.0%"), second.node_rows
        assert second.head.endswith("(node)") and not second.strays and second.main == "", second.head
    finally:
        node.send_signal(signal.SIGTERM)
        _, err = node.communicate(timeout=30)
    assert "Traceback" not in err, err

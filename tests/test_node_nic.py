"""reaper node's NIC side: the kernel log's lines (recorded /dev/kmsg records of ENA,
NETDEV WATCHDOG in both forms, mlx5, a soft lockup, and lines that must not count),
driver counters through the ethtool ioctl on a real veth pair in a network namespace
of the test's own (ENA's names through a recorded `ethtool -S`), the early warning on
recorded /proc/interrupts sequences, and the chain in one report: recorded kmsg lines
replayed through --kmsg while a real core is held in the kernel, exit 1; the same
lines on a quiet node, exit 0."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REAPER, free_port, wait_for
from metrics_helpers import Scrape, wait_scrape
from test_node import _finish, _node, _recorded, burner, watching  # noqa: F401 (burner: a fixture)

DATA = Path(__file__).resolve().parent / "data" / "node"


# --- the kernel log ---------------------------------------------------------------------------------

def test_the_kernel_logs_nic_and_watchdog_lines_are_recognized_and_nothing_else():
    from reaper.node import kmsg

    events = [e for e in map(kmsg.parse_record, (DATA / "kmsg.incident").read_text().splitlines()) if e]
    got = [(e.kind, e.device, e.driver, e.queue) for e in events]
    assert got == [("tx_paused", "eth0", "ena", 3), ("napi_starved", "eth0", "ena", None),
                   ("reset", "eth0", "ena", None), ("tx_timeout", "ens5", "ena", 5),
                   ("tx_timeout", "eno2", "ixgbe", 2), ("tx_timeout", "eth2", "mlx5_core", 6),
                   ("soft_lockup", "cpu39", "", None)]
    assert events[0].when == pytest.approx(1190.521873)
    assert events[0].what() == "ena: TX q 3 paused for too long"
    assert events[-1].cpu == 39 and events[-1].what() == "soft lockup, cpu39 stuck for 22 s"
    # A process's own write (user facility) and a message that only quotes a driver's line do not count.
    assert kmsg.parse_record("12,1,5,-;ena 0000:00:05.0 eth0: Trigger reset is on") is None
    assert kmsg.parse_record("6,1,5,-;said: ena 0000:00:05.0 eth0: Trigger reset is on") is None


def test_a_followed_file_gives_each_record_once_and_a_torn_one_when_complete(tmp_path):
    from reaper.node import kmsg

    f = tmp_path / "kmsg"
    f.write_text("4,1,1000000,-;ena 0000:00:05.0 eth0: Trigger reset is on\n4,2,2000000,-;NETDEV WATCH")
    log = kmsg.KernelLog(str(f))
    try:
        assert [e.kind for e in log.poll()] == ["reset"]
        assert log.poll() == []
        with f.open("a") as w:
            w.write("DOG: eth0 (ena): transmit queue 1 timed out\n")
        assert [(e.kind, e.queue) for e in log.poll()] == [("tx_timeout", 1)]
    finally:
        log.close()


# --- driver counters ----------------------------------------------------------------------------------

def test_enas_reset_reasons_and_allowances_are_the_counters_taken_from_ethtool_s():
    from reaper.node import ethtool

    stats = ethtool.parse_ethtool_s((DATA / "ethtool-S.ena").read_text())
    taken = {k: v for k, v in stats.items() if ethtool.wanted(k)}
    assert taken["suspected_poll_starvation"] == 1 and taken["total_resets"] == 1 and taken["os_netdev_wd"] == 1
    assert taken["bw_out_allowance_exceeded"] == 12
    assert {"queue_0_tx_cnt", "conntrack_allowance_available", "interface_up", "suspend"} & set(taken) == set()
    assert len(taken) == 24
    assert ethtool.wanted("queue_0_tx_cnt", frozenset({"queue_0_tx_cnt"}))


def test_driver_counters_are_read_through_the_ioctl_on_a_real_veth_pair(tmp_path):
    """In a network namespace of the test's own: a veth pair; reaper node asked for veth's
    peer_ifindex exports each end's peer's index, read with SIOCETHTOOL (no ethtool)."""
    out = tmp_path / "metrics.prom"
    script = (f"ip link add rnva type veth peer name rnvb && ip -o link show rnva && ip -o link show rnvb && "
              f"exec {REAPER} node --diagnose 2 --kmsg '' --nic-stats peer_ifindex --metrics-file {out} "
              f"--metrics-interval 1")
    r = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in r.stderr, r.stderr
    a, b = (re.match(r"(\d+): ", ln).group(1) for ln in r.stdout.splitlines()[:2])   # "4: rnva@rnvb: ..."
    s = Scrape(out.read_text())
    assert s.value("reaper_node_nic_driver_stats_total", device="rnva", driver="veth", stat="peer_ifindex") == int(b)
    assert s.value("reaper_node_nic_driver_stats_total", device="rnvb", driver="veth", stat="peer_ifindex") == int(a)
    assert s.value("reaper_node_source_available", source="driver_counters") == 1
    assert s.value("reaper_node_source_available", source="kernel_log") == 0       # --kmsg '': none


# --- the early warning ----------------------------------------------------------------------------------

def _readings():
    from reaper.node import queues

    return [queues.parse_queue_counts((DATA / f"interrupts.ena-stall.{i}").read_text()) for i in range(7)]


def test_a_queue_whose_interrupts_stop_on_a_core_saturated_in_kernel_time_is_warned_of_once():
    from reaper.node import queues

    readings = _readings()
    assert sorted(readings[0]) == [25, 26, 27]                 # the queues; not the management IRQ
    qmap = {irq: queues.Queue(irq, "ens5", q, q) for q, irq in enumerate((25, 26, 27))}
    w = queues.Watch()
    got = []
    for t, counts in enumerate(readings):                      # cpu1 saturated in kernel time from t=0.5
        got += [(t, e.kind, e.device, e.queue, e.cpu) for e in w.update(float(t), counts, qmap, {1: 0.5})]
    assert got == [(5, "irq_stalled", "ens5", 1, 1)]           # moved at 1, 2, 3; still from 3, 2 s on


def test_a_still_queue_on_a_core_not_saturated_or_a_queue_already_quiet_is_no_warning():
    from reaper.node import queues

    readings = _readings()
    qmap = {irq: queues.Queue(irq, "ens5", q, q) for q, irq in enumerate((25, 26, 27))}
    for kernel_since in ({}, {0: 0.5, 2: 0.5}):                # no core, or only the moving queues' cores
        w = queues.Watch()
        assert [e for t, c in enumerate(readings) for e in w.update(float(t), c, qmap, kernel_since)] == []
    w = queues.Watch()                                         # quiet for 20 s before the core saturates
    events = [e for t in (0, 20, 21, 22, 23) for e in w.update(float(t), readings[3], qmap, {1: 20.0})]
    assert events == []
    w = queues.Watch()                                         # one blip of an idle queue, then still
    events = [e for t, i in enumerate((0, 1, 4, 4, 4, 4)) for e in w.update(float(t), readings[i], qmap, {1: 0.0})]
    assert events == []


def test_queues_are_found_by_name_with_their_cores(tmp_path):
    from reaper.node import queues

    proc = tmp_path / "proc"
    for irq, cpus in ((25, "0"), (26, "1\n"), (27, "2-3")):
        (proc / "irq" / str(irq)).mkdir(parents=True)
        (proc / "irq" / str(irq) / "effective_affinity_list").write_text(cpus)
    qmap = queues.queues(_readings()[0], str(proc), str(tmp_path / "sys"))
    assert {irq: (q.device, q.queue, q.cpu) for irq, q in qmap.items()} == \
        {25: ("ens5", 0, 0), 26: ("ens5", 1, 1), 27: ("ens5", 2, 2)}


# --- the chain, in one report ------------------------------------------------------------------------

def _uptime_usec() -> int:
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


@pytest.mark.xdist_group("cpu-heavy")     # one core must be saturated by the test alone
def test_a_nic_stall_after_a_core_held_in_the_kernel_is_one_chain_and_exit_1(burner, tmp_path):
    """Recorded ENA lines replayed through --kmsg, stamped now, while a real core is held
    in the kernel by a renamed dd: the report ties the stall to that core, the process and
    its kernel function; exit 1; one WARN line; the metrics count the events and the chain."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text((DATA / "kmsg.incident").read_text().splitlines()[0] + "\n")   # an old, unrelated record
    node, port, _, cpu = watching(["--kmsg", str(kmsg)])
    try:
        dd = burner(cpu)
        wait_scrape(port, lambda s: s.value("reaper_node_cpu_saturation_streak_seconds", cpu=str(cpu)) >= 3
                    and s.samples("reaper_node_kernel_function_top_ratio"), f"cpu{cpu} held for 3 s", timeout=30)
        now = _uptime_usec()
        with kmsg.open("a") as f:           # eth7: no queue of this machine, so "any core saturated before it"
            f.write(f"4,2202,{now},-;ena 0000:00:05.0 eth7: TX q 3 is paused for too long (threshold 5000000). "
                    f"Time since last napi 5312000 usec. napi scheduled: 1\n")
            f.write(f"3,2203,{now + 30},-;ena 0000:00:05.0 eth7: napi handler hasn't been called for a long time "
                    f"but is scheduled\n")
        s = wait_scrape(port, lambda s: s.value("reaper_node_nic_events_total", device="eth7", kind="napi_starved"),
                        "the replayed lines", timeout=15)
        assert s.value("reaper_node_nic_events_total", device="eth7", kind="tx_paused") == 1
        assert s.value("reaper_node_nic_events_total", device="eth7", kind="napi_starved") == 1
        assert s.value("reaper_node_nic_chains_total") >= 2
        assert s.value("reaper_node_source_available", source="kernel_log") == 1
        node.send_signal(signal.SIGINT)
        status, out, err = _finish(node)
    finally:
        node.kill()
    assert status == 1, out
    chain = re.compile(rf"eth7 transmit queue 3 stalled at \d\d:\d\d:\d\d \(ena: TX q 3 paused for too long\); "
                       rf"cpu{cpu} had been saturated in kernel time for (\d+) s before it: {burner.name} "
                       rf"\(pid {dd.pid}\) in \w+")
    m = chain.search(out.split("Signature found:", 1)[1])
    assert m and int(m.group(1)) >= 2, out
    warned = [ln for ln in err.splitlines() if "eth7" in ln]          # one line for the burst
    assert len(warned) == 1 and chain.search(warned[0]) and " WARN " in warned[0], err


def test_nic_events_on_a_quiet_node_are_listed_without_a_chain_and_exit_0(tmp_path):
    proc = _recorded(tmp_path, 6)
    p = _node(["--diagnose", "2", "--proc", str(proc), "--sys", str(DATA / "sys-v1"),
               "--kmsg", str(DATA / "kmsg.incident")])
    status, out, err = _finish(p)
    assert status == 0, out
    assert "eth0 transmit queue 3 stalled at" in out and \
        "(ena: TX q 3 paused for too long); no core saturated in kernel time in the 10 s before it" in out, out
    assert "cpu39 soft lockup at" in out and "eth2 transmit queue 6 stalled at" in out, out
    assert err == "", err                  # silence: no chain, nothing to warn of


def test_diagnose_opens_no_port_from_the_environment_only_from_a_flag(tmp_path):
    proc = _recorded(tmp_path, 9)
    port = free_port()
    env = dict(os.environ, REAPER_METRICS_PORT=str(port), REAPER_METRICS_ADDRESS="127.0.0.1")
    p = subprocess.Popen([REAPER, "node", "--diagnose", "3", "--proc", str(proc), "--kmsg", ""], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:                                    # watched until it ends: a bind would show at any moment
        wait_for(lambda: (_listening(port) and seen.append(port)) or p.poll() is not None, timeout=20,
                 what="the end of --diagnose")
        assert seen == []
    finally:
        status, out, err = _finish(p)
    assert status == 0, err


def _listening(port: int) -> bool:
    hexport = f"{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        if any(r.split()[1].endswith(":" + hexport) and r.split()[3] == "0A" for r in rows):
            return True
    return False


# --- the node's view for reaper stats / top (reaper/node/view.py) ---------------------------------

def test_the_node_view_is_built_from_a_real_scrape_of_reaper_node(tmp_path):
    """reaper node on a recorded node (dying cgroups held below two pods, the recorded
    kernel log): its metrics file, parsed as a scraper would, gives the view's rows."""
    from prometheus_client.parser import text_string_to_metric_families

    from reaper.node import view

    proc = _recorded(tmp_path, 9)
    out = tmp_path / "metrics.prom"
    status, _, err = _finish(_node(["--diagnose", "2", "--proc", str(proc), "--sys", str(DATA / "sys-v2"),
                                    "--kmsg", str(DATA / "kmsg.incident"), "--metrics-file", str(out),
                                    "--metrics-interval", "1"]))
    assert status == 1, err                      # sys-v2: 3,000 dying against 8 live
    samples = [s for f in text_string_to_metric_families(out.read_text()) for s in f.samples]
    rows = view.rows(samples, before=samples, seconds=1.0)
    text = {section: [t for sec, t in rows if sec == section] for section in {sec for sec, _ in rows}}
    assert text["cores"] == ["no core saturated in the window"]
    assert text["memory"] == ["memory cgroups: live 8, dying 3,000",
                              "dying ones held below: /kubepods.slice/pod-aaa.slice (1,990), "
                              "/system.slice/ecs-agent.service (990), /kubepods.slice/pod-bbb.slice (10), "
                              "/system.slice (10)"]
    (nic,) = text["nic"]
    assert nic.startswith("events: ") and "eth0 tx_paused 1" in nic and "cpu39 soft_lockup 1" in nic, nic
    assert text["pressure"][0].startswith("stalled: cpu full 0.0%, cpu some 0.0%, io full"), text["pressure"]
    assert [sec for sec, _ in rows] == sorted((sec for sec, _ in rows), key=["cores", "functions", "culprits",
                                                                             "memory", "nic", "pressure"].index)


@pytest.mark.parametrize("args, needle", [
    (["--kmsg", "/nonexistent/kmsg"], "--kmsg: no such file: '/nonexistent/kmsg'"),
    (["--nic-stats", "a b"], "--nic-stats: expected a statistic's name as `ethtool -S` prints it, not 'a b'"),
    (["--nic-stats"], "option --nic-stats requires an argument"),
])
def test_bad_nic_options_are_one_line_and_exit_2(args, needle):
    r = subprocess.run([REAPER, "node", "--diagnose", "1", *args], capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout) == (2, ""), r
    assert r.stderr.splitlines() == [f"reaper node: {needle} (see 'reaper node --help')"], r.stderr

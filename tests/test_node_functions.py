"""The kernel function: a core saturated in kernel time is sampled alone (perf_event_open,
cpu-clock, kernel call chains, symbols from /proc/kallsyms). On this machine's real
cores, a renamed dd pinned to one core and reading /dev/zero is named with the kernel
function it burns and its caller, the ones Debian's perf (`perf record -C N -g`, the
reference) finds for it. Where sampling is not permitted (nobody, no capability) it is
said once and the run goes on; the sample parser and the symbol table on recorded
bytes."""
from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from metrics_helpers import wait_scrape
from test_node import _finish, burner, watching  # noqa: F401 (burner: a fixture)

DATA = Path(__file__).resolve().parent / "data" / "node"
PERF = shutil.which("perf")


def _functions(s, cpu: str) -> list:
    return [x for x in s.samples("reaper_node_kernel_function_top_ratio") if x.labels["cpu"] == cpu]


def _perf_reference(cpu: int, comm: str, tmp_path: Path, seconds: int = 3) -> tuple:
    """(leaf kernel functions of comm's samples, Counter; first callers of each leaf,
    {leaf: Counter}) from `perf record -C cpu -g`."""
    data = tmp_path / "perf.data"
    subprocess.run([PERF, "record", "-q", "-C", str(cpu), "-g", "-o", str(data), "--", "sleep", str(seconds)],
                   check=True, capture_output=True, timeout=60)
    out = subprocess.run([PERF, "script", "-i", str(data), "-F", "comm,ip,sym"], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    leaves, callers = Counter(), {}
    for block in out.split("\n\n"):
        lines = block.strip("\n").splitlines()
        if not lines or lines[0].strip() != comm:
            continue
        frames = [ln.split()[1] for ln in lines[1:] if len(ln.split()) >= 2 and ln.split()[0].startswith("ffff")]
        if not frames:
            continue
        leaves[frames[0]] += 1
        nxt = next((f for f in frames[1:] if f != frames[0]), None)
        if nxt:
            callers.setdefault(frames[0], Counter())[nxt] += 1
    return leaves, callers


@pytest.mark.skipif(PERF is None, reason="needs Debian's perf as the reference")
@pytest.mark.xdist_group("cpu-heavy")     # one core must be saturated by the test alone
def test_the_kernel_function_of_a_core_burnt_in_the_kernel_is_the_one_perf_finds(burner, tmp_path):
    node, port, _, cpu = watching()
    try:
        label = str(cpu)
        dd = burner(cpu)
        s = wait_scrape(port, lambda s: _functions(s, label)
                        and any(x.labels["pid"] == str(dd.pid)
                                for x in s.samples("reaper_node_kernel_time_top_ratio")),
                        f"cpu{cpu}'s functions and {burner.name} named", timeout=30)
        # Named within 5 s of the streak's start (the network driver's watchdog).
        assert s.value("reaper_node_cpu_saturation_streak_seconds", cpu=label) <= 5
        assert s.value("reaper_node_source_available", source="kernel_functions") == 1
        leaves, callers = _perf_reference(cpu, burner.name, tmp_path)
        s = wait_scrape(port, lambda s: _functions(s, label),
                        "the functions again")
        functions = sorted(_functions(s, label), key=lambda x: -x.value)
        node.send_signal(signal.SIGINT)
        status, out, err = _finish(node)
    finally:
        node.kill()
    assert leaves, "perf found no kernel samples of the burner"
    top, n = leaves.most_common(1)[0]
    assert functions[0].labels["function"] == top, (functions, leaves.most_common(5))
    share = n / sum(leaves.values())
    assert share >= 0.3 and functions[0].value >= 0.3, (share, functions)
    m = re.search(rf"^    {burner.name} \(pid {dd.pid}, (\d+)% of cpu{cpu}\) in (\S+) <- (\S+)", out, re.M)
    assert m, out
    assert int(m.group(1)) >= 50 and m.group(2) == top, out
    assert m.group(3) == callers[top].most_common(1)[0][0], (out, callers[top].most_common(3))
    assert status == 1, out
    # The log's lines name the function too.
    assert re.search(rf"saturated for \d+ s \(system \d+%\): kernel time: {burner.name} \(pid {dd.pid} on "
                     rf"cpu{cpu}, \d+% of a core, cgroup [^)]*\) in {top} <- ", err), err


def test_sampling_not_permitted_is_said_once_and_the_run_goes_on():
    """As nobody without capabilities (perf_event_paranoid 2 here): perf_event_open is
    refused; Sampling says so once, whatever the number of samples, and is off."""
    script = (
        "from reaper.node.sampling import Sampling\n"
        "class Log:\n"
        "    lines = []\n"
        "    def warn(self, text): self.lines.append(text)\n"
        "log = Log()\n"
        "s = Sampling('/proc', log)\n"
        "for i in range(5):\n"
        "    s.update(float(i), {0}, {0})\n"
        "print(s.available, len(log.lines))\n"
        "print(log.lines[0])\n")
    r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--inh-caps=-all",
                        sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (available, count), line = r.stdout.splitlines()[0].split(), r.stdout.splitlines()[1]
    assert (available, count) == ("False", "1"), r.stdout
    assert line.startswith("node: kernel functions not sampled: "), line
    assert "CAP_PERFMON" in line or "CAP_SYSLOG" in line, line


def test_kallsyms_names_an_address_by_the_function_that_holds_it():
    from reaper.node import kallsyms

    syms = kallsyms.parse((DATA / "kallsyms").read_bytes())
    assert syms.name(0xffffffff812a4f10) == "mem_cgroup_nr_lru_pages"          # its first byte
    assert syms.name(0xffffffff812a4f9c) == "mem_cgroup_nr_lru_pages"          # inside it
    assert syms.name(0xffffffff812a5000) == "memcg_stat_show"
    assert syms.name(0xffffffffc0a01234) == "ena_io_poll"                      # a module's ([ena])
    assert syms.name(0x1000) == "?"                                            # below every symbol
    with pytest.raises(kallsyms.Hidden, match="read 0"):
        kallsyms.parse(re.sub(rb"^[0-9a-f]{16}", b"0" * 16, (DATA / "kallsyms").read_bytes(), flags=re.M))


def _sample(pid: int, tid: int, chain: list) -> bytes:
    body = struct.pack("<QIIQ", chain[0] if chain else 0x401000, pid, tid, len(chain) + 1)
    body += struct.pack(f"<{len(chain) + 1}Q", (1 << 64) - 128, *chain)    # PERF_CONTEXT_KERNEL first
    return struct.pack("<IHH", 9, 1, 8 + len(body)) + body


def test_samples_are_parsed_and_a_profile_names_functions_with_their_callers():
    from reaper.node import kallsyms, perf, profile

    syms = kallsyms.parse((DATA / "kallsyms").read_bytes())
    walk = [0xffffffff812a4f40, 0xffffffff812a5010, 0xffffffff8139a020]    # nr_lru_pages <- stat_show <- seq_read_iter
    softirq, idle = [0xffffffff81e01010], [0xffffffff81e02010]              # net_rx_action, default_idle
    data = _sample(123, 124, walk) * 7 + _sample(0, 0, softirq) * 2 + _sample(0, 0, idle) + _sample(77, 77, []) \
        + struct.pack("<IHHQQ", 2, 0, 24, 1, 5)                              # 5 samples lost
    sampler = perf.CpuSampler.__new__(perf.CpuSampler)
    sampler.lost = 0
    samples = sampler._parse(data + b"\x00" * 5)                             # a torn record at the end: ignored
    assert len(samples) == 11 and sampler.lost == 5
    prof = profile.Profile(1, 0.0)
    prof.add(samples, syms)
    assert prof.top_functions() == [("mem_cgroup_nr_lru_pages", 7 / 11), ("net_rx_action", 2 / 11)]   # idle: not work
    first, second = prof.culprits()                                          # pid 77 ran in user mode only
    assert (first.pid, first.ratio, first.kernel_ratio) == (123, 7 / 11, 7 / 11)
    assert profile.path(first.functions[0]) == "mem_cgroup_nr_lru_pages <- memcg_stat_show <- seq_read_iter"
    assert (second.pid, second.ratio, second.kernel_ratio) == (0, 3 / 11, 2 / 11)     # a softirq on the idle task


# --- the culprits stay until the next kernel-time streak ---------------------------------------------

class _Node:
    """A recorded-style /proc of two cores and two processes, advanced by hand: core 0 at
    100 % system or user time, and each process's system time."""

    def __init__(self, root: Path) -> None:
        self.proc = root / "proc"
        self.proc.mkdir()
        self.jiffies = {0: [0] * 8, 1: [0] * 8}
        self.stime = {2412: 0, 3001: 0}
        for pid, name in ((2412, "kubelet"), (3001, "trainer")):
            (self.proc / str(pid)).mkdir()
            (self.proc / str(pid) / "cgroup").write_text(f"0::/{name}.slice\n")
        self.names = {2412: "kubelet", 3001: "trainer"}

    def second(self, mode: int, grows: dict) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        self.jiffies[0][mode] += tick
        self.jiffies[1][3] += tick
        lines = [f"cpu{c} " + " ".join(map(str, j)) for c, j in self.jiffies.items()]
        (self.proc / "stat").write_text("cpu  0 0 0 0 0 0 0 0\n" + "\n".join(lines) + "\nintr 0\n")
        for pid, ticks in grows.items():
            self.stime[pid] += ticks
        for pid, st in self.stime.items():
            f = ["R", "1"] + ["0"] * 10 + [str(st)] + ["0"] * 6 + ["500"] + ["0"] * 16 + ["0"] + ["0"] * 5
            (self.proc / str(pid) / "stat").write_text(f"{pid} ({self.names[pid]}) " + " ".join(f) + "\n")


def test_the_culprits_of_a_kernel_time_streak_stay_until_the_next_one(tmp_path):
    """On-call finding (issue 35): a later streak in user mode (a training node's usual
    state) named a process at 1 % of a core in place of the kernel-time culprit. Now the
    culprits are replaced only by the next kernel-time streak. (No kallsyms in this /proc:
    sampling is off, said once, and the per-process scan names them.)"""
    from reaper.node.monitor import Monitor

    class Log:
        lines: list = []

        def warn(self, text):
            self.lines.append(text)

    node = _Node(tmp_path)
    node.second(2, {})
    clock = [100.0]
    m = Monitor(str(node.proc), str(tmp_path), 0.95, 600.0, Log(), clock=lambda: clock[0])
    tick = os.sysconf("SC_CLK_TCK")

    def second(mode, grows):
        node.second(mode, grows)
        clock[0] += 1.0
        m.sample(clock[0])

    for _ in range(4):                                  # kernel time: kubelet
        second(2, {2412: tick})
    assert [c.comm for c in m.top] == ["kubelet"]
    for _ in range(2):
        second(3, {})                                   # core 0 idle: the streak ends
    for _ in range(4):                                  # a user-time streak: trainer's 2 % system time
        second(0, {3001: max(1, tick // 50)})
    assert [c.comm for c in m.top] == ["kubelet"], m.top
    for _ in range(2):
        second(3, {})
    for _ in range(4):                                  # the next kernel-time streak: trainer
        second(2, {3001: tick})
    assert [c.comm for c in m.top] == ["trainer"]
    assert [ln for ln in Log.lines if "not sampled" in ln] == [
        f"node: kernel functions not sampled: {node.proc}/kallsyms: No such file or directory"]

"""`reaper stats` against a slow or hostile endpoint or file (issue 20, point 7): real
servers on real sockets that drip, flood or answer garbage, a real FIFO, /dev/zero, a
page of NaN and ±Inf. Each ends in bounded time and memory: one line and exit 1 for
what cannot be read, "?" for a number that is not one, never a traceback.

The clients that could grow without end run under `prlimit --as` (1 GiB): a client that
reads all it is sent ends in a MemoryError there, not in the machine's memory.
"""
import math
import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from conftest import free_port, one_line, reaper_stats

CAP = 4 << 20               # the most reaper stats reads (docs/reaper-stats.md, Exit codes)
AS_LIMIT = 1 << 30          # the address space a hostile-input client runs in
TIMEOUT = 30                # each test's own bound on a client


def _stats(*args, limit: bool = False):
    return reaper_stats(*args, prefix=["prlimit", f"--as={AS_LIMIT}"] if limit else (), text=False, timeout=TIMEOUT)


def _refused(out, *needles) -> str:
    """One line on stderr (no traceback), exit 1, naming the problem."""
    line = one_line(out.stderr, "reaper stats: ")
    assert out.returncode == 1, line
    for needle in needles:
        assert needle in line, line
    return line


class _Server:
    """A TCP server on a port of this test's own, in a thread: every connection is
    answered by answer(send, stop), send(bytes) raising OSError once the client is gone
    or stop (an Event) is set. Counts what it sent; stopped and joined on exit."""

    def __init__(self, answer) -> None:
        self.answer, self.sent, self.port = answer, 0, free_port()
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(4)
        self.sock.settimeout(0.1)
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)
        self.sock.close()
        assert not self.thread.is_alive(), "the test server did not stop"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:                 # the accept's timeout: look at stop again
                continue
            with conn:
                conn.settimeout(0.5)
                try:
                    self.answer(lambda data: self._send(conn, data), self.stop)
                except OSError:             # the client is gone (or the test is over)
                    pass

    def _send(self, conn, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.stop.is_set():
                raise OSError("stopped")
            try:
                n = conn.send(view)
            except socket.timeout:          # the client does not read: look at stop again
                continue
            self.sent += n
            view = view[n:]


# --- the whole request within --timeout ---------------------------------------------

HEAD = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\r\n"
PAGE_START = b'# TYPE reaper_build_info gauge\nreaper_build_info{version="1.0",mode="init"} 1\n'


def _drip(first: bytes, then: bytes):
    """An answer that sends first then then for ever (until the client goes or the test
    ends), a byte every 0.1 s: each well within any socket timeout."""
    def answer(send, stop):
        data = first
        while True:
            for byte in data:
                send(bytes([byte]))
                if stop.wait(0.1):
                    return
            data = then
    return answer


@pytest.mark.parametrize("first, then", [
    (b"HTTP/1.0 200 OK\r\n", b"X-Slow: yes\r\n"),      # the status line and headers drip
    (HEAD + PAGE_START, b"# more\n"),                 # the headers at once, the body drips
], ids=["headers", "body"])
def test_a_dripping_server_is_given_timeout_seconds_in_all(first, then):
    """--timeout bounds the request, connect to last byte: a socket's timeout bounds
    each read only, and a byte every 0.1 s never trips a 1 s one."""
    with _Server(_drip(first, then)) as server:
        out = _stats("--url", server.url, "--timeout", "1")
        sent = server.sent
    _refused(out, "timed out after 1s", server.url)
    assert sent > 0, "the client never connected: it did not meet the drip"


# --- at most 4 MiB ----------------------------------------------------------------------

def _flood(head: bytes, block: bytes):
    def answer(send, stop):
        send(head)
        while True:                 # until the client goes; a client that read it all dies at AS_LIMIT
            send(block)
    return answer


LINES = b"reaper_flood_total 1\n" * 4096


@pytest.mark.parametrize("head, block", [
    (HEAD + PAGE_START, LINES),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 99999999999\r\n\r\n" + PAGE_START, LINES),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
     b"%x\r\n%s\r\n" % (len(LINES), LINES)),
], ids=["plain", "content-length", "chunked"])
def test_a_flooding_server_is_cut_off_at_the_cap(head, block):
    with _Server(_flood(head, block)) as server:
        out = _stats("--url", server.url, limit=True)
        sent = server.sent
    _refused(out, f"{server.url}: more than {CAP} bytes")
    assert sent > CAP, sent


@pytest.mark.parametrize("answer, needle", [
    (_flood(b"HTTP/1.0 200 OK\r\nX-Long: ", b"a" * 65536), "LineTooLong"),         # one endless header
    (_flood(b"HTTP/1.0 200 OK\r\n", b"X-Many: a\r\n" * 1000), "more than 100 headers"),
    (lambda send, stop: send(b"\x1b[2J" + b"garbage " * 1000 + b"\r\n\r\n"), "BadStatusLine"),
], ids=["long-header", "many-headers", "garbage"])
def test_an_answer_that_is_not_http_is_one_line(answer, needle):
    """http.client's limits raise its own exceptions, not OSError: one line too, the
    server's words escaped and cut short."""
    with _Server(answer) as server:
        out = _stats("--url", server.url, limit=True)
    line = _refused(out, "bad HTTP answer", needle)
    assert len(line) < 600 and "\x1b" not in line, line


# --- --file: a regular file, at most 4 MiB --------------------------------------------------

def test_a_fifo_is_refused_not_waited_on(tmp_path):
    """The open would wait for a writer for ever: it is made O_NONBLOCK, then refused."""
    fifo = tmp_path / "m.prom"
    os.mkfifo(fifo)
    _refused(_stats("--file", str(fifo)), f"{fifo} is not a regular file")


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom"])
def test_a_device_is_refused_not_read_for_ever(path):
    _refused(_stats("--file", path, limit=True), f"{path} is not a regular file")


def test_a_file_over_the_cap_is_refused_one_at_the_cap_is_read(tmp_path):
    page = _page().encode()
    at_cap = tmp_path / "cap.prom"
    at_cap.write_bytes(page + b"#" * (CAP - len(page) - 1) + b"\n")
    assert at_cap.stat().st_size == CAP
    out = _stats("--file", str(at_cap))
    assert out.returncode == 0 and out.stdout.startswith(b"reaper 1.0 (init)"), out
    over = tmp_path / "over.prom"
    over.write_bytes(at_cap.read_bytes() + b"\n")
    _refused(_stats("--file", str(over)), f"{over}: more than {CAP} bytes")


# --- numbers that are not numbers ---------------------------------------------------------

def _page(per_core: bool = True) -> str:
    """A page with every number `reaper stats` shows (test_the_page_has_every_number_shown
    keeps it so), each finite and plausible."""
    now = time.time()
    text = f"""# TYPE reaper_build_info gauge
reaper_build_info{{version="1.0",mode="init"}} 1
reaper_start_time_seconds {now - 100}
reaper_pid 1
reaper_phase{{phase="running"}} 1
reaper_phase{{phase="draining"}} 0
reaper_main_child_state{{state="running"}} 1
reaper_main_child_state{{state="exited"}} 0
reaper_main_child_outcome{{outcome="exited_nonzero"}} 0
reaper_main_child_exit_code 7
reaper_service_starts_total{{service="web"}} 2
reaper_service_state{{service="web",state="up"}} 1
reaper_service_ready{{service="web"}} 1
reaper_service_up{{service="web"}} 1
reaper_service_start_time_seconds{{service="web"}} {now - 50}
reaper_service_last_exit_code{{service="web"}} 1
reaper_reaped_total{{kind="orphan",outcome="exited_0"}} 3
reaper_reaped_total{{kind="main",outcome="exited_0"}} 0
reaper_reap_latency_seconds_bucket{{le="0.001"}} 2
reaper_reap_latency_seconds_bucket{{le="0.01"}} 3
reaper_reap_latency_seconds_bucket{{le="+Inf"}} 3
reaper_reap_latency_seconds_count 3
reaper_reap_latency_seconds_sum 0.004
reaper_zombies 1
reaper_zombie_oldest_age_seconds 2.5
reaper_zombies_by_parent{{parent_name="sh",parent_pid="2"}} 1
reaper_processes{{class="main_tree"}} 3
reaper_processes{{class="stray"}} 1
reaper_signals_received_total{{signal="SIGUSR1"}} 1
reaper_signals_forwarded_total{{signal="SIGUSR1"}} 1
reaper_drain_duration_seconds 0.5
reaper_drain_processes_total{{result="terminated"}} 1
reaper_budget_info{{mechanism="nice",memory_mechanism="none"}} 1
reaper_stray_cpu_seconds_total 12
reaper_budget_violations_total{{action="nice"}} 1
reaper_budget_actions_total{{action="nice",reason="cpu"}} 1
reaper_stray_cpu_cores{{name="spin",pid="9",action="nice"}} 0.9
reaper_stray_cpu_cores{{name="idle",pid="10",action="nice"}} 0.1
reaper_stray_memory_bytes{{pid="9"}} 100000000
reaper_node_cpu_busiest_ratio{{mode="busy"}} 1
reaper_node_cpu_busiest_ratio{{mode="system"}} 0.97
reaper_node_cpus 96
reaper_node_cpu_saturated_cores 1
reaper_node_cpu_any_saturated_seconds_total 530
reaper_node_cpu_busiest_saturated_seconds_total 520
reaper_node_memory_cgroups_available 1
reaper_node_cgroups{{controller="memory"}} 80
reaper_visible_memory_cgroups 12
reaper_cgroup_v2_descendants{{state="live"}} 10
reaper_cgroup_v2_descendants{{state="dying"}} 2
reaper_cgroup_v2_controller_cgroups{{controller="memory",state="live"}} 8
reaper_cgroup_v2_controller_cgroups{{controller="memory",state="dying"}} 2
reaper_cgroup_pids_available 1
reaper_cgroup_pids 5
reaper_cgroup_pids_max 400
reaper_cpu_seconds_total 0.25
reaper_resident_memory_bytes 30000000
reaper_leftovers_total{{action="reported"}} 2
reaper_leftovers_total{{action="killed"}} 0
reaper_leftover_owners_ended_total{{kind="service"}} 1
reaper_leftover_device_holders{{device="/dev/nvidia0"}} 1
reaper_leftovers_tracked 3
"""
    if per_core:
        text += """reaper_node_cpu_busy_ratio{cpu="0"} 0.1
reaper_node_cpu_busy_ratio{cpu="7"} 1.0
reaper_node_cpu_mode_ratio{cpu="7",mode="system"} 0.97
reaper_node_cpu_saturated_seconds_total{cpu="7"} 520
"""
    return text


# reaper node's page: its own rows (reaper/node/view.py), the host's zombies.
NODE_PAGE = """reaper_build_info{version="1.0",mode="node"} 1
reaper_node_cpu_saturation_streak_seconds{cpu="3"} 40
reaper_node_cpu_saturation_streak_max_seconds{cpu="3"} 95
reaper_node_cpu_saturation_streak_length_seconds_bucket{mode="system",le="+Inf"} 2
reaper_node_cpu_saturation_streak_length_seconds_count{mode="system"} 2
reaper_node_cpu_saturation_streak_length_seconds_sum{mode="system"} 130
reaper_node_cpu_saturation_streak_length_seconds_count{mode="user"} 0
reaper_node_cpu_saturation_streak_length_seconds_sum{mode="user"} 0
reaper_node_kernel_time_top_ratio{pid="77",comm="kburn",cpu="3",cgroup="/a"} 0.9
reaper_node_kernel_function_top_ratio{cpu="3",function="clear_page_erms"} 0.6
reaper_node_memory_cgroups{state="live"} 8
reaper_node_memory_cgroups{state="dying"} 3000
reaper_node_cgroup_dying_children{cgroup="/k"} 1990
reaper_node_nic_events_total{device="eth0",kind="reset"} 1
reaper_node_zombies 1
reaper_node_zombies_by_cgroup{cgroup="/k/pod"} 1
"""


NOT_A_NUMBER = re.compile(r"\b(nan|inf)\b", re.IGNORECASE)


def test_the_page_has_every_number_shown():
    """The control: every metric the view reads is on _page(), and the finite page shows
    each row with no unknown."""
    from reaper.commands import figures, stats
    from reaper.metrics import names

    # The names the view reads: names.X in its modules (a counter's as total(), a
    # histogram's with its suffix), each matched as a family on the page.
    source = "".join(Path(m.__file__).read_text() for m in (stats, figures))
    page = _page() + NODE_PAGE
    found = {getattr(names, c) for c in re.findall(r"\bN\.([A-Z0-9_]+)\b", source)}
    assert len(found) > 40, found                   # the control of the control: the names were found
    missing = sorted(n for n in found if not re.search(rf"^{n}(_total|_bucket|_sum|_count)?[{{ ]", page, re.MULTILINE))
    assert not missing, f"add them to _page(): {missing}"
    for per_core in (True, False):
        view = stats.render(_samples(_page(per_core)))
        assert " ?" not in view and not NOT_A_NUMBER.search(view), view
        assert "up 1m40s" in view and "web: up, ready, 2 starts, up 50s, last exit 1" in view, view
    view = stats.render(_samples(NODE_PAGE))
    assert " ?" not in view and not NOT_A_NUMBER.search(view), view
    assert view.splitlines() == [
        "reaper 1.0 (node)",
        "  cores        cpu3: saturated for 40 s now, longest streak 95 s in the window",
        "               ended streaks by the mode that dominated them: system 2 (2m10s in all)",
        "  functions    cpu3: clear_page_erms 60%",
        "  culprits     kburn (pid 77, 90% of cpu3, cgroup /a)",
        "  memory       memory cgroups: live 8, dying 3,000",
        "               dying ones held below: /k (1,990)",
        "  nic          events: eth0 reset 1",
        "  zombies      1 on the host; by cgroup: /k/pod 1"], view


def _samples(text: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_a_page_of_non_finite_numbers_shows_them_as_unknown(tmp_path, value):
    """The real command on a file whose every number is value (a NaN start time was a
    ValueError, -Inf an OverflowError)."""
    f = tmp_path / "m.prom"
    f.write_text(re.sub(r"^([^#].*) \S+$", rf"\1 {value}", _page(), flags=re.MULTILINE))
    out = _stats("--file", str(f))
    assert out.returncode == 0 and out.stderr == b"", out
    view = out.stdout.decode()
    head = view.splitlines()[0]
    assert head.startswith("reaper 1.0 (?), pid ?, up ?"), view
    assert not NOT_A_NUMBER.search(view), view
    # reaper_cgroup_pids_available is a flag: not set when it is not a number.
    assert not [ln for ln in view.splitlines() if ln.split()[:1] == ["pids"]], view
    assert "  self         reaper's own CPU ?, resident memory ? MiB" in view, view


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["NaN", "+Inf", "-Inf"])
@pytest.mark.parametrize("per_core", [True, False], ids=["per-core", "summary"])
def test_each_number_alone_not_finite_is_unknown(value, per_core):
    """Every sample of the page in turn made value, the rest finite: no path through
    the view (a mean, a quantile, an uptime, a percentage) fails or prints nan/inf."""
    from reaper.commands import stats

    samples = _samples(_page(per_core))
    for i, s in enumerate(samples):
        view = stats.render([*samples[:i], s._replace(value=value), *samples[i + 1:]])
        assert not NOT_A_NUMBER.search(view), (s.name, s.labels, view)
    node = _samples(NODE_PAGE)
    for i, s in enumerate(node):
        view = stats.render([*node[:i], s._replace(value=value), *node[i + 1:]])
        assert not NOT_A_NUMBER.search(view), (s.name, s.labels, view)
    start = [s._replace(value=value) if s.name == "reaper_start_time_seconds" else s for s in samples]
    assert ", up ?" in stats.render(start).splitlines()[0]


def test_pids_max_without_a_limit_is_max():
    """The one +Inf with a meaning: reaper_cgroup_pids_max when pids.max says "max"."""
    from reaper.commands import stats

    page = _page().replace("reaper_cgroup_pids_max 400", "reaper_cgroup_pids_max +Inf")
    assert "  pids         5 / max (reaper's cgroup)" in stats.render(_samples(page))


def test_a_bucket_bound_that_is_not_a_number_is_unknown(tmp_path):
    f = tmp_path / "m.prom"
    f.write_text(_page().replace('le="0.01"', 'le="abc"'))
    out = _stats("--file", str(f))
    assert out.returncode == 0 and out.stderr == b"", out
    assert "half within ?, 99% within ? (3 reaps)" in out.stdout.decode(), out.stdout


# --- labels and size ---------------------------------------------------------------------

def test_labels_cannot_write_escape_sequences(tmp_path):
    """A label is the page's word, a process's name among them: a zombie's parent named
    with an escape sequence shows as text."""
    f = tmp_path / "m.prom"
    f.write_text(_page().replace('parent_name="sh"', 'parent_name="\x1b]0;owned\x07\x1b[2J"'))
    out = _stats("--file", str(f))
    assert out.returncode == 0, out
    assert b"\x1b" not in out.stdout and b"\x07" not in out.stdout, out.stdout
    assert "\\x1b]0;owned\\x07\\x1b[2J[2] 1" in out.stdout.decode(), out.stdout


def test_a_page_of_many_services_is_shown_within_the_bound(tmp_path):
    """Each number was a scan of the whole page, and each service asked six: 20,000
    services took an hour. Now the view is made in one pass per metric."""
    n = 20000
    lines = [_page()]
    for i in range(n):
        lines.append(f'reaper_service_starts_total{{service="s{i}"}} 1\n'
                     f'reaper_service_state{{service="s{i}",state="up"}} 1\n')
    f = tmp_path / "m.prom"
    f.write_text("".join(lines))
    assert f.stat().st_size < CAP
    out = _stats("--file", str(f))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(b": up, 1 start") == n, out.stdout[-500:]

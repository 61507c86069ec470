"""`reaper stats`: a compact view of a running reaper's numbers, from its endpoint or its file."""
import signal
import subprocess

from conftest import REAPER, free_port, wait_for_file
from metrics_helpers import EVENTS_CHILD, send_and_confirm, wait_scrape, write_script, start_with_metrics


def _stats(*args):
    return subprocess.run([REAPER, "stats", *args], capture_output=True, text=True, timeout=30)


def test_stats_from_url_and_file(reaper, tmp_path):
    mfile = tmp_path / "m.prom"
    r, port = start_with_metrics(reaper, [*write_script(tmp_path, "child.py", EVENTS_CHILD), str(tmp_path)],
                                 ["--metrics-file", str(mfile), "--metrics-interval", "0.2"])
    wait_for_file(tmp_path / "ready", 20)
    send_and_confirm(r, signal.SIGUSR1, tmp_path / "signals", 1)
    wait_scrape(port, lambda s: s.total("reaper_reaped_total") == 6 and s.value("reaper_zombies") == 1
                and s.samples("reaper_node_cpu_busy_ratio"), "the orphans reaped")
    out = _stats("--url", f"http://127.0.0.1:{port}/metrics")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    print(text)
    assert text.startswith("reaper ") and "(init), pid 1" in text
    lines = {ln.split()[0]: ln for ln in text.splitlines()[1:] if ln.strip()}
    assert "running" in lines["main"]
    assert "reaped       6 (orphan 6); orphans by outcome: SIGTERM 1, exited_0 3, exited_nonzero 2" in text
    assert "1 now" in lines["zombies"] and "[2] 1" in lines["zombies"]
    assert "received: SIGUSR1 1; forwarded: SIGUSR1 1" in lines["signals"]
    assert "busiest core cpu" in lines["node"]
    assert len(text.splitlines()) <= 20               # compact: fits a terminal

    (tmp_path / "go").touch()
    assert r.wait(30) == 7
    out = _stats("--file", str(mfile))
    assert out.returncode == 0, out.stderr
    assert "exited, exit code 7 (exited_nonzero)" in out.stdout
    assert "phase done" in out.stdout


def test_stats_errors_are_one_line():
    port = free_port()            # nothing listens there
    out = _stats("--url", f"http://127.0.0.1:{port}/metrics", "--timeout", "2")
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "Connection refused" in out.stderr
    out = _stats("--file", "/nonexistent/m.prom")
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "No such file" in out.stderr
    out = _stats("--url", "x", "--file", "y")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not allowed with" in out.stderr


def test_stats_rejects_a_non_reaper_endpoint(tmp_path):
    other = tmp_path / "other.prom"
    other.write_text("# TYPE foo counter\nfoo_total 1\n")
    out = _stats("--file", str(other))
    assert out.returncode == 1 and "reaper_build_info missing" in out.stderr

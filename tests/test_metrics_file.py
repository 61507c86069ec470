"""--metrics-file: always complete when read concurrently, final numbers at exit."""
import os
import time

from prometheus_client.parser import text_string_to_metric_families

from conftest import wait_for, wait_for_file
from metrics_helpers import Scrape

# Families present in every complete write (the last one the collector yields
# included, so a truncated file cannot pass).
ALWAYS = {"reaper_build_info", "reaper_reaped", "reaper_reap_latency_seconds", "reaper_zombies",
          "reaper_processes", "reaper_cpu_seconds", "reaper_resident_memory_bytes"}


def test_file_is_always_complete_while_rewritten(reaper, tmp_path):
    path = tmp_path / "reaper.prom"
    # The child keeps making orphans so that the content changes between writes.
    code = ("import os, sys, time\n"
            "while not os.path.exists(sys.argv[1] + '/stop'):\n"
            "    if os.fork() == 0:\n"
            "        if os.fork() == 0: os._exit(0)\n"
            "        os._exit(0)\n"
            "    os.wait()\n"
            "    time.sleep(0.002)\n"
            "sys.exit(3)\n")
    r = reaper(["--metrics-file", str(path), "--metrics-interval", "0.1", "--",
                "python3", "-c", code, str(tmp_path)])
    wait_for_file(path, 20)
    reads, rewrites, last, reaped = 0, 0, None, []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline or rewrites < 20:
        assert time.monotonic() < deadline + 30, f"only {rewrites} rewrites seen"
        with open(path) as f:
            st = os.fstat(f.fileno())
            version = (st.st_ino, st.st_mtime_ns)   # inode numbers alone are reused
            rewrites += version != last
            last = version
            text = f.read()
        reads += 1
        assert text.endswith("\n"), text[-200:]
        families = {fam.name: fam for fam in text_string_to_metric_families(text)}
        missing = ALWAYS - set(families)
        assert not missing, f"read {reads}: incomplete file, missing {missing}"
        reaped.append(sum(s.value for s in families["reaper_reaped"].samples))
    print(f"{reads} reads, {rewrites} rewrites")
    assert reads >= 100
    assert rewrites >= 20                  # it was replaced (rename) many times while we read
    assert reaped == sorted(reaped) and reaped[-1] > reaped[0]
    (tmp_path / "stop").touch()
    assert r.wait(30) == 3
    final = Scrape(path.read_text())
    assert final.value("reaper_main_child_exit_code") == 3
    assert final.value("reaper_phase", phase="done") == 1
    assert final.total("reaper_reaped_total", kind="orphan") >= reaped[-1]
    wait_for(lambda: not [p for p in tmp_path.iterdir() if ".tmp" in p.name], 5, what="no temp files left")

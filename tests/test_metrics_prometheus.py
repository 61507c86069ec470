"""A real Prometheus server (Debian's prometheus package) scrapes reaper; its HTTP API returns reaper's series."""
import json
import shutil
import subprocess
import urllib.parse
import urllib.request

import pytest

from conftest import free_port, require, wait_for, wait_for_file
from metrics_helpers import start_with_metrics

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def _query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.prometheus
@pytest.mark.slow
def test_prometheus_scrapes_reaper(reaper, tmp_path):
    require("prometheus", shutil.which(PROMETHEUS) is not None, "apt-get install prometheus")
    prom_port = free_port()
    code = ("import os, sys, time\n"
            "for _ in range(3):\n"
            "    if os.fork() == 0:\n"
            "        if os.fork() == 0: os._exit(0)\n"
            "        os._exit(0)\n"
            "    os.wait()\n"
            "open(sys.argv[1] + '/ready', 'w').write('ready')\n"
            "time.sleep(300)\n")
    r, port = start_with_metrics(reaper, ["python3", "-c", code, str(tmp_path)])
    wait_for_file(tmp_path / "ready", 20)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n"
        "scrape_configs:\n  - job_name: reaper\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
    prom = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: _ready(prom_port) or prom.poll() is not None, 60, 0.2, what="prometheus to be ready")
        assert prom.poll() is None, prom.stderr.read().decode()[-2000:]
        up = wait_for(lambda: _query(prom_port, 'up{job="reaper"} == 1'), 60, 0.5, what="reaper target up")
        assert up[0]["metric"]["instance"] == f"127.0.0.1:{port}"
        reaped = wait_for(lambda: _query(prom_port, 'reaper_reaped_total{kind="orphan"}'), 30, 0.5,
                          what="reaper_reaped_total in prometheus")
        assert [float(x["value"][1]) for x in reaped] == [3.0]
        assert reaped[0]["metric"]["outcome"] == "exited_0"
        # One slow scrape on a busy machine marks every series stale until the next: await, don't peek.
        info = wait_for(lambda: _query(prom_port, "reaper_build_info"), 30, 0.5, what="reaper_build_info")
        assert info[0]["metric"]["mode"] == "init"
        # The histogram arrives as a histogram: histogram_quantile works on it.
        q = wait_for(lambda: _query(prom_port, "histogram_quantile(0.5, reaper_reap_latency_seconds_bucket)"),
                     30, 0.5, what="a latency quantile")
        assert 0 < float(q[0]["value"][1]) <= 0.025     # microseconds of C work; a bucket bound
        wait_for(lambda: _query(prom_port, "reaper_node_cgroups"), 30, 0.5, what="node signals")
        # No scrape failed: Prometheus accepted every exposition (it asks for OpenMetrics).
        wait_for(lambda: _query(prom_port, 'scrape_samples_scraped{job="reaper"} > 50'), 30, 0.5,
                 what="a full scrape")
    finally:
        prom.terminate()
        try:
            prom.wait(20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait(10)
    r.kill()

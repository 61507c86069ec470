"""Which reaper this is: version, mode, start, pid, PID namespace, whether its port is served."""
from __future__ import annotations

import os

from reaper.metrics import names as N


def collect(r, available):
    from prometheus_client.core import GaugeMetricFamily as G

    from reaper import __version__

    s = r.stats
    g = G(N.BUILD_INFO, "reaper's version and mode (init: PID 1 or subreaper; watch: sidecar)",
          labels=["version", "mode"])
    g.add_metric([__version__, r.mode], 1)
    yield g
    yield G(N.START_TIME_SECONDS, "When reaper started, seconds since the epoch", value=s.start_time)
    yield G(N.PID, "reaper's pid in its own PID namespace", value=os.getpid())
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = None
    if ns is not None:
        yield G(N.PID_NAMESPACE, "The inode of reaper's PID namespace (/proc/self/ns/pid): "
                                 "who shares it sees reaper_pid as reaper", value=ns)
    if r.cfg.metrics_port is not None:     # 0 only ever in the metrics file: a scrape needs the port
        yield G(N.METRICS_LISTENING, "1 once the metrics endpoint is bound and served; 0 while "
                                     "its port is taken (or its address absent) and the bind is "
                                     "retried", value=1 if r.x.listening else 0)

"""The main child's state and end, and reaper's phase (init mode only: watch has no child)."""
from __future__ import annotations

from reaper.metrics import names as N

MAIN_STATES = ("starting", "running", "exited", "exec_failed")     # stats.Stats.main_state, as exported
PHASES = ("running", "draining", "killing", "done")                # stats.Stats.phase


def collect(r, available):
    from prometheus_client.core import GaugeMetricFamily as G

    s = r.stats
    if r.mode != "init":
        return
    g = G(N.MAIN_CHILD_STATE, "State of the main child: 1 for the current one", labels=["state"])
    for state in MAIN_STATES:
        g.add_metric([state], 1 if s.main_state == state else 0)
    yield g
    yield G(N.MAIN_CHILD_UP, "1 while the main child runs", value=1 if s.main_state == "running" else 0)
    if s.main_state == "running" and s.main_pid is not None:
        yield G(N.MAIN_CHILD_PID, "The main child's pid in reaper's PID namespace, while it runs "
                                  "(reaper top tells reaper's own children from what it adopted)", value=s.main_pid)
    yield G(N.STOP_REQUESTED, "1 once reaper was asked to stop (SIGTERM, SIGINT, SIGQUIT from "
                              "outside) before the main child ended", value=1 if s.stop_requested else 0)
    if s.main_status is not None:
        from reaper.stats import outcome

        yield G(N.MAIN_CHILD_EXIT_CODE, "The main child's exit code (128+N: killed by signal N)",
                value=s.main_exit_code)
        g = G(N.MAIN_CHILD_OUTCOME, "How the main child ended (exited_0, exited_nonzero or the "
                                    "signal name)", labels=["outcome"])
        g.add_metric([outcome(s.main_status)], 1)
        yield g
    g = G(N.PHASE, "reaper's phase: 1 for the current one", labels=["phase"])
    for phase in PHASES:
        g.add_metric([phase], 1 if s.phase == phase else 0)
    yield g

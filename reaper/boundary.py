"""The failure boundary: from the spawn of the main child on, nothing ends reaper
but the main child's exit followed by the drain.

Before the spawn (cli.py) reaper may fail fast: one line, exit 2 or 1, no child.
From the spawn on, supervise() runs everything, in three layers:

- the core: the C wait (reaping, forwarding, the main child's status kept in C)
  and the drain, driven by the Supervisor (reaper/supervisor.py). It treats
  its own OS faults (a failed wait, EPERM, no /proc) as things to go on from;
- policy: the pieces below, each reached only through Policy.call(), which
  switches a piece off at its first failure with one ERROR line and counts it
  in reaper_policy_errors_total; the core goes on without it;
- the fallback: if the Supervisor's own Python fails anyway (a bug, MemoryError,
  an import that EMFILE stops), minimal_loop() takes over with the C core, os
  and time only: reap, forward, drain, exit with the main child's status.

Policy pieces (composed in reaper/pieces.py), in start order: services,
statistics, hygiene (cwd, inherited fds), title, oom, metrics, budgets; then
the summary at the end. With nothing asked of the end (no metrics, budgets or
summary file), the first wait comes before any piece is loaded, and the C core's
quiet end is armed: while there is nothing to say, the main child's exit with
nothing left ends reaper inside the C wait, with its status. Logging never blocks or floods
(reaper/log.py), so no piece can stop the loop by writing to stderr.
"""
from __future__ import annotations

import os
import time

from reaper import _native
from reaper._native import forward_table
from reaper.policy import SUMMARY, Policy
# The minimal loop's drain and exit status: loaded with the boundary, so that it needs no file later.
from reaper.drain import KILL_WAIT, continue_stopped, signal_rest
from reaper.status import exit_status

RESCAN_EVERY = 0.2       # minimal loop, as subreaper: look for late children this often while killing
RETRY_AFTER = 0.1        # a minimal loop that itself failed starts again after this
FIRST_WAIT_MS = 20       # the wait before the policy is loaded (metrics, budgets, title...)


def supervise(cfg, log, stats, sfd: int, main_pid: int, exporter=None, inherited=(), note=None) -> int:
    """Runs reaper from the spawn to its exit status: the log (made here when nothing
    before the spawn needed it), the policy pieces (reaper/pieces.py; exporter: the
    metrics prepared before the spawn, inherited: the invoker's fds) and the loop.
    note: a debug line from before the spawn."""
    policy = Policy(log, stats)
    waiter = sup = None
    try:
        waiter = _native.Waiter(sfd, _native.REAP_LATENCY_BUCKETS)
        # Orphans are counted in C, unless each one must be seen (-w, debug log).
        # Not PID 1, the main child's stops are seen too (job control follows them).
        waiter.watch(main_pid, cfg.warn_on_reap or cfg.verbosity >= 3, bool(main_pid) and os.getpid() != 1)
        # The CPU times of reaped children feed the metrics (stats exists before the
        # spawn only with metrics) and the budgets (budgets/reaped.py): without either
        # the C core reaps without rusage.
        waiter.without_rusage(stats is None and not cfg.budgets_enabled)
        # Forwarding before the first wait: a signal queued since the spawn goes out with it.
        forwarding = forward_table(cfg.rewrite)
        waiter.forward(main_pid, cfg.process_group, forwarding)
        first = first_error = None
        # The quiet end: while nothing is asked of the end but the exit status, the
        # C core's wait itself exits with it when the main child's exit is all
        # there is (no orphan, nothing left to drain). The Supervisor re-arms it
        # before each wait, for as long as there is still nothing to say.
        quiet_end = bool(main_pid) and _may_end_early(cfg, log, stats)
        armed = quiet_end and (log is None or not log.pending())
        waiter.zero_codes(cfg.remap_exit)
        waiter.quiet_end(armed, cfg.no_drain)
        if quiet_end:
            # The first wait comes before the policy is loaded: a child that is done
            # at once (`reaper -- true`, a failing entrypoint) and left nothing
            # behind ends reaper in that wait, before anything more is loaded.
            try:
                first = waiter.wait(FIRST_WAIT_MS)
            except OSError as e:             # said and retried by the Supervisor's loop
                first_error = e
        if log is None:            # nothing before the spawn needed it: made here, inside the boundary
            from reaper.log import Log

            log = policy.log = Log(cfg.verbosity, cfg.log_format)
        if note:
            log.debug(note)
        from reaper import pieces

        start_policy = pieces.compose(cfg, log, exporter, main_pid, list(inherited))
        from reaper.stats import Stats
        from reaper.supervisor import Supervisor

        if stats is None:
            stats = policy.stats = Stats()
        stats.native = waiter.totals
        sup = Supervisor(cfg, log, stats, waiter, policy, forwarding)
        sup.quiet_end = armed
        if first_error is not None:
            sup.wait_failed(first_error)
        start_policy(policy, sup)
        status = sup.run(main_pid, first)
    except BaseException as e:     # the Supervisor's own Python failed: the core goes on
        status = _fall_back(e, cfg, log, sfd, waiter, main_pid, sup)
        if log is None:            # not even the log could be loaded: the status is all there is
            return status
        policy.close()
    policy.call(SUMMARY, _summarise, cfg, stats, waiter, log)
    log.close()
    return status


def _summarise(cfg, stats, waiter, log) -> None:
    if stats is None:           # the Supervisor failed before the statistics existed: a summary still
        from reaper.stats import Stats

        stats = Stats()
        stats.native = None if waiter is None else waiter.totals
    if not cfg.summary_file and not log.enabled(2) and not (log.enabled(1) and stats.news(log.dropped)):
        return                  # nobody reads it: nothing is loaded or built on the way out
    from reaper import summary     # inside the boundary, at the end: not on the way to the exec

    summary.write(cfg, stats, log)


def _may_end_early(cfg, log, stats) -> bool:
    """Whether a run may end quietly (the C core's quiet end, before or after the
    policy is loaded): nothing is asked of it at the end but the exit status (no
    metrics, budgets or summary file; the summary line shows only news, and there
    can be none)."""
    return (stats is None and not cfg.budgets_enabled and not cfg.summary_file and
            not cfg.warn_on_reap and cfg.verbosity < 2 and (log is None or not log.dropped))


def _fall_back(e: BaseException, cfg, log, sfd: int, waiter, main_pid: int, sup) -> int:
    if waiter is not None:
        waiter.quiet_end(False)          # a failure is news: the summary says so
    _say(log, f"reaper's supervisor failed ({e!r}): going on with the minimal loop "
              "(reap, forward, drain; no metrics or budgets)")
    deadline = getattr(sup, "deadline", None)
    main_pid = main_pid or getattr(sup, "main_group", 0) or 0    # with services, started by the loop
    if not main_pid and not getattr(cfg, "pause", False) and waiter is not None:
        # Services mode, the main child never started: drain at once, exit 1.
        waiter.assume_main_ended(1 << 8)
        deadline = deadline or time.monotonic() + cfg.grace
    while True:
        try:
            if waiter is None:
                waiter = _native.Waiter(sfd)
                waiter.watch(main_pid, False)
            return minimal_loop(cfg, waiter, main_pid, deadline)
        except BaseException as again:   # catatonit's rule: exit only on the main child
            _say(log, f"minimal loop failed ({again!r}): starting it again")
            time.sleep(RETRY_AFTER)


def _say(log, msg: str) -> None:
    try:
        log.error(msg)
    except BaseException:
        pass


# --- the minimal loop: the C core, os and time; no other import ----------------------

def minimal_loop(cfg, waiter, main_pid: int, deadline=None) -> int:
    """Reap, forward, drain, return the main child's exit status. Forwarding is the
    C core's (re-armed here with cfg's rewrites, in case setup never got that far);
    the drain signals the whole namespace as PID 1, else reaper's own children
    and the main child's group."""
    import _signal as sig    # built in: needs no file, so it imports even at EMFILE

    pause = getattr(cfg, "pause", False)
    if not waiter.main_reaped and main_pid:
        waiter.forward(main_pid, cfg.process_group, forward_table(cfg.rewrite))
    term_sent = killed = False
    rescan_at = None
    more = False
    while True:
        now = time.monotonic()
        if waiter.main_reaped and deadline is None:
            deadline = now + cfg.grace
        if deadline is not None and getattr(cfg, "no_drain", False):
            return 0 if pause else exit_status(cfg, waiter.main_status)
        if deadline is not None and not term_sent:
            signal_rest(sig.SIGTERM, main_pid)
            continue_stopped(sig.SIGCONT, main_pid)
            term_sent = True
        due = deadline if rescan_at is None else min(deadline, rescan_at)
        try:
            events, no_children, more = waiter.wait(0 if more else _native.ms_until(due))
        except OSError:
            time.sleep(0.01)
            continue
        if pause and deadline is None and any(
                ev.kind == _native.EV_SIGNAL and ev.signo in (sig.SIGTERM, sig.SIGINT) for ev in events):
            deadline = time.monotonic() + cfg.grace          # pause mode ends on SIGTERM/SIGINT
            continue
        if deadline is None:
            continue
        now = time.monotonic()
        if no_children and (waiter.main_reaped or pause):
            return 0 if pause else exit_status(cfg, waiter.main_status)
        if now >= deadline:
            if killed:
                return 0 if pause else exit_status(cfg, waiter.main_status)   # survivors: nothing more to do
            killed = True
            deadline = now + KILL_WAIT
            rescan_at = now
        if killed and rescan_at is not None and now >= rescan_at:
            signal_rest(sig.SIGKILL, main_pid)
            rescan_at = None if os.getpid() == 1 else now + RESCAN_EVERY

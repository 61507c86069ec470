"""The policy pieces reaper starts after the spawn, composed for the failure
boundary (reaper/boundary.py), which runs each one under its guard: a piece that
fails is switched off with one line, reaper goes on. In start order: services,
statistics, hygiene (cwd, inherited fds), title, oom, metrics, budgets, leftovers.

Kept apart from cli.py, whose code is all on the way from start to the child's
exec: this module is loaded after the child runs.
"""
import os
import sys

from reaper.policy import BUDGETS, HYGIENE, LEFTOVERS, METRICS, OOM, SERVICES, STATISTICS, TITLE


def compose(cfg, log, exporter, pid: int, inherited: list):
    """The policy pieces started after the spawn, in order; the boundary runs each
    under its guard (a piece that fails is switched off, reaper goes on)."""
    def start(policy, sup) -> None:
        stats = sup.stats
        # With services the main child starts later, from the loop: the inherited fds
        # and the OOM score wait for it (it must get both as the invoker left them).
        later = cfg.services_enabled and not pid and not cfg.pause
        if cfg.services_enabled:
            policy.start(SERVICES, lambda: _services(cfg, log, stats, sup))
        if pid:
            policy.call(STATISTICS, _note_main, stats, pid, cfg.command)
        elif later:
            sup.spawn_main = lambda: _start_main_later(cfg, log, policy, stats, inherited)
        else:
            stats.main_state = "none"
        if not later:
            policy.call(HYGIENE, _after_spawn, inherited)
        policy.call(TITLE, _set_title, cfg.command or ["pause"])
        if not later:
            policy.call(OOM, _protect_from_oom, log)
        if exporter is not None:
            policy.start(METRICS, lambda: exporter.start(sup), getattr(exporter, "abort", None))
        if cfg.budgets_enabled:
            policy.start(BUDGETS, lambda: _enforcer(cfg, log, stats, sup))
        if _leftovers_mode(cfg) != "keep":
            policy.start(LEFTOVERS, lambda: _leftovers(cfg, log, stats, sup))
    return start


def _services(cfg, log, stats, sup):
    from reaper.services.runner import Runner

    return Runner(cfg, log, stats, sup)


def _start_main_later(cfg, log, policy, stats, inherited: list) -> tuple:
    """Services mode: the main child's spawn, then what follows a spawn."""
    from reaper.spawn import spawn_main

    pid, status = spawn_main(cfg, log)
    if pid is not None:
        policy.call(STATISTICS, _note_main, stats, pid, cfg.command)
    else:
        stats.main_state = "exec_failed"
    policy.call(HYGIENE, _after_spawn, inherited)
    policy.call(OOM, _protect_from_oom, log)
    return pid, status


def _note_main(stats, pid: int, command: list) -> None:
    from reaper.text import display

    stats.main_pid = pid
    stats.main_state = "running"
    stats.main_command = display(os.path.basename(command[0]))


def _after_spawn(inherited: list) -> None:
    # The C spawn left the start directory before the fork; this is for when it
    # could not (no fd free to hold it) and for pause mode.
    os.chdir("/")                          # never pin a mount the child may want to unmount
    for fd in inherited:                   # the child keeps them; reaper must not hold them open
        try:
            os.close(fd)
        except OSError:
            pass


def _set_title(command: list) -> None:
    from reaper.text import display

    # The title is C text: argv bytes that are not UTF-8 are shown escaped.
    _setproctitle()("reaper: " + display(" ".join(command)))


def _setproctitle():
    """setproctitle's C function. Loaded from its extension module alone: the
    package's __init__ imports logging for a fallback message, which would cost
    PID 1 about 8 ms and 1.5 MB. The usual import if that cannot be done."""
    try:
        # importlib's own finder, loaded at start-up (importlib.machinery would import warnings).
        PathFinder = sys.modules["_frozen_importlib_external"].PathFinder
        pkg = PathFinder.find_spec("setproctitle")
        spec = PathFinder.find_spec("setproctitle._setproctitle", pkg.submodule_search_locations)
        module = spec.loader.create_module(spec)
        spec.loader.exec_module(module)
        return module.setproctitle
    except Exception:
        from setproctitle import setproctitle

        return setproctitle


def _protect_from_oom(log) -> None:
    from reaper import oom

    oom.protect(log)


def _enforcer(cfg, log, stats, sup):
    from reaper.budgets import reaped
    from reaper.budgets.enforcer import Enforcer

    return Enforcer(cfg, log, stats.budget, sup, reaped.of(sup, stats))


def _leftovers_mode(cfg) -> str:
    """--leftovers as given; unset, report where there are services (the loop has
    timers anyway), else keep: an idle reaper with nothing asked never wakes, and the
    budgets' cost stays theirs."""
    if cfg.leftovers is not None:
        return cfg.leftovers
    return "report" if cfg.services_enabled else "keep"


def _leftovers(cfg, log, stats, sup):
    from reaper.leftovers.piece import Leftovers

    return Leftovers(cfg, log, stats, sup, cfg.leftovers or "report")

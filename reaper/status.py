"""reaper's exit status: one rule for every end. The Supervisor's end and the boundary's
minimal loop apply it here; the C core's quiet end applies the same rule (the code from
reaper_exit_code, -e through reaper_waitspec.zero_codes) when it exits by itself."""
from reaper._native import exit_code


def from_code(cfg, code: int, stopped: bool = False) -> int:
    """The main child's exit code (N, or 128+N if killed by signal N) as reaper's exit
    status: 0 where -e names it, or where --exit-zero-on-stop applies to a requested
    stop (stopped: a SIGTERM reached the main child)."""
    return 0 if code in cfg.remap_exit or (stopped and cfg.exit_zero_on_stop) else code


def exit_status(cfg, status: int, stopped: bool = False) -> int:
    """from_code() of a wait status."""
    return from_code(cfg, exit_code(status), stopped)

"""``reaper [OPTIONS] [--] COMMAND [ARGS...]``: setup, spawn, then the loop.

Everything before the spawn is on the path from start to the child's exec,
so it imports only what it must; psutil, setproctitle and the exporter are
imported after the child runs.
"""
import os
import sys

from reaper import _native
from reaper.spawn import spawn_main


def run(invoker_blocked=None) -> None:
    """The `reaper` command: main(), then exit at once. Everything reaper writes is
    written by then (log lines, the summary, the metrics and summary files), so
    the interpreter's teardown (module by module, thread by thread) is skipped:
    it would only delay the container's end by milliseconds. invoker_blocked: the
    mask the launcher's early block replaced (bin/reaper, reaper/__main__.py)."""
    code = main(invoker_blocked=invoker_blocked)
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:       # a closed or broken stdout: nothing more can be said
            pass
    os._exit(code)


def _usage_error(msg: str) -> int:
    os.write(2, f"reaper: {msg} (see 'reaper --help')\n".encode())
    return 2


def main(argv=None, invoker_blocked=None) -> int:
    """invoker_blocked: the signals the invoker had blocked, when the launcher blocked
    every signal before importing reaper (None: nothing was blocked before)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("stats", "top"):     # plain clients: Ctrl-C must work as usual
        from reaper import commands

        try:
            _unblock(invoker_blocked)
        except KeyboardInterrupt:        # a Ctrl-C since the launcher's block: as during the command
            return 130
        return commands.run(argv[0], argv[1:], None)

    # Before anything else (if the launcher did not): block the signals we handle, so
    # none is lost or delivered to a thread the interpreter starts later.
    try:
        sfd = _native.setup(invoker_blocked)
    except OSError as e:
        os.write(2, f"reaper: cannot set up signal handling: {e.strerror}\n".encode())
        return 1
    inherited = _inherited_fds(sfd)

    if argv and argv[0] in ("watch", "node"):
        from reaper import commands

        return commands.run(argv[0], argv[1:], sfd)

    from reaper import options

    try:
        cfg = options.parse(argv)
    except options.HelpRequested:
        return options.write_stdout(options.help_text(), closed=sfd == 1)
    except options.VersionRequested:
        from reaper import __version__

        return options.write_stdout(f"reaper {__version__}\n", closed=sfd == 1)
    except options.LicenseRequested:
        from reaper._license import LICENSE

        return options.write_stdout(LICENSE, closed=sfd == 1)
    except options.UsageError as e:
        return _usage_error(str(e))
    return _run(cfg, sfd, inherited)


def _unblock(invoker_blocked) -> None:
    """The invoker's mask back, for a command that handles no signal of its own: what
    came since the launcher's block is delivered now, as it would have been."""
    if invoker_blocked is not None:
        import _signal

        _signal.pthread_sigmask(_signal.SIG_SETMASK, invoker_blocked)


def _inherited_fds(sfd: int) -> list:
    """The fds >= 3 reaper's invoker left open (the child keeps them; reaper closes its copies)."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:    # no /proc: the usual range
        fds = range(3, 1024)
    # Keep only fds still open: listdir's own directory fd is in the listing and
    # closed by now; its number may be reused (e.g. by the metrics socket).
    return [fd for fd in fds if fd >= 3 and fd != sfd and _is_open(fd)]


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _run(cfg, sfd: int, inherited: list) -> int:
    # reaper's Log is made here only when something before the spawn needs it;
    # otherwise after the spawn: importing reaper.log is not on the way to the exec.
    log = stats = exporter = None
    idle = cfg.idle_budget_options()
    if idle:        # a budget setting with no budget: said once, before the child starts
        from reaper.options import IDLE_BUDGET_HINT

        log = _new_log(cfg)
        log.warn(f"{', '.join(idle)}: {IDLE_BUDGET_HINT}")
    if cfg.metrics_enabled:
        from reaper import metrics
        from reaper.stats import Stats

        log = log or _new_log(cfg)
        stats = Stats()
        try:
            exporter = metrics.prepare(cfg, stats, log)   # binds the port: fails here, not later (in use: retried)
        except metrics.SetupError as e:
            return _usage_error(str(e))

    subreaper = None
    if os.getpid() != 1:
        try:
            _native.set_subreaper()
            subreaper = "not PID 1: registered as child subreaper"
        except OSError as e:
            log = log or _new_log(cfg)
            log.warn(f"cannot become a subreaper ({e.strerror}): orphans will escape reaper")
    if cfg.pdeath_signal:
        _native.set_pdeathsig(cfg.pdeath_signal)

    if cfg.pause or cfg.services_enabled:
        # catatonit's -P: no child; with services, the loop starts them and then the
        # main child (reaper/services/). The same boundary from here on.
        return _supervise(cfg, log, stats, sfd, 0, exporter, inherited, subreaper)
    pid, status = spawn_main(cfg, log)
    if pid is None:
        return status
    # The child runs: from here on nothing ends reaper but the main child's exit.
    return _supervise(cfg, log, stats, sfd, pid, exporter, inherited, subreaper)


def _supervise(cfg, log, stats, sfd: int, pid: int, exporter, inherited: list, note) -> int:
    """The failure boundary (reaper/boundary.py) runs everything after the spawn: the log,
    the pieces and the loop. Its import is the one step outside it: if even that fails
    (no file descriptor, no memory), the C core alone takes the main child to its end."""
    try:
        from reaper import boundary
    except BaseException as e:
        return _core_only(cfg, sfd, pid, e)
    return boundary.supervise(cfg, log, stats, sfd, pid, exporter, inherited, note)


def _core_only(cfg, sfd: int, pid: int, e: BaseException) -> int:
    """The last resort, with what is loaded already (the C core, os): reap and forward
    until the main child ends, and exit with its status (-e applies). No drain: what is
    left ends with the namespace (PID 1) or goes to the next subreaper. Pause mode ends
    on SIGTERM or SIGINT; with services the main child never started: exit 1."""
    try:   # never wait on stderr: a descriptor of its own (the flags of fd 2 are the child's too)
        fd = os.open("/proc/self/fd/2", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            os.write(fd, f"reaper: cannot load its loop ({e!r}): reaping and forwarding only\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass
    if not pid and not cfg.pause:
        return 1
    waiter = _native.Waiter(sfd)
    waiter.watch(pid, False)
    if pid:
        waiter.forward(pid, cfg.process_group, _native.forward_table(cfg.rewrite))
    stops = (15, 2)                      # SIGTERM, SIGINT: the _signal module may not load either
    while not waiter.main_reaped:
        try:
            events, _, _ = waiter.wait(-1)
        except OSError:                  # poll() without kernel memory: retry, not spin
            import time

            time.sleep(0.01)
            continue
        if not pid and any(ev.kind == _native.EV_SIGNAL and ev.signo in stops for ev in events):
            return 0
    code = _native.exit_code(waiter.main_status)
    return 0 if code in cfg.remap_exit else code


def _new_log(cfg):
    from reaper.log import Log

    return Log(cfg.verbosity, cfg.log_format)

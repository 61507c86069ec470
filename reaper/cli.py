"""``reaper [OPTIONS] [--] COMMAND [ARGS...]``: setup, spawn, then the loop.

Everything before the spawn is on the path from start to the child's exec,
so it imports only what it must; psutil, setproctitle and the exporter are
imported after the child runs.
"""
import os
import sys

from reaper import _native


def run() -> None:
    """The `reaper` command: main(), then exit at once. Everything reaper writes is
    written by then (log lines, the summary, the metrics and summary files), so
    the interpreter's teardown (module by module, thread by thread) is skipped:
    it would only delay the container's end by milliseconds."""
    code = main()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:       # a closed or broken stdout: nothing more can be said
            pass
    os._exit(code)


def _usage_error(msg: str) -> int:
    os.write(2, f"reaper: {msg} (see 'reaper --help')\n".encode())
    return 2


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "stats":      # a plain client: Ctrl-C must work as usual
        from reaper import commands

        return commands.run("stats", argv[1:], None)

    # Before anything else: block the signals we handle, so none is lost or
    # delivered to a thread the interpreter starts later.
    try:
        sfd = _native.setup()
    except OSError as e:
        os.write(2, f"reaper: cannot set up signal handling: {e.strerror}\n".encode())
        return 1
    inherited = _inherited_fds(sfd)

    if argv and argv[0] == "watch":
        from reaper import commands

        return commands.run("watch", argv[1:], sfd)

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
        from reaper import boundary

        log = _said(log or _new_log(cfg), subreaper)
        return boundary.supervise(cfg, log, stats, sfd, 0, _pieces(cfg, log, exporter, 0, inherited))
    pid, status = spawn_main(cfg, log)
    if pid is None:
        return status

    # The child runs. From here on the failure boundary holds (reaper/boundary.py).
    from reaper import boundary

    log = _said(log or _new_log(cfg), subreaper)

    return boundary.supervise(cfg, log, stats, sfd, pid, _pieces(cfg, log, exporter, pid, inherited))


def _pieces(cfg, log, exporter, pid: int, inherited: list):
    from reaper import pieces     # after the spawn: not on the way to the exec

    return pieces.compose(cfg, log, exporter, pid, inherited)


def _new_log(cfg):
    from reaper.log import Log

    return Log(cfg.verbosity)


def _said(log, debug_line):
    if debug_line:
        log.debug(debug_line)
    return log


def spawn_main(cfg, log) -> tuple:
    """(pid, None) once the main child runs, or (None, reaper's exit status) after one
    line (on log, or a Log made for it when there is none yet)."""
    own_group = True
    # systemd socket activation through an init: the sockets are the child's.
    listen_pid = os.environ.get("LISTEN_PID") == str(os.getpid())
    try:
        pid, exec_errno = _native.spawn(cfg.command, own_group, own_group and os.isatty(0), listen_pid)
    except OSError as e:             # fork failed: EAGAIN (pids limit), ENOMEM
        from reaper.log import quoted

        (log or _new_log(cfg)).error(f"cannot start {quoted(cfg.command[0])}: {e.strerror}")
        return None, 1
    if exec_errno:
        import errno

        from reaper.log import quoted

        (log or _new_log(cfg)).error(f"cannot run {quoted(cfg.command[0])}: {_exec_error(cfg.command[0], exec_errno)}")
        os.waitpid(pid, 0)          # the child has already _exit()ed: leave no zombie
        return None, 127 if exec_errno in (errno.ENOENT, errno.ENOTDIR) else 126
    return pid, None


def _exec_error(command: str, err: int) -> str:
    """strerror, except that execvp says EACCES for a directory: say what it is."""
    import errno

    if err == errno.EACCES:
        dirs = [""] if "/" in command else os.environ.get("PATH", os.defpath).split(os.pathsep)
        for d in dirs:
            path = os.path.join(d, command)
            if os.path.isdir(path):
                return os.strerror(errno.EISDIR)
            if os.path.exists(path):
                break
    return os.strerror(err)

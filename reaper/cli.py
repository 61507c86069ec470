"""``reaper [OPTIONS] [--] COMMAND [ARGS...]``: setup, spawn, then the loop.

Everything before the spawn is on the path from start to the child's exec,
so it imports only what it must; psutil, setproctitle and the exporter are
imported after the child runs.
"""
from __future__ import annotations

import errno
import os
import sys

from reaper import _native


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
        sys.stdout.write(options.help_text())
        return 0
    except options.VersionRequested:
        from reaper import __version__

        sys.stdout.write(f"reaper {__version__}\n")
        return 0
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
    from reaper.log import Log

    log = Log(cfg.verbosity)
    stats = exporter = None
    if cfg.metrics_enabled:
        from reaper import metrics
        from reaper.stats import Stats

        stats = Stats()
        try:
            exporter = metrics.prepare(cfg, stats, log)   # binds the port: fails here, not later
        except metrics.SetupError as e:
            return _usage_error(str(e))

    if os.getpid() != 1:
        try:
            _native.set_subreaper()
            log.debug("not PID 1: registered as child subreaper")
        except OSError as e:
            log.warn(f"cannot become a subreaper ({e.strerror}): orphans will escape reaper")
    if cfg.pdeath_signal:
        _native.set_pdeathsig(cfg.pdeath_signal)

    own_group = True
    pid, exec_errno = _native.spawn(cfg.command, own_group, own_group and os.isatty(0))
    if exec_errno:
        log.error(f"cannot run {cfg.command[0]!r}: {os.strerror(exec_errno)}")
        os.waitpid(pid, 0)          # the child has already _exit()ed: leave no zombie
        return 127 if exec_errno in (errno.ENOENT, errno.ENOTDIR) else 126

    # The child runs: now the things that may take time.
    if stats is None:
        from reaper.stats import Stats

        stats = Stats()
    stats.main_pid = pid
    stats.main_state = "running"
    stats.main_command = os.path.basename(cfg.command[0])
    log.debug(f"started main child {pid}: {' '.join(cfg.command)}")
    _after_spawn(cfg, inherited)
    from reaper.supervisor import Supervisor

    sup = Supervisor(cfg, log, stats, sfd)
    if exporter is not None:
        sup.plugins.extend(exporter.start(sup))
    if cfg.budgets_enabled:
        from reaper import budget

        sup.plugins.append(budget.Enforcer(cfg, log, stats.budget, sup))
    status = sup.run(pid)
    _log_summary(cfg, stats, log)
    return status


def _after_spawn(cfg, inherited: list) -> None:
    os.chdir("/")                          # never pin a mount the child may want to unmount
    for fd in inherited:                   # the child keeps them; reaper must not hold them open
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        from setproctitle import setproctitle

        setproctitle("reaper: " + " ".join(cfg.command))
    except ImportError:
        pass


def _log_summary(cfg, stats, log) -> None:
    import json

    line = json.dumps(stats.summary(), sort_keys=True)
    log.info(f"summary {line}")
    if cfg.summary_file:
        try:
            tmp = f"{cfg.summary_file}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(line + "\n")
            os.replace(tmp, cfg.summary_file)
        except OSError as e:
            log.error(f"cannot write summary file {cfg.summary_file}: {e.strerror}")

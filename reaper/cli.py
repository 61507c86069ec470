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
    from reaper.log import Log, quoted

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

    from reaper import boundary

    if cfg.pause:    # catatonit's -P: no child; the same boundary from here on
        return boundary.supervise(cfg, log, stats, sfd, 0, _policy(cfg, log, exporter, 0, inherited))

    own_group = True
    # systemd socket activation through an init: the sockets are the child's.
    listen_pid = os.environ.get("LISTEN_PID") == str(os.getpid())
    try:
        pid, exec_errno = _native.spawn(cfg.command, own_group, own_group and os.isatty(0), listen_pid)
    except OSError as e:             # fork failed: EAGAIN (pids limit), ENOMEM
        log.error(f"cannot start {quoted(cfg.command[0])}: {e.strerror}")
        return 1
    if exec_errno:
        log.error(f"cannot run {quoted(cfg.command[0])}: {_exec_error(cfg.command[0], exec_errno)}")
        os.waitpid(pid, 0)          # the child has already _exit()ed: leave no zombie
        return 127 if exec_errno in (errno.ENOENT, errno.ENOTDIR) else 126

    # The child runs. From here on the failure boundary holds (reaper/boundary.py).
    return boundary.supervise(cfg, log, stats, sfd, pid, _policy(cfg, log, exporter, pid, inherited))


def _exec_error(command: str, err: int) -> str:
    """strerror, except that execvp says EACCES for a directory: say what it is."""
    if err == errno.EACCES:
        dirs = [""] if "/" in command else os.environ.get("PATH", os.defpath).split(os.pathsep)
        for d in dirs:
            path = os.path.join(d, command)
            if os.path.isdir(path):
                return os.strerror(errno.EISDIR)
            if os.path.exists(path):
                break
    return os.strerror(err)


def _policy(cfg, log, exporter, pid: int, inherited: list):
    """The policy pieces started after the spawn, in order; the boundary runs each
    under its guard (a piece that fails is switched off, reaper goes on)."""
    def start(policy, sup) -> None:
        stats = sup.stats
        if pid:
            policy.call("statistics", _note_main, stats, pid, cfg.command)
        else:
            stats.main_state = "none"
        policy.call("hygiene", _after_spawn, inherited)
        policy.call("title", _set_title, cfg.command or ["pause"])
        policy.call("oom", _protect_from_oom, log)
        if exporter is not None:
            policy.start("metrics", lambda: exporter.start(sup), getattr(exporter, "abort", None))
        if cfg.budgets_enabled:
            policy.start("budgets", lambda: _enforcer(cfg, log, stats, sup))
    return start


def _note_main(stats, pid: int, command: list) -> None:
    from reaper.log import display

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
    from reaper.log import display
    from setproctitle import setproctitle

    # The title is C text: argv bytes that are not UTF-8 are shown escaped.
    setproctitle("reaper: " + display(" ".join(command)))


def _protect_from_oom(log) -> None:
    from reaper import oom

    oom.protect(log)


def _enforcer(cfg, log, stats, sup):
    from reaper import budget

    return budget.Enforcer(cfg, log, stats.budget, sup)

"""Starting the main child: the spawn, and the one line and exit status when it
cannot start or run.

Used by reaper/cli.py (before the loop) and reaper/pieces.py (services mode: the
loop starts the main child later); a module of its own so that neither imports
the other. It is on the way from start to the child's exec: it imports os and
reaper._native only; reaper.log and errno only when the spawn failed.
"""
import os

from reaper import _native


def spawn_main(cfg, log) -> tuple:
    """(pid, None) once the main child runs, or (None, reaper's exit status) after one
    line (on log, or a Log made for it when there is none yet)."""
    own_group = True
    # systemd socket activation through an init: the sockets are the child's.
    listen_pid = os.environ.get("LISTEN_PID") == str(os.getpid())
    try:
        pid, exec_errno = _native.spawn(cfg.command, own_group, own_group and os.isatty(0), listen_pid)
    except OSError as e:             # fork failed: EAGAIN (pids limit), ENOMEM
        from reaper.text import quoted

        _log(cfg, log).error(f"cannot start {quoted(cfg.command[0])}: {e.strerror}")
        return None, 1
    if exec_errno:
        from reaper.text import quoted

        _log(cfg, log).error(f"cannot run {quoted(cfg.command[0])}: {_exec_error(cfg.command[0], exec_errno)}")
        os.waitpid(pid, 0)          # the child has already _exit()ed: leave no zombie
        return None, _native.exec_failure_code(exec_errno)
    return pid, None


def _log(cfg, log):
    if log is not None:
        return log
    from reaper.log import Log

    return Log(cfg.verbosity, cfg.log_format)


def _exec_error(command: str, err: int) -> str:
    """strerror, except that execvp says EACCES for a directory: say what it is."""
    import errno

    if err == errno.EACCES and lookup(command) == errno.EISDIR:
        return os.strerror(errno.EISDIR)
    return os.strerror(err)


def lookup(program: str) -> "int | None":
    """What execvp would find for program now, walking PATH as it does: None if it would
    run it, else the errno (ENOENT: nowhere; EACCES: found, not executable; EISDIR: only
    a directory of that name). The services are checked with it before anything starts."""
    import errno

    if "/" in program:
        candidates = [program]
    else:
        candidates = [os.path.join(d or ".", program) for d in os.environ.get("PATH", os.defpath).split(os.pathsep)]
    denied = None
    for path in candidates:
        if os.path.isdir(path):
            denied = denied or errno.EISDIR
        elif os.path.exists(path):
            if os.access(path, os.X_OK):
                return None
            denied = errno.EACCES
    return denied or errno.ENOENT

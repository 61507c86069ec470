# `python -m reaper`: bin/reaper's early block (see there), as this module's first statement.
try:
    import _signal
    invoker_blocked = _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
    from reaper.cli import run
except KeyboardInterrupt:       # a Ctrl-C that came before the block: quietly, with the shell's code
    import posix

    posix._exit(130)
run(invoker_blocked)

"""reaper's log: stderr only, one line per event, ``reaper[PID]: LEVEL message``.

Written with os.write on fd 2 rather than the logging module: it costs nothing
at import, never buffers, and a closed or broken stderr can never raise into
PID 1's loop.
"""
from __future__ import annotations

import os

ERROR, WARN, INFO, DEBUG = 0, 1, 2, 3
_NAMES = ("ERROR", "WARN", "INFO", "DEBUG")


class Log:
    def __init__(self, verbosity: int = 2) -> None:
        self.verbosity = verbosity
        self.pid = os.getpid()

    def _emit(self, level: int, msg: str) -> None:
        if level > self.verbosity and level != ERROR:
            return
        try:
            os.write(2, f"reaper[{self.pid}]: {_NAMES[level]} {msg}\n".encode(errors="replace"))
        except OSError:
            pass

    def error(self, msg: str) -> None:
        self._emit(ERROR, msg)

    def warn(self, msg: str) -> None:
        self._emit(WARN, msg)

    def info(self, msg: str) -> None:
        self._emit(INFO, msg)

    def debug(self, msg: str) -> None:
        self._emit(DEBUG, msg)

    def enabled(self, level: int) -> bool:
        return level <= self.verbosity

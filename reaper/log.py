"""reaper's log: stderr only, one line per event, ``reaper[PID]: LEVEL message``, or
with --log-format json one JSON object a line: {"time", "level", "pid", "event", "msg",
"fields"} (the summary's figures in "fields", an object), for a pipeline's JSON parser.

Every message is escaped here, in one place (reaper.text.display: control characters
and undecodable bytes as \\x1b, \\n...): the messages carry what processes control
(names, command lines, paths), and an ESC or a newline must neither drive a terminal
nor forge a line. JSON encoding escapes the rest.

Written with os.write rather than the logging module: it costs nothing at
import and never buffers. Two rules keep PID 1 alive whatever stderr is:

- Never wait on stderr. A pipe nobody reads would stop the loop in write()
  while zombies pile up. Every write is non-blocking *without* touching the
  flags of the open file, which the child shares (O_NONBLOCK there would hand
  the child EAGAINs): RWF_NOWAIT for pipes, MSG_DONTWAIT for sockets, a
  non-blocking descriptor of our own for terminals. A line stderr cannot take
  right now is dropped and counted (``dropped``: reaper_log_lines_dropped_total).
- Never flood. The same event (same key) repeated within REPEAT_WINDOW seconds
  is counted, not printed; the count comes with its next line, or at close().
"""
import os
import stat
import time

from reaper.text import display

ERROR, WARN, INFO, DEBUG = 0, 1, 2, 3
_NAMES = ("ERROR", "WARN", "INFO", "DEBUG")
MAX_LINE = 4000          # under PIPE_BUF: a line reaches a pipe whole or not at all
REPEAT_WINDOW = 5.0      # seconds in which a repeated event is only counted


class _Stderr:
    """Writes to fd 2 that never block. The method is chosen once from what fd 2 is."""

    def __init__(self) -> None:
        self.fd, self.how, self.sock = 2, "write", None
        try:
            mode = os.fstat(2).st_mode
        except OSError:
            self.how = "closed"
            return
        if stat.S_ISREG(mode):
            return                                  # a file: write() does not wait for a reader
        if stat.S_ISSOCK(mode):
            import socket                           # only for a socket (journald): not on the common path

            self.sock, self.how = socket.socket(fileno=os.dup(2)), "send"
            return
        if stat.S_ISFIFO(mode) and hasattr(os, "RWF_NOWAIT"):
            self.how = "nowait"                     # a kernel without it says EOPNOTSUPP: see write()
            return
        self._reopen()

    def _reopen(self) -> None:
        """A non-blocking open file of our own on the same pipe or terminal (through
        /proc); without /proc or permission, poll for room before each write."""
        try:
            self.fd = os.open("/proc/self/fd/2", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            self.how = "write"
        except OSError:
            self.fd, self.how = 2, "poll"

    def write(self, data: bytes) -> bool:
        """True if the line was written (whole, for pipes)."""
        try:
            if self.how == "nowait":
                try:
                    return os.pwritev(2, [data], -1, os.RWF_NOWAIT) > 0
                except OSError as e:
                    if e.errno not in (95, 22):     # EOPNOTSUPP, EINVAL: an older kernel
                        raise
                    self._reopen()
            if self.how == "send":
                import socket

                return self.sock.send(data, socket.MSG_DONTWAIT) > 0
            if self.how == "poll" and not _room(self.fd):
                return False
            if self.how == "closed":
                return False
            return os.write(self.fd, data) > 0
        except OSError:                             # EAGAIN (full), EPIPE, EBADF, ...
            return False


def _room(fd: int) -> bool:
    # The last resort (no RWF_NOWAIT, no /proc): a writer racing us for the last
    # free slot could still make write() wait; every other method cannot.
    import select

    try:
        p = select.poll()
        p.register(fd, select.POLLOUT)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return False


class Log:
    def __init__(self, verbosity: int = 1, fmt: str = "text") -> None:
        self.verbosity = verbosity
        self.pid = os.getpid()
        self.dropped = 0                            # lines stderr could not take
        self._out = _Stderr()
        self._repeats: dict = {}                    # key -> [first seen, count since printed, level, msg]
        self._dumps = None
        if fmt == "json":
            import json                             # only when asked for: the text path imports nothing

            self._dumps = json.dumps

    def _emit(self, level: int, msg: str, label: int = -1, event=None, fields=None) -> None:
        if level > self.verbosity and level != ERROR:
            return
        name = _NAMES[level if label < 0 else label]
        text = display(msg)                         # what a process put in msg is escaped here
        if self._dumps is None:
            data = f"reaper[{self.pid}]: {name} {text}".encode()
            if len(data) >= MAX_LINE:
                data = data[:MAX_LINE - 4] + b"..."
        else:
            data = self._object(name, text, event, fields)
        if not self._out.write(data + b"\n"):
            self.dropped += 1

    def _object(self, level: str, text: str, event, fields) -> bytes:
        """One JSON object (ASCII: every control character and non-ASCII one escaped),
        shortened as a whole object under MAX_LINE, never cut in the middle."""
        if not isinstance(event, str):
            event = event[0] if event and isinstance(event[0], str) else "log"
        t = time.time()
        obj = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z",
               "level": level, "pid": self.pid, "event": event, "msg": text, "fields": fields or {}}
        data = self._dumps(obj, default=str).encode()
        if len(data) >= MAX_LINE:
            obj["msg"] = text[:MAX_LINE // 8] + "..." if len(text) > MAX_LINE // 8 else text
            if len(self._dumps(obj["fields"], default=str)) > MAX_LINE // 2:
                obj["fields"] = {"truncated": True}
            data = self._dumps(obj, default=str).encode()
        return data

    def error(self, msg: str) -> None:
        self._emit(ERROR, msg)

    def warn(self, msg: str) -> None:
        self._emit(WARN, msg)

    def info(self, msg: str) -> None:
        self._emit(INFO, msg)

    def debug(self, msg: str) -> None:
        self._emit(DEBUG, msg)

    def summary(self, msg: str, news: bool, fields: "dict | None" = None) -> None:
        """The exit summary: an INFO line, printed at the default level too (warnings)
        when there is news; nothing with -q. In JSON, fields (the figures) are the
        object's "fields" and msg is not repeated."""
        self._emit(WARN if news else INFO, "summary" if self._dumps and fields is not None else msg,
                   label=INFO, event="summary", fields=fields)

    def pending(self) -> bool:
        """Whether the end has something of the log's to say: a lost line, or
        repeats counted but not yet printed (close() prints them)."""
        return bool(self.dropped) or any(r[1] for r in self._repeats.values())

    def enabled(self, level: int) -> bool:
        return level <= self.verbosity

    def event(self, key, level: int, msg: str) -> None:
        """Logs msg unless the same key was logged within REPEAT_WINDOW; repeats are
        counted and their number printed with the key's next line or at close()."""
        if level > self.verbosity and level != ERROR:
            return
        now = time.monotonic()
        r = self._repeats.get(key)
        if r is not None and now - r[0] < REPEAT_WINDOW:
            r[1] += 1
            r[2], r[3] = level, msg
            return
        if r is not None and r[1]:
            msg += f" (and {r[1]} more like it in the {now - r[0]:.0f}s before)"
        self._repeats[key] = [now, 0, level, msg]
        self._emit(level, msg, event=key)

    def close(self) -> None:
        """Prints the counts of repeats not yet reported."""
        for key, r in self._repeats.items():
            if r[1]:
                self._emit(r[2], f"{r[3]} (repeated {r[1]} more times)", event=key)
        self._repeats.clear()

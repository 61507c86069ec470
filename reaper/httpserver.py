"""The exporter's HTTP server: one thread, one selectors loop, non-blocking sockets.

A thread per connection (wsgiref with ThreadingMixIn) let a handful of idle
clients take every slot. Here a connection costs a descriptor and a few hundred
bytes, never a thread, and this policy keeps a well-behaved client served
whatever the others do:

- At most MAX_CONNECTIONS are open, and never more than half of RLIMIT_NOFILE
  (the scrape's /proc reads and the rest of reaper need descriptors too). At
  that limit, or when accept() fails with EMFILE/ENFILE, the oldest connection
  without a complete request is cut (RST) to make room: a new client always
  gets in.
- A new connection is read at once (a scraper's request is usually there
  already) and answered in the same pass.
- Deadlines: a request head must arrive whole within REQUEST_DEADLINE of the
  accept and fit in MAX_HEAD bytes; the answer must be taken within WRITE_DEADLINE.
- TCP_DEFER_ACCEPT: the kernel keeps a connection that has sent nothing for
  DEFER_ACCEPT seconds before handing it over, so idle ones cost nothing meanwhile.
- One request per connection (``Connection: close``); GET and HEAD only.
- Answers within a CPU share: answering (parsing a request, making and sending the
  answer, closing) may use ANSWER_SHARE of a core on average, measured as the thread's
  CPU time (the app's own work excluded: the exporter's routes bound their collections).
  Past a burst of ANSWER_BURST, a complete request is held, unanswered and unwatched,
  until the share allows it (oldest first, within REQUEST_DEADLINE). A client that asks
  again as soon as it is answered, any number of them, is answered more slowly, never
  with more of PID 1's CPU; connections are still accepted, read and cut meanwhile, so
  the rules above hold.

Nothing is written to stderr per request: faults are logged at debug level,
and a fault of the loop itself once.
"""
from __future__ import annotations

import errno
import http.client
import io
import resource
import selectors
import socket
import struct
import threading
import time
from collections import OrderedDict
from http import HTTPStatus
from typing import NamedTuple
from urllib.parse import urlsplit

from reaper.policy import SayOnce

MAX_CONNECTIONS = 256       # open at once; beyond, the oldest without a complete request is cut
REQUEST_DEADLINE = 5.0      # seconds from the accept to a complete request head
WRITE_DEADLINE = 5.0        # seconds a client has to take the answer
MAX_HEAD = 16384            # bytes of request line + headers
DEFER_ACCEPT = 1            # seconds the kernel holds a connection that has sent nothing
ACCEPT_BATCH = 64           # accepts per pass, so that a flood of connects cannot starve the rest
ACCEPT_PAUSE = 0.1          # seconds without accepting when descriptors run out and none can be freed
RECV_SIZE = 65536
DISCARD_LIMIT = 65536       # unread input read away before a close (else close() sends RST)
ANSWER_SHARE = 0.01         # of a core, on average, for answering (the app's own work excluded)
ANSWER_BURST = 0.05         # CPU seconds of answers that may go at once beyond the share
METHODS = ("GET", "HEAD")
_RST = struct.pack("ii", 1, 0)      # SO_LINGER on, 0 s: close() resets, no TIME_WAIT


class Request(NamedTuple):
    method: str
    path: str
    headers: http.client.HTTPMessage


class Response(NamedTuple):
    status: int
    headers: list          # (name, value); Content-Length and Connection are added
    body: bytes


def text(status: int, body: str, *headers) -> Response:
    return Response(status, [("Content-Type", "text/plain; charset=utf-8"), *headers], body.encode())


class _Conn:
    __slots__ = ("sock", "deadline", "data", "out", "events", "open", "head")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.data = bytearray()
        self.out = None            # memoryview of the answer left to send
        self.events = 0            # what the selector watches for
        self.open = True
        self.head = b""            # a complete request head held until the share allows its answer


class Server:
    """Serves app(Request) -> Response on a bound, listening socket from one thread."""

    def __init__(self, listener: socket.socket, app, log) -> None:
        self.listener = listener
        self.app = app
        self.log = log
        self.thread: threading.Thread | None = None
        self.limit = connection_limit()
        self.reading: OrderedDict = OrderedDict()    # sock -> _Conn, oldest accept first
        self.writing: OrderedDict = OrderedDict()    # sock -> _Conn, oldest answer first
        self.held: OrderedDict = OrderedDict()       # sock -> _Conn with a complete request, oldest first
        self._credit = ANSWER_BURST                 # CPU seconds answers may still use now
        self._credited = time.monotonic()           # when the credit was last counted
        self._app_cpu = 0.0                         # CPU time of the app in the last answer
        self._stopping = False
        self._fault = SayOnce(self._say_fault, default=False)    # a bug in the loop: said once
        self._resume_at: float | None = None        # accepting paused until then
        self.selector = self._wake_r = self._wake_w = None
        try:
            listener.setblocking(False)
            try:
                listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_ACCEPT)
            except (OSError, AttributeError):
                pass                                 # an optimisation only
            self.selector = selectors.DefaultSelector()
            self._wake_r, self._wake_w = socket.socketpair()   # stop() wakes the loop through it
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self.selector.register(listener, selectors.EVENT_READ, "accept")
            self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        except BaseException:
            self._close_all()
            raise

    # --- lifetime (called from other threads) ---

    def start(self) -> None:
        t = threading.Thread(target=self.run, name="reaper-metrics-http", daemon=True)
        t.start()              # RuntimeError when no thread can be made: the caller cleans up
        self.thread = t

    def stop(self) -> None:
        """Ends the loop, which closes every socket; never raises. Without a running
        thread, closes them here."""
        self._stopping = True
        for step in (lambda: self._wake_w.send(b"x"), self._wake_w.close):
            _quietly(step)
        if self.thread is None:
            self._close_all()

    # --- the loop ---

    def run(self) -> None:
        try:
            while not self._stopping:
                if self._fault.run("loop", self._step) is False:
                    time.sleep(ACCEPT_PAUSE)          # no hot spin
        finally:
            self._close_all()

    def _say_fault(self, _name: str, e: Exception) -> None:
        if not self._stopping:
            self.log.error(f"metrics: HTTP server fault ({e!r}); it goes on")

    def _step(self) -> None:
        for key, mask in self.selector.select(self._timeout(time.monotonic())):
            if key.data == "accept":
                self._accept()
            elif key.data == "wake":
                _quietly(self._wake_r.recv, 64)
            elif key.data.open:      # not cut earlier in this pass
                self._guarded(key.data, self._on_ready)
        now = time.monotonic()
        self._expire(now)
        self._answer_held(now)
        if self._resume_at is not None and now >= self._resume_at:
            self._resume_at = None
            self.selector.register(self.listener, selectors.EVENT_READ, "accept")

    def _timeout(self, now: float):
        due = [d for d in (self._resume_at,
                           next(iter(self.reading.values())).deadline if self.reading else None,
                           next(iter(self.writing.values())).deadline if self.writing else None,
                           next(iter(self.held.values())).deadline if self.held else None,
                           now - self._credit / ANSWER_SHARE if self.held else None)
               if d is not None]
        return max(0.0, min(due) - now) if due else None

    def _expire(self, now: float) -> None:
        # Deadlines are a constant after insertion, so each dict is in deadline order.
        for pending in (self.reading, self.held, self.writing):
            while pending:
                conn = next(iter(pending.values()))
                if conn.deadline > now:
                    break
                self._cut(conn)

    # --- accepting ---

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if self._evict():
                        continue
                    self._pause_accept()
                    return
                if e.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR):
                    continue                  # that one connection failed
                return                        # the listener is gone (stop)
            self._guarded(_Conn(sock, time.monotonic() + REQUEST_DEADLINE), self._admit)

    def _guarded(self, conn: _Conn, handle) -> None:
        """handle(conn); a fault there costs that connection only."""
        try:
            handle(conn)
        except Exception as e:
            self.log.debug(f"metrics: HTTP connection fault: {e!r}")
            self._cut(conn)

    def _pause_accept(self) -> None:
        if self._resume_at is None:
            self.selector.unregister(self.listener)
            self._resume_at = time.monotonic() + ACCEPT_PAUSE

    def _admit(self, conn: _Conn) -> None:
        conn.sock.setblocking(False)   # accept() hands back a blocking socket
        self.reading[conn.sock] = conn
        self._receive(conn)           # its request is usually there already
        if conn.open and conn.out is None:
            if len(self.reading) + len(self.held) + len(self.writing) > self.limit:
                self._evict()         # the oldest: never this one, the newest
            self._watch(conn, selectors.EVENT_READ)

    def _evict(self) -> bool:
        """Cuts the oldest connection still without a complete request (else the
        oldest one being answered); False if there is none."""
        for pending in (self.reading, self.held, self.writing):
            if pending:
                self._cut(next(iter(pending.values())))
                return True
        return False

    # --- reading and answering ---

    def _on_ready(self, conn: _Conn) -> None:
        if conn.out is None:
            self._receive(conn)
        else:
            self._send(conn)

    def _receive(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._cut(conn)
            return
        if not chunk:                  # the client left before its request was complete
            self._cut(conn)
            return
        conn.data += chunk
        end = _head_end(conn.data)
        if end < 0 and len(conn.data) <= MAX_HEAD:
            return
        if end < 0 or end > MAX_HEAD:
            self._answer(conn, text(431, "request head too large\n"), head_only=False)
            return
        conn.head = bytes(conn.data[:end])
        conn.data = bytearray()
        if self.held or self._refill(time.monotonic()) < 0:    # behind those held, or past the share
            self.reading.pop(conn.sock, None)
            self._unwatch(conn)                   # not read meanwhile: a close cannot spin the loop
            conn.deadline = time.monotonic() + REQUEST_DEADLINE
            self.held[conn.sock] = conn
            return
        self._answer_head(conn)

    def _refill(self, now: float) -> float:
        """The answers' credit now: ANSWER_SHARE of the time since it was last counted, up
        to ANSWER_BURST."""
        self._credit = min(ANSWER_BURST, self._credit + (now - self._credited) * ANSWER_SHARE)
        self._credited = now
        return self._credit

    def _answer_held(self, now: float) -> None:
        """The held requests the share allows, oldest first."""
        while self.held and self._refill(now) >= 0:
            conn = self.held.popitem(last=False)[1]
            self._guarded(conn, self._answer_head)
            now = time.monotonic()

    def _answer_head(self, conn: _Conn) -> None:
        """Answers conn's complete request; its CPU time, the app's excluded, is charged
        to the credit."""
        started, self._app_cpu = time.thread_time(), 0.0
        try:
            request = _parse(conn.head)
            self._answer(conn, self._respond(request), head_only=request is not None and request.method == "HEAD")
        finally:
            self._credit -= time.thread_time() - started - self._app_cpu

    def _respond(self, request) -> Response:
        if request is None:
            return text(400, "bad request\n")
        if request.method not in METHODS:
            return text(405, "method not allowed\n", ("Allow", ", ".join(METHODS)))
        started = time.thread_time()
        try:
            return self.app(request)
        except Exception as e:
            self.log.debug(f"metrics: error answering {request.method} {request.path}: {e!r}")
            return text(500, "internal error\n")
        finally:
            self._app_cpu = time.thread_time() - started

    def _answer(self, conn: _Conn, response: Response, head_only: bool) -> None:
        self.reading.pop(conn.sock, None)
        conn.out = memoryview(_encode(response, head_only))
        conn.deadline = time.monotonic() + WRITE_DEADLINE
        self.writing[conn.sock] = conn
        self._send(conn)

    def _send(self, conn: _Conn) -> None:
        try:
            n = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            self._cut(conn)
            return
        conn.out = conn.out[n:]
        if conn.out:
            self._watch(conn, selectors.EVENT_WRITE)
        else:
            self._finish(conn)

    # --- closing ---

    def _watch(self, conn: _Conn, events: int) -> None:
        if conn.events == events:
            return
        if conn.events:
            self.selector.modify(conn.sock, events, conn)
        else:
            self.selector.register(conn.sock, events, conn)
        conn.events = events

    def _unwatch(self, conn: _Conn) -> None:
        if conn.events:
            _quietly(self.selector.unregister, conn.sock)
            conn.events = 0

    def _forget(self, conn: _Conn) -> None:
        conn.open = False
        self.reading.pop(conn.sock, None)
        self.held.pop(conn.sock, None)
        self.writing.pop(conn.sock, None)
        self._unwatch(conn)

    def _finish(self, conn: _Conn) -> None:
        """A graceful close after a complete answer: what the client sent beyond
        its head is read away first, else close() would reset the connection."""
        self._forget(conn)
        try:
            left = DISCARD_LIMIT
            while left > 0 and conn.sock.recv(min(left, RECV_SIZE)):
                left -= RECV_SIZE
        except OSError:
            pass
        _quietly(conn.sock.close)

    def _cut(self, conn: _Conn) -> None:
        """Closes with RST: for abusers and dead clients, no TIME_WAIT left behind."""
        self._forget(conn)
        _quietly(conn.sock.setsockopt, socket.SOL_SOCKET, socket.SO_LINGER, _RST)
        _quietly(conn.sock.close)

    def _close_all(self) -> None:
        for pending in (self.reading, self.held, self.writing):
            while pending:
                self._cut(next(iter(pending.values())))
        for step in (lambda: self.selector.close(), lambda: self._wake_r.close(), lambda: self._wake_w.close(),
                     self.listener.close):
            _quietly(step)


def connection_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(4, min(MAX_CONNECTIONS, soft // 2))


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:
        pass


def _head_end(data: bytearray) -> int:
    """Index just past the blank line that ends the head (CRLF or bare LF), or -1."""
    i = data.find(b"\r\n\r\n")
    if i >= 0:
        return i + 4
    i = data.find(b"\n\n")
    return i + 2 if i >= 0 else -1


def _parse(head: bytes) -> "Request | None":
    """The request line and headers; None if malformed."""
    line, _, rest = head.partition(b"\n")
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not (parts[0].isascii() and parts[0].isalpha()) or not parts[2].startswith("HTTP/1."):
        return None
    try:
        headers = http.client.parse_headers(io.BytesIO(rest))
    except (http.client.HTTPException, ValueError):
        return None
    return Request(parts[0], urlsplit(parts[1]).path or "/", headers)


def _encode(response: Response, head_only: bool) -> bytes:
    """The answer's bytes; for HEAD the same headers (Content-Length included), no body."""
    status, headers, body = response
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", *(f"{k}: {v}" for k, v in headers),
             f"Content-Length: {len(body)}", "Connection: close", "", ""]
    data = "\r\n".join(lines).encode("latin-1")
    return data if head_only else data + body

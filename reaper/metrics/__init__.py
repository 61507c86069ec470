"""The Prometheus exporter: /metrics and /healthz on a port, and/or a metrics file.

Two steps, so that nothing slows the path to the child's exec and a bad flag
still fails before the child starts:

- prepare() (here, before the spawn): binds the listening socket with the socket
  module only. Errors are one SetupError line, except a port in use or an address
  not (yet) on this host: one WARN line, and the exporter's sampler retries the
  bind with backoff until it works. A port taken by another pod of a hostNetwork
  node must not stop the container. The metrics file was checked when the options
  were parsed (reaper.values.check_writable).
- Exporter.start() (after the spawn, exporter.py): serves HTTP on the pre-bound
  socket (routes.py, reaper/httpserver.py) and starts the sampler thread
  (sampler.py).

What a scrape reads is the collector's (collector.py): sections, one module each
(sections/), registered in sections.SECTIONS. Metric names: names.py; the one
client of the endpoint: client.py.

Loaded before the spawn: this module and exporter.py only (tests/test_import_graph.py).
"""
from __future__ import annotations

import errno
import socket

from reaper.metrics.exporter import BIND_RETRY_FIRST, BIND_RETRY_MAX, Exporter

LISTEN_BACKLOG = 1024       # accept() queue: a flood of connects must not drop a scraper's SYN
# Bind failures that may end by themselves (another pod frees the port, an interface
# comes up): reaper goes on and retries. Any other one is a usage error before the spawn.
BIND_LATER = (errno.EADDRINUSE, errno.EADDRNOTAVAIL)


class SetupError(Exception):
    """A bad metrics flag: one line, exit 2, before the child starts."""


def prepare(cfg, stats, log, mode: str = "init") -> Exporter:
    """The exporter, its port bound (or to be bound later: BIND_LATER). Raises SetupError."""
    sock = later = None
    if cfg.metrics_port is not None:
        port = Port(*_resolve(cfg.metrics_address, cfg.metrics_port))
        try:
            sock = port.bind()
        except OSError as e:         # BIND_LATER: the sampler retries (sampler.BindRetry)
            later = port
            log.warn(f"{port.problem(e)}: reaper goes on without /metrics and /healthz and retries "
                     f"the bind in the background ({BIND_RETRY_FIRST:g} s, doubling up to {BIND_RETRY_MAX:g} s)")
    return Exporter(cfg, stats, log, sock, mode, later)


class Port:
    """The endpoint's address (family, sockaddr): bound before the spawn, or by the
    sampler's retries (which know it only through this interface)."""

    def __init__(self, family, sockaddr) -> None:
        self.family, self.sockaddr = family, sockaddr

    def where(self) -> str:
        host, port = self.sockaddr[:2]
        return f"[{host}]:{port}" if self.family == socket.AF_INET6 else f"{host}:{port}"

    def listen(self) -> socket.socket:
        """A listening socket; raises OSError as socket(), bind() and listen() do."""
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # a restart within TIME_WAIT works
            if self.family == socket.AF_INET6 and self.sockaddr[0] == "::":
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(self.sockaddr)
            sock.listen(LISTEN_BACKLOG)
        except BaseException:
            sock.close()
            raise
        return sock

    @staticmethod
    def for_now(e: OSError) -> bool:
        """A failure that may end by itself: retried."""
        return e.errno in BIND_LATER

    def bind(self) -> socket.socket:
        """listen(), with its failures sorted: OSError for those that may end by
        themselves (BIND_LATER), SetupError for the others. EACCES (a port below
        net.ipv4.ip_unprivileged_port_start without CAP_NET_BIND_SERVICE) is one of
        these: the kernel checks it before it looks whether the port is free, and a
        process never gains the capability later, so no retry could ever succeed."""
        try:
            return self.listen()
        except OSError as e:
            if self.for_now(e):
                raise
            if e.errno == errno.EACCES:
                raise SetupError(f"--metrics-port: no permission to bind {self.where()}") from None
            raise SetupError(f"--metrics-address: cannot listen on {self.where()}: {e.strerror}") from None

    def problem(self, e: OSError) -> str:
        if e.errno == errno.EADDRINUSE:
            return f"--metrics-port: {self.where()} is already in use"
        if e.errno == errno.EADDRNOTAVAIL:
            return f"--metrics-address: {self.sockaddr[0]} is not an address of this host (yet)"
        return f"--metrics-address: cannot listen on {self.where()}: {e.strerror}"


def _resolve(address: str, port: int) -> tuple:
    host = address.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise SetupError("--metrics-address: empty address")
    try:   # numeric first: no name lookup on the way to the child's exec
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_NUMERICHOST | socket.AI_PASSIVE)
    except socket.gaierror:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except (socket.gaierror, UnicodeError) as e:
            msg = e.strerror if isinstance(e, socket.gaierror) else str(e)
            raise SetupError(f"--metrics-address: bad address {address!r} ({msg})") from None
    family, _, _, _, sockaddr = infos[0]
    return family, sockaddr

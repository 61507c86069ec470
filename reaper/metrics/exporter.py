"""The exporter's lifecycle after the spawn: start() serves HTTP on the port that
prepare() bound (routes.py, reaper/httpserver.py) and starts the sampler thread
(sampler.py); abort() releases what start() took; close() writes the metrics file
a last time. reaper node serves its own collector through serve().

Loaded before the spawn (prepare() makes the Exporter): it imports only modules
the binding loaded already; the rest is imported in start().
"""
from __future__ import annotations

import os
import socket
import threading

BIND_RETRY_FIRST = 1.0      # seconds from the start to the first retry of a bind that failed for now
BIND_RETRY_MAX = 30.0       # the retries' interval doubles up to this


class Exporter:
    def __init__(self, cfg, stats, log, sock: socket.socket | None, mode: str, later=None) -> None:
        self.cfg = cfg                  # options.Config
        self.stats = stats              # stats.Stats (None for reaper node, whose collector is its own)
        self.log = log
        self.sock = sock
        self.mode = mode                # init, watch or node: reaper_build_info{mode}
        self.later = later              # metrics.Port the sampler binds once it can (BIND_LATER)
        self.listening = False          # the endpoint is bound and served: reaper_metrics_listening
        self.cpu = None                 # nodestats.CpuSampler while per-core CPU can be read
        self.memory_visible: int | None = None     # counted by the sampler: may be a big tree
        self.collector = None
        self.file_registry = None
        self.server = None              # httpserver.Server
        self._stop = threading.Event()
        self._file_lock = threading.Lock()
        self._sampler: threading.Thread | None = None
        self._file_error = ""
        self._retry = None              # sampler.BindRetry while the port is taken

    def start(self, scope) -> list:
        """scope: an object with pid, is_pid1, main_pid, supervised, watch (the
        Supervisor, or watch's). Raises (e.g. RuntimeError: no room for a thread) with
        nothing left running."""
        try:
            self._start(scope)
        except BaseException:
            self.abort()
            raise
        return [_ClosePlugin(self)]

    def _start(self, scope) -> None:
        # After the spawn: not on the path to the child's exec. httpserver and the routes
        # now too, so that a bind retried later imports nothing; and what a scrape imports:
        # out of descriptors, a first scrape could not open it.
        import prometheus_client.core  # noqa: F401
        from prometheus_client import CollectorRegistry

        from reaper import httpserver, nodestats  # noqa: F401
        from reaper.metrics import routes, sampler  # noqa: F401
        from reaper.metrics.collector import ReaperCollector

        self.collector = ReaperCollector(self, scope)
        if self.cfg.metrics_file:
            # The file carries reaper_* only: node_exporter has process_* of its own.
            self.file_registry = CollectorRegistry()
            self.file_registry.register(self.collector)
        try:
            if self.cfg.node_metrics != "off":       # off: /proc/stat is never read
                self.cpu = nodestats.CpuSampler()
        except OSError as e:      # no /proc: reaper_source_available{source="proc_stat"} says so
            self.log.debug(f"metrics: cannot read /proc/stat ({e.strerror}): no per-core CPU")
        self._sampler = threading.Thread(target=sampler.run, args=(self, self._stop),
                                         name="reaper-metrics-sampler", daemon=True)
        self._sampler.start()
        if self.sock is not None:
            self.serve_http()
            self.log.debug(f"metrics: serving on {self.sock.getsockname()[:2]}")

    def serve(self, collector) -> None:
        """Serves another command's collector (reaper node's) on the prepared port and
        file, with no sampler thread: the caller's loop calls write_file() and, while
        the port is taken, retry_bind()."""
        from prometheus_client import CollectorRegistry

        self.collector = collector
        if self.cfg.metrics_file:
            self.file_registry = CollectorRegistry()
            self.file_registry.register(collector)
        if self.sock is not None:
            self.serve_http()

    def retry_bind(self):
        """One bind of a port that was taken: seconds until the next try, or None once
        served (or given up, said once by the caller's guard when it raises)."""
        from reaper.metrics.sampler import BindRetry

        if self._retry is None:
            self._retry = BindRetry(self)
        return self._retry.once()

    def serve_http(self) -> None:
        """Serves HTTP on self.sock from the server thread (started once, here)."""
        from prometheus_client import CollectorRegistry, ProcessCollector

        from reaper import httpserver
        from reaper.metrics import routes
        from reaper.metrics.collector import Guarded

        registry = CollectorRegistry()
        registry.register(self.collector)
        registry.register(Guarded(ProcessCollector(registry=None), "process", self.log))
        self.server = httpserver.Server(self.sock, routes.app(registry, self.log), self.log)
        # Before the thread starts: its first answer may come before this thread runs again.
        self.listening = True
        try:
            self.server.start()
        except BaseException:
            self.listening = False
            raise

    def release(self) -> None:
        """Stops the server and closes the port; never raises."""
        self.listening = False
        for step in (lambda: self.server is not None and self.server.stop(),
                     lambda: self.sock is not None and self.sock.close()):
            try:
                step()
            except BaseException:
                pass

    def bind_backoff(self) -> tuple:
        """(first, ceiling) of the bind retries' interval."""
        return BIND_RETRY_FIRST, BIND_RETRY_MAX

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def abort(self) -> None:
        """Releases what start() took, best effort; never raises (the failure boundary
        calls it when start() failed). Clients then get "connection refused", not a hang."""
        # The stop first: a bind the sampler makes after it sees it and releases itself.
        steps = [self._stop.set,                    # the sampler ends at its next wake-up
                 self.release]                      # ends the server thread, closes the port and connections
        for step in steps:
            try:
                step()
            except BaseException:                   # nothing may escape into PID 1's failure path
                pass

    def write_file(self) -> None:
        from prometheus_client import generate_latest

        path = self.cfg.metrics_file
        with self._file_lock:
            data = generate_latest(self.file_registry)
            tmp = _tmp_name(path)
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
                self._file_error = ""
            except OSError as e:
                if e.strerror != self._file_error:      # once per distinct error, not every interval
                    self.log.error(f"cannot write metrics file {path}: {e.strerror}")
                    self._file_error = e.strerror
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        if self.file_registry is not None:
            self.collector.invalidate()     # the final state, not a scan from before the exit
            self.write_file()       # the final numbers, drain included


def _tmp_name(path: str) -> str:
    # Same directory (rename is atomic only within a filesystem); a name that
    # node_exporter's textfile collector (*.prom) never reads half-written.
    d, base = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{base}.tmp{os.getpid()}")


class _ClosePlugin:
    """Supervisor plugin: nothing periodic (threads do that), a final write at exit."""

    name = "metrics"

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter

    def next_deadline(self):
        return None

    def tick(self, now: float) -> None:
        pass

    def close(self) -> None:
        self.exporter.close()

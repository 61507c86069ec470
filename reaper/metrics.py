"""The Prometheus exporter: /metrics and /healthz on a port, and/or a metrics file.

Two steps, so that nothing slows the path to the child's exec and a bad flag
still fails before the child starts:

- prepare() (before the spawn): binds the listening socket with the socket
  module only and checks that the metrics file can be written. Errors are one
  SetupError line, except a port in use or an address not (yet) on this host:
  one WARN line, and the sampler thread retries the bind with backoff
  (BIND_RETRY_FIRST doubling up to BIND_RETRY_MAX) until it works. A port taken
  by another pod of a hostNetwork node must not stop the container.
- Exporter.start() (after the spawn): imports prometheus_client, serves HTTP on
  the pre-bound socket from one thread (reaper/httpserver.py) and starts a
  sampler thread (per-core CPU every second, visible memory cgroups every
  CGROUP_INTERVAL, the metrics file every --metrics-interval). If it fails (no
  room for a thread), nothing is left started; abort() releases the rest.

The loop never calls into this module: every value is read from Stats (plain
counters the loop updates) or from /proc at scrape time by a custom collector.
Collection is split into sections that fail alone, and a source that cannot be
read (say, an empty /proc) leaves its metrics out and says so in
reaper_source_available: a scrape always answers.
"""
from __future__ import annotations

import errno
import os
import socket
import threading
import time


SAMPLE_INTERVAL = 1.0       # seconds between per-core CPU samples
CGROUP_INTERVAL = 10.0      # seconds between counts of visible memory cgroups (walks a directory tree)
SCAN_MAX_AGE = 0.5          # a /proc scan is reused by scrapes within this many seconds
TOP = 10                    # at most this many zombie parents / strays are labelled
LISTEN_BACKLOG = 1024       # accept() queue: a flood of connects must not drop a scraper's SYN
BIND_RETRY_FIRST = 1.0      # seconds from the start to the first retry of a bind that failed for now
BIND_RETRY_MAX = 30.0       # the retries' interval doubles up to this
# Bind failures that may end by themselves (another pod frees the port, an interface
# comes up): reaper goes on and retries. Any other one is a usage error before the spawn.
BIND_LATER = (errno.EADDRINUSE, errno.EADDRNOTAVAIL)
_DONE = object()            # a sampler piece that returns it is never run again
# A sampler piece that failed starts again after PART_RESTART_FIRST seconds, doubling to
# PART_RESTART_MAX (reaper/policy.py's rule for the pieces of PID 1's loop).
PART_RESTART_FIRST = 1.0
PART_RESTART_MAX = 300.0
# What the collector reads; reaper_source_available says which it could read for a scrape.
SOURCES = ("proc", "proc_stat", "proc_cgroups", "cgroup_pids", "cgroup_tree", "cgroup_stat", "self_memory")


class SetupError(Exception):
    """A bad metrics flag: one line, exit 2, before the child starts."""


# --- before the spawn -------------------------------------------------------------

def prepare(cfg, stats, log, mode: str = "init") -> "Exporter":
    # The metrics file was checked when the options were parsed (reaper.values.check_writable).
    sock = later = None
    if cfg.metrics_port is not None:
        target = _resolve(cfg.metrics_address, cfg.metrics_port)
        try:
            sock = _bind(*target)
        except OSError as e:         # BIND_LATER: the sampler retries (Exporter._retry_bind)
            later = target
            log.warn(f"{_bind_problem(target, e)}: reaper goes on without /metrics and /healthz and retries "
                     f"the bind in the background ({BIND_RETRY_FIRST:g} s, doubling up to {BIND_RETRY_MAX:g} s)")
    return Exporter(cfg, stats, log, sock, mode, later)


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


def _where(family, sockaddr) -> str:
    return f"[{sockaddr[0]}]:{sockaddr[1]}" if family == socket.AF_INET6 else f"{sockaddr[0]}:{sockaddr[1]}"


def _listen(family, sockaddr) -> socket.socket:
    """A listening socket on sockaddr; raises OSError as socket(), bind() and listen() do."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # a restart within TIME_WAIT works
        if family == socket.AF_INET6 and sockaddr[0] == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(sockaddr)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _bind(family, sockaddr) -> socket.socket:
    """_listen(), with its failures sorted: OSError for those that may end by themselves
    (BIND_LATER), SetupError for the others. EACCES (a port below
    net.ipv4.ip_unprivileged_port_start without CAP_NET_BIND_SERVICE) is one of these:
    the kernel checks it before it looks whether the port is free, and a process
    never gains the capability later, so no retry could ever succeed."""
    try:
        return _listen(family, sockaddr)
    except OSError as e:
        if e.errno in BIND_LATER:
            raise
        if e.errno == errno.EACCES:
            raise SetupError(f"--metrics-port: no permission to bind {_where(family, sockaddr)}") from None
        raise SetupError(f"--metrics-address: cannot listen on {_where(family, sockaddr)}: {e.strerror}") from None


def _bind_problem(target, e: OSError) -> str:
    family, sockaddr = target
    if e.errno == errno.EADDRINUSE:
        return f"--metrics-port: {_where(family, sockaddr)} is already in use"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"--metrics-address: {sockaddr[0]} is not an address of this host (yet)"
    return f"--metrics-address: cannot listen on {_where(family, sockaddr)}: {e.strerror}"


def _tmp_name(path: str) -> str:
    # Same directory (rename is atomic only within a filesystem); a name that
    # node_exporter's textfile collector (*.prom) never reads half-written.
    d, base = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{base}.tmp{os.getpid()}")


# --- after the spawn ---------------------------------------------------------------

class Exporter:
    def __init__(self, cfg, stats, log, sock: socket.socket | None, mode: str, later=None) -> None:
        self.cfg = cfg
        self.stats = stats
        self.log = log
        self.sock = sock
        self.mode = mode
        self.later = later              # (family, sockaddr) the sampler binds once it can (BIND_LATER)
        self.listening = False          # the endpoint is bound and served: reaper_metrics_listening
        self._retry_wait = BIND_RETRY_FIRST
        self._retries = 0
        self.cpu = None                 # nodestats.CpuSampler while per-core CPU can be read
        self._cpu_parked = None         # the sampler while its piece is off (its counters kept)
        self.memory_visible: int | None = None     # walked by the sampler: may be a big tree
        self.collector = None
        self.file_registry = None
        self.server = None              # httpserver.Server
        self._stop = threading.Event()
        self._file_lock = threading.Lock()
        self._sampler: threading.Thread | None = None
        self._file_error = ""

    def start(self, scope) -> list:
        """scope: an object with pid, is_pid1, main_pid, supervised (the Supervisor, or watch's).
        Raises (e.g. RuntimeError: no room for a thread) with nothing left running."""
        try:
            self._start(scope)
        except BaseException:
            self.abort()
            raise
        return [_ClosePlugin(self)]

    def _start(self, scope) -> None:
        # After the spawn: not on the path to the child's exec. httpserver now too, so that a
        # bind retried later (Exporter._retry_bind) imports nothing.
        from reaper import httpserver, nodestats  # noqa: F401

        # What a scrape imports, imported now: out of descriptors, a first scrape could not open it.
        import prometheus_client.core  # noqa: F401
        from prometheus_client import CollectorRegistry, ProcessCollector  # noqa: F401

        self.collector = ReaperCollector(self, scope)
        if self.cfg.metrics_file:
            # The file carries reaper_* only: node_exporter has process_* of its own.
            self.file_registry = CollectorRegistry()
            self.file_registry.register(self.collector)
        try:
            if _node_metrics(self.cfg) != "off":       # off: /proc/stat is never read
                self.cpu = nodestats.CpuSampler()
        except OSError as e:      # no /proc: reaper_source_available{source="proc_stat"} says so
            self.log.debug(f"metrics: cannot read /proc/stat ({e.strerror}): no per-core CPU")
        self._sampler = threading.Thread(target=self._sample_loop, name="reaper-metrics-sampler", daemon=True)
        self._sampler.start()
        if self.sock is not None:
            self._serve()
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
            self._serve()

    def retry_bind(self):
        """One bind of a port that was taken: seconds until the next try, or None once
        served (or given up, said once by the caller's guard when it raises)."""
        after = self._retry_bind()
        return None if after is _DONE else after

    def _serve(self) -> None:
        """Serves HTTP on self.sock from the server thread (started once, here)."""
        from prometheus_client import CollectorRegistry, ProcessCollector

        from reaper import httpserver

        registry = CollectorRegistry()
        registry.register(self.collector)
        registry.register(_Guarded(ProcessCollector(registry=None), "process", self.log))
        self.server = httpserver.Server(self.sock, _routes(registry, self.log), self.log)
        # Before the thread starts: its first answer may come before this thread runs again.
        self.listening = True
        try:
            self.server.start()
        except BaseException:
            self.listening = False
            raise

    def _retry_bind(self):
        """The sampler's piece while the port is taken (or the address not up): one bind
        per wake-up, BIND_RETRY_FIRST doubling up to BIND_RETRY_MAX apart; _DONE once
        served, so no wake-up is left for it. Raises (the piece is switched off) on a
        failure no retry can mend, or when the server cannot start."""
        self._retries += 1
        try:
            sock = _listen(*self.later)
        except OSError as e:
            if e.errno not in BIND_LATER:
                raise
            self._retry_wait = min(self._retry_wait * 2, BIND_RETRY_MAX)    # 1 s after the start, 2, 4 ... 30
            self.log.debug(f"metrics: {_bind_problem(self.later, e)}; next try in {self._retry_wait:g} s")
            return self._retry_wait
        self.sock = sock
        try:
            self._serve()
        except BaseException:
            self._release()
            self.server = self.sock = None
            if self._stop.is_set():      # abort() closed the new socket under it: nothing to say
                return _DONE
            raise
        if self._stop.is_set():          # abort() ran meanwhile and may have missed the new server
            self._release()
            return _DONE
        self.log.info(f"metrics: serving on {_where(*self.later)} (bound at try {self._retries + 1})")
        return _DONE

    def _release(self) -> None:
        """Stops the server and closes the port; never raises."""
        self.listening = False
        for step in (lambda: self.server is not None and self.server.stop(),
                     lambda: self.sock is not None and self.sock.close()):
            try:
                step()
            except BaseException:
                pass

    def abort(self) -> None:
        """Releases what start() took, best effort; never raises (the failure boundary
        calls it when start() failed). Clients then get "connection refused", not a hang."""
        # The stop first: a bind the sampler makes after it sees it and releases itself.
        steps = [self._stop.set,                    # the sampler ends at its next wake-up
                 self._release]                     # ends the server thread, closes the port and connections
        for step in steps:
            try:
                step()
            except BaseException:                   # nothing may escape into PID 1's failure path
                pass

    # The sampler thread: per-core CPU, cgroup counts, the metrics file. A piece that
    # raises is logged and switched off, and starts again after a backoff (the metrics
    # port has retries of its own: a failure there is for good); the others go on.
    def _sample_loop(self) -> None:
        now = time.monotonic()
        pieces = []                                 # _Part
        if self.cpu is not None:
            pieces.append(_Part("per-core CPU", self._sample_cpu, SAMPLE_INTERVAL, now + SAMPLE_INTERVAL))
        pieces.append(_Part("memory cgroup count", self._count_memory_cgroups, CGROUP_INTERVAL, now))
        if self.file_registry is not None:
            pieces.append(_Part("metrics file", self.write_file, self.cfg.metrics_interval, now))
        if self.later is not None and self.sock is None:
            pieces.append(_Part("metrics port", self._retry_bind, BIND_RETRY_FIRST, now + BIND_RETRY_FIRST))
        while pieces:
            for part in list(pieces):
                now = time.monotonic()
                if now < part.due:
                    continue
                try:
                    after = part.run()      # None: due again after interval; seconds; or _DONE
                except Exception as e:
                    if part.name == "metrics port":
                        pieces.remove(part)
                        self._switch_off(part.name, e, None)
                    else:
                        self._switch_off(part.name, e, part.failed(now))
                    continue
                if after is _DONE:
                    pieces.remove(part)
                    continue
                part.due = now + (part.interval if after is None else after)
                if part.off:
                    part.off = False
                    self.log.info(f"metrics: {part.name} started again after a failure")
            if not pieces or self._stop.wait(max(0.0, min(p.due for p in pieces) - time.monotonic())):
                return

    def _sample_cpu(self) -> None:
        sampler = self.cpu or self._cpu_parked
        sampler.sample()
        self.cpu = sampler

    def _count_memory_cgroups(self) -> None:
        from reaper import nodestats

        self.memory_visible = nodestats.visible_memory_cgroups()

    def _switch_off(self, name: str, e: Exception, wait) -> None:
        if name == "per-core CPU":
            # Stale ratios would look like live ones; the sampler's counters are kept.
            self._cpu_parked, self.cpu = self.cpu or self._cpu_parked, None
        elif name == "memory cgroup count":
            self.memory_visible = None
        then = "the other metrics go on" if wait is None else f"starting it again in {wait:g} s"
        self.log.warn(f"metrics: {name} failed ({e!r}): switched off, {then}")

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


class _Part:
    """One piece of the sampler thread, with its restart backoff."""

    def __init__(self, name: str, run, interval: float, due: float) -> None:
        self.name, self.run, self.interval, self.due = name, run, interval, due
        self.failures = 0
        self.since = due                # when it last started
        self.off = False

    def failed(self, now: float) -> float:
        """Switches the part off; returns the seconds until it starts again."""
        if now - self.since >= PART_RESTART_MAX:
            self.failures = 0           # it ran well for long: a fresh backoff
        wait = min(PART_RESTART_MAX, PART_RESTART_FIRST * 2 ** self.failures)
        self.failures += 1
        self.due = self.since = now + wait
        self.off = True
        return wait


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


class _Guarded:
    """A collector whose failure leaves its metrics out of the scrape, not fails it."""

    def __init__(self, inner, name: str, log) -> None:
        self.inner, self.name, self.log = inner, name, log
        self.failed = False

    def collect(self):
        try:
            return list(self.inner.collect())
        except Exception as e:
            if not self.failed:
                self.failed = True
                self.log.warn(f"metrics: collecting {self.name} failed ({e!r}): left out while it fails")
            return []


# --- HTTP routes ---------------------------------------------------------------------

def _routes(registry, log):
    """The HTTP server's app: /metrics, /healthz and /; any other path is a 404."""
    import gzip

    from prometheus_client.exposition import choose_encoder, gzip_accepted

    from reaper.httpserver import Response, text

    def app(request):
        if request.path == "/metrics":
            # The scraper's Accept picks the format (Prometheus asks for OpenMetrics).
            encoder, content_type = choose_encoder(request.headers.get("Accept") or "")
            try:
                body = encoder(registry)
            except Exception as e:   # never a traceback on PID 1's stderr per scrape
                log.debug(f"metrics: scrape failed: {e!r}")
                return text(500, "collection failed\n")
            headers = [("Content-Type", content_type)]
            if gzip_accepted(request.headers.get("Accept-Encoding") or ""):
                body = gzip.compress(body)
                headers.append(("Content-Encoding", "gzip"))
            return Response(200, headers, body)
        if request.path == "/healthz":
            return text(200, "ok\n")
        if request.path == "/":
            return text(200, "reaper: metrics at /metrics, health at /healthz\n")
        return text(404, "not found\n")
    return app


# --- what is exported --------------------------------------------------------------

def _node_metrics(cfg) -> str:
    """--node-metrics: summary (the default), per-core or off."""
    return getattr(cfg, "node_metrics", "summary")


def _copy(counter) -> dict:
    # dict(d) is one C call under the GIL: safe while the loop adds keys.
    return dict(counter) if counter else {}


class ReaperCollector:
    """Reads Stats, /proc and the sampler's results at scrape time, section by
    section: a section that raises is left out (and logged once), the rest is served."""

    def __init__(self, exporter: Exporter, scope) -> None:
        self.x = exporter
        self.scope = scope
        self._lock = threading.Lock()
        self._cache: dict = {}          # source -> (when read, value)
        self._failed: set = set()       # sections already logged as failing

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        s, available = self.x.stats, {}
        for section in (self._identity, self._main_child, self._services, self._reaping, self._signals, self._drain,
                        self._errors, self._scope_metrics, self._budget, self._self_usage, self._node_cpu,
                        self._node_cgroups, self._cgroup_pids, self._leftovers):
            yield from self._run(section, s, available)
        g = GaugeMetricFamily("reaper_source_available",
                              "1 if reaper could read the source for this scrape; the metrics of a source "
                              "it could not read are left out", labels=["source"])
        for source in SOURCES:
            if source == "proc_stat" and _node_metrics(self.x.cfg) == "off":
                continue                   # not read by choice (--node-metrics off), not unreadable
            g.add_metric([source], 1 if available.get(source) else 0)
        yield g

    def _run(self, section, s, available: dict) -> list:
        try:
            return list(section(s, available))
        except Exception as e:
            name = section.__name__.strip("_")
            if name not in self._failed:
                self._failed.add(name)
                self.x.log.warn(f"metrics: collecting {name} failed ({e!r}): left out while it fails")
            return []

    def _fresh(self, source: str, read):
        """read()'s value, reused by the scrapes within SCAN_MAX_AGE (one read at a time)."""
        with self._lock:
            now = time.monotonic()
            hit = self._cache.get(source)
            if hit is None or now - hit[0] > SCAN_MAX_AGE:
                hit = self._cache[source] = (now, read())
            return hit[1]

    def invalidate(self) -> None:
        self._cache = {}

    # --- sections: each yields families, and marks the sources it could read ---

    def _identity(self, s, available):
        from prometheus_client.core import GaugeMetricFamily as G

        from reaper import __version__

        g = G("reaper_build_info", "reaper's version and mode (init: PID 1 or subreaper; watch: sidecar)",
              labels=["version", "mode"])
        g.add_metric([__version__, self.x.mode], 1)
        yield g
        yield G("reaper_start_time_seconds", "When reaper started, seconds since the epoch", value=s.start_time)
        yield G("reaper_pid", "reaper's pid in its own PID namespace", value=os.getpid())
        try:
            ns = os.stat("/proc/self/ns/pid").st_ino
        except OSError:
            ns = None
        if ns is not None:
            yield G("reaper_pid_namespace", "The inode of reaper's PID namespace (/proc/self/ns/pid): "
                                            "who shares it sees reaper_pid as reaper", value=ns)
        if self.x.cfg.metrics_port is not None:     # 0 only ever in the metrics file: a scrape needs the port
            yield G("reaper_metrics_listening", "1 once the metrics endpoint is bound and served; 0 while "
                                                "its port is taken (or its address absent) and the bind is "
                                                "retried", value=1 if self.x.listening else 0)

    def _main_child(self, s, available):
        from prometheus_client.core import GaugeMetricFamily as G

        if self.x.mode != "init":
            return
        g = G("reaper_main_child_state", "State of the main child: 1 for the current one", labels=["state"])
        for state in ("starting", "running", "exited", "exec_failed"):
            g.add_metric([state], 1 if s.main_state == state else 0)
        yield g
        yield G("reaper_main_child_up", "1 while the main child runs", value=1 if s.main_state == "running" else 0)
        yield G("reaper_stop_requested", "1 once reaper was asked to stop (SIGTERM, SIGINT, SIGQUIT from "
                                         "outside) before the main child ended", value=1 if s.stop_requested else 0)
        if s.main_status is not None:
            from reaper.stats import outcome

            yield G("reaper_main_child_exit_code", "The main child's exit code (128+N: killed by signal N)",
                    value=s.main_exit_code)
            g = G("reaper_main_child_outcome", "How the main child ended (exited_0, exited_nonzero or the "
                                                "signal name)", labels=["outcome"])
            g.add_metric([outcome(s.main_status)], 1)
            yield g
        g = G("reaper_phase", "reaper's phase: 1 for the current one", labels=["phase"])
        for phase in ("running", "draining", "killing", "done"):
            g.add_metric([phase], 1 if s.phase == phase else 0)
        yield g

    def _services(self, s, available):
        """Supervised services (reaper/services/): only when there are some."""
        from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

        services = list(s.services)
        if not services:
            return
        from reaper.services.runner import STATES

        up = G("reaper_service_up", "1 while the service's process runs", labels=["service"])
        ready = G("reaper_service_ready", "1 once the service said it is ready (its current run; "
                                          "only --service-ready services say so)", labels=["service"])
        starts = C("reaper_service_starts", "Times the service was started (failed starts included)",
                   labels=["service"])
        failed = G("reaper_service_failed", "1 once the service was given up (the restart limit, or a "
                                            "failure under --restart never)", labels=["service"])
        state = G("reaper_service_state", "The service's state: 1 for the current one", labels=["service", "state"])
        code = G("reaper_service_last_exit_code", "The exit code of the service's last run (128+N: killed "
                                                  "by signal N); absent before its first exit", labels=["service"])
        since = G("reaper_service_start_time_seconds", "When the service's current or last run started, "
                                                       "seconds since the epoch", labels=["service"])
        floods = C("reaper_service_ready_floods", "Runs of the service whose readiness fd reaper gave up "
                                                  "on: too much written without a newline", labels=["service"])
        for svc in services:
            up.add_metric([svc.name], 1 if svc.pid is not None else 0)
            ready.add_metric([svc.name], 1 if svc.ready else 0)
            starts.add_metric([svc.name], svc.starts)
            failed.add_metric([svc.name], 1 if svc.failed else 0)
            for st in STATES:
                state.add_metric([svc.name, st], 1 if svc.state == st else 0)
            if svc.last_exit_code is not None:
                code.add_metric([svc.name], svc.last_exit_code)
            if svc.started_at is not None:
                since.add_metric([svc.name], svc.started_at)
            floods.add_metric([svc.name], svc.ready_floods)
        yield from (up, ready, starts, failed, state, code, since, floods)

    def _leftovers(self, s, available):
        """What ended Ray workers and services left running (reaper/leftovers/publish.py)."""
        from reaper.leftovers.publish import families

        yield from families(getattr(s, "leftovers", None))

    def _reaping(self, s, available):
        from prometheus_client.core import CounterMetricFamily as C, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        from reaper.stats import REAP_LATENCY_BUCKETS

        c = C("reaper_reaped", "Children reaped, by kind (main, orphan, supervised) and outcome "
                               "(exited_0, exited_nonzero or the signal name)", labels=["kind", "outcome"])
        for (kind, outcome), n in sorted(_copy(s.reaped).items()):
            c.add_metric([kind, outcome], n)
        yield c
        yield C("reaper_reaped_cpu_seconds", "User plus system CPU of every child reaped",
                value=s.reaped_cpu_seconds)
        buckets, acc = [], 0
        counts = list(s.latency_buckets)
        for bound, n in zip(REAP_LATENCY_BUCKETS, counts):
            acc += n
            buckets.append((floatToGoString(bound), acc))
        buckets.append(("+Inf", acc + counts[-1]))
        h = HistogramMetricFamily("reaper_reap_latency_seconds",
                                  "Time from the wake-up that found an exited child to its reap")
        h.add_metric([], buckets, s.latency_sum)
        yield h

    def _signals(self, s, available):
        from prometheus_client.core import CounterMetricFamily as C

        for name, doc, counter in (
                ("reaper_signals_received", "Signals reaper received, by name", s.signals_received),
                ("reaper_signals_forwarded", "Signals reaper forwarded to the main child, by name as sent",
                 s.signals_forwarded)):
            c = C(name, doc, labels=["signal"])
            for sig, n in sorted(_copy(counter).items()):
                c.add_metric([sig], n)
            yield c

    def _drain(self, s, available):
        from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

        c = C("reaper_drain_processes", "Processes left when the main child ended, by how they ended "
                                        "(terminated by SIGTERM, killed by SIGKILL, survived SIGKILL, "
                                        "not_permitted: reaper may not signal it)",
              labels=["result"])
        drain = _copy(s.drain)
        for result in ("terminated", "killed", "survived", "not_permitted"):
            c.add_metric([result], drain.get(result, 0))
        yield c
        if s.drain_seconds is not None:
            yield G("reaper_drain_duration_seconds", "How long the drain took", value=s.drain_seconds)

    def _errors(self, s, available):
        from prometheus_client.core import CounterMetricFamily as C

        yield C("reaper_policy_errors", "Errors caught in policy code (reaper went on)", value=s.policy_errors)
        restarts = C("reaper_policy_restarts", "Pieces started again after a failure switched them off",
                     labels=["piece"])
        for piece, n in sorted(s.policy_restarts.items()):
            restarts.add_metric([piece], n)
        yield restarts
        yield C("reaper_log_lines_dropped", "Log lines stderr could not take at once (dropped: reaper "
                                            "never waits on stderr)", value=getattr(self.x.log, "dropped", 0))

    # --- /proc: zombies and processes in scope ---

    def _scope_metrics(self, s, available):
        from prometheus_client.core import GaugeMetricFamily as G

        v = self._fresh("proc", self._read_scope)
        available["proc"] = v is not None
        if v is None:
            return
        yield G("reaper_zombies", "Zombie processes in reaper's scope now (PID 1 or watch: the whole PID "
                                  "namespace; else reaper's descendants)", value=v["zombies"])
        if v["oldest"] is not None:
            yield G("reaper_zombie_oldest_age_seconds", "Age (since process start) of the oldest zombie in "
                                                        "scope; 0 when there is none", value=v["oldest"])
        g = G("reaper_zombies_by_parent", f"Zombies in scope by parent process (the {TOP} parents with most)",
              labels=["parent_pid", "parent_name"])
        for pid, name, n in v["parents"]:
            g.add_metric([str(pid), name], n)
        yield g
        g = G("reaper_processes", "Live processes in scope by class (main_tree: the main child and its "
                                  "descendants; stray: the budget enforcer's strays when budgets are on, "
                                  "else the live processes outside the main tree; all: every live process "
                                  "but reaper)", labels=["class"])
        if self.x.mode == "init":
            g.add_metric(["main_tree"], v["main_tree"])
            g.add_metric(["stray"], getattr(s.budget, "strays", 0) if self._budgets() else v["outside"])
        elif self._budgets():
            g.add_metric(["stray"], getattr(s.budget, "strays", 0))
        g.add_metric(["all"], v["live"])
        yield g

    def _read_scope(self) -> "dict | None":
        """The process table's view of reaper's scope; None when /proc cannot be read
        (an empty directory bound over it lists nothing, not even reaper)."""
        from reaper import nodestats
        from reaper.procfs import processes

        s, sc = self.x.stats, self.scope
        table = processes.scan()
        me = os.getpid()
        if me not in table:
            return None
        try:
            up = nodestats.uptime()
        except (OSError, ValueError, IndexError):
            up = None                      # no ages, the counts still hold
        whole = getattr(sc, "watch", False) or getattr(sc, "is_pid1", False)
        in_scope = (set(table) - {me}) if whole else processes.descendants(table, me)
        zombies = [table[p] for p in in_scope if table[p].state == "Z"]
        live = [p for p in in_scope if table[p].state != "Z"]
        main = s.main_pid if s.main_state == "running" else None
        main_tree = set()
        if main is not None and main in table:
            main_tree = {main} | processes.descendants(table, main)
        kept = set(main_tree)
        for pid in list(getattr(sc, "supervised", ())):      # services are not strays
            if pid in table:
                kept |= {pid} | processes.descendants(table, pid)
        parents: dict = {}
        for z in zombies:
            parents[z.ppid] = parents.get(z.ppid, 0) + 1
        top = sorted(parents.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]
        return {
            "zombies": len(zombies),
            "oldest": None if up is None else max((up - z.started for z in zombies), default=0.0),
            "parents": [(pid, table[pid].comm if pid in table else "", n) for pid, n in top],
            "live": len(live),
            "main_tree": len([p for p in live if p in main_tree]),
            "outside": len([p for p in live if p not in kept]),
        }

    def _budgets(self) -> bool:
        return bool(getattr(self.x.cfg, "budgets_enabled", False))

    def _budget(self, s, available):
        from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

        from reaper.budgets.kinds import ANY, REASONS    # the budget kinds' registry: names only

        b = s.budget
        yield C("reaper_stray_cpu_seconds", "CPU used by stray processes while reaper watched them",
                value=getattr(b, "stray_cpu_seconds", 0.0))
        for name, doc, attr in (
                ("reaper_budget_violations", "Budget violations, by the configured action and the budget "
                                             f"(reason: {', '.join(REASONS)})", "violations_by_reason"),
                ("reaper_budget_actions", "Actions taken on strays, by action and by what they were for "
                                          f"(reason: {', '.join(REASONS + (ANY,))})", "actions_by_reason")):
            c = C(name, doc, labels=["action", "reason"])
            for (action, reason), n in sorted(_copy(getattr(b, attr, None)).items()):
                c.add_metric([str(action), str(reason)], n)
            yield c
        if not self._budgets():
            return
        yield C("reaper_budget_samples", "Samples the budget enforcer has taken",
                value=getattr(b, "samples", 0))
        yield C("reaper_stray_cgroup_escapes", "Strays found outside the cgroup reaper holds them in, "
                                               "moved back", value=getattr(b, "stray_cgroup_escapes", 0))
        yield C("reaper_budget_stale_cgroups_removed", "Stray cgroups left by reapers that are gone, removed "
                                                       "at start", value=getattr(b, "stale_cgroups_removed", 0))
        g = G("reaper_strays_over_budget", "Strays over their budget at the last sample, by budget (cpu, "
                                           "memory; age: past --stray-max-age and still alive)",
              labels=["reason"])
        over = dict(getattr(b, "over_budget", None) or {})
        for reason in REASONS:
            g.add_metric([reason], over.get(reason, 0))
        yield g
        g = G("reaper_budget_cgroups", "Cgroups reaper holds for strays (live), and those removed below its own "
                                       "that the kernel still holds (dying; cgroup v2 only)", labels=["state"])
        for state, n in sorted(dict(getattr(b, "cgroups", None) or {"live": 0}).items()):
            g.add_metric([state], n)
        yield g
        g = G("reaper_budget_info", "Budgets are on; mechanism: how CPU throttling is done; memory_mechanism: "
                                    "how memory budgets are held", labels=["mechanism", "memory_mechanism"])
        g.add_metric([getattr(b, "mechanism", "") or "none", getattr(b, "memory_mechanism", "") or "none"], 1)
        yield g
        from reaper.stats import TOP_STRAYS

        strays = list(getattr(b, "stray_list", None) or [])
        for metric, doc, field in (
                ("reaper_stray_cpu_cores", f"CPU cores used by the {TOP_STRAYS} busiest strays (comm, never the "
                                           "command line)", "cpu_cores"),
                ("reaper_stray_memory_bytes", f"Private memory (what a stray alone holds: shared pages left out) "
                                              f"of the {TOP_STRAYS} strays holding most (comm, never the command line)",
                 "memory_bytes")):
            g = G(metric, doc, labels=["pid", "name", "action", "reason"])
            for d in sorted(strays, key=lambda d: -float(d.get(field, 0) or 0))[:TOP_STRAYS]:
                g.add_metric([str(d.get("pid", "")), str(d.get("name", ""))[:32],
                              str(d.get("action", "") or "none"), str(d.get("reason", "") or "orphan")],
                             float(d.get(field, 0) or 0))
            yield g

    def _self_usage(self, s, available):
        from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

        from reaper import nodestats

        t = os.times()
        c = C("reaper_cpu_seconds", "reaper's own CPU time", labels=["mode"])
        c.add_metric(["user"], t.user)
        c.add_metric(["system"], t.system)
        yield c
        rss = nodestats.own_rss()
        available["self_memory"] = rss is not None
        if rss is not None:
            yield G("reaper_resident_memory_bytes", "reaper's own resident memory", value=rss)

    # --- node signals (from the sampler thread) ---

    def _node_cpu(self, s, available):
        """Node CPU from the sampler. summary (the default): a fixed number of series
        whatever the cores; per-core: also 7 series per core; off: nothing (no sampler)."""
        from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

        from reaper import nodestats

        mode = _node_metrics(self.x.cfg)
        if mode == "off":
            return
        cpu = self.x.cpu                   # None once the sampler switched it off
        available["proc_stat"] = cpu is not None and cpu.available
        if not available["proc_stat"] or not cpu.ratios:
            return
        ratios = dict(cpu.ratios)          # one sample: the sampler replaces the dict whole
        sat = f"{nodestats.SATURATED:.0%}"
        g = G("reaper_node_cpu_busiest_ratio", "The highest per-core ratio over the last second, by mode "
                                               "(busy: all non-idle time)", labels=["mode"])
        for m in ("busy",) + nodestats.CPU_MODES:
            g.add_metric([m], max(r[m] for r in ratios.values()))
        yield g
        yield G("reaper_node_cpus", "Cores sampled from the host-wide /proc/stat", value=len(ratios))
        yield G("reaper_node_cpu_saturated_cores", f"Cores at >= {sat} busy over the last second",
                value=sum(1 for r in ratios.values() if r["busy"] >= nodestats.SATURATED))
        yield C("reaper_node_cpu_any_saturated_seconds", f"Seconds in which at least one core was at >= {sat} "
                                                         "busy", value=cpu.any_saturated)
        yield C("reaper_node_cpu_busiest_saturated_seconds", f"Seconds at >= {sat} busy of the core that has "
                                                             "most of them", value=cpu.busiest_saturated())
        if mode != "per-core":
            return
        g = G("reaper_node_cpu_mode_ratio", "Share of each core's time in a mode over the last second "
                                            "(host-wide /proc/stat)", labels=["cpu", "mode"])
        busy = G("reaper_node_cpu_busy_ratio", "Share of each core's time not idle (nor iowait) over the "
                                               "last second", labels=["cpu"])
        for n in sorted(ratios):
            for m in nodestats.CPU_MODES:
                g.add_metric([str(n), m], ratios[n][m])
            busy.add_metric([str(n)], ratios[n]["busy"])
        yield g
        yield busy
        c = C("reaper_node_cpu_saturated_seconds", f"Seconds each core spent at >= {sat} busy", labels=["cpu"])
        for n, secs in sorted(dict(cpu.saturated).items()):
            c.add_metric([str(n)], secs)
        yield c

    def _node_cgroups(self, s, available):
        from prometheus_client.core import GaugeMetricFamily as G

        from reaper import nodestats

        cgroups = self._fresh("proc_cgroups", nodestats.proc_cgroups)
        available["proc_cgroups"] = cgroups is not None
        if cgroups is not None:
            g = G("reaper_node_cgroups", "Cgroups per controller as /proc/cgroups counts them (host-wide, "
                                         "dying ones included; recent kernels list v1 controllers only)",
                  labels=["controller"])
            for ctrl, n in sorted(cgroups.items()):
                g.add_metric([ctrl], n)
            yield g
        yield G("reaper_node_memory_cgroups_available", "1 if /proc/cgroups lists the memory controller",
                value=1 if cgroups and "memory" in cgroups else 0)
        st = self._fresh("cgroup_stat", nodestats.cgroup_stat)
        available["cgroup_stat"] = st is not None
        if st is not None:
            g = G("reaper_cgroup_v2_descendants", "Cgroups below the highest cgroup v2 directory visible "
                                                   "(its cgroup.stat): live ones, and dying ones (removed, "
                                                   "still held by charged memory)", labels=["state"])
            g.add_metric(["live"], st.live)
            g.add_metric(["dying"], st.dying)
            yield g
            g = G("reaper_cgroup_v2_controller_cgroups", "The same by controller (cgroup.stat's nr_subsys_* "
                                                          "and nr_dying_subsys_*, newer kernels)",
                  labels=["controller", "state"])
            for ctrl in sorted(set(st.subsys) | set(st.dying_subsys)):
                if ctrl in st.subsys:
                    g.add_metric([ctrl, "live"], st.subsys[ctrl])
                if ctrl in st.dying_subsys:
                    g.add_metric([ctrl, "dying"], st.dying_subsys[ctrl])
            yield g
        visible = self.x.memory_visible
        available["cgroup_tree"] = visible is not None
        if visible is not None:
            yield G("reaper_visible_memory_cgroups", "Memory cgroup directories visible to reaper (live ones; "
                                                     "only its own subtree in a private cgroup namespace)",
                    value=visible)

    def _cgroup_pids(self, s, available):
        from prometheus_client.core import GaugeMetricFamily as G

        from reaper import nodestats

        pids = self._fresh("cgroup_pids", nodestats.cgroup_pids)
        available["cgroup_pids"] = pids is not None
        yield G("reaper_cgroup_pids_available", "1 if the pids controller of reaper's cgroup is readable",
                value=0 if pids is None else 1)
        if pids is not None:
            yield G("reaper_cgroup_pids", "Tasks in reaper's cgroup (pids.current)", value=pids.current)
            yield G("reaper_cgroup_pids_max", "Tightest pids.max from reaper's cgroup up (+Inf: no limit)",
                    value=pids.max)

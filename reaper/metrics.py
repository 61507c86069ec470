"""The Prometheus exporter: /metrics and /healthz on a port, and/or a metrics file.

Two steps, so that nothing slows the path to the child's exec and a bad flag
still fails before the child starts:

- prepare() (before the spawn): binds the listening socket with the socket
  module only and checks that the metrics file can be written. Errors are one
  SetupError line.
- Exporter.start() (after the spawn): imports prometheus_client, serves HTTP on
  the pre-bound socket from a daemon thread and starts a sampler thread (per-core
  CPU every second, visible memory cgroups every CGROUP_INTERVAL, the metrics
  file every --metrics-interval).

The loop never calls into this module: every value is read from Stats (plain
counters the loop updates) or from /proc at scrape time by a custom collector.
Requests are handled by at most MAX_CONNECTIONS threads, each with a total
deadline, so a slow or abusive client costs a thread, never the loop.
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
MAX_CONNECTIONS = 8         # requests served at once; more get 503 at once
REQUEST_DEADLINE = 5.0      # seconds a client has to send its request head and read the answer
MAX_HEAD = 16384            # bytes of request line + headers
TOP = 10                    # at most this many zombie parents / strays are labelled


class SetupError(Exception):
    """A bad metrics flag: one line, exit 2, before the child starts."""


# --- before the spawn -------------------------------------------------------------

def prepare(cfg, stats, log, mode: str = "init") -> "Exporter":
    sock = _bind(cfg.metrics_address, cfg.metrics_port) if cfg.metrics_port is not None else None
    if cfg.metrics_file:
        try:
            _check_writable(cfg.metrics_file)
        except SetupError:
            if sock is not None:
                sock.close()
            raise
    return Exporter(cfg, stats, log, sock, mode)


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


def _bind(address: str, port: int) -> socket.socket:
    family, sockaddr = _resolve(address, port)
    where = f"[{sockaddr[0]}]:{port}" if family == socket.AF_INET6 else f"{sockaddr[0]}:{port}"
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # a restart within TIME_WAIT works
        if family == socket.AF_INET6 and sockaddr[0] == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(sockaddr)
        sock.listen(64)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise SetupError(f"--metrics-port: {where} is already in use") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise SetupError(f"--metrics-address: {sockaddr[0]} is not an address of this host") from None
        if e.errno == errno.EACCES:
            raise SetupError(f"--metrics-port: no permission to bind {where}") from None
        raise SetupError(f"--metrics-address: cannot listen on {where}: {e.strerror}") from None
    return sock


def _check_writable(path: str) -> None:
    if os.path.isdir(path):
        raise SetupError(f"--metrics-file: {path} is a directory")
    tmp = _tmp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as e:
        raise SetupError(f"--metrics-file: cannot write in {os.path.dirname(os.path.abspath(path))}: "
                         f"{e.strerror}") from None
    os.close(fd)
    os.unlink(tmp)


def _tmp_name(path: str) -> str:
    # Same directory (rename is atomic only within a filesystem); a name that
    # node_exporter's textfile collector (*.prom) never reads half-written.
    d, base = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{base}.tmp{os.getpid()}")


# --- after the spawn ---------------------------------------------------------------

class Exporter:
    def __init__(self, cfg, stats, log, sock: socket.socket | None, mode: str) -> None:
        self.cfg = cfg
        self.stats = stats
        self.log = log
        self.sock = sock
        self.mode = mode
        self.cpu = None                 # nodestats.CpuSampler, once started
        self.memory_visible: int | None = None     # walked by the sampler: may be a big tree
        self.collector = None
        self.file_registry = None
        self._stop = threading.Event()
        self._file_lock = threading.Lock()
        self._sampler: threading.Thread | None = None
        self.server = None
        self._file_error = ""

    def start(self, scope) -> list:
        """scope: an object with pid, is_pid1, main_pid, supervised (the Supervisor, or watch's)."""
        from reaper import nodestats    # after the spawn: not on the path to the child's exec

        from prometheus_client import CollectorRegistry, ProcessCollector

        self.collector = ReaperCollector(self, scope)
        if self.cfg.metrics_file:
            # The file carries reaper_* only: node_exporter has process_* of its own.
            self.file_registry = CollectorRegistry()
            self.file_registry.register(self.collector)
        try:
            self.cpu = nodestats.CpuSampler()
        except OSError as e:
            self.log.warn(f"metrics: cannot read /proc/stat ({e.strerror}): no per-core CPU")
        self._sampler = threading.Thread(target=self._sample_loop, name="reaper-metrics-sampler", daemon=True)
        self._sampler.start()
        if self.sock is not None:
            registry = CollectorRegistry()
            registry.register(self.collector)
            ProcessCollector(registry=registry)
            self.server = _serve(self.sock, registry, self.log)
            self.log.debug(f"metrics: serving on {self.sock.getsockname()[:2]}")
        return [_ClosePlugin(self)]

    # The sampler thread: per-core CPU, cgroup counts, the metrics file.
    def _sample_loop(self) -> None:
        from reaper import nodestats

        next_cpu = time.monotonic() + SAMPLE_INTERVAL if self.cpu is not None else float("inf")
        next_cgroups = next_file = 0.0
        interval = self.cfg.metrics_interval
        while True:
            now = time.monotonic()
            try:
                if self.cpu is not None and now >= next_cpu:
                    self.cpu.sample()
                    next_cpu = now + SAMPLE_INTERVAL
                if now >= next_cgroups:
                    self.memory_visible = nodestats.visible_memory_cgroups()
                    next_cgroups = now + CGROUP_INTERVAL
                if self.file_registry is not None and now >= next_file:
                    self.write_file()
                    next_file = now + interval
            except Exception as e:   # a thread must not die silently; reaper goes on
                self.log.error(f"metrics sampler: {e!r}")
            due = [next_cpu, next_cgroups] + ([next_file] if self.file_registry is not None else [])
            if self._stop.wait(max(0.0, min(due) - time.monotonic())):
                return

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


# --- what is exported --------------------------------------------------------------

def _copy(counter) -> dict:
    # dict(d) is one C call under the GIL: safe while the loop adds keys.
    return dict(counter) if counter else {}


class ReaperCollector:
    """Reads Stats, /proc and the sampler's results at scrape time."""

    def __init__(self, exporter: Exporter, scope) -> None:
        self.x = exporter
        self.scope = scope
        self._scan_lock = threading.Lock()
        self._scan = None
        self._scan_at = -1.0

    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)
        from prometheus_client.utils import floatToGoString

        from reaper import __version__
        from reaper.stats import REAP_LATENCY_BUCKETS

        s, x = self.x.stats, self.x
        G, C = GaugeMetricFamily, CounterMetricFamily

        g = G("reaper_build_info", "reaper's version and mode (init: PID 1 or subreaper; watch: sidecar)",
              labels=["version", "mode"])
        g.add_metric([__version__, x.mode], 1)
        yield g
        yield G("reaper_start_time_seconds", "When reaper started, seconds since the epoch", value=s.start_time)
        yield G("reaper_pid", "reaper's pid in its own PID namespace", value=os.getpid())

        if x.mode == "init":
            yield from self._main_child(s)
            g = G("reaper_phase", "reaper's phase: 1 for the current one", labels=["phase"])
            for phase in ("running", "draining", "killing", "done"):
                g.add_metric([phase], 1 if s.phase == phase else 0)
            yield g

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

        for name, doc, counter in (
                ("reaper_signals_received", "Signals reaper received, by name", s.signals_received),
                ("reaper_signals_forwarded", "Signals reaper forwarded to the main child, by name as sent",
                 s.signals_forwarded)):
            c = C(name, doc, labels=["signal"])
            for sig, n in sorted(_copy(counter).items()):
                c.add_metric([sig], n)
            yield c

        c = C("reaper_drain_processes", "Processes left when the main child ended, by how they ended "
                                        "(terminated by SIGTERM, killed by SIGKILL, survived the grace)",
              labels=["result"])
        drain = _copy(s.drain)
        for result in ("terminated", "killed", "survived"):
            c.add_metric([result], drain.get(result, 0))
        yield c
        if s.drain_seconds is not None:
            yield G("reaper_drain_duration_seconds", "How long the drain took", value=s.drain_seconds)
        yield C("reaper_policy_errors", "Errors caught in policy code (reaper went on)", value=s.policy_errors)

        yield from self._scope_metrics(s)
        yield from self._budget(s)
        yield from self._self_usage()
        yield from self._node()

    def _main_child(self, s):
        from prometheus_client.core import GaugeMetricFamily as G

        g = G("reaper_main_child_state", "State of the main child: 1 for the current one", labels=["state"])
        for state in ("starting", "running", "exited", "exec_failed"):
            g.add_metric([state], 1 if s.main_state == state else 0)
        yield g
        yield G("reaper_main_child_up", "1 while the main child runs", value=1 if s.main_state == "running" else 0)
        if s.main_status is not None:
            from reaper.stats import outcome

            yield G("reaper_main_child_exit_code", "The main child's exit code (128+N: killed by signal N)",
                    value=s.main_exit_code)
            g = G("reaper_main_child_outcome", "How the main child ended (exited_0, exited_nonzero or the "
                                                "signal name)", labels=["outcome"])
            g.add_metric([outcome(s.main_status)], 1)
            yield g

    # --- /proc: zombies and processes in scope ---

    def invalidate(self) -> None:
        self._scan = None

    def scope_view(self) -> dict:
        with self._scan_lock:     # one scan at a time, reused for SCAN_MAX_AGE
            now = time.monotonic()
            if self._scan is None or now - self._scan_at > SCAN_MAX_AGE:
                self._scan = self._compute_scope()
                self._scan_at = now
            return self._scan

    def _compute_scope(self) -> dict:
        from reaper import nodestats

        s, sc = self.x.stats, self.scope
        table = nodestats.scan()
        up = nodestats.uptime()
        me = os.getpid()
        whole = getattr(sc, "watch", False) or getattr(sc, "is_pid1", False)
        in_scope = (set(table) - {me}) if whole else nodestats.descendants(table, me)
        zombies = [table[p] for p in in_scope if table[p].state == "Z"]
        live = [p for p in in_scope if table[p].state != "Z"]
        main = s.main_pid if s.main_state == "running" else None
        main_tree = set()
        if main is not None and main in table:
            main_tree = {main} | nodestats.descendants(table, main)
        parents: dict = {}
        for z in zombies:
            parents[z.ppid] = parents.get(z.ppid, 0) + 1
        top = sorted(parents.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]
        return {
            "zombies": len(zombies),
            "oldest": max((up - z.start for z in zombies), default=0.0),
            "parents": [(pid, table[pid].name if pid in table else "", n) for pid, n in top],
            "live": len(live),
            "main_tree": len([p for p in live if p in main_tree]),
            "outside": len([p for p in live if p not in main_tree]),
            "cgroups": nodestats.proc_cgroups(),
            "pids": nodestats.cgroup_pids(),
        }

    def _scope_metrics(self, s):
        from prometheus_client.core import GaugeMetricFamily as G

        v = self.scope_view()
        yield G("reaper_zombies", "Zombie processes in reaper's scope now (PID 1 or watch: the whole PID "
                                  "namespace; else reaper's descendants)", value=v["zombies"])
        yield G("reaper_zombie_oldest_age_seconds", "Age (since process start) of the oldest zombie in scope; "
                                                    "0 when there is none", value=v["oldest"])
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

    def _budgets(self) -> bool:
        return bool(getattr(self.x.cfg, "budgets_enabled", False))

    def _budget(self, s):
        from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

        b = s.budget
        yield C("reaper_stray_cpu_seconds", "CPU used by stray processes while reaper watched them",
                value=getattr(b, "stray_cpu_seconds", 0.0))
        for name, doc, attr in (
                ("reaper_budget_violations", "CPU budget violations, by the configured action", "violations"),
                ("reaper_budget_actions", "Actions taken on strays over budget, by action", "actions")):
            c = C(name, doc, labels=["action"])
            for action, n in sorted(_copy(getattr(b, attr, None)).items()):
                c.add_metric([str(action)], n)
            yield c
        if not self._budgets():
            return
        yield C("reaper_budget_samples", "CPU samples the budget enforcer has taken",
                value=getattr(b, "samples", 0))
        g = G("reaper_budget_info", "CPU budgets are on; mechanism: how throttling is done", labels=["mechanism"])
        g.add_metric([getattr(b, "mechanism", "") or "none"], 1)
        yield g
        strays = list(getattr(b, "stray_list", None) or [])
        strays.sort(key=lambda d: -float(d.get("cpu_cores", 0) or 0))
        g = G("reaper_stray_cpu_cores", f"CPU cores used by the {TOP} busiest strays (comm, never the command line)",
              labels=["pid", "name", "action"])
        for d in strays[:TOP]:
            g.add_metric([str(d.get("pid", "")), str(d.get("name", ""))[:32], str(d.get("action", "") or "none")],
                         float(d.get("cpu_cores", 0) or 0))
        yield g

    @staticmethod
    def _self_usage():
        from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

        t = os.times()
        c = C("reaper_cpu_seconds", "reaper's own CPU time", labels=["mode"])
        c.add_metric(["user"], t.user)
        c.add_metric(["system"], t.system)
        yield c
        try:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            yield G("reaper_resident_memory_bytes", "reaper's own resident memory", value=rss)
        except (OSError, IndexError, ValueError):
            pass

    # --- node signals (from the sampler thread) ---

    def _node(self):
        from reaper import nodestats

        from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

        cpu = self.x.cpu
        if cpu is not None and cpu.ratios:
            ratios = dict(cpu.ratios)
            g = G("reaper_node_cpu_mode_ratio", "Share of each core's time in a mode over the last second "
                                                "(host-wide /proc/stat)", labels=["cpu", "mode"])
            busy = G("reaper_node_cpu_busy_ratio", "Share of each core's time not idle (nor iowait) over the "
                                                   "last second", labels=["cpu"])
            for n in sorted(ratios):
                for mode in nodestats.CPU_MODES:
                    g.add_metric([str(n), mode], ratios[n][mode])
                busy.add_metric([str(n)], ratios[n]["busy"])
            yield g
            yield busy
            g = G("reaper_node_cpu_busiest_ratio", "The highest per-core ratio over the last second, by mode "
                                                   "(busy: all non-idle time)", labels=["mode"])
            for mode in ("busy",) + nodestats.CPU_MODES:
                g.add_metric([mode], max(r[mode] for r in ratios.values()))
            yield g
            c = C("reaper_node_cpu_saturated_seconds", f"Seconds each core spent at >= "
                                                       f"{nodestats.SATURATED:.0%} busy", labels=["cpu"])
            for n, secs in sorted(dict(cpu.saturated).items()):
                c.add_metric([str(n)], secs)
            yield c
        v = self.scope_view()
        cgroups, pids = v["cgroups"], v["pids"]
        g = G("reaper_node_cgroups", "Cgroups per controller as /proc/cgroups counts them (host-wide, "
                                     "dying ones included; recent kernels list v1 controllers only)",
              labels=["controller"])
        for ctrl, n in sorted(cgroups.items()):
            g.add_metric([ctrl], n)
        yield g
        yield G("reaper_node_memory_cgroups_available", "1 if /proc/cgroups lists the memory controller",
                value=1 if "memory" in cgroups else 0)
        if self.x.memory_visible is not None:
            yield G("reaper_visible_memory_cgroups", "Memory cgroup directories visible to reaper (live ones; "
                                                     "only its own subtree in a private cgroup namespace)",
                    value=self.x.memory_visible)
        yield G("reaper_cgroup_pids_available", "1 if the pids controller of reaper's cgroup is readable",
                value=0 if pids is None else 1)
        if pids is not None:
            yield G("reaper_cgroup_pids", "Tasks in reaper's cgroup (pids.current)", value=pids.current)
            yield G("reaper_cgroup_pids_max", "Tightest pids.max from reaper's cgroup up (+Inf: no limit)",
                    value=pids.max)


# --- HTTP ----------------------------------------------------------------------------

def _serve(sock: socket.socket, registry, log):
    import io
    import socketserver
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    from prometheus_client import make_wsgi_app

    metrics_app = make_wsgi_app(registry)

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "GET, HEAD")])
            return [b"method not allowed\n"]
        if path == "/metrics":
            try:
                return metrics_app(environ, start_response)
            except Exception as e:   # never a traceback on PID 1's stderr per scrape
                log.debug(f"metrics: scrape failed: {e!r}")
                start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
                return [b"collection failed\n"]
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"reaper: metrics at /metrics, health at /healthz\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]

    class Handler(WSGIRequestHandler):
        timeout = REQUEST_DEADLINE       # per socket operation, also for writing the answer

        def log_message(self, *args) -> None:
            pass

        def get_stderr(self):
            return io.StringIO()          # wsgiref's error reports must not reach reaper's stderr

        def handle(self) -> None:
            head = _read_head(self.connection)
            if head is None:
                return
            self.rfile = io.BytesIO(head)
            super().handle()

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True

        def __init__(self) -> None:
            super().__init__(sock.getsockname()[:2], Handler, bind_and_activate=False)
            self.socket.close()
            self.socket = sock
            host, port = sock.getsockname()[:2]
            self.server_name, self.server_port = host, port
            self.setup_environ()
            self.set_app(app)
            self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

        def process_request(self, request, client_address) -> None:
            if not self.slots.acquire(blocking=False):
                try:
                    request.settimeout(0)
                    request.send(b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\n"
                                 b"Content-Length: 0\r\n\r\n")
                except OSError:
                    pass
                self.shutdown_request(request)
                return
            try:
                super().process_request(request, client_address)
            except Exception:
                self.slots.release()
                raise

        def process_request_thread(self, request, client_address) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

        def handle_error(self, request, client_address) -> None:
            log.debug(f"metrics: error serving {client_address}")

    server = Server()
    # No shutdown() is ever needed (a daemon thread), so select() may sleep long.
    threading.Thread(target=server.serve_forever, args=(3600,), name="reaper-metrics-http", daemon=True).start()
    return server


def _read_head(conn: socket.socket) -> bytes | None:
    """The request line and headers, within REQUEST_DEADLINE in total (a slow-loris
    client that trickles bytes is cut off); None if it never completes."""
    deadline = time.monotonic() + REQUEST_DEADLINE
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or len(data) > MAX_HEAD:
            return None
        conn.settimeout(left)
        try:
            chunk = conn.recv(4096)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    conn.settimeout(REQUEST_DEADLINE)
    return data

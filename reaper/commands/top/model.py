"""What ``reaper top`` shows, made from one fetch of the endpoint (reaper.metrics.client)
and, where ``reaper top`` runs in the PID namespace of the reaper it shows (the usual
``kubectl exec``), from /proc: the main child's pid, command, state and age, and why
each stray is one (the budget enforcer's own Finder, reaper/budgets/strays.py, with
the REAPER_STRAY_MATCH, REAPER_PROTECT and REAPER_NO_RAY_AWARE reaper reads).

Everything here is hostile input (a page, a process's name and command line): it is
kept as text, shown through text.display, never as markup.
"""
import os
import time

from reaper.commands import figures
from reaper.metrics import client
from reaper.metrics import names as N
from reaper.metrics.client import known, on
from reaper.text import display

SORTS = {"c": "cpu", "m": "memory", "p": "pid", "a": "age"}
SAME_START = 2.0        # seconds: reaper's start on the page and in /proc agree within this
SAME_RUN = 0.5          # seconds: a service's start on the page and its run's in /proc agree within this
MAX_HUNG = 4            # fetch threads left behind (client.fetch gives up on them) before a pause


class Frame:
    """One screen's content; view is None when nothing was ever read."""

    def __init__(self) -> None:
        self.view = None
        self.error = ""
        self.head = ""
        self.main = ""
        self.zombies = ""
        self.parents: list = []         # (name, pid, count)
        self.strays: list = []          # dicts: pid name reason action cpu memory age
        self.services: list = []        # (name, state, starts, up)
        self.service_starts: list = []  # when each running service's current run started (the page's)
        self.cores: list = []           # (cpu, busy, saturated seconds, streak, longest): None unknown
        self.counts = ""
        self.local = False
        self.node = False               # reaper node: no processes of its own, no strays
        self.node_rows: list = []       # reaper node: (section, text), reaper/node/view.py's
        self.leftovers = ""             # the leftovers of ended owners, counted (figures.leftovers)
        self.holders: list = []         # dicts: pid name devices state owner, from this /proc (holders.py)
        self.scanned = (0, 0)           # processes whose descriptors were read, of all


class Source:
    """The endpoint, fetched once per frame; the last good page is kept across a
    failed fetch (its error shown)."""

    def __init__(self, url: str, timeout: float, environ=None) -> None:
        self.url = client.endpoint(url)
        self.timeout = timeout
        self.environ = os.environ if environ is None else environ
        self.samples = None
        self.fetched = None             # monotonic time of the last good fetch
        self.before = None              # the fetch before it, for rates: (samples, time)
        self.sort = "cpu"
        self.finder = None
        self.holders = None             # holders.Scan, made on the first local frame

    def frame(self, now: float) -> Frame:
        f = Frame()
        hung = client.hung_fetches()
        if hung >= MAX_HUNG:        # a server that drips: its fetches outlive their timeout
            f.error = f"{hung} fetches of {display(self.url)} still hang: not fetching again until one ends"
        else:
            try:
                samples = client.fetch(self.url, self.timeout)
            except client.Unreadable as e:
                f.error = str(e)
            else:
                if self.samples is not None:
                    self.before = (self.samples, self.fetched)
                self.samples, self.fetched = samples, time.monotonic()
        if self.samples is None:
            return f
        v = f.view = client.View(self.samples)
        fill(f, v, now, self.sort)
        if f.node:
            before, then = self.before or (None, None)
            f.node_rows = figures.node_rows(v, self.samples, before, self.fetched - then if then is not None else None)
            return f
        try:
            local = self.local(v)
        except Exception as e:          # /proc read fails or changes under us: the page alone
            local, f.error = None, f.error or f"cannot read /proc: {e!r}"
        if local is not None:
            add_local(f, local, now, self.sort)
        return f

    def local(self, v) -> "dict | None":
        """The reaper on the page seen in this /proc (the same pid, started within
        SAME_START of its start time), with its processes; None otherwise."""
        pid, start = v.get(N.PID), v.get(N.START_TIME_SECONDS)
        if not known(pid) or not known(start) or pid < 1:
            return None
        ns = v.get(N.PID_NAMESPACE)
        if known(ns) and ns != _own_pid_namespace():
            return None                 # another namespace's pid: its start may match by chance
        from reaper.procfs import processes

        table = processes.scan()
        me = table.get(int(pid))
        boot = _boot_time()
        if me is None or boot is None or abs(boot + me.started - start) > SAME_START:
            return None
        from reaper.commands.top import holders

        main = v.get(N.MAIN_CHILD_PID)
        runs = {int(s.value) for s in v.rows(N.SERVICE_PID) if known(s.value)}
        if self.holders is None:
            self.holders = holders.Scan()
        return {"pid": int(pid), "table": table, "boot": boot, "main": int(main) if known(main) else None,
                "scan": self.holders,
                "pids": runs if main is not None or runs else None,     # None: a reaper too old to give them
                "watch": figures.role(v) == "watch", "devices": holders.globs(self.environ)}


def _own_pid_namespace() -> "float | None":
    try:
        return float(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def _boot_time() -> "float | None":
    """When the host booted, seconds since the epoch: process start times are since boot."""
    from reaper.procfs.system import uptime

    try:
        return time.time() - uptime()
    except (OSError, ValueError, IndexError):
        return None


def fill(f: Frame, v, now: float, sort: str) -> None:
    """The frame's parts that come from the page."""
    f.head = figures.head(v, now=now)
    if v.rows(N.MAIN_CHILD_STATE) and figures.mode(v) == "init":      # pause mode has no main child
        f.main = v.current(N.MAIN_CHILD_STATE, "state") or "?"
        code = v.get(N.MAIN_CHILD_EXIT_CODE)
        if code is not None:
            f.main += f", exit code {figures.n(code)}"
    f.node = figures.role(v) == "node"
    if f.node and v.get(N.PID) is None:      # reaper node exports neither pid nor start
        f.head = f"reaper {v.info('version')} (node)"
    f.zombies = figures.n(v.get(N.NODE_ZOMBIES if f.node else N.ZOMBIES))
    f.parents = sorted(((s.labels.get("parent_name", ""), s.labels.get("parent_pid", ""), s.value)
                        for s in v.rows(N.ZOMBIES_BY_PARENT)), key=lambda p: -_num(p[2]))
    f.counts = figures.processes(v)
    f.strays = _page_strays(v)
    _sort(f.strays, sort)
    parts = v.split("service")
    for name in figures.services(v):
        sv = parts.get(name) or client.View([])
        since = sv.get(N.SERVICE_START_TIME_SECONDS)
        up = figures.dur(now - since) if since is not None and on(sv.get(N.SERVICE_UP)) else "-"
        if up != "-" and known(since):
            f.service_starts.append(since)
        f.services.append((name, sv.current(N.SERVICE_STATE, "state") or "?", sv.get(N.total(N.SERVICE_STARTS)), up))
    f.cores = _cores(v)
    f.leftovers = figures.leftovers(v) or ""


def _num(x) -> float:
    return x if known(x) else 0.0


def _page_strays(v) -> list:
    """The strays the page names (the busiest and the largest, with the action on each)."""
    rows: dict = {}
    for metric, field in ((N.STRAY_CPU_CORES, "cpu"), (N.STRAY_MEMORY_BYTES, "memory")):
        for s in v.rows(metric):
            pid = s.labels.get("pid", "")
            d = rows.setdefault(pid, {"pid": pid, "name": s.labels.get("name", ""),
                                      "reason": _reason(s.labels.get("reason")),
                                      "action": s.labels.get("action", ""), "cpu": None, "memory": None,
                                      "age": None})
            d[field] = s.value
    return list(rows.values())


def _reason(reason) -> str:
    """Why a process is a stray, in words (the metrics' reason label; "?" from a reaper
    too old to export it)."""
    if not reason:
        return "?"
    return {"ray-idle": "below idle Ray worker", "match": "matched"}.get(reason, reason)


def _cores(v) -> list:
    """Per core, the busiest first: (cpu, busy ratio, seconds saturated in all, the
    current saturation streak, the longest within the window). reaper with
    --node-metrics per-core has the first two; reaper node the streaks."""
    busy = v.by(N.NODE_CPU_BUSY_RATIO, "cpu")
    total = v.by(N.total(N.NODE_CPU_SATURATED_SECONDS), "cpu")
    streak = v.by(N.NODE_CPU_SATURATION_STREAK_SECONDS, "cpu")
    longest = v.by(N.NODE_CPU_SATURATION_STREAK_MAX_SECONDS, "cpu")
    cpus = set(busy) | set(streak) | set(longest)
    rows = [(c, busy.get(c), total.get(c), streak.get(c), longest.get(c)) for c in cpus]
    rows.sort(key=lambda r: (-_num(r[3]), -_num(r[1]), -_num(r[4]), -_num(r[2]), len(r[0]), r[0]))
    return rows


def _sort(strays: list, by: str) -> None:
    def key(d):
        if by == "pid":
            return int(d["pid"]) if str(d["pid"]).isdigit() else 0
        value = d.get(by)
        return -(value if known(value) else -1.0)
    strays.sort(key=key)


def add_local(f: Frame, local: dict, now: float, sort: str) -> None:
    """The main child and the strays' reasons, from this /proc."""
    from reaper.procfs import processes

    f.local = True
    table, me, boot = local["table"], local["pid"], local["boot"]
    children = sorted((p for p in table.values() if p.ppid == me and p.state != "Z"), key=lambda p: p.start)
    # reaper's own children: the main child and each service's current run, by the pids
    # the page gives; a reaper too old to give them: the runs started when the page says
    # (within SAME_RUN), the main child the oldest of the others. The rest were
    # re-parented to reaper: their owner ended.
    if local["pids"] is not None:
        runs = [p for p in children if p.pid in local["pids"]]
        main = next((p for p in children if p.pid == local["main"]), None)
    else:
        runs = [p for p in children if any(abs(boot + p.started - t) <= SAME_RUN for t in f.service_starts)]
        rest = [p for p in children if p not in runs]
        main = rest[0] if rest and f.main.startswith("running") else None
    kept = runs + ([main] if main is not None else [])
    if main is not None:
        cmd = processes.read_cmdline(main.pid) or f"[{main.comm}]"
        head, sep, rest = cmd.partition(" ")
        cmd = os.path.basename(head) + sep + rest          # python3, not its whole path
        f.main = (f"pid {main.pid}, {STATES.get(main.state, main.state)}, up {figures.dur(now - boot - main.started)}"
                  f": {display(cmd)}")
    f.holders, *f.scanned = local["scan"].get(time.monotonic(), table, me, {p.pid for p in kept}, local["devices"])
    found = _find(local, kept, main)
    by_pid = {str(d["pid"]): d for d in f.strays}
    for s in found.values():
        d = by_pid.get(str(s.pid))
        if d is None:
            d = by_pid[str(s.pid)] = {"pid": str(s.pid), "name": s.comm, "action": "", "cpu": None,
                                      "memory": None}
            f.strays.append(d)
        d["reason"] = _reason(s.reason)
        d["name"] = s.comm or d["name"]
        proc = table.get(s.pid)
        d["age"] = now - boot - proc.started if proc else None
    _sort(f.strays, sort)


STATES = {"R": "running", "S": "sleeping", "D": "disk wait", "T": "stopped", "t": "traced", "Z": "zombie",
           "I": "idle"}


class _Scope:
    def __init__(self, pid: int, main, kept: list, watch: bool) -> None:
        self.pid = pid
        self.is_pid1 = pid == 1
        self.main_pid = main.pid if main is not None else None
        self.supervised = {p.pid for p in kept}
        self.watch = watch
        self.phase = "running"


def _find(local: dict, kept: list, main) -> dict:
    from reaper import options
    from reaper.budgets.strays import Finder
    from reaper.procfs.processes import ProcTable, children_index

    rows = tuple(o for o in options.OPTIONS if o.dest in ("stray_match", "protect", "ray_aware"))
    cfg = options.configure([], rows, os.environ)
    pt = ProcTable()
    pt.procs = local["table"]
    pt.children = children_index(pt.procs.values())
    finder = Finder(cfg, _Scope(local["pid"], main, kept, local["watch"]))
    return {key: finder.stray(key, why, pt) for key, why in finder.find(pt).items()}

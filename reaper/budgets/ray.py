"""Which processes are Ray's own, judged by what a process cannot change about
itself: the file it executes, never its comm or command line (prctl and
``exec -a`` rename anything).

- raylet and gcs_server: /proc/PID/exe is ray/core/src/ray/raylet/raylet or
  ray/core/src/ray/gcs/gcs_server inside an installed ray package;
- Ray's Python daemons (dashboard, its agents, monitor, log monitor, client
  server): the executable is a Python interpreter and the script it runs (the first
  argument after the interpreter's options; ``-m ray.x.y``: that module's file) is a
  real file inside an installed ray package, under _private/, autoscaler/,
  dashboard/ or util/client/;
- ``ray start``: the interpreter runs Ray's ``ray`` launcher, the console script
  that pip generated when it installed an installed ray package: listed in that
  distribution's RECORD and with the content RECORD hashes (a script of the same
  name and text elsewhere is anybody's).

An installed ray package is a ``ray`` directory with ``__init__.py`` and the
compiled core ``_raylet.so`` that is either the one reaper's own interpreter would
import (found without importing it) or sits in a ``site-packages`` or
``dist-packages`` directory of any interpreter. Paths are resolved inside the
process's own root (/proc/PID/root, symlinks included), relative to its working
directory (/proc/PID/cwd): in ``reaper watch`` Ray is usually installed in another
container of the pod, which the sidecar sees only there. The file found must be
the very file the process runs (same device and inode as /proc/PID/exe).

Results are kept per (pid, start time) until the process execs (its argv's
address, which only an exec changes, in /proc/PID/stat): a new name or title
(prctl, setproctitle) is not judged again. A not-Ray's verdict the strays' finder
drops (budgets/strays.py keeps its own) is still kept here when it was costly.

Every path read here is one the process controls (its root, its cwd, its
executable's and script's directories, a dist-info beside them): files are read
only through read_regular (regular files, bounded); a path is walked a component at
a time inside the process's root, at most MAX_STEPS components and MAX_LINKS
symlinks (a deeper path is none of Ray's); and the whole judgement runs off the loop
under a deadline (procfs/offloop.py), which the walk checks between its steps. A
process whose files do not answer in CLASSIFY_TIMEOUT (a hung FUSE or NFS mount
under its root), or whose judgement waits for a checker held that way, is UNDECIDED:
neither Ray's nor a stray, never acted upon, asked again at the next scan; PID 1
never waits longer for it.
"""
from __future__ import annotations

import io
import os
import time

from reaper.procfs.files import read_regular
from reaper.procfs.offloop import Late, OffLoop, check
from reaper.procfs.processes import stat_fields

RAYLET = "core/src/ray/raylet/raylet"
GCS_SERVER = "core/src/ray/gcs/gcs_server"
DAEMON_DIRS = ("_private/", "autoscaler/", "dashboard/", "util/client/")
MAX_LAUNCHER = 1 << 16         # bytes: pip's console scripts are a few hundred
MAX_RECORD = 8 << 20           # bytes: ray's own RECORD is about 1 MB
# The interpreter's options that take a value (CPython's -W, -X, --check-hash-based-pycs).
_TAKES_VALUE = ("W", "X")
MAX_LINKS = 40
# Components walked in one path, those its links add included: Ray's own paths take
# about 10 to 30; a longer one is none of Ray's (and each step costs a kernel walk).
MAX_STEPS = 128
MAX_SITES = 16                 # lib*/python* directories of a prefix looked into
MAX_ROWS = 8                   # RECORD rows naming a `ray` script resolved
CLASSIFY_TIMEOUT = 0.5         # seconds the loop waits for one process's files (a few ms when they answer)
COSTLY = 0.001                 # CPU seconds: a judgement that cost more is kept whatever the finder drops
UNDECIDED = "undecided"        # kind(): not judged yet (its files or the checkers did not answer)


def python_exe(name: str) -> bool:
    """name is a CPython interpreter's: python, python3, python3.11, python3.13t...
    The pattern python(\\d+(\\.\\d+)*)?[a-z]?$ of re.match, without re (PID 1 need not
    load it and its enum): \\d is any decimal digit, $ also matches before a last newline."""
    if not name.startswith("python"):
        return False
    rest = name[6:-1] if name.endswith("\n") else name[6:]
    if "a" <= rest[-1:] <= "z":
        rest = rest[:-1]                 # a build's letter: t (free-threaded), m, d
    return not rest or all(p.isdecimal() for p in rest.split("."))


def _record_hash(data: bytes) -> str:
    """A file's hash as a wheel's RECORD writes it (PEP 376/427: urlsafe base64, no padding)."""
    import base64
    import hashlib          # here: its OpenSSL costs megabytes of PID 1's memory, and few strays are Ray's

    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def local_package() -> str | None:
    """The ray package reaper's own interpreter would import; None if there is none.
    find_spec on a top-level name reads sys.path only: ray is not imported."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("ray")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.realpath(os.path.dirname(spec.origin))


def resolve_in(root: str, path: str, cwd: str = "/", deadline: float = float("inf")) -> str | None:
    """path as the process whose root directory is `root` sees it, symlinks resolved
    inside that root; the result is absolute within the root. None if it does not resolve,
    or takes more than MAX_STEPS components or MAX_LINKS links; Late past deadline."""
    if not path:
        return None
    todo = _parts(path if path.startswith("/") else cwd.rstrip("/") + "/" + path)
    done: list = []
    links = steps = 0
    while todo:
        part = todo.pop()
        steps += 1
        if steps > MAX_STEPS:
            return None
        check(deadline)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        done.append(part)
        try:
            target = os.readlink(root + "/" + "/".join(done))
        except OSError as e:
            if e.errno == 22:           # EINVAL: not a symlink
                continue
            return None                 # missing, unreadable, or longer than PATH_MAX
        done.pop()
        links += 1
        if links > MAX_LINKS:
            return None
        if target.startswith("/"):
            done = []
        todo += _parts(target)
    return "/" + "/".join(done)


def _parts(path: str) -> list:
    """path's components, last first: resolve_in's stack (a path is at most 8 KB)."""
    parts = [p for p in path.split("/") if p]
    parts.reverse()
    return parts


def python_script(argv: list) -> tuple:
    """What a CPython command line runs: ("script", path), ("module", name) or
    ("other", None) for -c, stdin and anything it cannot tell."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return ("script", argv[i + 1]) if i + 1 < len(argv) else ("other", None)
        if a.startswith("--"):
            if a == "--check-hash-based-pycs":
                i += 1
            i += 1
            continue
        if a.startswith("-") and len(a) > 1:
            j = 1
            while j < len(a):
                c = a[j]
                if c == "c":
                    return ("other", None)
                if c == "m":
                    name = a[j + 1:] or (argv[i + 1] if i + 1 < len(argv) else "")
                    return ("module", name) if name else ("other", None)
                if c in _TAKES_VALUE:
                    if j + 1 == len(a):
                        i += 1          # the value is the next argument
                    break
                j += 1
            i += 1
            continue
        if a == "-":
            return ("other", None)
        return ("script", a)
    return ("other", None)


class RayProcesses:
    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.local = local_package()
        self.cache: dict = {}           # (pid, start) -> (exec id, kind)
        self.costly: dict = {}          # the same, for judgements that took COSTLY or more
        self._packages: dict = {}       # (root id, dir) -> bool: an installed ray package
        self.files = OffLoop(CLASSIFY_TIMEOUT)
        self.late: list = []            # pids left UNDECIDED because their files or the checkers did not answer

    def prune(self, alive) -> None:
        """Forgets processes no longer in the table (alive: the (pid, start) keys)."""
        for kept in (self.cache, self.costly):
            for key in [k for k in kept if k not in alive]:
                del kept[key]
        if len(self._packages) > 256:
            self._packages.clear()

    def kind(self, pid: int, start: int, cmdline: bytes | None = None) -> str | None:
        """'raylet', 'gcs_server', 'daemon' or 'ray_start' for Ray's own processes; None
        otherwise; UNDECIDED when it could not be told in time (asked again next time)."""
        key = (pid, start)
        hit = self.cache.get(key) or self.costly.get(key)
        if hit is not None:
            if hit[0] == self._exec_id(pid, cmdline):
                return hit[1]
            self.costly.pop(key, None)  # it exec'd: judged afresh
        if cmdline is None:
            cmdline = self._cmdline(pid)
        cost = []
        try:
            k = self.files.run(self._timed, cost, pid, cmdline, self.files.deadline())
        except Late:     # undecided, never a verdict: not Ray's would let budgets act on Ray's own
            self.late = [*self.late[-7:], pid]
            return UNDECIDED
        except (OSError, ValueError):   # ValueError: a NUL or surrogate in a path it chose
            k = None
        verdict = (self._exec_id(pid, cmdline), k)
        self.cache[key] = verdict
        if cost and cost[0] >= COSTLY:
            self.costly[key] = verdict
        return k

    def _timed(self, cost: list, pid: int, cmdline: bytes, deadline: float) -> str | None:
        """_classify, its CPU time put in cost (the worker's own: neither waits nor load count)."""
        began = time.thread_time()
        try:
            return self._classify(pid, cmdline, deadline)
        finally:
            cost.append(time.thread_time() - began)

    def _exec_id(self, pid: int, cmdline: bytes | None) -> object:
        """What changes when pid execs and not when it renames itself: the address of its
        argv (/proc/PID/stat's arg_start: only an exec, or CAP_SYS_RESOURCE, moves it).
        Where it reads as 0 (another user's process, reaper without ptrace rights over
        it) or not at all: the command line, as before."""
        st = stat_fields(pid, self.proc)
        try:
            arg_start = int(st[1][45])  # field 48, counted from the state (field 3)
        except (TypeError, IndexError, ValueError):
            arg_start = 0
        if arg_start:
            return arg_start
        return self._cmdline(pid) if cmdline is None else cmdline

    def _cmdline(self, pid: int) -> bytes:
        try:
            with open(f"{self.proc}/{pid}/cmdline", "rb") as f:
                return f.read(8192)
        except OSError:
            return b""

    def _classify(self, pid: int, cmdline: bytes, deadline: float) -> str | None:
        # Reads of paths the process controls, all here and below (off the loop):
        # readlink and stat of /proc/PID/exe and /proc/PID/cwd; readlink of each step
        # of a path inside /proc/PID/root (resolve_in); stat of that root and of the
        # file found; isfile of a ray package's __init__.py and _raylet.so and of a
        # module's file; listdir of a prefix's lib*/ and of a site's *.dist-info;
        # read_regular of the script (MAX_LAUNCHER) and of RECORD (MAX_RECORD).
        base = f"{self.proc}/{pid}"
        exe = os.readlink(f"{base}/exe")
        if exe.endswith(" (deleted)"):
            return None
        root = f"{base}/root"
        real_exe = resolve_in(root, exe, "/", deadline)
        if real_exe is None:
            return None
        st = os.stat(f"{base}/exe")
        found = os.stat(root + real_exe)
        if (st.st_dev, st.st_ino) != (found.st_dev, found.st_ino):
            return None                 # not the file the process runs
        rel = self._in_package(root, real_exe)
        if rel == RAYLET:
            return "raylet"
        if rel == GCS_SERVER:
            return "gcs_server"
        if not python_exe(os.path.basename(real_exe)):
            return None
        argv = [a.decode(errors="surrogateescape") for a in cmdline.rstrip(b"\0").split(b"\0")]
        what, arg = python_script(argv)
        if what == "other":
            return None
        cwd = os.readlink(f"{base}/cwd")
        if what == "module":
            parts = arg.split(".")
            if parts[0] != "ray" or len(parts) < 2 or not all(p.isidentifier() for p in parts):
                return None
            for pkg in self._packages_for(root, real_exe, deadline):
                for cand in ("/".join(parts[1:]) + ".py", "/".join(parts[1:]) + "/__main__.py"):
                    if os.path.isfile(f"{root}{pkg}/{cand}") and cand.startswith(DAEMON_DIRS):
                        return "daemon"
            return None
        script = resolve_in(root, arg, cwd, deadline)
        if script is None or not os.path.isfile(root + script):
            return None
        rel = self._in_package(root, script)
        if rel is not None:
            return "daemon" if rel.endswith(".py") and rel.startswith(DAEMON_DIRS) else None
        if os.path.basename(script) == "ray" and self._is_launcher(root, script, real_exe, deadline):
            return "ray_start"
        return None

    def _is_package(self, root: str, d: str) -> bool:
        st = os.stat(root + "/")          # the root's identity: shared by a container's processes
        key = (st.st_dev, st.st_ino, d)
        hit = self._packages.get(key)
        if hit is None:
            here = root + d
            real_local = self.local is not None and d == self.local and self._same_root(root)
            hit = (os.path.isfile(here + "/__init__.py") and os.path.isfile(here + "/_raylet.so")
                   and (real_local or os.path.basename(os.path.dirname(d)) in ("site-packages", "dist-packages")))
            self._packages[key] = hit
        return hit

    def _same_root(self, root: str) -> bool:
        try:
            a, b = os.stat(root + "/"), os.stat("/")
            return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
        except OSError:
            return False

    def _in_package(self, root: str, path: str) -> str | None:
        """path relative to the installed ray package holding it, or None."""
        parts = path.strip("/").split("/")
        for i, part in enumerate(parts[:-1]):
            if part == "ray":
                d = "/" + "/".join(parts[:i + 1])
                if self._is_package(root, d):
                    return "/".join(parts[i + 1:])
        return None

    def _packages_for(self, root: str, exe: str, deadline: float) -> list:
        """Installed ray packages an interpreter would import: beside it (its prefix's
        lib*/pythonX.Y/{site,dist}-packages), and reaper's own when the root is ours."""
        out = []
        prefix = os.path.dirname(os.path.dirname(exe))
        for lib in ("lib", "lib64"):
            try:
                names = os.listdir(f"{root}{prefix}/{lib}")
            except OSError:
                continue
            for n in [n for n in names if n.startswith("python")][:MAX_SITES]:
                check(deadline)
                for sub in ("site-packages", "dist-packages"):
                    d = f"{prefix}/{lib}/{n}/{sub}/ray".replace("//", "/")
                    if self._is_package(root, d):
                        out.append(d)
        for d in ("/usr/lib/python3/dist-packages/ray",):
            if self._is_package(root, d) and d not in out:
                out.append(d)
        if self.local is not None and self._same_root(root) and self.local not in out and \
                self._is_package(root, self.local):
            out.append(self.local)
        return out

    def _is_launcher(self, root: str, script: str, exe: str, deadline: float) -> bool:
        """script is the `ray` console script pip installed with a ray package: listed
        in that distribution's RECORD, with the content RECORD hashes (a hash is required). The package is
        one the interpreter would import or one beside the script (a virtualenv's bin/
        runs the base interpreter, whose prefix is not the venv's)."""
        for pkg in {*self._packages_for(root, exe, deadline), *self._packages_for(root, script, deadline)}:
            want = self._launchers(root, os.path.dirname(pkg), deadline).get(script)
            if want is None:
                continue
            try:     # the stray's own file: a regular one, bounded (procfs.files)
                data = read_regular(root + script, MAX_LAUNCHER)
            except OSError:
                return False
            if not data.startswith(b"#!"):
                return False
            return want != "" and want == _record_hash(data)
        return False

    def _launchers(self, root: str, site: str, deadline: float) -> dict:
        """Files that the ray distributions in site install outside it (their console
        scripts): resolved path -> RECORD's sha256 ('' where it gives none: pip always
        gives one, and a site beside the script may be anybody's, so none is no match)."""
        st = os.stat(root + "/")
        key = (st.st_dev, st.st_ino, "launchers", site)
        hit = self._packages.get(key)
        if hit is None:
            hit = {}
            try:
                names = [n for n in os.listdir(root + site) if n.startswith("ray-") and n.endswith(".dist-info")]
            except OSError:
                names = []
            import csv

            for n in names[:MAX_SITES]:
                check(deadline)
                try:     # a site beside the script may be anybody's: a bad RECORD (a FIFO,
                         # /dev/zero, too large, not csv) is no RECORD, and never blocks reaper
                    data = read_regular(f"{root}{site}/{n}/RECORD", MAX_RECORD)
                    rows = []
                    for i, row in enumerate(csv.reader(io.StringIO(data.decode("utf-8", errors="replace")))):
                        if i % 4096 == 0:
                            check(deadline)     # 8 MB of csv take about a second
                        if row and row[0].startswith("../") and os.path.basename(row[0]) == "ray":
                            rows.append(row)
                except Late:
                    raise
                except (OSError, csv.Error):
                    continue
                for row in rows[:MAX_ROWS]:
                    path = resolve_in(root, os.path.normpath(f"{site}/{row[0]}"), "/", deadline)
                    if path is not None:
                        digest = row[1] if len(row) > 1 else ""
                        hit[path] = digest[len("sha256="):] if digest.startswith("sha256=") else ""
            self._packages[key] = hit
        return hit

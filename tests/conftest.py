"""Shared harness: run reaper as a real PID 1 in a fresh PID namespace.

Every wait is bounded; nothing sleeps where an event can be awaited. Tests run
in parallel (pytest-xdist): use tmp_path for files and free_port() for ports.
"""
from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The console script next to this interpreter (a pyenv shim on PATH would add a bash hop).
REAPER = str(Path(sys.executable).with_name("reaper")) if Path(sys.executable).with_name("reaper").exists() \
    else shutil.which("reaper")
PYTHON = sys.executable
# Ray >= 2.52 turns token authentication on for a new local cluster (ray.init() without an
# address) and leaves the token in ~/.ray/auth_token; every `ray start` after it then
# demands the token that the drivers of other tests do not send. The suite's Ray runs
# are local and short-lived: authentication off, for all of them, whatever ran before.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The nice value the suite runs at (`nice -n 10 pytest`): what a process it starts has,
# and what one reaper leaves alone or lets go of keeps.
START_NICE = os.getpriority(os.PRIO_PROCESS, 0)
# REAPER_TEST_SLOW=N: every bounded wait lasts N times longer (the cgroup v2 QEMU guest of
# .ci/check-cgroup2 runs about 35 times slower than its host); what is awaited is unchanged.
SLOW = float(os.environ.get("REAPER_TEST_SLOW") or 1)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.005, what: str = "condition"):
    """Polls predicate until it returns a truthy value; fails after timeout (times SLOW)."""
    timeout *= SLOW
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def wait_for_file(path: Path, timeout: float = 10.0, contains: str = "") -> str:
    def ready():
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            return ""
        return text if contains in text and text else ""
    return wait_for(ready, timeout, what=f"{path} to contain {contains!r}")


def children_of(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def descendants(root: int) -> list:
    """Host pids below root, every thread's children included (/proc/PID/task/TID/children)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def host_pid_below(root: int, ns_pid: int | None = None, arg: str | None = None, timeout: float = 10.0) -> int:
    """Host pid of the one process below root (a namespace's unshare, a container's init)
    that is ns_pid in its own PID namespace (NSpid's last field) and has arg among its
    argv (either may be left out): the suite's one way to find, from the host, a
    process started inside a namespace. Waits for exactly one to match (a fork not yet
    exec'd shares its parent's argv for a moment)."""
    assert ns_pid is not None or arg is not None, "say what the process is"
    found = []

    def in_ns(pid: int) -> bool:
        try:
            return int(proc_status(pid)["NSpid"].split()[-1]) == ns_pid
        except OSError:
            return False

    def one():
        pids = descendants(root)
        if arg is not None:
            pids = set(pids) & set(pids_with_arg(arg))
        found[:] = [pid for pid in pids if ns_pid is None or in_ns(pid)]
        return found[0] if len(found) == 1 else None
    try:
        return wait_for(one, timeout, 0.02, f"the process below {root} with ns pid {ns_pid}, argument {arg!r}")
    except AssertionError as e:
        raise AssertionError(f"{e} (matching: {found})") from None


def proc_stat(pid: int) -> dict:
    """/proc/PID/stat's fields the tests use: state, ppid, cpu (user + system seconds),
    nice, start (clock ticks after boot). Raises OSError (FileNotFoundError) once pid is gone."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return {"state": fields[0], "ppid": int(fields[1]), "cpu": (int(fields[11]) + int(fields[12])) / CLK_TCK,
            "nice": int(fields[16]), "start": int(fields[19])}


def pids_with_arg(arg: str, last: bool = False) -> list:
    """Pids of the live processes (zombies have no argv) with arg as one of their arguments,
    or (last) as their last one, which leaves out a reaper given it as an option's value:
    the suite's one way to find a process it started, by a tag only that test uses."""
    want, found = arg.encode(), []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")[:-1]
                if (argv[-1:] == [want]) if last else (want in argv):
                    found.append(int(name))
            except OSError:
                pass
    return found


def child_oom_score() -> int:
    """The oom_score_adj reaper, started from here, gives its children: this process's,
    raised where reaper cannot lower its own (no CAP_SYS_RESOURCE; docs/reaper.md)."""
    from reaper._core import lib

    value = int(open("/proc/self/oom_score_adj").read())
    if int(proc_status(os.getpid())["CapEff"], 16) & (1 << 24) or value <= -1000:
        return value
    return max(value, min(1000, value + lib.REAPER_CHILD_OOM_RAISE))


def alive(pid: int) -> bool:
    """pid exists and is not a zombie."""
    try:
        return proc_stat(pid)["state"] != "Z"
    except OSError:
        return False


def proc_status(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def ns_pid(pid: int) -> int:
    """pid as a reaper that is PID 1 of its own namespace (the innermost) names it in its log."""
    return int(proc_status(pid)["NSpid"].split()[-1])


@pytest.fixture
def shared_dir(tmp_path) -> Path:
    """A directory another uid can write to (pytest's own tmp tree is private to root),
    with a short path (Ray's unix sockets under it have a 108-byte limit), removed
    after the test whatever its outcome."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    d.chmod(0o777)
    (tmp_path / "shared-dir").write_text(str(d))   # for the record when a test fails
    yield d
    shutil.rmtree(d, ignore_errors=True)


def pytest_configure(config):
    """The CPU-heavy tests rely on --dist loadgroup to run one at a time. pytest 9.2 makes
    pytest-xdist 3.8 drop the groups silently (pytest-xdist#1386): refuse, rather than
    run them side by side and fail by chance."""
    def version(module) -> tuple:
        return tuple(int(p) for p in module.__version__.split(".")[:2] if p.isdigit())

    if config.getoption("dist", "no") != "loadgroup" or hasattr(config, "workerinput"):
        return
    import xdist

    if version(pytest) >= (9, 2) and version(xdist) <= (3, 8):
        raise pytest.UsageError(f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} ignores "
                                "xdist_group (pytest-xdist#1386): pip install -e '.[test]' (pytest<9.2)")


PORT_BASE = 21000      # above Ray's default worker ports (10002-19999)
_next_index = 0        # where this worker's next reserve_ports() looks


def usable_ports() -> list:
    """The ports tests may take: from PORT_BASE up, outside the ephemeral range (where
    an outgoing connection could take one before its server binds it)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(x) for x in f.read().split()[:2])
    return [p for p in range(PORT_BASE, 65536) if not low <= p <= high]


def port_block(worker: int, workers: int) -> list:
    """Worker's share of the usable ports: an equal slice, whatever the worker count."""
    ports = usable_ports()
    size = len(ports) // max(workers, 1)
    if size < 16:
        raise RuntimeError(f"{workers} workers leave {size} ports each of {len(ports)}: run fewer (-n)")
    return ports[worker * size:(worker + 1) * size]


def reserve_ports(count: int = 1) -> list:
    """count consecutive free ports from this xdist worker's own block: workers cannot
    collide, and a port a test has freed is handed out again only once the whole
    block has gone round (binding port 0 could give it to the very next test)."""
    global _next_index
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    block = port_block(worker, workers)
    for _ in range(len(block)):
        i = _next_index if _next_index + count <= len(block) else 0
        _next_index = (i + count) % len(block)
        run = block[i:i + count]
        if run[-1] - run[0] == count - 1 and all(_bindable(p) for p in run):
            return run
    raise RuntimeError(f"worker {worker}'s ports {block[0]}-{block[-1]}: no {count} consecutive ones free")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def require(what: str, present: bool, how: str) -> None:
    """A dependency of one test. Missing, the test is skipped, except under CI=true:
    .ci/run installs every one of them, so there a missing one is a broken CI and
    fails the test with one line naming it (not pytest.exit: in an xdist worker that
    is an INTERNALERROR that hides the line). Call it from a test or fixture, never
    at import: a run that deselects the test by marker must not need it."""
    if present:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing, though .ci/run installs it ({how})", pytrace=False)
    pytest.skip(f"{what} is not installed ({how})")


def importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def free_port() -> int:
    return reserve_ports(1)[0]


_user_checked: dict = {}


def why_user_cannot_run(uid: int, argv: list) -> str:
    """Why uid cannot run argv ("" if it can). The exec itself is made as uid, with no
    capabilities (subprocess drops to uid before it, and a process whose uids are all
    non-zero has none): setpriv would exec with root's capabilities, past a directory
    uid cannot search."""
    uid = int(uid)                      # "65534" is a uid, never a user or group name
    try:
        p = subprocess.run(argv, user=uid, group=uid, extra_groups=[], capture_output=True, text=True,
                           timeout=30, cwd="/")
    except OSError as e:
        return str(e)
    return "" if p.returncode == 0 else (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]


def check_user_can_run(uid: int) -> None:
    """Fails, with the reason, a test that runs reaper as uid when that user cannot
    run this interpreter (a pyenv under /root is mode 700: .ci/run opens it)."""
    if uid not in _user_checked:
        _user_checked[uid] = why_user_cannot_run(uid, [REAPER, "--version"])
    if _user_checked[uid]:
        pytest.fail(f"uid {uid} cannot run {PYTHON} with reaper ({_user_checked[uid]}): make the "
                    "directories on its path traversable (.ci/run does chmod o+x /root)", pytrace=False)


class Reaper:
    """A running reaper. In a namespace (pid1=True) it is PID 1 there; .pid is its
    pid as seen from the test."""

    def __init__(self, args, pid1=True, env=None, user=None, stdin=subprocess.DEVNULL,
                 cwd=None, preexec_fn=None, pass_fds=(), exe=None, stderr=subprocess.PIPE):
        cmd = [*(exe or [REAPER]), *args]
        if user is not None:
            check_user_can_run(user)
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
        if pid1:
            cmd = [*UNSHARE, *cmd]
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr,
                                     env=full_env, cwd=cwd, preexec_fn=preexec_fn, pass_fds=pass_fds)
        self.pid1 = pid1
        self._pid = None
        self.stdout = self.stderr = None
        self._buf = b""

    @property
    def pid(self) -> int:
        """Host pid of the reaper process (blocks until it has been exec'd)."""
        if self._pid is None:
            if not self.pid1:
                self._pid = self.proc.pid
            else:
                def reaper_child():
                    for c in children_of(self.proc.pid):
                        try:
                            if os.readlink(f"/proc/{c}/exe") != os.readlink(f"/proc/{self.proc.pid}/exe"):
                                return c
                        except OSError:
                            pass
                    return None
                self._pid = wait_for(reaper_child, 10, what="reaper to start under unshare")
        return self._pid

    def wait_ready(self, timeout=10.0) -> int:
        """Waits until reaper has blocked its signals (the C core's first act). Its
        signalfd says so: it is made right after the mask is set. (A blocked signal
        would not: the invoker may have left one blocked.)"""
        def has_signalfd():
            try:
                fds = os.listdir(f"/proc/{self.pid}/fd")
            except OSError:
                return False
            for fd in fds:
                try:
                    if "signalfd" in os.readlink(f"/proc/{self.pid}/fd/{fd}"):
                        return True
                except OSError:
                    pass
            return False
        wait_for(has_signalfd, timeout, 0.001, what="reaper to block its signals")
        return self.pid

    def main_child(self, timeout=10.0) -> int:
        """Host pid of reaper's main child (its first child)."""
        return wait_for(lambda: (children_of(self.pid) or [None])[0], timeout, what="main child")

    def readline(self, timeout: float = 10.0) -> str:
        """Next line the main child wrote to stdout (reaper passes stdout straight through)."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout * SLOW
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise AssertionError(f"no line from the child within {timeout}s (got {self._buf!r})")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"child's stdout closed (got {self._buf!r})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def send(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout=30.0, input=None) -> int:
        try:
            self.stdout, self.stderr = self.proc.communicate(input, timeout=timeout * SLOW)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"reaper did not exit within {timeout}s")
        self.stdout = self._buf.decode(errors="replace") + self.stdout.decode(errors="replace")
        self.stderr = (self.stderr or b"").decode(errors="replace")
        return self.proc.returncode

    def kill(self) -> None:
        """Stops reaper (and, in a namespace, all it started) and keeps what it wrote;
        removes the stray cgroups it held, which a killed reaper cannot."""
        held = held_cgroups(self.proc.pid) if self.proc.poll() is None else set()
        try:
            self._stop()
        finally:
            for base in held | set(STRAY_CGROUP.findall(self.stderr or "")):
                remove_cgroup(base)

    def _stop(self) -> None:
        if self.proc.poll() is None:
            if not self.pid1:
                # Not in a namespace of its own: let reaper drain its tree, then insist.
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            # In a namespace, unshare --kill-child takes everything down with it.
            self.proc.kill()
        if self.stderr is not None or self.proc.stdout.closed:
            return
        try:
            out, err = self.proc.communicate(timeout=10)
            self.stdout = self._buf.decode(errors="replace") + out.decode(errors="replace")
            self.stderr = (err or b"").decode(errors="replace")
        except subprocess.TimeoutExpired:   # a survivor holds the pipes: don't wait for it
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()
            self.stdout = self.stderr = "(a survivor held reaper's pipes open)"


STRAY_CGROUP = re.compile(r"(/sys/fs/cgroup/\S*?/reaper-(?:strays|leftovers)\.[0-9a-f]+)")


def held_cgroups(root: int) -> set:
    """The reaper-strays.* and reaper-leftovers.* cgroups a reaper at or below host pid root holds: reaper keeps
    each one's directory open (its owner's lock, budgets/cgroupfs.py) while it lives,
    so they are found whatever it logged."""
    found = set()
    for pid in [root, *descendants(root)]:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                m = STRAY_CGROUP.match(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            if m:
                found.add(m.group(1))
    return found


@pytest.fixture
def reaper():
    """Factory: reaper(args, pid1=True, ...) -> Reaper; everything is killed afterwards,
    and the stray cgroups a killed reaper could not remove with it (Reaper.kill)."""
    started = []

    def start(args, **kw):
        r = Reaper(args, **kw)
        started.append(r)
        return r
    yield start
    for r in started:
        r.kill()


@pytest.fixture
def namespace():
    """Registers an `unshare --kill-child ...` Popen; killed (and so its namespace)
    afterwards, and the stray cgroups a reaper in it held removed."""
    started = []
    yield started.append
    for ns in started:
        held = held_cgroups(ns.pid) if ns.poll() is None else set()
        if ns.poll() is None:
            ns.kill()
        ns.communicate()
        for base in held:
            remove_cgroup(base)


@pytest.fixture(scope="session")
def storm_bin(tmp_path_factory) -> str:
    """tests/helpers/storm.c, compiled once per worker."""
    out = tmp_path_factory.mktemp("bin") / "storm"
    src = Path(__file__).with_name("helpers") / "storm.c"
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-o", str(out), str(src)], check=True)
    return str(out)


def zombies_of(pid: int) -> list:
    """Zombie children of pid (host view)."""
    found = []
    for c in children_of(pid):
        try:
            if proc_status(c)["State"].startswith("Z"):
                found.append(c)
        except FileNotFoundError:
            pass
    return found


def summary(stderr: str) -> dict:
    """reaper's exit summary (the JSON on its 'summary' log line). At the default
    verbosity reaper prints it only when there is news (an orphan reaped, a drain, a
    budget action, a policy error): a test of a run without news passes -v."""
    import json

    for line in stderr.splitlines():
        if ": INFO summary " in line:
            return json.loads(line.split(": INFO summary ", 1)[1])
    raise AssertionError(f"no summary line in stderr:\n{stderr}")


def clean_env(extra=None, **more) -> dict:
    """This environment without the variables reaper reads (REAPER_*, TINI_*, LISTEN_*),
    plus extra and more."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REAPER_", "TINI_", "LISTEN_"))}
    env.update(extra or {})
    env.update(more)
    return env


def take_tty() -> None:
    """preexec_fn: the child leads a new session whose controlling terminal is its stdin (a pty)."""
    import fcntl
    import termios

    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def read_until(fd: int, done, timeout: float = 10.0, have: bytes = b"") -> bytes:
    """What fd (a pipe, a pty's master) gave until done(have + it) is true, or, with
    done None, until it closed (a pty's EIO: every slave fd is closed). Fails at the
    timeout, or at an end before done."""
    timeout *= SLOW
    got, deadline = b"", time.monotonic() + timeout
    while done is None or not done(have + got):
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], f"timed out after {timeout}s; got {got!r}"
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            assert done is None, f"ended early; got {got.decode(errors='replace')}"
            return got
        got += chunk
    return got


def line_with(needle) -> "callable":
    """done for read_until: a whole line holds needle (bytes, or a compiled bytes pattern)."""
    found = needle.search if hasattr(needle, "search") else (lambda line: needle in line)
    return lambda out: any(found(line) for line in out.split(b"\n")[:-1])


def one_line(stderr: bytes, prefix: str) -> str:
    """The one line stderr holds: no traceback, strictly UTF-8 (undecodable bytes shown as \\xff)."""
    assert b"Traceback" not in stderr, stderr.decode(errors="backslashreplace")
    text = stderr.decode("utf-8")
    lines = text.splitlines()
    assert len(lines) == 1, text
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


def refused(tmp_path, args, *needles, env=None, user=None, pid1=False) -> str:
    """The rule for bad input: `reaper ARGS -- touch MARKER` exits 2 with one line naming
    the problem (and the hint to --help), and the child never ran. pid1: as a
    namespace's PID 1; user: run by that uid."""
    marker = tmp_path / "child-ran"
    line = _refusal([REAPER, *args, "--", "touch", str(marker)], "reaper", needles, env, user, pid1)
    assert not marker.exists(), "the child started on bad input"
    return line


def refused_sub(name, args, *needles, env=None, pid1=False) -> str:
    """The same rule for `reaper NAME ARGS`, a subcommand that starts no child (stats,
    watch): exit 2 and one line naming the problem and the hint to NAME's --help."""
    return _refusal([REAPER, name, *args], f"reaper {name}", needles, env, None, pid1)


def _refusal(cmd, who, needles, env, user, pid1) -> str:
    if user is not None:
        check_user_can_run(user)
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    if pid1:
        cmd = [*UNSHARE, *cmd]
    p = subprocess.run(cmd, env=clean_env(env), stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    line = one_line(p.stderr, f"{who}: ")
    assert p.returncode == 2, line
    assert line.endswith(f"(see '{who} --help')"), line
    for needle in needles:
        assert needle in line, line
    return line


def summary_file(path) -> dict:
    """reaper's exit summary as --summary-file wrote it."""
    import json

    with open(path) as f:
        return json.loads(f.read())


def remove_cgroup(d) -> None:
    """Removes cgroup directory d and its leaves (v1 or v2), moving what is still in
    them to d's parent first; retried until the kernel lets go (exiting tasks)."""
    d = Path(d)
    if not d.is_dir():
        return
    leaves = [c for c in d.iterdir() if c.is_dir()]

    def removed():
        for c in leaves + [d]:
            try:
                for pid in (c / "cgroup.procs").read_text().split():
                    try:
                        (d.parent / "cgroup.procs").write_text(pid)
                    except OSError:
                        pass            # it exited meanwhile
                c.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                return False
        return True
    wait_for(removed, 10, interval=0.05, what=f"{d} to be removable")


def invoker_signals(ignored=(), blocked=()):
    """preexec_fn: exactly these signals ignored and blocked, whatever the test itself
    inherited (under nohup SIGHUP is ignored; a CI runner may block some)."""
    def setup():
        for s in range(1, signal.NSIG):
            if s not in (signal.SIGKILL, signal.SIGSTOP):
                try:
                    signal.signal(s, signal.SIG_IGN if s in ignored else signal.SIG_DFL)
                except (OSError, ValueError):
                    pass                  # 32, 33: glibc's own
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return setup


def run_reaper(args, pid1=True, timeout=30.0, **kw):
    """Runs reaper to completion; returns the Reaper (with .stdout, .stderr, .proc.returncode)."""
    r = Reaper(args, pid1=pid1, **kw)
    r.wait(timeout)
    return r


def py(code: str) -> list:
    """argv running a Python snippet with this interpreter."""
    return [PYTHON, "-c", code]


# poll() and ppoll() by architecture: /proc/PID/syscall names the call a process
# sleeps in by number (wchan's function names differ between kernels).
POLL_SYSCALLS = {"x86_64": {7, 271}, "aarch64": {73}, "ppc64le": {167, 281}, "s390x": {168, 302}}


def in_poll(pid: int, forever: bool = True) -> bool:
    """pid sleeps in poll(); with forever, with no timeout: reaper's idle loop, not
    the bounded first wait it makes before its policy is loaded (boundary.py)."""
    try:
        fields = open(f"/proc/{pid}/syscall").read().split()
    except OSError:
        return False
    calls = POLL_SYSCALLS.get(os.uname().machine)
    if calls is None:                                   # an architecture not listed: the kernel's word
        return "poll" in open(f"/proc/{pid}/wchan").read()
    if not fields or not fields[0].isdigit() or int(fields[0]) not in calls:
        return False
    # poll's third argument is its timeout (-1: none); ppoll's a timespec pointer (NULL: none).
    return not forever or (len(fields) > 3 and int(fields[3], 16) in (2**64 - 1, 2**32 - 1, 0))


# --- small helpers more than one test file needs (one copy each, here) ------------------------

def signal_set(hex_mask: str) -> set:
    """The signal numbers of a /proc/PID/status mask (SigBlk, SigIgn...)."""
    bits = int(hex_mask, 16)
    return {n for n in range(1, 65) if bits >> (n - 1) & 1}


def rmdir_quietly(d: Path) -> bool:
    """Removes empty directory d (a cgroup); True once it is gone, False while it cannot be."""
    try:
        d.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def reaper_version() -> str:
    from reaper import __version__

    return __version__


def lines_of(path: Path, partial: bool = False) -> list:
    """The lines a process wrote to path ([] before it exists); a last line not yet ended
    by a newline only with partial."""
    if not path.exists():
        return []
    text = path.read_text()
    return text.splitlines() if partial else text.split("\n")[:-1]


def yaml_module():
    """PyYAML, a test dependency (require: skipped, or failed under CI, without it)."""
    require("pyyaml", importable("yaml"), "pip install -e '.[test]'")
    import yaml

    return yaml


def reaper_stats(*args, prefix=(), text: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """`reaper stats ARGS`, run to its end (prefix: a command it runs under, prlimit...)."""
    return subprocess.run([*prefix, REAPER, "stats", *args], capture_output=True, text=text,
                          timeout=timeout * SLOW, stdin=subprocess.DEVNULL)
